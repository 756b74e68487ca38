//! The leader's physical-compaction driver.
//!
//! A Compact request moves the compaction point at once and removes the compacted history in
//! bounded steps (`crate::mvcc::compact`), one riding on each later write. Without writes (an
//! idle cluster, or one refusing writes under a NOSPACE alarm, where `compact` + `defrag` is
//! etcd's documented way out) nothing would drive them, so while this member leads and its
//! applied store shows history left to remove, it proposes `CompactStep` commands. A step is
//! decided from replicated state only, so every member removes the same records at the same
//! log entry; a step proposed when nothing is left (a step that rode on a write got there
//! first) applies as a no-op.

use std::sync::Arc;
use std::time::Duration;

use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::CompactStep;

use super::Ctx;

/// How often a member looks for pending steps while none is pending or it does not lead.
const IDLE_TICK: Duration = Duration::from_millis(200);

/// Pause between two steps while work remains. Each step is one log entry with at most about
/// 256 deletes; pacing them keeps a large compaction from taking every append of the leader
/// (client writes share the batcher and still drive steps themselves) while still removing
/// tens of thousands of records per second.
const STEP_PAUSE: Duration = Duration::from_millis(5);

/// Runs for the life of the node.
pub async fn run(ctx: Arc<Ctx>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut pause = IDLE_TICK;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        pause = IDLE_TICK;
        let leads = ctx.leads();
        let (compacted, physical) =
            ctx.sm.with_store(|s| (s.compact_revision(), s.compact_physical()));
        if !leads || physical >= compacted {
            continue;
        }
        // `Ctx::propose` is bounded by the request timeout. A failed or unknown step changes
        // nothing a read can see and is simply proposed again: steps are idempotent in effect.
        match ctx.propose(Cmd::CompactStep(CompactStep {})).await {
            Ok(_) => pause = STEP_PAUSE,
            Err(e) => tracing::debug!(error = %e, compacted, physical, "compaction step failed"),
        }
    }
}
