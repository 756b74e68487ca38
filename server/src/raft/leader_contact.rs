//! Whether this member hears from a leader: the "leader" that `Status`, `hasleader`
//! (`WithRequireLeader`), `/health`, the `has_leader` gauge and the removal watcher go by.
//!
//! openraft names as leader whoever holds this member's committed vote, whether or not it still
//! hears from it. Without Pre-Vote that was close enough: a follower that stopped hearing from
//! its leader became a candidate within 1.25-1.5 election timeouts, and the candidate's vote is
//! not committed. With Pre-Vote (`--pre-vote`) a follower that cannot win keeps its vote, so it
//! would name a dead leader forever: a lone survivor answered "leader 1a2b" instead of etcd's
//! "no leader", and a removed follower never noticed its removal (seen in
//! `tests/cluster_ops.rs` when Pre-Vote was turned on). So a follower names its vote's leader
//! only while that leader's appends (or snapshot chunks) reached it within the window in which
//! a follower without Pre-Vote would not yet have campaigned (etcd's raft, likewise, forgets
//! the leader when it becomes a pre-candidate).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::types::NodeId;

/// The last time a leader's message was accepted, and whose.
pub struct LeaderContact {
    /// Base of `at_ms`.
    epoch: Instant,
    /// Who sent the last accepted message (0 before any).
    leader: AtomicU64,
    /// When, in milliseconds after `epoch`, plus one (0 before any).
    at_ms: AtomicU64,
    /// How long a leader counts as heard from after its last message.
    window: Duration,
}

impl LeaderContact {
    pub fn new(window: Duration) -> Self {
        Self { epoch: Instant::now(), leader: AtomicU64::new(0), at_ms: AtomicU64::new(0), window }
    }

    /// Records that `leader`'s append or snapshot chunk was accepted just now. Two relaxed
    /// stores: a reader may pair one leader's id with the other's time for a moment, which at
    /// worst names the new leader a message early or late.
    pub fn heard(&self, leader: NodeId) {
        let ms = self.epoch.elapsed().as_millis() as u64 + 1;
        self.leader.store(leader, Ordering::Relaxed);
        self.at_ms.store(ms, Ordering::Relaxed);
    }

    /// The leader to report, given openraft's `current_leader` and this member's id: itself
    /// when it leads; another member only while its messages keep arriving.
    pub fn leader(&self, current_leader: Option<NodeId>, me: NodeId) -> Option<NodeId> {
        let l = current_leader?;
        if l == me {
            return Some(l);
        }
        let at = self.at_ms.load(Ordering::Relaxed);
        if at == 0 || self.leader.load(Ordering::Relaxed) != l {
            return None;
        }
        let since = Duration::from_millis((self.epoch.elapsed().as_millis() as u64 + 1) - at);
        (since <= self.window).then_some(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_named_only_while_it_is_heard_from() {
        let c = LeaderContact::new(Duration::from_millis(50));
        assert_eq!(c.leader(None, 1), None);
        assert_eq!(c.leader(Some(1), 1), Some(1), "a leader names itself");
        assert_eq!(c.leader(Some(2), 1), None, "never heard from 2");
        c.heard(2);
        assert_eq!(c.leader(Some(2), 1), Some(2));
        assert_eq!(c.leader(Some(3), 1), None, "heard from 2, not from the new leader 3");
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(c.leader(Some(2), 1), None, "silent past the window");
        c.heard(2);
        assert_eq!(c.leader(Some(2), 1), Some(2));
    }
}
