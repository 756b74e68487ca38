//! TLS on the client listener, accepted here instead of by tonic.
//!
//! tonic's TLS acceptor offers only `h2` in ALPN. An HTTPS client that speaks only HTTP/1.1
//! (Patroni's urllib3, APISIX's HTTP client, `curl --http1.1`) offers only `http/1.1`, and the
//! handshake fails with "no application protocol": the JSON gateway was unreachable over TLS
//! for exactly the clients it exists for. This acceptor offers `h2` first and `http/1.1`; gRPC
//! clients keep negotiating h2, and hyper serves whichever protocol the connection speaks.
//!
//! The client certificate rules are `crate::tls`'s: with `--client-cert-auth` a client must
//! present a certificate signed by `--trusted-ca-file`; otherwise none is asked for (etcd's
//! behaviour). The peer listener keeps tonic's acceptor: peers speak only gRPC.
//!
//! Handshakes run in their own tasks, each bounded by the handshake timeout, so a client that
//! connects and sends nothing cannot hold up the connections behind it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::authority::AuthorityFix;

/// Connections whose handshake finished but that the server has not taken yet. Small: the
/// server takes each at once; the bound only keeps a stalled server from buffering without end.
const READY_BACKLOG: usize = 64;

/// Pause after a failed `accept` (out of file descriptors, say) before trying again, so the
/// loop does not spin while the condition lasts. Safe: pending connections wait in the kernel's
/// backlog meanwhile.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The client listener's TLS: the member's certificate and key, the CA that client
/// certificates must chain to when they are required, and ALPN `h2` and `http/1.1`.
#[derive(Clone)]
pub struct Acceptor {
    tls: TlsAcceptor,
    handshake_timeout: Duration,
}

impl Acceptor {
    /// Builds the acceptor from PEM bytes already read and checked by `crate::tls`. The error
    /// is the reason, for the caller to name its flags with.
    pub fn new(
        cert_pem: &[u8],
        key_pem: &[u8],
        required_client_ca_pem: Option<&[u8]>,
        handshake_timeout: Duration,
    ) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("certificate: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("key: {e}"))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match required_client_ca_pem {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    let cert = cert.map_err(|e| format!("trusted CA: {e}"))?;
                    roots.add(cert).map_err(|e| format!("trusted CA: {e}"))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| format!("trusted CA: {e}"))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs, key).map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self { tls: TlsAcceptor::from(Arc::new(config)), handshake_timeout })
    }
}

/// One accepted client connection, plain or TLS.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Client connections of `listener`: TLS-accepted with `acceptor` when given, plain text
/// otherwise, each read through an [`AuthorityFix`]. The accept loop ends when the server
/// drops the stream.
pub fn incoming(
    listener: TcpListener,
    acceptor: Option<Acceptor>,
) -> impl Stream<Item = io::Result<AuthorityFix<Conn>>> + Send + 'static {
    let (tx, rx) = mpsc::channel(READY_BACKLOG);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a client connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            // TCP_NODELAY: replies are small and latency-bound; with Nagle's algorithm on, a
            // reply that follows another unacknowledged one waits for the client's delayed ACK.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "client connection closed before it was set up");
                continue;
            }
            let Some(acceptor) = acceptor.clone() else {
                if tx.send(Ok(AuthorityFix::new(Conn::Plain(tcp)))).await.is_err() {
                    return;
                }
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let bound = acceptor.handshake_timeout;
                match tokio::time::timeout(bound, acceptor.tls.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        // The server may be gone by now; the connection then just closes.
                        let _ = tx.send(Ok(AuthorityFix::new(Conn::Tls(Box::new(tls))))).await;
                    }
                    // A client with the wrong CA, no certificate where one is required, or
                    // plain text on an https port: its own problem, one debug line each.
                    Ok(Err(e)) => tracing::debug!(error = %e, "client TLS handshake failed"),
                    Err(_) => tracing::debug!(?bound, "client TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl Connected for AuthorityFix<Conn> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self.get_ref() {
            Conn::Plain(s) => s.connect_info(),
            Conn::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}
