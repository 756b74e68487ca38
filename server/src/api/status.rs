//! The one place where Picket errors become gRPC statuses (etcd's `toGRPCErrorMap`). Clients
//! match etcd errors by code and exact message text, so the texts below are etcd's verbatim.

use tonic::{Code, Status};

use crate::lease::LeaseError;
use crate::mvcc::MvccError;
use crate::raft::proposer::ProposeError;
use picket_proto::picket::raft::v1::CommandError;

pub const ERR_REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";

/// Maps an MVCC error to etcd's status.
pub fn mvcc_status(e: &MvccError) -> Status {
    let (code, msg): (Code, String) = match e {
        MvccError::Compacted => {
            (Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted".into())
        }
        MvccError::FutureRevision => {
            (Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision".into())
        }
        MvccError::LeaseNotFound(_) => {
            (Code::NotFound, "etcdserver: requested lease not found".into())
        }
        MvccError::KeyNotFound => (Code::InvalidArgument, "etcdserver: key not found".into()),
        MvccError::KeyNotProvided => {
            (Code::InvalidArgument, "etcdserver: key is not provided".into())
        }
        MvccError::TooManyOps => {
            (Code::InvalidArgument, "etcdserver: too many operations in txn request".into())
        }
        MvccError::DuplicateKey => {
            (Code::InvalidArgument, "etcdserver: duplicate key given in txn request".into())
        }
        MvccError::ValueProvided => (Code::InvalidArgument, "etcdserver: value is provided".into()),
        MvccError::LeaseProvided => (Code::InvalidArgument, "etcdserver: lease is provided".into()),
        other => (Code::Internal, format!("picket: storage failure: {other}")),
    };
    let status = Status::new(code, msg);
    match e {
        MvccError::TooManyOps => with_hint(
            status,
            "each branch of a txn may hold at most --max-txn-ops operations (default 128)",
        ),
        _ => status,
    }
}

/// Attaches a `picket-hint` metadata entry naming the limit or flag behind a refusal. The
/// message itself stays etcd's, verbatim, because etcd clients map errors by their message.
pub fn with_hint(mut status: Status, hint: &str) -> Status {
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(hint) {
        status.metadata_mut().insert(crate::quota::HINT_METADATA, v);
    }
    status
}

/// Whether an MVCC error means the node's storage failed, rather than a deterministic outcome
/// of the command. Such errors stop the node (openraft `Fatal`).
pub fn mvcc_is_fatal(e: &MvccError) -> bool {
    matches!(e, MvccError::Engine(_) | MvccError::Corrupt(_))
}

pub fn lease_status(e: &LeaseError) -> Status {
    let code = match e {
        LeaseError::NotFound => Code::NotFound,
        LeaseError::AlreadyExists => Code::FailedPrecondition,
        LeaseError::TtlTooLarge => Code::OutOfRange,
    };
    Status::new(code, e.to_string())
}

pub fn concurrency_status(e: &crate::concurrency::ConcurrencyError) -> Status {
    use crate::concurrency::ConcurrencyError as E;
    match e {
        E::Store(s) => s.clone(),
        E::InvalidArgument(m) => Status::invalid_argument(m.clone()),
        // etcd returns its election errors as plain errors; the text is what clients match.
        E::NotLeader | E::NoLeader | E::KeyLost { .. } => {
            Status::failed_precondition(e.to_string())
        }
    }
}

/// A fenced write whose token is no longer the holder's.
pub fn stale_token(name: &[u8], token: i64, current: Option<i64>) -> Status {
    let name = String::from_utf8_lossy(name);
    match current {
        Some(c) => Status::failed_precondition(format!(
            "picket: fencing token {token} is stale: lock {name:?} is held with token {c}"
        )),
        None => Status::failed_precondition(format!(
            "picket: fencing token {token} is stale: lock {name:?} is not held"
        )),
    }
}

pub fn propose_status(e: ProposeError) -> Status {
    e.into_status()
}

/// A replicated command's error, back to a status.
pub fn command_error_status(e: &CommandError) -> Status {
    Status::new(Code::from_i32(e.code as i32), e.message.clone())
}

pub fn request_too_large(size: usize, limit: usize) -> Status {
    with_hint(
        Status::invalid_argument(ERR_REQUEST_TOO_LARGE),
        &format!("the request is {size} bytes, over --max-request-bytes ({limit})"),
    )
}

/// Maps a cluster-operation error to etcd's status (codes from etcd's `rpctypes`).
pub fn membership_status(e: crate::raft::membership::MembershipError) -> Status {
    use crate::raft::membership::MembershipError as E;
    let code = match &e {
        E::Remote(s) => return s.clone(),
        E::MemberNotFound => Code::NotFound,
        E::BadUrls | E::HttpsWithoutPeerTls => Code::InvalidArgument,
        E::MemberExists
        | E::PeerUrlExists
        | E::NotLearner
        | E::LearnerNotReady
        | E::NotEnoughMembers
        | E::BadTransferee => Code::FailedPrecondition,
        // Not leader, no leader, timeouts, removed, stopped: try another member or later.
        _ => Code::Unavailable,
    };
    Status::new(code, e.to_string())
}

/// A `Maintenance` failure reading local storage (not a client error).
pub fn storage_failure(what: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("picket: {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_texts() {
        let s = mvcc_status(&MvccError::Compacted);
        assert_eq!(s.code(), Code::OutOfRange);
        assert_eq!(s.message(), "etcdserver: mvcc: required revision has been compacted");
        let s = lease_status(&LeaseError::NotFound);
        assert_eq!(
            (s.code(), s.message()),
            (Code::NotFound, "etcdserver: requested lease not found")
        );
        let s = command_error_status(&CommandError {
            code: Code::OutOfRange as u32,
            message: "x".into(),
        });
        assert_eq!(s.code(), Code::OutOfRange);
    }
}
