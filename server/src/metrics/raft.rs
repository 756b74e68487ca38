//! Raft gauges and the leader-change counter.
//!
//! The gauges that move with every write (term, applied and last log index, snapshot index)
//! and `has_leader` (which also turns 0 when the leader falls silent, `raft::leader_contact`,
//! something no metrics change announces) are read when `/metrics` is scraped ([`observe`]).
//! They used to be copied by a task that followed openraft's metrics channel, which openraft
//! publishes on every turn of its core loop, several times per write: a task poll, a borrow and
//! seven gauge writes per turn on the member's one runtime thread, for values only a scrape
//! reads. Counting leader changes needs every change seen, so [`follow`] watches openraft's
//! server metrics, which change only with the leader, the vote, the role or the membership.

use std::sync::Arc;

use openraft::async_runtime::WatchReceiver;
use tokio::sync::watch;

use super::Metrics;
use crate::raft::proposer::Proposer;
use crate::raft::types::NodeId;

/// Clamps an index or term to a gauge value (they never approach `i64::MAX` in practice).
fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Counts the leaders this member learns of until Raft shuts down or `stop` turns true.
pub async fn follow(metrics: Arc<Metrics>, proposer: Proposer, mut stop: watch::Receiver<bool>) {
    let mut rx = proposer.raft().server_metrics();
    let mut last_leader: Option<NodeId> = None;
    loop {
        {
            let m = rx.borrow_and_update();
            // etcd counts every new leader this member learns of, including the first one.
            if m.current_leader.is_some() && m.current_leader != last_leader {
                metrics.leader_changes.inc();
                last_leader = m.current_leader;
            }
        }
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Refreshes the Raft gauges, at scrape time.
pub fn observe(metrics: &Metrics, proposer: &Proposer) {
    // Before the borrow below: `leader()` reads the same watch, and a second read of it while a
    // writer waits would deadlock.
    let has_leader = proposer.leader().is_some();
    let rx = proposer.raft().metrics();
    let m = rx.borrow_watched();
    metrics.raft_term.set(gauge(m.current_term));
    metrics.has_leader.set(i64::from(has_leader));
    metrics.is_leader.set(i64::from(m.current_leader == Some(m.id)));
    metrics.applied_index.set(gauge(m.last_applied.map(|l| l.index).unwrap_or(0)));
    metrics.last_log_index.set(gauge(m.last_log_index.unwrap_or(0)));
    metrics.snapshot_index.set(gauge(m.snapshot.map(|l| l.index).unwrap_or(0)));
}
