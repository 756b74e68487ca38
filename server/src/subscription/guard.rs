//! The compaction guard: an etcd Compact, applied through Raft, that would remove history a
//! subscription group has not committed past is clamped to the oldest position a group still
//! needs.
//!
//! Runs inside apply, so it reads only replicated state (the group records, seen through the
//! apply batch, and the store's revision counters) and no clock: every member clamps the same
//! compaction to the same revision and their stores stay identical (HashKV agrees).
//!
//! Clamped, not refused: etcd clients and Kubernetes compact on a timer and treat an error as
//! something to retry or alert on, while a clamped compaction succeeds and compacts whatever
//! it may; the next periodic compaction catches up once the group has moved on. etcd's
//! `CompactionResponse` has no field to say so, so the member logs it (`compaction held back
//! by subscription group`), and `GetGroup` shows `holding`.

use picket_proto::etcdserverpb::{CompactionRequest, CompactionResponse, RangeRequest};

use super::{decode, hold, is_lost, GROUP_PREFIX, GROUP_PREFIX_END};
use crate::mvcc::{ApplyBatch, MvccError};
use crate::storage::engine::Engine;

/// What the guard decided for one compaction request.
#[derive(Debug, PartialEq, Eq)]
pub struct Decision {
    /// The revision to compact at; at or below the current compaction point means "nothing to
    /// do".
    pub revision: i64,
    /// The group that held the compaction back the most, if any held it back.
    pub held_by: Option<String>,
    /// Groups this compaction passes although they had not committed past it: they lose
    /// history now (they lagged past their bound).
    pub passed: Vec<String>,
}

/// Decides where a compaction requested at `requested` may go, given the groups, the store
/// revision and the current compaction point. Pure, for tests and for apply.
pub fn decide<'a>(
    requested: i64,
    revision: i64,
    compacted: i64,
    groups: impl IntoIterator<Item = (&'a str, &'a picket_proto::picket::v1::SubscriptionGroup)>,
) -> Decision {
    let groups: Vec<_> = groups.into_iter().collect();
    let mut target = requested;
    let mut held_by = None;
    for (name, rec) in &groups {
        if let Some(h) = hold(rec, revision, compacted) {
            if h < target {
                target = h;
                held_by = Some(name.to_string());
            }
        }
    }
    // Groups not holding, that were not lost before, and that this compaction goes past.
    let passed = groups
        .iter()
        .filter(|(_, rec)| !is_lost(rec, compacted) && is_lost(rec, target))
        .map(|(name, _)| name.to_string())
        .collect();
    Decision { revision: target, held_by, passed }
}

/// etcd Compact with the guard: what the state machine calls for `Cmd::Compaction`. Requests
/// the store would refuse anyway (at or below the compaction point, or in the future) go to
/// the store unchanged, so etcd's errors stay etcd's.
pub fn compact<E: Engine>(
    batch: &mut ApplyBatch<'_, E>,
    req: &CompactionRequest,
) -> Result<CompactionResponse, MvccError> {
    let (revision, compacted) = (batch.revision(), batch.compact_revision());
    if req.revision <= compacted || req.revision > revision {
        return batch.compact(req);
    }
    let records = batch.range(&RangeRequest {
        key: GROUP_PREFIX.to_vec(),
        range_end: GROUP_PREFIX_END.to_vec(),
        ..Default::default()
    })?;
    let groups: Vec<_> = records.kvs.iter().filter_map(decode).collect();
    let d = decide(req.revision, revision, compacted, groups.iter().map(|(n, r)| (n.as_str(), r)));
    for name in &d.passed {
        tracing::warn!(
            group = %name,
            revision = d.revision,
            "subscription group lagged past its bound and lost history to compaction"
        );
    }
    if let Some(group) = &d.held_by {
        tracing::info!(
            requested = req.revision,
            revision = d.revision,
            group = %group,
            "compaction held back by subscription group"
        );
    }
    if d.revision <= compacted {
        // Nothing may go yet. Succeed, as etcd would for a compaction that had nothing to
        // drop: the caller compacts again later. The API stamps the current revision.
        return Ok(CompactionResponse { header: None });
    }
    batch.compact(&CompactionRequest { revision: d.revision, ..*req })
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod apply_tests;

#[cfg(test)]
mod tests {
    use picket_proto::picket::v1::SubscriptionGroup;

    use super::*;

    fn g(committed: i64, max_lag: i64) -> SubscriptionGroup {
        SubscriptionGroup {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            committed,
            max_lag_revisions: max_lag,
        }
    }

    #[test]
    fn no_groups_no_clamp() {
        let d = decide(50, 100, 0, []);
        assert_eq!(d, Decision { revision: 50, held_by: None, passed: vec![] });
    }

    #[test]
    fn the_slowest_holding_group_wins() {
        let (a, b) = (g(30, 1000), g(20, 1000));
        let d = decide(50, 100, 0, [("a", &a), ("b", &b)]);
        assert_eq!(d, Decision { revision: 21, held_by: Some("b".into()), passed: vec![] });
    }

    #[test]
    fn a_group_past_its_bound_is_passed_and_loses_history() {
        let (slow, ok) = (g(10, 50), g(40, 1000));
        let d = decide(80, 100, 0, [("slow", &slow), ("ok", &ok)]);
        assert_eq!(
            d,
            Decision { revision: 41, held_by: Some("ok".into()), passed: vec!["slow".into()] }
        );
    }

    #[test]
    fn an_already_lost_group_neither_holds_nor_is_reported_again() {
        let lost = g(10, 1000);
        let d = decide(80, 100, 30, [("lost", &lost)]);
        assert_eq!(d, Decision { revision: 80, held_by: None, passed: vec![] });
    }

    #[test]
    fn a_group_ahead_of_the_request_does_not_hold() {
        let a = g(90, 1000);
        let d = decide(50, 100, 0, [("a", &a)]);
        assert_eq!(d.revision, 50);
        assert_eq!(d.held_by, None);
    }
}
