//! The leader's lease clock: when each lease expires, by the leader's monotonic clock.
//!
//! Only the leader keeps deadlines, and only in memory. A member that becomes leader starts
//! with no deadlines and gives every lease a full TTL from the moment it first looks at it, so a
//! leader change can delay an expiry but never hasten one. The bound on how long a lease can
//! outlive its last keep-alive is therefore:
//!
//! - without a leader change: its TTL (plus one expiry tick and one Raft commit for the revoke);
//! - across leader changes: its TTL as seen by the old leader, plus the time until a new leader
//!   is elected (at most a few election timeouts), plus a full TTL on the new leader.
//!
//! This module never reads the clock itself: callers pass `now`, which keeps it testable and
//! keeps clocks out of anything apply could call.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Deadlines of the leases this member knows about while it is leader.
#[derive(Debug, Default)]
pub struct LeaseClock {
    /// The Raft term in which these deadlines were set; `None` when not leader.
    term: Option<u64>,
    deadlines: HashMap<i64, Instant>,
}

impl LeaseClock {
    /// Records who leads. On becoming leader in a new term every deadline is forgotten, so each
    /// lease is given its full TTL again; on losing leadership the clock is cleared.
    pub fn set_leader_term(&mut self, term: Option<u64>) {
        if self.term != term {
            self.deadlines.clear();
            self.term = term;
        }
    }

    pub fn is_leader(&self) -> bool {
        self.term.is_some()
    }

    /// The deadline of a lease, starting a full TTL now if it has none yet.
    pub fn deadline(&mut self, id: i64, ttl_seconds: i64, now: Instant) -> Instant {
        *self.deadlines.entry(id).or_insert_with(|| now + ttl(ttl_seconds))
    }

    /// A keep-alive: the lease lives a full TTL from now. Refused (returns `false`) once the
    /// lease's deadline has passed on this leader: from that moment the expiry task has
    /// proposed, or is about to propose, its revoke in this term, and that revoke will apply.
    /// Renewing then would answer the client with a TTL the lease is not going to get (found by
    /// the Jepsen lease workload: a keep-alive racing an in-flight expiry was answered "TTL 2"
    /// and the lease vanished 0.3 s later). etcd's lessor refuses such renewals the same way.
    pub fn renew(&mut self, id: i64, ttl_seconds: i64, now: Instant) -> bool {
        if self.deadlines.get(&id).is_some_and(|d| *d <= now) {
            return false;
        }
        self.deadlines.insert(id, now + ttl(ttl_seconds));
        true
    }

    /// Seconds left, rounded up (as etcd reports it), never negative.
    pub fn remaining_seconds(&mut self, id: i64, ttl_seconds: i64, now: Instant) -> i64 {
        let left = self.deadline(id, ttl_seconds, now).saturating_duration_since(now);
        let secs = left.as_secs() as i64;
        if left.subsec_nanos() > 0 {
            secs + 1
        } else {
            secs
        }
    }

    /// Leases whose deadline has passed, given the live leases `(id, ttl)`; forgets deadlines
    /// of leases that no longer exist.
    pub fn expired(
        &mut self,
        live: impl IntoIterator<Item = (i64, i64)>,
        now: Instant,
    ) -> Vec<i64> {
        let mut seen = HashMap::new();
        let mut out = Vec::new();
        for (id, ttl_seconds) in live {
            let d = self.deadline(id, ttl_seconds, now);
            seen.insert(id, d);
            if d <= now {
                out.push(id);
            }
        }
        self.deadlines = seen;
        out.sort_unstable();
        out
    }
}

fn ttl(seconds: i64) -> Duration {
    Duration::from_secs(seconds.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_after_the_deadline_is_refused() {
        let t0 = Instant::now();
        let mut c = LeaseClock::default();
        c.set_leader_term(Some(2));
        c.deadline(1, 2, t0);
        // Before the deadline a keep-alive extends the lease...
        assert!(c.renew(1, 2, t0 + Duration::from_millis(1900)));
        // ...but once the deadline has passed the expiry may already be proposed: refused, and
        // the lease stays expired.
        assert!(!c.renew(1, 2, t0 + Duration::from_millis(3900)));
        assert_eq!(c.expired([(1, 2)], t0 + Duration::from_millis(3900)), vec![1]);
        // A new leader term gives every lease its full TTL again, so it may be renewed.
        c.set_leader_term(Some(3));
        assert!(c.renew(1, 2, t0 + Duration::from_millis(4000)));
    }

    #[test]
    fn new_leader_gives_full_ttl_and_keepalive_extends() {
        let t0 = Instant::now();
        let mut c = LeaseClock::default();
        c.set_leader_term(Some(2));
        assert!(c.expired([(1, 10)], t0).is_empty());
        assert_eq!(c.remaining_seconds(1, 10, t0 + Duration::from_millis(500)), 10);
        assert_eq!(c.expired([(1, 10)], t0 + Duration::from_secs(10)), vec![1]);
        // A keep-alive at t0+9s moves the deadline to t0+19s.
        let mut c = LeaseClock::default();
        c.set_leader_term(Some(2));
        c.deadline(1, 10, t0);
        c.renew(1, 10, t0 + Duration::from_secs(9));
        assert!(c.expired([(1, 10)], t0 + Duration::from_secs(18)).is_empty());
        // Leadership moves: the next leader term restarts the lease's full TTL.
        c.set_leader_term(Some(3));
        assert!(c.expired([(1, 10)], t0 + Duration::from_secs(25)).is_empty());
        assert_eq!(c.expired([(1, 10)], t0 + Duration::from_secs(35)), vec![1]);
        // Revoked leases drop out of the clock.
        c.expired(std::iter::empty(), t0 + Duration::from_secs(36));
        assert_eq!(c.remaining_seconds(1, 10, t0 + Duration::from_secs(36)), 10);
    }
}
