//! Why the apply rules refused a command: a typed value, the same on every member, written into
//! the command's result as a [`CommandError`] (its kind by name, its text verbatim). Which gRPC
//! status a client sees for it is the API layer's decision (`api::status`), never apply's.

use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::{CommandError, RefusalKind};

use crate::auth::AuthError;
use crate::lease::LeaseError;
use crate::mvcc::MvccError;
use crate::subscription::GroupError;

/// What `CommandError.code` holds for refusals that carry a kind: gRPC's Unknown. Only members
/// built before the kind existed read the field (see raft.proto); for them a relayed refusal is
/// "Unknown" with the right message rather than a code apply would have to choose.
pub const LEGACY_CODE: u32 = 2;

/// A deterministic refusal of a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// An MVCC outcome (never one of its fatal errors: those stop the member instead).
    #[error("{0}")]
    Mvcc(MvccError),
    #[error("{0}")]
    Lease(#[from] LeaseError),
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error("{0}")]
    Group(#[from] GroupError),
    /// A `FencedTxn` whose token is not the lock's current holder (`holder: None`: not held).
    #[error("{}", stale_token_text(.name, *.token, *.holder))]
    StaleToken { name: Vec<u8>, token: i64, holder: Option<i64> },
    /// A `LeaseExpire` decided by the leader of an earlier term than the entry that carries it
    /// (the current leader renewed every lease when it took over).
    #[error("picket: stale lease expiry from term {decided} applied in term {applied}")]
    StaleLeaseExpiry { decided: u64, applied: u64 },
    /// A write that grows the store while a NOSPACE alarm is active.
    #[error("{}", crate::quota::NOSPACE_MESSAGE)]
    NoSpace,
    /// A command no API handler builds: empty, nested, or a field this build does not know.
    #[error("picket: {0}")]
    Malformed(&'static str),
}

fn stale_token_text(name: &[u8], token: i64, holder: Option<i64>) -> String {
    let name = String::from_utf8_lossy(name);
    match holder {
        Some(h) => {
            format!("picket: fencing token {token} is stale: lock {name:?} is held with token {h}")
        }
        None => format!("picket: fencing token {token} is stale: lock {name:?} is not held"),
    }
}

impl Refusal {
    /// The refusal's name on the wire.
    pub fn kind(&self) -> RefusalKind {
        match self {
            // A fatal MVCC error never becomes a refusal (`apply::outcome` stops the member); if
            // one did, it would travel as malformed rather than without a kind.
            Refusal::Mvcc(e) => e.kind().unwrap_or(RefusalKind::MalformedCommand),
            Refusal::Lease(e) => e.kind(),
            Refusal::Auth(e) => e.kind(),
            Refusal::Group(e) => e.kind(),
            Refusal::StaleToken { .. } => RefusalKind::FenceStaleToken,
            Refusal::StaleLeaseExpiry { .. } => RefusalKind::LeaseExpiryStale,
            Refusal::NoSpace => RefusalKind::QuotaNospace,
            Refusal::Malformed(_) => RefusalKind::MalformedCommand,
        }
    }

    /// The command result that carries this refusal.
    pub fn into_result(self) -> CmdResult {
        CmdResult::Error(CommandError {
            code: LEGACY_CODE,
            message: self.to_string(),
            kind: self.kind() as i32,
        })
    }
}
