//! Unit tests of `tls`: flag pairing rules, file checks, and the warnings. Handshakes are
//! tested end to end with real processes in `tests/tests/tls.rs`.

use std::path::Path;

use clap::Parser;
use rcgen::{CertificateParams, KeyPair};

use super::*;

fn parse(args: &[&str]) -> Config {
    Config::parse_from(std::iter::once("picketd").chain(args.iter().copied()))
}

/// A self-signed certificate for 127.0.0.1 and its key, written as PEM files into `dir`.
fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("self-signed");
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

#[test]
fn https_listeners_need_a_certificate_and_name_the_flag() {
    tracing::info!("an https client URL without --cert-file is refused, naming the flag");
    let err = parse(&["--listen-client-urls", "https://127.0.0.1:5"]).validate().unwrap_err();
    assert!(matches!(err, ConfigError::TlsWithoutCert { cert_flag: "cert-file", .. }), "{err}");
    assert!(err.to_string().contains("--cert-file"), "{err}");

    tracing::info!("the same for peers, naming --peer-cert-file");
    let err = parse(&[
        "--listen-peer-urls",
        "https://127.0.0.1:6",
        "--initial-cluster",
        "default=https://127.0.0.1:6",
    ])
    .validate()
    .unwrap_err();
    assert!(err.to_string().contains("--peer-cert-file"), "{err}");

    tracing::info!("metrics stay plain HTTP");
    let err = parse(&["--listen-metrics-urls", "https://127.0.0.1:7"]).validate().unwrap_err();
    assert!(matches!(err, ConfigError::BadUrl { .. }), "{err}");
}

#[test]
fn flags_come_in_pairs() {
    let err = parse(&["--cert-file", "a.crt"]).validate().unwrap_err();
    assert_eq!(err.to_string(), "--cert-file needs --key-file");
    let err = parse(&["--peer-key-file", "a.key"]).validate().unwrap_err();
    assert_eq!(err.to_string(), "--peer-key-file needs --peer-cert-file");
    let err = parse(&["--client-cert-auth"]).validate().unwrap_err();
    assert_eq!(err.to_string(), "--client-cert-auth needs --trusted-ca-file");
    let err = parse(&["--peer-client-cert-auth=true"]).validate().unwrap_err();
    assert_eq!(err.to_string(), "--peer-client-cert-auth needs --peer-trusted-ca-file");
    // etcd's boolean spellings: bare, `=true`, `=false`.
    assert!(!parse(&["--client-cert-auth=false"]).client_cert_auth);
    assert!(parse(&["--client-cert-auth", "--name", "x"]).client_cert_auth);
}

#[test]
fn a_full_tls_configuration_validates() {
    let c = parse(&[
        "--listen-client-urls",
        "https://127.0.0.1:5,http://127.0.0.1:8",
        "--cert-file",
        "s.crt",
        "--key-file",
        "s.key",
        "--trusted-ca-file",
        "ca.crt",
        "--client-cert-auth",
        "--listen-peer-urls",
        "https://127.0.0.1:6",
        "--initial-cluster",
        "default=https://127.0.0.1:6",
        "--peer-cert-file",
        "p.crt",
        "--peer-key-file",
        "p.key",
        "--peer-trusted-ca-file",
        "ca.crt",
        "--peer-client-cert-auth",
    ]);
    c.validate().expect("valid");
    assert_eq!(listener_tls(&c, Side::Client), vec![true, false]);
    assert_eq!(listener_tls(&c, Side::Peer), vec![true]);
    tracing::info!("the plain-text client listener next to --cert-file is warned about");
    let warnings = plain_text_warnings(&c);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("http://127.0.0.1:8"), "{warnings:?}");
}

#[test]
fn cert_auth_without_tls_listener_is_warned_about() {
    let c = parse(&["--trusted-ca-file", "ca.crt", "--client-cert-auth"]);
    c.validate().expect("valid");
    let warnings = plain_text_warnings(&c);
    assert!(
        warnings.iter().any(|w| w.contains("--client-cert-auth has no effect")),
        "{warnings:?}"
    );
}

fn flags<'a>(cert: &'a Path, key: &'a Path, ca: Option<&'a Path>) -> SideFlags<'a> {
    SideFlags {
        side: Side::Client,
        cert_file: Some(cert),
        key_file: Some(key),
        trusted_ca_file: ca,
        cert_auth: ca.is_some(),
    }
}

#[test]
fn files_are_checked_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), "server");
    let (_, other_key) = write_pair(dir.path(), "other");
    let missing = dir.path().join("missing.crt");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");

    tracing::info!("a good pair, with the certificate as its own CA, loads");
    let tls = SideTls::load(flags(&cert, &key, Some(&cert))).expect("loads");
    assert!(tls.server_config().is_some());
    tls.server_builder(true).expect("acceptor");

    tracing::info!("a missing file names its flag and path");
    let err = SideTls::load(flags(&missing, &key, None)).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("cannot read --cert-file") && text.contains("missing.crt"), "{text}");

    tracing::info!("a file without PEM contents names its flag");
    let err = SideTls::load(flags(&cert, &garbage, None)).unwrap_err();
    assert!(err.to_string().starts_with("--key-file"), "{err}");
    let err = SideTls::load(flags(&cert, &key, Some(&garbage))).unwrap_err();
    assert!(err.to_string().starts_with("--trusted-ca-file"), "{err}");

    tracing::info!("a key that is not the certificate's is refused at load");
    let err = SideTls::load(flags(&cert, &other_key, None)).unwrap_err();
    assert!(matches!(err, TlsError::Pair { cert_flag: "cert-file", .. }), "{err}");
}

#[test]
fn https_detection_and_plain_dials() {
    assert!(is_https("https://a:1"));
    assert!(is_https("HTTPS://a:1"));
    assert!(!is_https("http://a:1"));
    assert!(!is_https("a:1"));
}

/// What a peer dial writes first: a TLS ClientHello (a handshake record, byte 0x16) or the
/// plain HTTP/2 connection preface (`PRI * HTTP/2.0`). Observed on the wire, so a dialer that
/// put TLS on a plain `http` peer, or dropped it from an `https` one, fails here.
#[tokio::test]
async fn peer_dials_use_tls_exactly_for_https_urls_even_with_a_peer_ca() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_pair(dir.path(), "peer");
    let peer = SideFlags { side: Side::Peer, ..flags(&cert, &key, Some(&cert)) };
    let dialer = PeerDialer::new(&SideTls::load(peer).expect("peer TLS loads"));
    for (scheme, want_tls) in [("http", false), ("https", true)] {
        tracing::info!(scheme, "dialing a peer through the dialer with a peer CA configured");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("{scheme}://{}", listener.local_addr().expect("addr"));
        let endpoint = Endpoint::from_shared(url.clone()).expect("endpoint");
        let endpoint = dialer.apply(&url, endpoint).expect("dialer accepts the URL");
        // The dial cannot complete (nobody answers); it only has to write its first bytes.
        let dial = tokio::spawn(async move { endpoint.connect().await });
        // Bounded: a loopback connect and its first write take microseconds.
        let bound = Duration::from_secs(10);
        let (mut sock, _) =
            tokio::time::timeout(bound, listener.accept()).await.expect("dialed").expect("accept");
        let mut first = [0u8; 3];
        tokio::time::timeout(bound, sock.read_exact(&mut first))
            .await
            .expect("first bytes written")
            .expect("read");
        if want_tls {
            assert_eq!(first[0], 0x16, "{url}: expected a TLS handshake, got {first:?}");
        } else {
            assert_eq!(&first, b"PRI", "{url}: expected the plain HTTP/2 preface, got {first:?}");
        }
        dial.abort();
    }
}
