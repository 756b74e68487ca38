//! Transport below the gRPC services: what the client listener does to bytes before hyper and
//! tonic see them. TLS configuration lives beside it in `crate::tls`.
//!
//! - [`authority`]: repairs the URL-valued HTTP/2 `:authority` etcdctl 3.4 sends on its
//!   per-endpoint calls, which hyper would otherwise refuse; every other byte passes through.
//! - [`tls`]: accepts the client listener's connections, TLS with ALPN `h2` and `http/1.1`
//!   (tonic's acceptor offers only `h2`, which HTTP/1.1-only HTTPS clients cannot use).

pub mod authority;
pub mod tls;
