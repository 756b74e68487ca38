//! Durable subscriptions (consumer groups): the replicated part.
//!
//! A group is the ordinary key `picket/sub/<name>` holding a protobuf
//! [`SubscriptionGroup`] record (its range, committed revision and lag bound), so groups are
//! replicated, snapshotted and restored with the rest of the store and need no Raft command of
//! their own. The API layer ([`crate::api::subscription`]) creates, commits and deletes groups
//! with compare-and-swap transactions; consumers watch the group's range from `committed + 1`.
//!
//! What the store itself must do for groups is in [`guard`]: during apply, an etcd Compact is
//! clamped so it never removes history a group still owes its consumers, unless the group lags
//! past its bound, in which case the group is passed and has lost history. `mvcc` never learns
//! about groups: the state machine calls [`guard::compact`] instead of `ApplyBatch::compact`.
//!
//! The rules that decide "holding" and "lost" are here, as pure functions, so the API (which
//! reports them) and apply (which enforces them) cannot disagree.
//! See `proto/proto/picket/v1/subscription.proto` for the user-facing contract.

pub mod guard;

use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{PutRequest, TxnRequest};
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::v1::{GroupState, SubscriptionGroup};
use prost::Message;

/// Every group record lives under this prefix; group ranges may not overlap it.
pub const GROUP_PREFIX: &[u8] = b"picket/sub/";

/// The end of [`GROUP_PREFIX`]'s range (the prefix with its last byte incremented).
pub const GROUP_PREFIX_END: &[u8] = b"picket/sub0";

/// Longest group name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// The default lag bound (`--sub-max-lag-revisions`): a group more than this many revisions
/// behind the store stops holding compaction back.
pub const DEFAULT_MAX_LAG_REVISIONS: i64 = 1_000_000;

/// The record key of group `name`.
pub fn group_key(name: &str) -> Vec<u8> {
    let mut k = GROUP_PREFIX.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

/// A group decoded from its record key-value, or `None` if the key is not a group record or
/// its value does not decode (someone wrote it by hand with a plain Put). Such keys are
/// ignored everywhere, deterministically.
pub fn decode(kv: &KeyValue) -> Option<(String, SubscriptionGroup)> {
    let name = kv.key.strip_prefix(GROUP_PREFIX)?;
    let name = std::str::from_utf8(name).ok()?;
    let rec = SubscriptionGroup::decode(kv.value.as_slice()).ok()?;
    Some((name.to_string(), rec))
}

/// Whether compaction at `compacted` removed history the group had not committed past: a
/// watch from `committed + 1` would be refused (a watch may start at the compaction point).
pub fn is_lost(rec: &SubscriptionGroup, compacted: i64) -> bool {
    compacted > rec.committed.saturating_add(1)
}

/// Whether the group is within its lag bound at store revision `revision`. A bound of 0 or
/// less (only possible in a hand-written record) means no bound.
pub fn within_bound(rec: &SubscriptionGroup, revision: i64) -> bool {
    rec.max_lag_revisions <= 0 || revision.saturating_sub(rec.committed) <= rec.max_lag_revisions
}

/// The revision up to which a group lets compaction go, or `None` if it holds nothing back
/// (already lost, or lagging past its bound).
pub fn hold(rec: &SubscriptionGroup, revision: i64, compacted: i64) -> Option<i64> {
    if is_lost(rec, compacted) || !within_bound(rec, revision) {
        return None;
    }
    Some(rec.committed.saturating_add(1))
}

/// The state reported to clients, at store revision `revision` and compaction point
/// `compacted`.
pub fn state(name: String, rec: SubscriptionGroup, revision: i64, compacted: i64) -> GroupState {
    GroupState {
        lag: revision.saturating_sub(rec.committed).max(0),
        compact_revision: compacted,
        lost_history: is_lost(&rec, compacted),
        holding: hold(&rec, revision, compacted).is_some(),
        name,
        key: rec.key,
        range_end: rec.range_end,
        committed: rec.committed,
        max_lag_revisions: rec.max_lag_revisions,
    }
}

/// Why a group name or range is refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    /// The name is empty, too long or uses characters outside `[A-Za-z0-9._-]`.
    #[error(
        "picket: invalid group name {0:?}: use 1 to {MAX_NAME_LEN} characters from [A-Za-z0-9._-]"
    )]
    BadName(String),
    /// The range has no key.
    #[error("picket: a group needs a key (or a prefix) to watch")]
    NoKey,
    /// The range overlaps the group records themselves.
    #[error("picket: a group's range may not overlap the reserved prefix picket/sub/ (where group positions are stored)")]
    Reserved,
    /// A Put (or a Txn's put) would store, under the group prefix, a value that is not a group
    /// record CreateGroup could have written.
    #[error(
        "picket: invalid subscription group record for key {key:?}: {reason}; keys under picket/sub/ hold group records, create groups with the Subscriptions service's CreateGroup"
    )]
    BadRecord { key: String, reason: String },
}

impl GroupError {
    /// The name a refusal with this error travels under (the API layer maps it to a code).
    pub fn kind(&self) -> picket_proto::picket::raft::v1::RefusalKind {
        use picket_proto::picket::raft::v1::RefusalKind as K;
        match self {
            GroupError::BadName(_) => K::GroupBadName,
            GroupError::NoKey => K::GroupNoKey,
            GroupError::Reserved => K::GroupReserved,
            GroupError::BadRecord { .. } => K::GroupBadRecord,
        }
    }
}

/// Checks a group name.
pub fn validate_name(name: &str) -> Result<(), GroupError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(GroupError::BadName(name.chars().take(MAX_NAME_LEN + 8).collect()))
    }
}

/// Checks a group range (etcd conventions: empty `range_end` = one key, `\0` = every key from
/// `key` on).
pub fn validate_range(key: &[u8], range_end: &[u8]) -> Result<(), GroupError> {
    if key.is_empty() {
        return Err(GroupError::NoKey);
    }
    let overlaps = if range_end.is_empty() {
        key.starts_with(GROUP_PREFIX)
    } else if range_end == b"\0" {
        key < GROUP_PREFIX_END
    } else {
        key < GROUP_PREFIX_END && range_end > GROUP_PREFIX
    };
    if overlaps {
        return Err(GroupError::Reserved);
    }
    Ok(())
}

/// Checks what a plain Put would store under the group prefix (issue 19, Medium #11): only a
/// record CreateGroup could have written goes in. A hand-written record with no lag bound
/// (`max_lag_revisions <= 0`) would hold compaction back forever, and one that does not decode
/// would be silently ignored by the guard and by ListGroups. Keys outside the prefix, and a put
/// that keeps the stored value (`ignore_value`), are not judged.
///
/// Validated rather than reserving the prefix for CreateGroup: a group record is an ordinary
/// key (see `subscription.proto`), so a mirror (`etcdctl make-mirror`) or a restore that copies
/// keys with Put keeps working, and a malformed write gets an error that says what is wrong
/// instead of a permission error on a key the user may otherwise write. Runs in apply, on
/// replicated data only, so every member refuses the same commands. Records already stored by
/// an earlier version are left as they are (the guard still reads them); delete such a record
/// to release its hold.
pub fn check_put(req: &PutRequest) -> Result<(), GroupError> {
    if req.ignore_value {
        return Ok(());
    }
    let Some(name) = req.key.strip_prefix(GROUP_PREFIX) else {
        return Ok(());
    };
    let bad = |reason: String| GroupError::BadRecord {
        key: String::from_utf8_lossy(&req.key).into_owned(),
        reason,
    };
    let name = std::str::from_utf8(name).map_err(|_| bad("the group name is not UTF-8".into()))?;
    validate_name(name).map_err(|e| bad(e.to_string()))?;
    let rec = SubscriptionGroup::decode(req.value.as_slice())
        .map_err(|e| bad(format!("the value is not a SubscriptionGroup ({e})")))?;
    validate_range(&rec.key, &rec.range_end).map_err(|e| bad(e.to_string()))?;
    if rec.committed < 0 {
        return Err(bad(format!("committed {} is negative", rec.committed)));
    }
    if rec.max_lag_revisions <= 0 {
        return Err(bad(format!(
            "max_lag_revisions {} must be positive (a group without a lag bound would hold compaction back forever)",
            rec.max_lag_revisions
        )));
    }
    Ok(())
}

/// [`check_put`] for every put of a txn, in both branches and in nested txns: the txn is
/// refused as a whole, whichever branch would run, as etcd refuses a txn with an invalid op.
pub fn check_txn(req: &TxnRequest) -> Result<(), GroupError> {
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(Op::RequestPut(p)) => check_put(p)?,
            Some(Op::RequestTxn(t)) => check_txn(t)?,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(committed: i64, max_lag: i64) -> SubscriptionGroup {
        SubscriptionGroup {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            committed,
            max_lag_revisions: max_lag,
        }
    }

    #[test]
    fn a_group_holds_compaction_at_committed_plus_one() {
        assert_eq!(hold(&rec(10, 100), 50, 0), Some(11));
        // Compacted exactly at committed + 1: still resumable, still holding.
        assert_eq!(hold(&rec(10, 100), 50, 11), Some(11));
        assert!(!is_lost(&rec(10, 100), 11));
    }

    #[test]
    fn a_lost_or_lagging_group_holds_nothing() {
        assert!(is_lost(&rec(10, 100), 12));
        assert_eq!(hold(&rec(10, 100), 50, 12), None);
        assert_eq!(hold(&rec(10, 5), 16, 0), None);
        assert_eq!(hold(&rec(10, 5), 15, 0), Some(11));
        // A hand-written record without a bound holds without bound.
        assert_eq!(hold(&rec(10, 0), i64::MAX, 0), Some(11));
    }

    #[test]
    fn names_and_ranges_are_checked() {
        assert!(validate_name("orders-v1.audit_2").is_ok());
        for bad in ["", "a/b", "a b", "é", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(validate_range(b"", b""), Err(GroupError::NoKey));
        assert!(validate_range(b"ledger/", b"ledger0").is_ok());
        assert!(validate_range(b"zzz", b"\0").is_ok());
        assert_eq!(validate_range(b"picket/sub/x", b""), Err(GroupError::Reserved));
        assert_eq!(validate_range(b"a", b"\0"), Err(GroupError::Reserved));
        assert_eq!(validate_range(b"picket/", b"picket0"), Err(GroupError::Reserved));
        assert!(validate_range(b"picket/q/", b"picket/q0").is_ok());
    }

    #[test]
    fn state_reports_lag_and_loss() {
        let s = state("g".into(), rec(10, 100), 40, 20);
        assert_eq!((s.lag, s.lost_history, s.holding, s.compact_revision), (30, true, false, 20));
        let s = state("g".into(), rec(10, 100), 40, 5);
        assert_eq!((s.lag, s.lost_history, s.holding), (30, false, true));
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod record_tests;
