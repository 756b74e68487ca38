//! Unit tests of `--config-file`: keys become flags, the command line wins, bad keys and values
//! are named, and the loader works for any clap struct (a struct with a switch stands in for the
//! TLS flags another module adds).

use std::io::Write;

use clap::Parser;

use super::*;
use crate::config::Config;

#[derive(Debug, Parser)]
struct Toy {
    #[arg(long = "config-file")]
    config_file: Option<PathBuf>,
    #[arg(long = "name", default_value = "default")]
    name: String,
    #[arg(long = "cert-file")]
    cert_file: Option<String>,
    #[arg(long = "peer-client-cert-auth")]
    peer_client_cert_auth: bool,
    #[arg(long = "client-cert-auth")]
    client_cert_auth: bool,
    #[arg(long = "urls", default_value = "")]
    urls: String,
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn args(f: &tempfile::NamedTempFile, extra: &[&str]) -> Vec<String> {
    let mut v = vec!["picketd".to_string(), "--config-file".into()];
    v.push(f.path().display().to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn real_config_from_a_file_and_the_command_line_wins() {
    let f = file(
        "name: m1\n\
         data-dir: /tmp/picket-m1\n\
         listen-client-urls: http://127.0.0.1:12379\n\
         initial-cluster: m1=http://127.0.0.1:12380,m2=http://127.0.0.1:22380\n\
         listen-peer-urls: [http://127.0.0.1:12380]\n\
         snapshot-count: 500\n\
         quota-backend-bytes: 1048576\n\
         max-txn-ops:\n",
    );
    let c: Config = parse_from(args(&f, &[])).unwrap();
    assert_eq!(c.name, "m1");
    assert_eq!(c.data_dir, Some(PathBuf::from("/tmp/picket-m1")));
    assert_eq!(c.listen_peer_urls, "http://127.0.0.1:12380");
    assert_eq!(c.snapshot_count, 500);
    assert_eq!(c.quota_backend_bytes, 1 << 20);
    assert_eq!(c.max_txn_ops, crate::config::DEFAULT_MAX_TXN_OPS);
    c.validate().unwrap();
    let c: Config = parse_from(args(&f, &["--name", "m2", "--snapshot-count=7"])).unwrap();
    assert_eq!((c.name.as_str(), c.snapshot_count), ("m2", 7));
}

#[test]
fn generic_over_the_clap_struct_with_switches_and_nested_tls_sections() {
    let f = file(
        "name: x\n\
         urls: [a, b]\n\
         client-transport-security:\n  cert-file: /c.pem\n  client-cert-auth: true\n\
         peer-transport-security:\n  client-cert-auth: false\n",
    );
    let t: Toy = parse_from(args(&f, &[])).unwrap();
    assert_eq!(t.name, "x");
    assert_eq!(t.urls, "a,b");
    assert_eq!(t.cert_file.as_deref(), Some("/c.pem"));
    assert!(t.client_cert_auth && !t.peer_client_cert_auth);
}

#[test]
fn unknown_keys_and_bad_values_are_named() {
    let err = |text: &str| parse_from::<Config, _, _>(args(&file(text), &[])).unwrap_err();
    let e = err("name: a\nenable-v2: true\n");
    assert!(matches!(&e, ConfigFileError::UnknownKey { key, .. } if key == "enable-v2"), "{e}");
    assert!(e.to_string().contains("unknown key \"enable-v2\""), "{e}");
    let e = err("peer-transport-security:\n  bogus: 1\n");
    assert!(e.to_string().contains("peer-transport-security.bogus"), "{e}");
    assert!(matches!(err("- a\n- b\n"), ConfigFileError::NotAMap { .. }));
    assert!(matches!(err("name: [a: b\n"), ConfigFileError::Yaml { .. }));
    assert!(matches!(err("config-file: x\n"), ConfigFileError::BadValue { .. }));
    assert!(matches!(err("help: true\n"), ConfigFileError::UnknownKey { .. }));
    // A value clap refuses is clap's error, naming the flag.
    let e = err("snapshot-count: many\n");
    assert!(e.to_string().contains("--snapshot-count"), "{e}");
    let e = parse_from::<Config, _, _>(["picketd", "--config-file", "/nonexistent/p.yaml"])
        .unwrap_err();
    assert!(matches!(e, ConfigFileError::Read { .. }), "{e}");
}

#[test]
fn empty_file_and_no_file() {
    let c: Config = parse_from(args(&file(""), &["--name", "n"])).unwrap();
    assert_eq!(c.name, "n");
    let c: Config = parse_from(["picketd"]).unwrap();
    assert_eq!(c.name, crate::config::DEFAULT_NAME);
}

/// An etcd config file's automatic compaction keys, as etcd writes them (the retention quoted
/// or not), set the policy.
#[test]
fn etcd_auto_compaction_keys_set_the_policy() {
    use crate::mvcc::retention::Retention;
    use std::time::Duration;
    let f = file("auto-compaction-mode: revision\nauto-compaction-retention: 1000\n");
    let c: Config = parse_from(args(&f, &[])).unwrap();
    assert_eq!(c.auto_compaction().unwrap(), Retention::Revisions(1000));
    let f = file("auto-compaction-retention: \"1\"\n");
    let c: Config = parse_from(args(&f, &[])).unwrap();
    assert_eq!(c.auto_compaction().unwrap(), Retention::Periodic(Duration::from_secs(3600)));
}
