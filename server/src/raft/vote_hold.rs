//! A restarted member refuses votes for one leader lease.
//!
//! A follower that accepts a message from an established leader promises, for one leader lease
//! (`election_timeout_max`) from then, to vote for nobody else: openraft's followers refuse vote
//! and Pre-Vote requests while that lease runs. openraft keeps the lease in memory only, so a
//! member that crashed and came back at once would start with none and could vote at once,
//! breaking a promise it made before the crash. The leader counts on that promise when it
//! confirms a keep-alive by a recent quorum acknowledgement instead of a heartbeat round
//! (`super::proposer::keep_alive_lease_age`).
//!
//! So a member whose stored vote names an established leader (a committed vote: it accepted
//! that leader's messages, and may have promised) refuses vote and Pre-Vote requests until one
//! leader lease after it started; a promise made before the crash ran out by then, since it was
//! made before this start. A member whose stored vote is not committed (a new member, or one
//! that last voted for a candidate, which it only does once its lease ran out) promised nothing
//! and votes at once, so a new cluster elects its first leader as fast as before.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::types::{Raft, Vote};

/// Until when this member refuses votes, if at all.
#[derive(Clone, Copy, Debug)]
pub struct VoteHold {
    until: Option<Instant>,
}

impl VoteHold {
    /// For a member that started at `started` (before its Raft core could answer anything)
    /// with a stored vote that is `committed` or not.
    pub fn at_start(committed: bool, started: Instant, leader_lease: Duration) -> Self {
        Self { until: committed.then(|| started + leader_lease) }
    }

    /// No hold: votes are answered at once.
    pub fn none() -> Self {
        Self { until: None }
    }

    /// For `raft`, whose core started after `started` on a store that held `stored` as its
    /// vote. (openraft's metrics show no vote until its first flush, so the caller reads the
    /// store's own before handing it over.)
    pub fn for_raft(raft: &Raft, stored: Option<&Vote>, started: Instant) -> Self {
        let leader_lease = Duration::from_millis(raft.config().election_timeout_max);
        let committed = stored.is_some_and(|v| v.is_committed());
        if committed {
            tracing::info!(
                hold_ms = leader_lease.as_millis() as u64,
                "restarted under an established leader: refusing votes for one leader lease"
            );
        }
        Self::at_start(committed, started, leader_lease)
    }

    /// Refuses a vote or Pre-Vote request that arrives at `now` while the hold lasts. The
    /// candidate counts the refusal as a vote not granted and campaigns again after its
    /// election timeout, as after any unreachable voter.
    pub fn check(&self, now: Instant) -> Result<(), Status> {
        match self.until {
            Some(until) if now < until => Err(Status::unavailable(format!(
                "picket: this member restarted and holds its vote for another {} ms (one \
                 leader lease), so it cannot break a lease it may have granted before",
                (until - now).as_millis()
            ))),
            _ => Ok(()),
        }
    }
}
