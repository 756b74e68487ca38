//! The one place where Picket errors become gRPC statuses (etcd's `toGRPCErrorMap`). Clients
//! match etcd errors by code and exact message text, so the texts below are etcd's verbatim.

use picket_proto::picket::raft::v1::{CommandError, RefusalKind};
use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::concurrency::StoreError;
use crate::lease::LeaseError;
use crate::mvcc::MvccError;
use crate::queue::QueueError;
use crate::raft::proposer::ProposeError;
use crate::subscription::GroupError;

pub const ERR_REQUEST_TOO_LARGE: &str = "etcdserver: request is too large";

/// The metadata key of a refusal's hint: which limit or flag refused it and the way out. The
/// message itself stays etcd's, verbatim, because etcd clients map errors by their message.
pub const HINT_METADATA: &str = "picket-hint";

/// The table: the gRPC code of every typed error below this layer, by its name on the wire
/// (`RefusalKind`, which each error type gives with `kind()`). Codes are etcd's (`rpctypes`).
pub fn code(kind: RefusalKind) -> Code {
    use RefusalKind as K;
    match kind {
        K::MvccCompacted | K::MvccFutureRevision => Code::OutOfRange,
        K::MvccLeaseNotFound | K::LeaseNotFound => Code::NotFound,
        K::MvccKeyNotFound
        | K::MvccKeyNotProvided
        | K::MvccTooManyOps
        | K::MvccDuplicateKey
        | K::MvccValueProvided
        | K::MvccLeaseProvided => Code::InvalidArgument,
        // A caller bug inside the server, not a client error.
        K::MvccTxnNotReadOnly => Code::Internal,
        K::LeaseAlreadyExists => Code::FailedPrecondition,
        K::LeaseTtlTooLarge => Code::OutOfRange,
        K::AuthUserEmpty
        | K::AuthRoleEmpty
        | K::AuthFailed
        | K::AuthOldRevision
        | K::AuthInvalidPermRange
        | K::AuthInvalidHash
        | K::AuthPasswordTooLong
        // etcd's `ErrGRPCInvalidAuthMgmt` is InvalidArgument: deleting root, or taking the root
        // role from root, is a request never valid while auth is on, not a state to wait out.
        | K::AuthInvalidAuthMgmt => Code::InvalidArgument,
        K::AuthPermissionDenied => Code::PermissionDenied,
        K::AuthInvalidAuthToken => Code::Unauthenticated,
        K::AuthUserAlreadyExist
        | K::AuthUserNotFound
        | K::AuthRoleAlreadyExist
        | K::AuthRoleNotFound
        | K::AuthRoleNotGranted
        | K::AuthPermissionNotGranted
        | K::AuthRootUserNotExist
        | K::AuthRootRoleNotExist
        | K::AuthNotEnabled => Code::FailedPrecondition,
        K::GroupBadName | K::GroupNoKey | K::GroupReserved | K::GroupBadRecord => {
            Code::InvalidArgument
        }
        K::FenceStaleToken | K::LeaseExpiryStale => Code::FailedPrecondition,
        K::QuotaNospace => Code::ResourceExhausted,
        K::MalformedCommand => Code::InvalidArgument,
        // Only an older member's refusal has no kind; `command_error_status` reads its code.
        K::Unspecified => Code::Unknown,
    }
}

/// Which limit or flag is behind a refusal, for the `picket-hint` metadata.
fn hint(kind: RefusalKind) -> Option<&'static str> {
    match kind {
        RefusalKind::MvccTooManyOps => {
            Some("each branch of a txn may hold at most --max-txn-ops operations (default 128)")
        }
        RefusalKind::QuotaNospace => Some(
            "the store is over --quota-backend-bytes (NOSPACE alarm active): compact, \
             defragment, then `etcdctl alarm disarm`, or restart with a larger quota",
        ),
        _ => None,
    }
}

/// The status of a typed error named `kind` whose text is `message`.
pub fn refusal(kind: RefusalKind, message: impl Into<String>) -> Status {
    let status = Status::new(code(kind), message);
    match hint(kind) {
        Some(h) => with_hint(status, h),
        None => status,
    }
}

/// Maps an MVCC error to etcd's status.
pub fn mvcc_status(e: &MvccError) -> Status {
    match e.kind() {
        Some(kind) => refusal(kind, e.to_string()),
        None => Status::internal(format!("picket: storage failure: {e}")),
    }
}

// Handlers use `?`: each typed error converts through its row of the table.
macro_rules! into_status {
    ($($ty:ty => $f:expr),* $(,)?) => {
        $(impl From<$ty> for Status {
            fn from(e: $ty) -> Status {
                $f(e)
            }
        })*
    };
}

into_status! {
    MvccError => |e: MvccError| mvcc_status(&e),
    LeaseError => |e: LeaseError| lease_status(&e),
    AuthError => |e: AuthError| auth_status(&e),
    GroupError => |e: GroupError| group_status(&e),
    crate::quota::NoSpace => nospace_status,
    StoreError => |e: StoreError| store_status(&e),
    crate::concurrency::ConcurrencyError => |e| concurrency_status(&e),
    QueueError => |e: QueueError| queue_status(&e),
    crate::raft::membership::MembershipError => membership_status,
    ProposeError => propose_status,
}

/// Attaches a `picket-hint` metadata entry naming the limit or flag behind a refusal.
pub fn with_hint(mut status: Status, hint: &str) -> Status {
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(hint) {
        status.metadata_mut().insert(HINT_METADATA, v);
    }
    status
}

pub fn lease_status(e: &LeaseError) -> Status {
    refusal(e.kind(), e.to_string())
}

pub fn auth_status(e: &AuthError) -> Status {
    refusal(e.kind(), e.to_string())
}

pub fn group_status(e: &GroupError) -> Status {
    refusal(e.kind(), e.to_string())
}

/// A write refused before proposing because NOSPACE is active on this member.
pub fn nospace_status(e: crate::quota::NoSpace) -> Status {
    refusal(RefusalKind::QuotaNospace, e.to_string())
}

/// A failure of the store behind locks, elections and queues: the status the backend (this
/// layer's `CtxBackend`) put inside, or "server stopped".
pub fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::Stopped => Status::unavailable(e.to_string()),
        StoreError::Backend(inner) => match inner.downcast_ref::<Status>() {
            Some(s) => s.clone(),
            None => Status::unknown(inner.to_string()),
        },
    }
}

pub fn concurrency_status(e: &crate::concurrency::ConcurrencyError) -> Status {
    use crate::concurrency::ConcurrencyError as E;
    match e {
        E::Store(s) => store_status(s),
        E::InvalidArgument(m) => Status::invalid_argument(m.clone()),
        // etcd returns its election errors as plain errors; the text is what clients match.
        E::NotLeader | E::NoLeader | E::KeyLost { .. } => {
            Status::failed_precondition(e.to_string())
        }
    }
}

/// Maps a queue error to its status (`picket.v1.Queue`).
pub fn queue_status(e: &QueueError) -> Status {
    match e {
        QueueError::Store(s) => store_status(s),
        QueueError::InvalidArgument(m) => Status::invalid_argument(m.clone()),
        QueueError::StaleClaim { .. } => Status::failed_precondition(e.to_string()),
        QueueError::NotDead { .. } => Status::not_found(e.to_string()),
        QueueError::Corrupt { .. } => Status::internal(e.to_string()),
        QueueError::Contended(_) => Status::aborted(e.to_string()),
    }
}

pub fn propose_status(e: ProposeError) -> Status {
    e.into_status()
}

/// A replicated command's refusal, back to a status. A refusal without a kind comes from a
/// member built before kinds existed and carries its code itself.
pub fn command_error_status(e: &CommandError) -> Status {
    match RefusalKind::try_from(e.kind) {
        Ok(RefusalKind::Unspecified) => Status::new(Code::from_i32(e.code as i32), &e.message),
        Ok(kind) => refusal(kind, &e.message),
        // A kind a newer member named: its text is still the right one.
        Err(_) => Status::unknown(&e.message),
    }
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
        // etcd's `rpctypes`: invalid auth management is InvalidArgument, an unknown role is
        // FailedPrecondition.
        let s = auth_status(&AuthError::InvalidAuthMgmt);
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "etcdserver: invalid auth management")
        );
        let s = auth_status(&AuthError::RoleNotFound);
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "etcdserver: role name not found")
        );
        let s = lease_status(&LeaseError::NotFound);
        assert_eq!(
            (s.code(), s.message()),
            (Code::NotFound, "etcdserver: requested lease not found")
        );
        // A refusal from a member built before kinds: its own code.
        let old = CommandError { code: Code::OutOfRange as u32, message: "x".into(), kind: 0 };
        assert_eq!(command_error_status(&old).code(), Code::OutOfRange);
        // A kind this build does not know (a newer leader's): Unknown, with its text.
        let newer = CommandError { code: 2, message: "y".into(), kind: 9999 };
        let s = command_error_status(&newer);
        assert_eq!((s.code(), s.message()), (Code::Unknown, "y"));
    }

    /// A refusal that crossed the wire as a `CommandError` gets the status its typed error gets
    /// when mapped directly, hint included.
    #[test]
    fn refusals_read_back_as_their_typed_status() {
        use crate::apply::Refusal;
        use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
        let cases: Vec<(Refusal, Status)> = vec![
            (Refusal::Mvcc(MvccError::Compacted), mvcc_status(&MvccError::Compacted)),
            (Refusal::Mvcc(MvccError::TooManyOps), mvcc_status(&MvccError::TooManyOps)),
            (Refusal::Lease(LeaseError::TtlTooLarge), lease_status(&LeaseError::TtlTooLarge)),
            (Refusal::Auth(AuthError::AuthOldRevision), auth_status(&AuthError::AuthOldRevision)),
            (Refusal::Auth(AuthError::PermissionDenied), auth_status(&AuthError::PermissionDenied)),
            (Refusal::Group(GroupError::NoKey), group_status(&GroupError::NoKey)),
            (Refusal::NoSpace, nospace_status(crate::quota::NoSpace)),
        ];
        for (refused, direct) in cases {
            let CmdResult::Error(e) = refused.clone().into_result() else {
                panic!("{refused:?} is not an error result");
            };
            assert_eq!(e.code, crate::apply::refusal::LEGACY_CODE);
            let s = command_error_status(&e);
            assert_eq!((s.code(), s.message()), (direct.code(), direct.message()), "{refused:?}");
            assert_eq!(
                s.metadata().get(HINT_METADATA),
                direct.metadata().get(HINT_METADATA),
                "{refused:?}"
            );
        }
        let stale = Refusal::StaleToken { name: b"l".to_vec(), token: 3, holder: Some(5) };
        let CmdResult::Error(e) = stale.into_result() else { panic!() };
        let s = command_error_status(&e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            "picket: fencing token 3 is stale: lock \"l\" is held with token 5"
        );
    }
}
