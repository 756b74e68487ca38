//! Errors a caller can act on, and the classification of gRPC statuses into them.
//!
//! The classification decides whether the client may retry a request on another endpoint, so it
//! errs towards "the outcome is unknown": a write is retried only when the request provably was
//! not applied (the connection was never made, or a member answered that there is no leader or
//! that it is not the leader, which Picket and etcd return before proposing anything).

use std::time::Duration;

use thiserror::Error;
use tonic::{Code, Status};

/// Everything that can go wrong in a Picket client call.
///
/// Match on the variant to decide what to do next: [`Error::Unavailable`] and
/// [`Error::Timeout`] mean "try again later", [`Error::OutcomeUnknown`] means "read back before
/// deciding", [`Error::LockLost`] and [`Error::SessionLost`] mean "stop acting on the
/// resource now".
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// No endpoint could serve the request before the deadline (all down, partitioned, or
    /// without a leader). Nothing was applied.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// A read or an idempotent request did not complete within the request timeout. Retrying
    /// is safe.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// A write may or may not have been applied: the connection failed or the deadline passed
    /// after the request was sent. It was not retried, because retrying could apply it twice.
    /// Read the key back to learn the outcome.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The requested revision was compacted. `compact_revision` is the oldest revision still
    /// available when the server said so (0 when the server did not say).
    #[error("required revision has been compacted (compact revision {compact_revision})")]
    Compacted {
        /// The revision the history was compacted at.
        compact_revision: i64,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("required revision is a future revision")]
    FutureRevision,
    /// The lease does not exist: it expired or was revoked.
    #[error("lease {0:x} not found (expired or revoked)")]
    LeaseNotFound(i64),
    /// The session's lease expired, was revoked, or could not be kept alive before its safety
    /// deadline. Everything tied to the session (locks, elections) must be considered lost.
    #[error("session lost: lease {0:x}")]
    SessionLost(i64),
    /// The lock is no longer held: its key was deleted or its session was lost. Whatever the
    /// holder was doing under the lock must stop; fenced writes made with its token now fail.
    #[error("lock lost: {key}")]
    LockLost {
        /// The lock key that was held, lossily decoded as UTF-8.
        key: String,
    },
    /// A lock wait ended without the lock (try-lock found it held, or the wait timed out).
    #[error("lock {name} not acquired")]
    NotAcquired {
        /// The lock name, lossily decoded as UTF-8.
        name: String,
    },
    /// A fenced write was rejected because the fencing token is no longer the lock holder's.
    #[error("fenced out: {0}")]
    Fenced(String),
    /// The caller is not (or no longer) the leader of an election, or the election has no
    /// leader.
    #[error("not leader: {0}")]
    NotLeader(String),
    /// The request is malformed or violates a limit (too large, too many operations, empty
    /// key, ...). Fix the request; retrying will not help.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The server refused the request for a reason not listed above (permission denied, quota
    /// exhausted, a failed precondition, ...).
    #[error("server error ({code:?}): {message}")]
    Server {
        /// The gRPC status code.
        code: Code,
        /// The server's message, verbatim.
        message: String,
    },
    /// A subscription group's history was compacted before the group consumed it (it lagged
    /// past its bound, so compaction stopped waiting for it). Events between `committed + 1`
    /// and `compacted - 1` are gone; nothing was skipped silently. Re-read the current state
    /// of the range, then [`Client::skip_lost_history`](crate::Client::skip_lost_history) to
    /// resume from the compaction point.
    #[error("lost history: committed {committed}, compacted through {compacted} (group {group})")]
    LostHistory {
        /// The group name.
        group: String,
        /// The group's committed revision.
        committed: i64,
        /// The store's compaction point: the oldest revision a watch can still start at.
        compacted: i64,
    },
    /// An endpoint URL could not be parsed.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },
}

impl Error {
    /// Whether retrying the same request later is safe and may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::Timeout(_))
    }

    /// Whether the request may have been applied even though it failed.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Error::OutcomeUnknown(_))
    }
}

/// What a failed attempt means for the next one.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The request was certainly not applied; another endpoint may serve it.
    NotApplied(String),
    /// The request may have reached a server; only idempotent requests may be retried.
    MaybeApplied(String),
    /// A definite answer: return it to the caller.
    Final(Error),
}

const NO_LEADER: &str = "etcdserver: no leader";
const NOT_LEADER: &str = "picket: not leader";
const COMPACTED: &str = "required revision has been compacted";
const FUTURE_REV: &str = "required revision is a future revision";
const LEASE_NOT_FOUND: &str = "requested lease not found";

/// Classifies a status from one attempt.
pub(crate) fn classify(status: &Status) -> Failure {
    let msg = status.message();
    // etcd returns election errors as plain errors (code Unknown); match them by text first.
    if msg.starts_with("election: not leader") || msg.starts_with("election: no leader") {
        return Failure::Final(Error::NotLeader(msg.to_string()));
    }
    match status.code() {
        Code::Unavailable => {
            if msg.contains(NO_LEADER) || msg.starts_with(NOT_LEADER) || never_connected(status) {
                Failure::NotApplied(msg.to_string())
            } else {
                // "request timed out", "leader changed", a connection reset mid-request: the
                // proposal may be in the log already.
                Failure::MaybeApplied(msg.to_string())
            }
        }
        Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Internal => {
            Failure::MaybeApplied(format!("{:?}: {msg}", status.code()))
        }
        Code::OutOfRange if msg.contains(COMPACTED) => {
            Failure::Final(Error::Compacted { compact_revision: 0 })
        }
        Code::OutOfRange if msg.contains(FUTURE_REV) => Failure::Final(Error::FutureRevision),
        Code::NotFound if msg.contains(LEASE_NOT_FOUND) => Failure::Final(Error::LeaseNotFound(0)),
        Code::InvalidArgument => Failure::Final(Error::InvalidArgument(msg.to_string())),
        Code::FailedPrecondition if msg.contains("fencing token") => {
            Failure::Final(Error::Fenced(msg.to_string()))
        }
        Code::FailedPrecondition if msg.contains("not leader") || msg.contains("no leader") => {
            Failure::Final(Error::NotLeader(msg.to_string()))
        }
        code => Failure::Final(Error::Server { code, message: msg.to_string() }),
    }
}

/// Whether a transport failure happened while connecting, so no byte of the request was sent.
/// hyper's connector says "tcp connect error" (refused, unreachable, connect timeout) and
/// tonic's channel "error trying to connect"; both come before any request is written.
fn never_connected(status: &Status) -> bool {
    let msg = status.message();
    if msg.contains("tcp connect error") || msg.contains("error trying to connect") {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if text.contains("tcp connect error") || text.contains("error trying to connect") {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_leader_and_not_leader_are_not_applied() {
        for s in [
            Status::unavailable("etcdserver: no leader"),
            Status::unavailable("picket: not leader (leader is 2)"),
            Status::unavailable("error trying to connect: tcp connect error: refused"),
        ] {
            assert!(matches!(classify(&s), Failure::NotApplied(_)), "{s:?}");
        }
    }

    #[test]
    fn timeouts_and_broken_connections_may_be_applied() {
        for s in [
            Status::unavailable("etcdserver: request timed out"),
            Status::unavailable("etcdserver: leader changed"),
            Status::unavailable("transport error"),
            Status::deadline_exceeded("timeout"),
            Status::unknown("h2 protocol error"),
            Status::cancelled("connection reset"),
        ] {
            assert!(matches!(classify(&s), Failure::MaybeApplied(_)), "{s:?}");
        }
    }

    #[test]
    fn etcd_errors_map_to_typed_errors() {
        let cases = [
            (
                Status::out_of_range("etcdserver: mvcc: required revision has been compacted"),
                "Compacted",
            ),
            (
                Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
                "FutureRevision",
            ),
            (Status::not_found("etcdserver: requested lease not found"), "LeaseNotFound"),
            (Status::invalid_argument("etcdserver: key is not provided"), "InvalidArgument"),
            (Status::failed_precondition("picket: fencing token 4 is stale: lock \"a\""), "Fenced"),
            (Status::failed_precondition("election: not leader"), "NotLeader"),
            (Status::unknown("election: no leader"), "NotLeader"),
            (Status::permission_denied("etcdserver: permission denied"), "Server"),
        ];
        for (status, want) in cases {
            match classify(&status) {
                Failure::Final(e) => assert!(format!("{e:?}").starts_with(want), "{e:?}"),
                other => panic!("{status:?} classified as {other:?}"),
            }
        }
    }
}
