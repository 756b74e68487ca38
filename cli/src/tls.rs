//! etcdctl's TLS flags (`--cacert`, `--cert`, `--key`): the files
//! are read once, before connecting, so a missing file fails with the flag that names it.

use std::path::Path;

use anyhow::{bail, Context, Result};
use picket_client::TlsOptions;

use crate::args::Global;

fn read(flag: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading --{flag} {}", path.display()))
}

/// The TLS options the global flags ask for: `None` when none of `--cacert`, `--cert`, `--key`
/// is given (plain text, unless an endpoint is `https://`, which then fails with a hint).
pub fn load(global: &Global) -> Result<Option<TlsOptions>> {
    let (cacert, cert, key) = (&global.cacert, &global.cert, &global.key);
    if cacert.is_none() && cert.is_none() && key.is_none() {
        return Ok(None);
    }
    let mut tls = TlsOptions::new();
    if let Some(ca) = cacert {
        tls = tls.with_ca_cert(read("cacert", ca)?);
    }
    match (cert, key) {
        (Some(cert), Some(key)) => {
            tls = tls.with_client_cert(read("cert", cert)?, read("key", key)?);
        }
        (Some(_), None) => bail!("--cert needs --key"),
        (None, Some(_)) => bail!("--key needs --cert"),
        (None, None) => {}
    }
    Ok(Some(tls))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    // Regression test: the global `--key` once shared its clap id with the positional `key` of
    // `get`/`put`, and parsing panicked on the type mismatch.
    #[test]
    fn tls_flags_parse_next_to_a_key_argument() {
        let args =
            ["picket", "--cacert", "ca.crt", "--cert", "c.crt", "--key", "c.key", "get", "k"];
        let cli = Cli::try_parse_from(args).expect("parses");
        assert_eq!(cli.global.key.as_deref(), Some(Path::new("c.key")));
        assert!(matches!(cli.command, Command::Get(_)));
    }

    #[test]
    fn errors_name_the_flag() {
        let cli = Cli::try_parse_from(["picket", "--cert", "c.crt", "get", "k"]).expect("parses");
        assert_eq!(load(&cli.global).unwrap_err().to_string(), "--cert needs --key");
        let cli = Cli::try_parse_from(["picket", "--cacert", "/nonexistent/ca.crt", "get", "k"])
            .expect("parses");
        let err = format!("{:#}", load(&cli.global).unwrap_err());
        assert!(err.starts_with("reading --cacert /nonexistent/ca.crt"), "{err}");
        let cli = Cli::try_parse_from(["picket", "get", "k"]).expect("parses");
        assert!(load(&cli.global).expect("no TLS").is_none());
    }
}
