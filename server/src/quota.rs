//! The storage quota (`--quota-backend-bytes`) and the replicated alarm set (etcd's `NOSPACE`).
//!
//! # What is measured
//!
//! etcd's quota limits its backend (the bbolt file), not its Raft WAL. Picket's backend is the
//! state machine's column families ([`BACKEND_CFS`]: `kv`, `changelog`, `meta`, `lease`,
//! `lease_keys`; the same set a snapshot holds); the Raft log families are excluded, as etcd's
//! WAL is, because snapshots bound them. [`backend_sizes`] adds, per family, the size of its
//! table files and of its memtables (data not flushed yet is on disk in the WAL and would be in
//! a table file after the next flush). Compaction (`etcdctl compact`) only writes tombstones,
//! so the size falls after a defragment (`etcdctl defrag`), which here is a full RocksDB manual
//! compaction: it flushes the memtables and rewrites every table file without the deleted
//! versions. The same numbers are `Status.db_size`/`db_size_in_use` and the
//! `picket_mvcc_db_total_size_*` metrics. Memtables count by the memory RocksDB allocated for
//! them, which grows in arena blocks (1 MiB per column family with the default 64 MiB write
//! buffer): a store with a few keys measures about 3 MiB, so quotas below about 8 MiB are
//! coarse. That errs on the side of raising the alarm early, never late.
//!
//! # Alarms are replicated
//!
//! An alarm is a `(member id, alarm type)` pair in the state machine ([`KEY_ALARMS`] in the
//! `meta` family, so snapshots carry it). Activating and deactivating are Raft commands
//! (`RaftCommand.alarm`), applied by [`apply_alarm`] on every member in log order, so all
//! members agree on which alarms are active and a restart keeps them. Listing reads the local
//! copy.
//!
//! # Who raises and clears NOSPACE
//!
//! The size of a member's store is not deterministic (it depends on when RocksDB flushes and
//! compacts), so the check runs outside apply: the monitor (`crate::api::quota_monitor`) on every member compares its own
//! size with the quota about twice a second and proposes `Activate(self, NOSPACE)` when the
//! size is over it, and `Deactivate(self, NOSPACE)` when its own NOSPACE alarm is active and the
//! size fell below [`CLEAR_PERCENT`] of the quota (the margin keeps the alarm from flapping
//! around the limit). An operator can also disarm it (`etcdctl alarm disarm`), as in etcd; if
//! the store is still over the quota, the monitor raises it again.
//!
//! # What NOSPACE refuses
//!
//! While any NOSPACE alarm is active, every command that can grow the store ([`grows_store`]:
//! Put, a Txn with a put in any branch, LeaseGrant, a fenced txn with a put; Lock and Campaign
//! are puts and lease grants underneath) fails with etcd's `etcdserver: mvcc: database space
//! exceeded` (ResourceExhausted). Reads, deletes, lease revokes, compaction, defragment and
//! alarm changes still work, so the operator can reclaim space. The refusal is made twice:
//! - in apply ([`gate`]), deterministically from the replicated alarm set, so every member
//!   refuses the same entries whatever it knew when the request arrived;
//! - before proposing ([`check_propose`]), from this member's copy of the alarm set, so a
//!   refused write does not take a Raft log entry (etcd checks before proposing too).
//!
//! The quota is soft, as etcd's: writes between crossing the limit and the alarm's commit (one
//! monitor tick plus one commit) are accepted.

use std::collections::BTreeSet;
use std::time::Duration;

use picket_proto::etcdserverpb::alarm_request::AlarmAction;
use picket_proto::etcdserverpb::request_op::Request as OpRequest;
use picket_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, RequestOp, TxnRequest,
};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use thiserror::Error;

use crate::mvcc::{ApplyBatch, MvccError};
use crate::storage::engine::{Cf, Engine, ReadView};
use crate::storage::rocks::RocksEngine;

/// etcd's default `--quota-backend-bytes`: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// etcd warns above 8 GiB ("exceeded recommended maximum"); so does Picket.
pub const MAX_SUGGESTED_QUOTA_BYTES: u64 = 8 * 1024 * 1024 * 1024;
/// A member clears its own NOSPACE alarm once its store is below this share of the quota.
pub const CLEAR_PERCENT: u64 = 90;
/// How often the monitor (`crate::api::quota_monitor`) measures the store: a handful of RocksDB property reads.
pub const MONITOR_INTERVAL: Duration = Duration::from_millis(500);
/// etcd's `ErrGRPCNoSpace` text, verbatim: etcd clients map errors by their message.
pub const NOSPACE_MESSAGE: &str = "etcdserver: mvcc: database space exceeded";

/// The `meta` key holding the active alarms (postcard `Vec<(member_id, alarm)>`, sorted).
pub(crate) const KEY_ALARMS: &[u8] = b"alarm/active";

/// The state machine's column families: what the quota measures and a snapshot holds.
pub const BACKEND_CFS: [Cf; 5] = [Cf::Kv, Cf::Changelog, Cf::Meta, Cf::Lease, Cf::LeaseKeys];

/// The active alarms, as `(member id, AlarmType as i32)`.
pub type AlarmSet = BTreeSet<(u64, i32)>;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// Reading the alarm set failed: a storage failure, fatal for the node.
    #[error("reading the alarm set: {0}")]
    Storage(#[from] MvccError),
    /// The stored alarm set does not decode: corrupt state-machine data, fatal for the node.
    #[error("corrupt alarm set: {0}")]
    Corrupt(String),
}

/// The quota in effect for `--quota-backend-bytes flag` (0 means etcd's default, as in etcd).
pub fn effective_quota(flag: u64) -> u64 {
    if flag == 0 {
        DEFAULT_QUOTA_BYTES
    } else {
        flag
    }
}

/// Estimated (bytes on disk, bytes of live data) of the backend: table files plus memtables of
/// every family in [`BACKEND_CFS`]. See the module docs.
/// [`backend_sizes`] as the signed numbers `Maintenance.Status` and the metrics report (etcd:
/// bbolt file size and bytes in use).
pub fn db_sizes(engine: &RocksEngine) -> (i64, i64) {
    let (total, live) = backend_sizes(engine);
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    (clamp(total), clamp(live))
}

pub fn backend_sizes(engine: &RocksEngine) -> (u64, u64) {
    let db = engine.db();
    let prop = |cf: Cf, name: &rocksdb::properties::PropName| -> u64 {
        // A missing or unreadable property only makes the estimate smaller.
        db.property_int_value_cf(engine.cf_handle(cf), name).ok().flatten().unwrap_or(0)
    };
    let (mut total, mut live) = (0u64, 0u64);
    for cf in BACKEND_CFS {
        let mem = prop(cf, rocksdb::properties::CUR_SIZE_ALL_MEM_TABLES);
        total += prop(cf, rocksdb::properties::TOTAL_SST_FILES_SIZE) + mem;
        live += prop(cf, rocksdb::properties::LIVE_SST_FILES_SIZE) + mem;
    }
    (total, live.min(total))
}

fn decode(raw: Option<Vec<u8>>) -> Result<AlarmSet, QuotaError> {
    let Some(raw) = raw else { return Ok(AlarmSet::new()) };
    let list: Vec<(u64, i32)> =
        postcard::from_bytes(&raw).map_err(|e| QuotaError::Corrupt(e.to_string()))?;
    Ok(list.into_iter().collect())
}

/// The active alarms as this member has applied them.
pub fn read_alarms(view: &impl ReadView) -> Result<AlarmSet, QuotaError> {
    decode(view.get(Cf::Meta, KEY_ALARMS).map_err(MvccError::from)?)
}

fn nospace_in(alarms: &AlarmSet) -> bool {
    alarms.iter().any(|&(_, a)| a == AlarmType::Nospace as i32)
}

fn txn_has_put(txn: &TxnRequest) -> bool {
    let op_puts = |op: &RequestOp| match &op.request {
        Some(OpRequest::RequestPut(_)) => true,
        Some(OpRequest::RequestTxn(t)) => txn_has_put(t),
        _ => false,
    };
    txn.success.iter().chain(&txn.failure).any(op_puts)
}

/// Whether `cmd` can grow the store, and so is refused while NOSPACE is active (etcd's
/// `applierV3Capped`: puts, txns with puts, lease grants).
pub fn grows_store(cmd: &Cmd) -> bool {
    match cmd {
        Cmd::Put(_) | Cmd::LeaseGrant(_) => true,
        Cmd::Txn(t) => txn_has_put(t),
        Cmd::FencedTxn(f) => f.txn.as_ref().is_some_and(txn_has_put),
        // A claim writes its claim key (so does an ack_claim, refused whole: its ack is not
        // applied without its claim); an ack only deletes.
        Cmd::Queue(q) => {
            use picket_proto::picket::raft::v1::queue_command::Op;
            matches!(q.op, Some(Op::Claim(_) | Op::AckClaim(_)))
        }
        Cmd::Batch(b) => b.commands.iter().any(|c| c.cmd.as_ref().is_some_and(grows_store)),
        _ => false,
    }
}

/// A write refused because it would grow the store while a NOSPACE alarm is active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{}", NOSPACE_MESSAGE)]
pub struct NoSpace;

/// The apply-time check: `Err(NoSpace)` if `cmd` grows the store while a NOSPACE alarm is
/// active in this batch's view of the state machine. Deterministic: it reads only replicated
/// state. Commands that cannot grow the store do not read the alarm set at all.
pub fn gate<E: Engine>(
    batch: &ApplyBatch<'_, E>,
    cmd: &Cmd,
) -> Result<Result<(), NoSpace>, QuotaError> {
    // A group-committed batch is not refused as a whole: apply gates each command in it, so
    // a delete in the same batch as a refused put still succeeds.
    if matches!(cmd, Cmd::Batch(_)) || !grows_store(cmd) {
        return Ok(Ok(()));
    }
    let alarms = decode(batch.get_raw(Cf::Meta, KEY_ALARMS)?)?;
    Ok(if nospace_in(&alarms) { Err(NoSpace) } else { Ok(()) })
}

/// Applies an `Alarm` command: Activate adds the pair, Deactivate removes it; the response lists
/// the pairs that changed (etcd answers with the alarm it activated or deactivated). GET and
/// unknown actions are never proposed by Picket; one found in the log changes nothing.
pub fn apply_alarm<E: Engine>(
    batch: &mut ApplyBatch<'_, E>,
    req: &AlarmRequest,
) -> Result<CmdResult, QuotaError> {
    let mut alarms = decode(batch.get_raw(Cf::Meta, KEY_ALARMS)?)?;
    let pair = (req.member_id, req.alarm);
    let changed = match AlarmAction::try_from(req.action) {
        Ok(AlarmAction::Activate) if req.alarm != AlarmType::None as i32 => alarms.insert(pair),
        Ok(AlarmAction::Deactivate) => alarms.remove(&pair),
        _ => false,
    };
    if changed {
        let list: Vec<(u64, i32)> = alarms.iter().copied().collect();
        let bytes = postcard::to_allocvec(&list).map_err(|e| QuotaError::Corrupt(e.to_string()))?;
        batch.put_raw(Cf::Meta, KEY_ALARMS, &bytes);
        tracing::info!(
            member_id = format!("{:x}", req.member_id),
            alarm = alarm_name(req.alarm),
            active = matches!(AlarmAction::try_from(req.action), Ok(AlarmAction::Activate)),
            "alarm changed"
        );
    }
    let alarms = if changed {
        vec![AlarmMember { member_id: req.member_id, alarm: req.alarm }]
    } else {
        Vec::new()
    };
    Ok(CmdResult::Alarm(AlarmResponse { header: None, alarms }))
}

/// etcd's name of an alarm type (`NOSPACE`, `CORRUPT`), or `UNKNOWN`.
pub fn alarm_name(alarm: i32) -> &'static str {
    AlarmType::try_from(alarm).map(|a| a.as_str_name()).unwrap_or("UNKNOWN")
}

/// Whether this member's applied alarm set has a NOSPACE alarm, kept in memory for
/// [`check_propose`], which every client write passes: reading the set from the engine and
/// decoding the wrapped command there cost 2-3 % of the members' CPU under 64-client puts
/// (docs/benchmarks.md, "Issue 20, session 18"). The state machine refreshes it after every
/// applied batch that wrote the alarm set ([`apply_alarm`] is its only writer), at open and
/// after a snapshot install, so it says what the engine says whenever a batch is not being
/// applied (the engine's copy is itself this member's view, which may lag the leader's: the
/// same early, advisory refusal as before).
#[derive(Debug, Default)]
pub struct AlarmCache {
    nospace: std::sync::atomic::AtomicBool,
}

impl AlarmCache {
    /// Reads the alarm set from `view` (the committed state).
    pub fn load(view: &impl ReadView) -> Result<Self, QuotaError> {
        let cache = Self::default();
        cache.refresh(view)?;
        Ok(cache)
    }

    /// Reads the alarm set from `view` again.
    pub fn refresh(&self, view: &impl ReadView) -> Result<(), QuotaError> {
        let nospace = nospace_in(&read_alarms(view)?);
        self.nospace.store(nospace, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Whether a NOSPACE alarm was active as of the last refresh.
    pub fn nospace(&self) -> bool {
        self.nospace.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The propose-time check (see the module docs): refuses `cmd` if it grows the store and this
/// member's copy of the alarm set (`alarms`) has NOSPACE. Only advisory: apply checks again
/// from the replicated state, so a write let through here is still refused there.
pub fn check_propose(alarms: &AlarmCache, cmd: &Cmd) -> Result<(), NoSpace> {
    if !alarms.nospace() {
        return Ok(());
    }
    // Client writes travel wrapped as `AuthChecked` (with auth on or off, `crate::api::auth`):
    // judge the command inside. An empty wrapper is left to apply to refuse.
    let grows = match cmd {
        Cmd::AuthChecked(c) => {
            c.command.as_deref().and_then(|r| r.cmd.as_ref()).is_some_and(grows_store)
        }
        other => grows_store(other),
    };
    if grows {
        return Err(NoSpace);
    }
    Ok(())
}

/// What the quota monitor (`crate::api::quota_monitor`) should propose, given this member's
/// size and alarms.
pub(crate) fn decide(
    member_id: u64,
    size: u64,
    quota: u64,
    alarms: &AlarmSet,
) -> Option<AlarmAction> {
    let mine = alarms.contains(&(member_id, AlarmType::Nospace as i32));
    if size > quota && !mine {
        Some(AlarmAction::Activate)
    } else if mine && size.saturating_mul(100) < quota.saturating_mul(CLEAR_PERCENT) {
        Some(AlarmAction::Deactivate)
    } else {
        None
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;
