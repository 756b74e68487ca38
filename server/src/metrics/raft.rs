//! Raft gauges, fed from openraft's metrics watch channel: every change of term, leader or log
//! index is published there, so following it costs nothing while the cluster is idle. The one
//! exception is `has_leader`, which also turns 0 when the leader falls silent
//! (`raft::leader_contact`), something no metrics change announces: it is refreshed every
//! [`LEADER_CHECK`] as well.

use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;

use tokio::sync::watch;

use super::Metrics;
use crate::raft::proposer::Proposer;
use crate::raft::types::NodeId;

/// How often `has_leader` is refreshed without a metrics change: well inside the window after
/// which a silent leader stops counting (1.5 election timeouts).
const LEADER_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// Clamps an index or term to a gauge value (they never approach `i64::MAX` in practice).
fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Updates the Raft families until Raft shuts down or `stop` turns true.
pub async fn follow(metrics: Arc<Metrics>, proposer: Proposer, mut stop: watch::Receiver<bool>) {
    let mut rx = proposer.raft().metrics();
    // One timer for the task's life, not one registered and dropped per metrics change (there
    // are several per write).
    let mut leader_check = tokio::time::interval(LEADER_CHECK);
    leader_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_leader: Option<NodeId> = None;
    loop {
        {
            // Before the borrow below: `leader()` reads the same watch, and a second read of it
            // while a writer waits would deadlock.
            let has_leader = proposer.leader().is_some();
            let m = rx.borrow_and_update();
            metrics.raft_term.set(gauge(m.current_term));
            metrics.has_leader.set(i64::from(has_leader));
            metrics.is_leader.set(i64::from(m.current_leader == Some(m.id)));
            // etcd counts every new leader this member learns of, including the first one.
            if m.current_leader.is_some() && m.current_leader != last_leader {
                metrics.leader_changes.inc();
                last_leader = m.current_leader;
            }
            metrics.applied_index.set(gauge(m.last_applied.map(|l| l.index).unwrap_or(0)));
            metrics.last_log_index.set(gauge(m.last_log_index.unwrap_or(0)));
            metrics.snapshot_index.set(gauge(m.snapshot.map(|l| l.index).unwrap_or(0)));
        }
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = leader_check.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
