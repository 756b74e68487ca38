//! The leader's automatic compaction (`--auto-compaction-mode`, `--auto-compaction-retention`).
//!
//! Every member samples its applied revision on the schedule of [`crate::mvcc::retention`];
//! when the schedule says to compact and this member leads, it proposes the Compaction a client
//! would (`physical: false`: the bounded steps of `compact_steps` remove the history after it).
//! Apply checks it as any client's: a revision at or below the compaction point is refused, and
//! subscription groups may hold the point back. Followers keep sampling, so a member that becomes
//! leader compacts on its own schedule.

use std::sync::Arc;
use std::time::Instant;

use picket_proto::etcdserverpb::CompactionRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;

use super::Ctx;
use crate::mvcc::retention::{Retention, Schedule};

/// Runs for the life of the node; returns at once when `retention` is off.
pub async fn run(
    ctx: Arc<Ctx>,
    retention: Retention,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(mut schedule) = Schedule::new(retention, Instant::now()) else { return };
    tracing::info!(?retention, "automatic compaction on");
    loop {
        tokio::select! {
            _ = tokio::time::sleep(schedule.interval()) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (current, compacted) = ctx.sm.with_store(|s| (s.revision(), s.compact_revision()));
        let Some(rev) = schedule.tick(Instant::now(), current) else { continue };
        let leads = ctx.leads();
        if !leads {
            // Asked again next tick: the leader compacts; this member only keeps its samples.
            continue;
        }
        if rev <= compacted {
            // A client (or an earlier proposal whose answer was lost) got there first.
            schedule.done(Instant::now(), rev);
            continue;
        }
        let req = CompactionRequest { revision: rev, physical: false };
        // `Ctx::propose` is bounded by the request timeout. A failed or unknown outcome is
        // asked for again next tick: compacting at a revision already compacted is refused by
        // apply and then seen here as done, so a retry never compacts twice.
        match ctx.propose(Cmd::Compaction(req)).await {
            Ok(_) => {
                tracing::info!(revision = rev, "automatic compaction");
                schedule.done(Instant::now(), rev);
            }
            Err(e) => tracing::warn!(revision = rev, error = %e, "automatic compaction failed"),
        }
    }
}
