//! TLS for the client and peer listeners and for every dial to a peer, configured with etcd's
//! flags and meanings:
//!
//! - clients: `--cert-file` and `--key-file` (what client listeners present),
//!   `--trusted-ca-file` (the CA client certificates must chain to), `--client-cert-auth`
//!   (require a client certificate);
//! - peers: `--peer-cert-file`, `--peer-key-file`, `--peer-trusted-ca-file`,
//!   `--peer-client-cert-auth`, the same for peer listeners and for dials to peers.
//!
//! A listener serves TLS exactly when its URL is `https://`; an `https` URL without a certificate
//! is a configuration error ([`crate::config::Config::validate`]), and an `http` URL next to
//! certificate flags serves plain text with a warning ([`plain_text_warnings`]), as etcd does.
//! The metrics listener (`--listen-metrics-urls`) is always plain HTTP.
//!
//! Files are read once at startup ([`SideTls::load`]) and checked there, so a missing or
//! malformed file stops the member with an error naming its flag instead of failing every
//! handshake later. Certificates are not reloaded while running: rotating them means a
//! restart, one member at a time.
//!
//! Dials to peers ([`PeerDialer`]) use TLS for `https` peer URLs only: the peer CA verifies the
//! peer (the system's roots when `--peer-trusted-ca-file` is absent, as in etcd) and the peer
//! certificate, if any, is presented so that peers running `--peer-client-cert-auth` accept us.
//! Every place that reaches a peer (`raft::network`, the proposer's forwarding and read-index
//! clients, `raft::membership`, `raft::identity`) dials through the one [`PeerDialer`] built
//! in `node::start`.

use picket_proto::error_chain;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

use crate::config::{split_urls, Config, ConfigError};

/// Bound on one TLS handshake on a listener. tonic runs handshakes concurrently, so a client
/// that connects and stalls only costs one task until this expires; 10 s is far beyond any
/// real handshake, even on a loaded machine.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which listener (and which set of flags) a TLS setting belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// `--listen-client-urls`, configured by `--cert-file`, `--key-file`, `--trusted-ca-file`,
    /// `--client-cert-auth`.
    Client,
    /// `--listen-peer-urls` and dials to peers, configured by the `--peer-*` flags.
    Peer,
}

impl Side {
    /// The flag holding this side's certificate.
    pub fn cert_flag(self) -> &'static str {
        match self {
            Side::Client => "cert-file",
            Side::Peer => "peer-cert-file",
        }
    }

    /// The flag holding this side's private key.
    pub fn key_flag(self) -> &'static str {
        match self {
            Side::Client => "key-file",
            Side::Peer => "peer-key-file",
        }
    }

    /// The flag holding this side's trusted CA bundle.
    pub fn ca_flag(self) -> &'static str {
        match self {
            Side::Client => "trusted-ca-file",
            Side::Peer => "peer-trusted-ca-file",
        }
    }

    /// The flag that makes this side require a client certificate.
    pub fn cert_auth_flag(self) -> &'static str {
        match self {
            Side::Client => "client-cert-auth",
            Side::Peer => "peer-client-cert-auth",
        }
    }

    /// The flag listing this side's listener URLs.
    pub fn listen_flag(self) -> &'static str {
        match self {
            Side::Client => "listen-client-urls",
            Side::Peer => "listen-peer-urls",
        }
    }
}

/// The TLS flags of one side, as given (paths, not contents).
#[derive(Debug, Clone, Copy)]
pub struct SideFlags<'a> {
    pub side: Side,
    pub cert_file: Option<&'a Path>,
    pub key_file: Option<&'a Path>,
    pub trusted_ca_file: Option<&'a Path>,
    pub cert_auth: bool,
}

impl<'a> SideFlags<'a> {
    /// The flags of `side` in `cfg`.
    pub fn of(cfg: &'a Config, side: Side) -> Self {
        match side {
            Side::Client => SideFlags {
                side,
                cert_file: cfg.cert_file.as_deref(),
                key_file: cfg.key_file.as_deref(),
                trusted_ca_file: cfg.trusted_ca_file.as_deref(),
                cert_auth: cfg.client_cert_auth,
            },
            Side::Peer => SideFlags {
                side,
                cert_file: cfg.peer_cert_file.as_deref(),
                key_file: cfg.peer_key_file.as_deref(),
                trusted_ca_file: cfg.peer_trusted_ca_file.as_deref(),
                cert_auth: cfg.peer_client_cert_auth,
            },
        }
    }
}

/// Why the TLS files could not be used. Each names the flag to fix.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read --{flag} {}: {source}", path.display())]
    Read { flag: &'static str, path: PathBuf, source: std::io::Error },
    #[error("--{flag} {}: {reason}", path.display())]
    Invalid { flag: &'static str, path: PathBuf, reason: String },
    /// rustls refused the certificate and key together (e.g. a key that does not belong to the
    /// certificate).
    #[error("--{cert_flag} and --{key_flag}: {reason}")]
    Pair { cert_flag: &'static str, key_flag: &'static str, reason: String },
    #[error("an https:// listener needs --{cert_flag}")]
    NoCertificate { cert_flag: &'static str },
}

/// One side's certificates, read and checked.
#[derive(Debug, Clone)]
pub struct SideTls {
    side: Side,
    identity: Option<Identity>,
    ca: Option<Certificate>,
    cert_auth: bool,
    /// The PEM bytes behind `identity` and `ca`, for the client listener's own acceptor
    /// ([`crate::net::tls`]), which tonic's types cannot hand over.
    identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    ca_pem: Option<Vec<u8>>,
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { flag, path: path.to_path_buf(), source })
}

fn invalid(flag: &'static str, path: &Path, reason: &str) -> TlsError {
    TlsError::Invalid { flag, path: path.to_path_buf(), reason: reason.to_string() }
}

/// Reads a PEM file of one or more certificates.
fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(flag, path, &format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(flag, path, "contains no PEM certificate (BEGIN CERTIFICATE)"));
    }
    Ok(pem)
}

/// Reads a PEM file holding a private key (PKCS#8, PKCS#1 or SEC1).
fn read_key(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| invalid(flag, path, &format!("contains no PEM private key: {e}")))?;
    Ok(pem)
}

impl SideTls {
    /// Reads and checks the files `flags` name. Pairing rules (a certificate needs its key, a
    /// required client certificate needs a CA) are [`crate::config::Config::validate`]'s job
    /// and are assumed here; a lone certificate or key is ignored.
    pub fn load(flags: SideFlags<'_>) -> Result<Self, TlsError> {
        let side = flags.side;
        let identity_pem = match (flags.cert_file, flags.key_file) {
            (Some(cert), Some(key)) => {
                Some((read_certs(side.cert_flag(), cert)?, read_key(side.key_flag(), key)?))
            }
            _ => None,
        };
        let identity = identity_pem.as_ref().map(|(c, k)| Identity::from_pem(c, k));
        let ca_pem = match flags.trusted_ca_file {
            Some(ca) => Some(read_certs(side.ca_flag(), ca)?),
            None => None,
        };
        let ca = ca_pem.as_ref().map(Certificate::from_pem);
        let tls = SideTls { side, identity, ca, cert_auth: flags.cert_auth, identity_pem, ca_pem };
        // Build the acceptors once now, so a key that does not match its certificate stops the
        // start with the flags' names rather than failing at the first connection.
        tls.client_acceptor()?;
        if let Some(server) = tls.server_config() {
            Server::builder().tls_config(server).map_err(|e| TlsError::Pair {
                cert_flag: side.cert_flag(),
                key_flag: side.key_flag(),
                reason: error_chain(&e),
            })?;
        }
        Ok(tls)
    }

    /// The listener configuration for `https` URLs, or `None` without a certificate. With
    /// cert auth on, a client must present a certificate signed by the trusted CA; without it,
    /// no client certificate is asked for (etcd's behaviour).
    pub fn server_config(&self) -> Option<ServerTlsConfig> {
        let identity = self.identity.clone()?;
        let mut cfg = ServerTlsConfig::new().identity(identity).timeout(HANDSHAKE_TIMEOUT);
        if self.cert_auth {
            if let Some(ca) = &self.ca {
                cfg = cfg.client_ca_root(ca.clone()).client_auth_optional(false);
            }
        }
        Some(cfg)
    }

    /// The acceptor of the client listener's `https` URLs ([`crate::net::tls`]: ALPN `h2` and
    /// `http/1.1`), with the same certificate rules as [`Self::server_config`]; `None` without
    /// a certificate.
    pub fn client_acceptor(&self) -> Result<Option<crate::net::tls::Acceptor>, TlsError> {
        let Some((cert, key)) = &self.identity_pem else { return Ok(None) };
        let required_ca = if self.cert_auth { self.ca_pem.as_deref() } else { None };
        crate::net::tls::Acceptor::new(cert, key, required_ca, HANDSHAKE_TIMEOUT).map(Some).map_err(
            |reason| TlsError::Pair {
                cert_flag: self.side.cert_flag(),
                key_flag: self.side.key_flag(),
                reason,
            },
        )
    }

    /// A gRPC server builder for one listener of this side: TLS when `https`, plain text
    /// otherwise.
    pub fn server_builder(&self, https: bool) -> Result<Server, TlsError> {
        let builder = Server::builder();
        if !https {
            return Ok(builder);
        }
        // `Config::validate` refuses an https listener without a certificate; this arm only
        // keeps that rule from being bypassed by a caller that skipped validation.
        let Some(cfg) = self.server_config() else {
            return Err(TlsError::NoCertificate { cert_flag: self.side.cert_flag() });
        };
        builder.tls_config(cfg).map_err(|e| TlsError::Pair {
            cert_flag: self.side.cert_flag(),
            key_flag: self.side.key_flag(),
            reason: error_chain(&e),
        })
    }

    /// The configuration for dialing `https` URLs with this side's material: its CA (or the
    /// system's roots) to verify the server, its certificate as the client identity.
    pub fn client_config(&self) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new();
        cfg = match &self.ca {
            Some(ca) => cfg.ca_certificate(ca.clone()),
            None => cfg.with_native_roots(),
        };
        if let Some(identity) = &self.identity {
            cfg = cfg.identity(identity.clone());
        }
        cfg
    }
}

/// How this member dials its peers: plain text for `http` peer URLs, TLS with the peer
/// certificates for `https` ones. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct PeerDialer {
    tls: ClientTlsConfig,
    /// Whether any peer TLS material (`--peer-trusted-ca-file`, `--peer-cert-file`) is set.
    configured: bool,
}

impl PeerDialer {
    /// A dialer using the peer side's certificates.
    pub fn new(peer: &SideTls) -> Self {
        let configured = peer.ca.is_some() || peer.identity.is_some();
        PeerDialer { tls: peer.client_config(), configured }
    }

    /// Whether this member has peer TLS configured, and so can reach `https` peer URLs as the
    /// operator intends: with the peer CA to verify them and its own peer certificate for
    /// peers that require one. Without either, an `https` peer would only be verified against
    /// the system's roots, and no peer requiring client certificates would accept us.
    pub fn has_peer_tls(&self) -> bool {
        self.configured
    }

    /// Adds TLS to `endpoint` if `url` is `https`. tonic only runs TLS on `https` URIs, but the
    /// configuration is added only where needed anyway: building it loads the system's roots
    /// when no peer CA is given, which plain-text peers should not depend on.
    pub fn apply(
        &self,
        url: &str,
        endpoint: Endpoint,
    ) -> Result<Endpoint, tonic::transport::Error> {
        if is_https(url) {
            endpoint.tls_config(self.tls.clone())
        } else {
            Ok(endpoint)
        }
    }
}

/// The URLs `side` listens on.
fn listen_urls(cfg: &Config, side: Side) -> Vec<String> {
    match side {
        Side::Client => split_urls(&cfg.listen_client_urls),
        Side::Peer => split_urls(&cfg.listen_peer_urls),
    }
}

/// For each URL of `side`'s listen flag, in order: whether that listener serves TLS.
pub fn listener_tls(cfg: &Config, side: Side) -> Vec<bool> {
    listen_urls(cfg, side).iter().map(|u| is_https(u)).collect()
}

/// The pairing rules of the TLS flags, checked without reading any file: a certificate needs
/// its key and the other way round, cert auth needs a CA to check against, and an `https`
/// listener needs a certificate. Plain text is never chosen silently in place of TLS.
pub fn validate(cfg: &Config) -> Result<(), ConfigError> {
    for side in [Side::Client, Side::Peer] {
        let f = SideFlags::of(cfg, side);
        match (f.cert_file, f.key_file) {
            (Some(_), None) => {
                return Err(ConfigError::FlagNeeds {
                    flag: side.cert_flag(),
                    needs: side.key_flag(),
                })
            }
            (None, Some(_)) => {
                return Err(ConfigError::FlagNeeds {
                    flag: side.key_flag(),
                    needs: side.cert_flag(),
                })
            }
            _ => {}
        }
        if f.cert_auth && f.trusted_ca_file.is_none() {
            return Err(ConfigError::FlagNeeds {
                flag: side.cert_auth_flag(),
                needs: side.ca_flag(),
            });
        }
        if f.cert_file.is_none() {
            if let Some(url) = listen_urls(cfg, side).into_iter().find(|u| is_https(u)) {
                return Err(ConfigError::TlsWithoutCert {
                    url_flag: side.listen_flag(),
                    url,
                    cert_flag: side.cert_flag(),
                    key_flag: side.key_flag(),
                });
            }
        }
    }
    Ok(())
}

/// Whether `url` asks for TLS.
pub fn is_https(url: &str) -> bool {
    url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://"))
}

/// Settings that are allowed but probably not what the operator meant, one message each, for
/// `node::start` to log as warnings: plain-text listeners next to certificate flags (etcd warns
/// the same way), and cert auth that has no TLS listener to apply to.
pub fn plain_text_warnings(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for side in [Side::Client, Side::Peer] {
        let flags = SideFlags::of(cfg, side);
        let urls = listen_urls(cfg, side);
        if flags.cert_file.is_some() {
            for url in urls.iter().filter(|u| !is_https(u)) {
                out.push(format!(
                    "--{} {url} serves plain text although --{} is given; use an https:// URL \
                     to serve TLS",
                    side.listen_flag(),
                    side.cert_flag()
                ));
            }
        }
        if flags.cert_auth && !urls.iter().any(|u| is_https(u)) {
            out.push(format!(
                "--{} has no effect: no --{} URL is https://",
                side.cert_auth_flag(),
                side.listen_flag()
            ));
        }
    }
    out
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
