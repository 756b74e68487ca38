//! The quota monitor: every member measures its own store and raises or clears its own NOSPACE
//! alarm through Raft (the rules are in [`crate::quota`]). A background task of the API layer,
//! like the lease expiry and the compaction steps, because it proposes through [`Ctx`].

use std::sync::Arc;

use picket_proto::etcdserverpb::alarm_request::AlarmAction;
use picket_proto::etcdserverpb::{AlarmRequest, AlarmType};
use picket_proto::picket::raft::v1::raft_command::Cmd;
use tokio::sync::watch;

use super::Ctx;
use crate::quota::{backend_sizes, decide, read_alarms, MONITOR_INTERVAL};

/// Measures this member's store every `MONITOR_INTERVAL` and raises or clears its own NOSPACE
/// alarm (see the module docs) until `stop` turns true.
pub async fn run(ctx: Arc<Ctx>, quota: u64, mut stop: watch::Receiver<bool>) {
    let member_id = ctx.member_id;
    let mut tick = tokio::time::interval(MONITOR_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (size, _) = backend_sizes(ctx.sm.engine());
        let alarms = match read_alarms(ctx.sm.engine()) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "quota monitor cannot read the alarm set");
                continue;
            }
        };
        let Some(action) = decide(member_id, size, quota, &alarms) else { continue };
        if action == AlarmAction::Activate {
            tracing::warn!(
                size,
                quota,
                "the store is over --quota-backend-bytes: raising the NOSPACE alarm, writes \
                 that grow the store are refused until space is reclaimed (compact, then \
                 defragment)"
            );
        } else {
            tracing::info!(size, quota, "the store is below the quota again: clearing NOSPACE");
        }
        let req =
            AlarmRequest { action: action as i32, member_id, alarm: AlarmType::Nospace as i32 };
        // Retried on the next tick if it fails (no leader, timeout): activating an active alarm
        // and deactivating an inactive one change nothing, so a duplicate is harmless.
        if let Err(e) = ctx.propose(Cmd::Alarm(req)).await {
            tracing::warn!(error = %e, "quota monitor could not propose the alarm change");
        }
    }
}
