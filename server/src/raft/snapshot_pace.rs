//! When a member builds a snapshot: every `--snapshot-count` applied entries (openraft's
//! `LogsSinceLast` policy, which Picket used before), except while it is sending a snapshot to
//! a follower.
//!
//! Every build is followed by a purge of the log up to the snapshot minus the catch-up entries
//! a member keeps (`bootstrap::raft_config`). openraft postpones a purge while a replication
//! request is reading the entries, but not while a follower is receiving a snapshot
//! (`ProgressEntry::is_log_range_inflight` is false for a snapshot in flight), and that
//! follower, once it has installed snapshot S, asks for entry S + 1. If builds during the
//! transfer purged past it, the leader sends another snapshot; with a large store under steady
//! writes (transfer time x write rate above the kept log) a follower can install snapshot after
//! snapshot without catching up (session 29's long runs: one member installed 11; the test is
//! `tests/tests/catch_up_snapshot.rs`). So while a send is in flight, builds wait: the log then
//! still holds everything after the snapshot being sent.
//!
//! The wait is bounded by [`defer_cap`] entries past the last snapshot, so a transfer that
//! never ends (a follower gone silent mid-send, which openraft retries every chunk timeout)
//! cannot grow the log without limit; past the cap a build runs as before and the follower
//! may need another snapshot, which is only slower, never unsafe: a snapshot is the state
//! machine at a committed index, whichever one is sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;
use tokio::sync::watch;

use super::types::Raft;

/// How often a member compares its applied index with its last snapshot. A build is due every
/// `--snapshot-count` entries (10,000 by default); starting it up to this late only lets the
/// log grow by the entries of this interval.
const TICK: Duration = Duration::from_millis(100);

/// After asking for a build, how long to wait for the snapshot to show before asking again.
/// openraft ignores a request while a build runs, and a build is a pinned view (no I/O), so
/// this only matters if a build failed.
const RETRY_BUILD: Duration = Duration::from_secs(5);

/// The least a send may hold builds back, in entries past the last snapshot.
const MIN_DEFER_CAP: u64 = 50_000;

/// What the pace says for one look at the indexes.
#[derive(Debug, PartialEq, Eq)]
pub enum Pace {
    /// Fewer than `every` entries since the last snapshot.
    Wait,
    /// A build is due but a snapshot is being sent: wait for the send.
    Defer,
    /// Build now.
    Build,
}

/// Entries past the last snapshot at which a build runs even while a send is in flight: five
/// snapshot intervals, and never fewer than [`MIN_DEFER_CAP`] (at the harness's
/// `--snapshot-count 200`, a transfer of a 1-2 GB store takes ~10 s).
pub fn defer_cap(every: u64) -> u64 {
    every.saturating_mul(5).max(MIN_DEFER_CAP)
}

/// Whether to build, given the applied index, the last snapshot's index, whether a snapshot is
/// being sent, and `--snapshot-count`.
pub fn decide(applied: u64, snapshot: u64, sending: bool, every: u64) -> Pace {
    let since = applied.saturating_sub(snapshot);
    if since < every.max(1) {
        Pace::Wait
    } else if sending && since < defer_cap(every) {
        Pace::Defer
    } else {
        Pace::Build
    }
}

/// Snapshot sends in flight on this member (the network's `full_snapshot` calls); cheap to
/// clone.
#[derive(Debug, Clone, Default)]
pub struct Sending(Arc<AtomicUsize>);

impl Sending {
    /// Counts a send until the returned guard is dropped (also when the send is abandoned).
    pub fn start(&self) -> SendGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        SendGuard(self.0.clone())
    }

    pub fn any(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
}

pub struct SendGuard(Arc<AtomicUsize>);

impl Drop for SendGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Asks openraft for a build whenever [`decide`] says so, until the member stops.
pub async fn run(raft: Raft, every: u64, sending: Sending, mut stop: watch::Receiver<bool>) {
    let mut deferring = false;
    // The snapshot index at which a build was last asked for, and when.
    let mut asked: Option<(u64, Instant)> = None;
    let metrics = raft.metrics();
    loop {
        if *stop.borrow() {
            return;
        }
        // Bounded: wakes every TICK, or at once when the member stops.
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (applied, snapshot) = {
            let m = metrics.borrow_watched();
            (m.last_applied.map_or(0, |l| l.index), m.snapshot.map_or(0, |l| l.index))
        };
        match decide(applied, snapshot, sending.any(), every) {
            Pace::Wait => deferring = false,
            Pace::Defer => {
                if !deferring {
                    tracing::info!(
                        applied,
                        snapshot,
                        "snapshot build deferred while a snapshot is being sent"
                    );
                }
                deferring = true;
            }
            Pace::Build => {
                deferring = false;
                if asked.is_some_and(|(at, when)| at == snapshot && when.elapsed() < RETRY_BUILD) {
                    continue;
                }
                if raft.trigger().snapshot().await.is_err() {
                    // Raft has stopped; so has the member.
                    return;
                }
                asked = Some((snapshot, Instant::now()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_due_every_snapshot_count_entries() {
        assert_eq!(decide(99, 0, false, 100), Pace::Wait);
        assert_eq!(decide(100, 0, false, 100), Pace::Build);
        assert_eq!(decide(250, 200, false, 100), Pace::Wait);
        assert_eq!(decide(300, 200, false, 100), Pace::Build);
    }

    #[test]
    fn a_send_in_flight_defers_a_due_build_up_to_the_cap() {
        assert_eq!(decide(300, 200, true, 100), Pace::Defer);
        assert_eq!(decide(200 + MIN_DEFER_CAP - 1, 200, true, 100), Pace::Defer);
        assert_eq!(decide(200 + MIN_DEFER_CAP, 200, true, 100), Pace::Build);
        assert_eq!(defer_cap(100_000), 500_000);
        // Not due: a send changes nothing.
        assert_eq!(decide(250, 200, true, 100), Pace::Wait);
    }

    #[test]
    fn sends_are_counted_until_their_guards_drop() {
        let s = Sending::default();
        assert!(!s.any());
        let a = s.start();
        let b = s.clone().start();
        drop(a);
        assert!(s.any());
        drop(b);
        assert!(!s.any());
    }
}
