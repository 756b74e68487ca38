//! etcd client calls with bounded time, and the classification of their errors.
//!
//! The classification decides what the history claims, so it errs towards "unknown":
//! - a **read** that failed for any reason is `fail`: it changed nothing, so whether it "happened"
//!   constrains nothing (Jepsen's idempotent-operation rule) and the worker keeps its process id;
//! - a **write** is `fail` only when the request provably was not applied: the server rejected it
//!   with a deterministic error (invalid argument, not found, ...), or the connection could not
//!   even be made. Everything else (timeouts, `Unavailable`, a broken connection, `Unknown`,
//!   `Internal`) is `info`: it may have been applied, now or later.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use tonic::Code;

use crate::history::{ErrorInfo, EventType, Header};

/// TCP connect timeout. Loopback connects either succeed at once or are refused; 1 s only
/// matters for a SIGSTOPped node whose accept backlog is full, and it is below every operation
/// timeout, so a connect attempt never outlives the operation that triggered it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Builds a client connected to exactly one endpoint (so the history's `node` is the node that
/// served the request). `request_timeout` bounds every request; the connection is made lazily.
pub async fn connect(
    endpoint: &str,
    request_timeout: Duration,
) -> Result<Client, etcd_client::Error> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT.min(request_timeout))
        .with_timeout(request_timeout);
    Client::connect([endpoint], Some(opts)).await
}

/// Why an operation did not return a response.
#[derive(Debug)]
pub enum OpError {
    /// The harness's own deadline passed.
    Timeout(Duration),
    Client(etcd_client::Error),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Timeout(d) => write!(f, "no response within {d:?}"),
            OpError::Client(e) => write!(f, "{e}"),
        }
    }
}

/// Runs `fut` for at most `timeout`. The client already carries a per-request timeout; this
/// outer bound also covers time spent waiting for a connection, which the request timeout does
/// not. A request abandoned here may still be applied later: callers record writes as `info`.
pub async fn bounded<T, F>(timeout: Duration, fut: F) -> Result<T, OpError>
where
    F: Future<Output = Result<T, etcd_client::Error>>,
{
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(OpError::Client(e)),
        Err(_) => Err(OpError::Timeout(timeout)),
    }
}

/// Whether an error message says the connection was never established, so no request bytes
/// were sent.
fn never_connected(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("tcp connect error")
        || m.contains("connection refused")
        || m.contains("error trying to connect")
}

/// `message` followed by the error's source chain (tonic reports a broken connection as
/// `Unknown: transport error` and keeps the cause in the chain).
fn with_sources(message: &str, e: &dyn std::error::Error) -> String {
    let mut out = message.to_string();
    let mut src = e.source();
    // Bounded: source chains are short, and 8 links is more than any tonic error has.
    for _ in 0..8 {
        let Some(s) = src else { break };
        // tonic often repeats its cause in its own message; skip text already shown.
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

/// A short stable label for a gRPC code.
fn code_kind(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid-argument",
        Code::DeadlineExceeded => "deadline-exceeded",
        Code::NotFound => "not-found",
        Code::AlreadyExists => "already-exists",
        Code::PermissionDenied => "permission-denied",
        Code::ResourceExhausted => "resource-exhausted",
        Code::FailedPrecondition => "failed-precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out-of-range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data-loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Codes with which etcd rejects a request before applying it, deterministically.
fn definitely_rejected(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::Unauthenticated
            | Code::ResourceExhausted
    )
}

/// The completion type and `[kind, message]` for a failed operation. `idempotent` operations
/// (reads) are always `fail`; see the module docs for writes.
pub fn classify(err: &OpError, idempotent: bool) -> (EventType, ErrorInfo) {
    let (definite, kind, message) = match err {
        OpError::Timeout(_) => (false, "timeout".to_string(), err.to_string()),
        OpError::Client(etcd_client::Error::GRpcStatus(s)) => {
            let msg = with_sources(s.message(), s);
            if never_connected(&msg) {
                (true, "connect".to_string(), msg)
            } else {
                (definitely_rejected(s.code()), code_kind(s.code()).to_string(), msg)
            }
        }
        OpError::Client(etcd_client::Error::TransportError(e)) => {
            let msg = with_sources(&e.to_string(), e);
            (never_connected(&msg), "transport".to_string(), msg)
        }
        OpError::Client(etcd_client::Error::IoError(e)) => (false, "io".to_string(), e.to_string()),
        // Argument and URI errors are raised before anything is sent.
        OpError::Client(
            e @ (etcd_client::Error::InvalidArgs(_)
            | etcd_client::Error::InvalidUri(_)
            | etcd_client::Error::InvalidMetadataValue(_)
            | etcd_client::Error::Utf8Error(_)),
        ) => (true, "client".to_string(), e.to_string()),
        OpError::Client(e) => (false, "client".to_string(), e.to_string()),
    };
    let kind_of_completion = if definite || idempotent { EventType::Fail } else { EventType::Info };
    (kind_of_completion, ErrorInfo(kind, message))
}

/// The history's view of a response header.
pub fn header(h: Option<&etcd_client::ResponseHeader>) -> Option<Header> {
    h.map(|h| Header { revision: h.revision(), raft_term: h.raft_term(), member_id: h.member_id() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fail_and_ambiguous_writes_are_info() {
        let timeout = OpError::Timeout(Duration::from_secs(1));
        assert_eq!(classify(&timeout, true).0, EventType::Fail);
        assert_eq!(classify(&timeout, false).0, EventType::Info);

        let unavailable = OpError::Client(etcd_client::Error::GRpcStatus(tonic::Status::new(
            Code::Unavailable,
            "etcdserver: request timed out",
        )));
        assert_eq!(classify(&unavailable, false).0, EventType::Info);
        assert_eq!(classify(&unavailable, false).1.kind(), "unavailable");

        let refused = OpError::Client(etcd_client::Error::GRpcStatus(tonic::Status::new(
            Code::Unavailable,
            "error trying to connect: tcp connect error: Connection refused (os error 111)",
        )));
        assert_eq!(
            classify(&refused, false),
            (
                EventType::Fail,
                ErrorInfo::new(
                    "connect",
                    "error trying to connect: tcp connect error: Connection refused (os error 111)"
                )
            )
        );

        let invalid = OpError::Client(etcd_client::Error::GRpcStatus(tonic::Status::new(
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        )));
        assert_eq!(classify(&invalid, false).0, EventType::Fail);
    }
}
