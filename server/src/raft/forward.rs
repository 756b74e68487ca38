//! Forwarding from followers, grouped: concurrent proposals that reach a follower travel to the
//! leader together, one `ForwardBatch` RPC per group instead of one `Forward` RPC per command.
//!
//! Two thirds of a three-member cluster's clients talk to a follower, and a unary gRPC call
//! costs both ends far more CPU than the command it carries (HTTP/2 framing, header
//! encoding, a task per stream). The follower queues forwarded commands in a
//! [`ProposalBatcher`] whose sink is one RPC per group; the leader proposes each command of the
//! group as if it had been forwarded alone (so they join its own group commit) and answers one
//! outcome per command, in order.
//!
//! # Outcomes
//!
//! Each caller keeps the single-command rules: a "not leader" outcome (the leader refused the
//! command before appending it) or an RPC that never left this member is safe to retry; a
//! connection that broke after sending, or a group that outlived the request timeout, leaves
//! the outcome unknown and is never retried.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::future::{join_all, BoxFuture};
use futures::FutureExt;
use parking_lot::Mutex;
use picket_proto::picket::raft::v1::forward_outcome::Outcome;
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::{
    CommandError, ForwardBatchRequest, ForwardOutcome, ForwardRequest, RaftCommand,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::batcher::{Applied, BatchSink};
use super::proposer::{never_sent, ProposeError, Proposer, NOT_LEADER};
use super::relay::{Failure, LeaderRelay};
use super::types::Command;

/// Groups in flight from one follower at once: enough that a command reaching a follower goes
/// to the leader at once (grouped only with commands that arrived together), and joins the
/// leader's next entry as a command on the leader itself would.
///
/// It was two when each group was its own unary RPC. A group holds its slot until the leader
/// has applied it and answered, and the leader starts its next entry as soon as it has applied
/// the previous one; so with two groups out (one inside the leader's current entry, one queued
/// for the next), a command arriving at the follower waited for a slot, and reached the leader
/// after the next entry had started: a whole entry later than on the leader (a grant or revoke
/// through a follower took 3.0-3.4 ms against 1.9 on the leader under lease cycle x16). On the
/// relay stream a group is one message each way, so waiting to group more saved little: 32
/// against 2, every row ahead in 4 of 4 rounds, lease cycle x16 +18 % (CPU per cycle -13 %),
/// queue x16 +12 %, lock uncontended +11 %, put x64 +5 % (docs/benchmarks.md, "Issue 20,
/// session 32"). Still a bound: the leader reads at most `relay_serve::MAX_CALLS` calls at
/// once from each stream.
pub const MAX_IN_FLIGHT: usize = 32;

/// How a forwarding member reaches the leader; the proposer implements it.
pub trait LeaderLink: Send + Sync + 'static {
    /// The current leader's relay (`super::relay`), or `None` when no other member is known to
    /// lead.
    fn leader(&self) -> Option<LeaderRelay>;
    /// The bound on one group's round trip: the request timeout.
    fn timeout(&self) -> Duration;
}

/// How long a follower forwards command by command after a leader answered `ForwardBatch`
/// with Unimplemented (a leader from before it, during a rolling upgrade). After that it tries
/// `ForwardBatch` again, so an upgraded leader is used fully within a minute.
const LEGACY_FORWARD_FOR: Duration = Duration::from_secs(60);

/// The follower's batch sink: one `ForwardBatch` RPC to the current leader per group.
pub struct Forwarder<L> {
    link: Weak<L>,
    /// Until when to use the single-command `Forward` RPC (see [`LEGACY_FORWARD_FOR`]).
    legacy_until: Arc<Mutex<Option<Instant>>>,
}

impl<L> Forwarder<L> {
    pub fn new(link: Weak<L>) -> Self {
        Self { link, legacy_until: Arc::default() }
    }
}

impl<L: LeaderLink> BatchSink for Forwarder<L> {
    fn send(
        &self,
        cmds: Vec<RaftCommand>,
    ) -> BoxFuture<'static, Vec<Result<Applied, ProposeError>>> {
        let link = self.link.upgrade();
        let legacy_until = self.legacy_until.clone();
        async move {
            let n = cmds.len();
            let Some(link) = link else { return vec![Err(ProposeError::Stopped); n] };
            // No leader known (or this member just became it): nothing was sent, so every
            // caller may retry, and will find the leader (or propose locally) next time.
            let Some(leader) = link.leader() else {
                return vec![Err(ProposeError::NotLeader(None)); n];
            };
            let legacy = legacy_until.lock().is_some_and(|t| Instant::now() < t);
            let group = async {
                if legacy {
                    forward_one_by_one(leader.client, cmds).await
                } else {
                    forward_group(&leader, cmds, &legacy_until).await
                }
            };
            // Bounded so a stalled connection cannot hold an in-flight slot (and every command
            // queued behind it) forever. Safe: the callers' own deadlines are no longer than
            // this, and a group that times out is reported indeterminate, never retried.
            match tokio::time::timeout(link.timeout(), group).await {
                Ok(outcomes) => outcomes,
                Err(_) => vec![Err(ProposeError::Timeout); n],
            }
        }
        .boxed()
    }
}

pub(super) async fn forward_group(
    leader: &LeaderRelay,
    cmds: Vec<RaftCommand>,
    legacy_until: &Mutex<Option<Instant>>,
) -> Vec<Result<Applied, ProposeError>> {
    let n = cmds.len();
    match leader.forward_batch(ForwardBatchRequest { commands: cmds }).await {
        Ok(resp) => {
            let outcomes = resp.outcomes;
            if outcomes.len() != n {
                // The commands reached the leader, so their outcome is unknown: never retried.
                tracing::error!(commands = n, outcomes = outcomes.len(), "malformed forward reply");
                return vec![Err(ProposeError::Timeout); n];
            }
            outcomes.into_iter().map(from_outcome).collect()
        }
        // A leader from before ForwardBatch (a rolling upgrade) refused the RPC without looking
        // at the commands: nothing was appended, so the callers retry (they keep their
        // commands), and meanwhile this follower forwards one command per RPC.
        Err(Failure::Status(s)) if s.code() == Code::Unimplemented => {
            tracing::info!("leader lacks ForwardBatch; forwarding one command per RPC for a while");
            *legacy_until.lock() = Some(Instant::now() + LEGACY_FORWARD_FOR);
            vec![Err(ProposeError::NotLeader(None)); n]
        }
        // Nothing reached the leader: a leader without the relay stream (the next attempt uses
        // the unary call), or a stream that was already over (the next attempt opens a new
        // one). The callers retry, keeping their commands.
        Err(Failure::Unsupported | Failure::NotSent) => vec![Err(ProposeError::NotLeader(None)); n],
        Err(Failure::Status(s)) => vec![Err(rpc_failure(s)); n],
    }
}

/// Forwarding as before `ForwardBatch`: one `Forward` RPC per command, concurrently.
async fn forward_one_by_one(
    client: RaftServiceClient<Channel>,
    cmds: Vec<RaftCommand>,
) -> Vec<Result<Applied, ProposeError>> {
    join_all(cmds.into_iter().map(|c| {
        let mut client = client.clone();
        async move {
            match client.forward(ForwardRequest { command: Some(c) }).await {
                // The single-command reply carries no entry index: nothing to wait for, as
                // before this member learned to wait.
                Ok(r) => Ok(Applied { result: r.into_inner(), log_index: 0 }),
                Err(s) => Err(rpc_failure(s)),
            }
        }
    }))
    .await
}

/// What a failed forwarding RPC means for each command it carried. Only two failures are
/// definite: the leader's "not leader" refusal (before appending) and a request that never left
/// this member. Any other error came after the request may have reached the leader, which may
/// have applied the commands (a reply it could not deliver, a decode error of a large reply, a
/// broken connection): their outcome is unknown, and reporting a failure would invite a retry
/// that applies them twice (issue 19, finding 3).
fn rpc_failure(s: Status) -> ProposeError {
    if s.message().starts_with(NOT_LEADER) || never_sent(&s) {
        // The leader refused before appending, or the request never left: safe to retry.
        ProposeError::NotLeader(None)
    } else {
        tracing::warn!(error = %s, "forwarded proposal failed after it may have been sent");
        ProposeError::Timeout
    }
}

/// A leader's outcome for one forwarded command, as the follower's caller sees it.
fn from_outcome(o: ForwardOutcome) -> Result<Applied, ProposeError> {
    match o.outcome {
        Some(Outcome::Result(result)) => Ok(Applied { result, log_index: o.log_index }),
        Some(Outcome::Error(e)) => {
            let s = Status::new(Code::from_i32(e.code as i32), e.message);
            if s.message().starts_with(NOT_LEADER) {
                Err(ProposeError::NotLeader(None))
            } else {
                Err(ProposeError::Remote(s))
            }
        }
        // The leader always sets one; an empty outcome leaves the command's fate unknown.
        None => Err(ProposeError::Timeout),
    }
}

/// On the leader: proposes every forwarded command locally, concurrently and in order (so they
/// queue for the leader's group commit in the follower's order), and answers one outcome each.
pub async fn serve_group(proposer: &Proposer, cmds: Vec<RaftCommand>) -> Vec<ForwardOutcome> {
    join_all(cmds.into_iter().map(|c| proposer.propose_local(Command::new(c))))
        .await
        .into_iter()
        .map(|r| ForwardOutcome {
            log_index: r.as_ref().map_or(0, |a| a.log_index),
            outcome: Some(match r {
                Ok(applied) => Outcome::Result(applied.result),
                Err(e) => {
                    let s = e.into_status();
                    // Not a refusal (no kind): the transport's own status, read by its code.
                    Outcome::Error(CommandError {
                        code: s.code() as u32,
                        message: s.message().to_string(),
                        ..Default::default()
                    })
                }
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use picket_proto::picket::raft::v1::CommandResult;

    #[test]
    fn outcomes_keep_the_single_forward_rules() {
        let result = CommandResult::default();
        let ok = ForwardOutcome { outcome: Some(Outcome::Result(result.clone())), log_index: 7 };
        // The entry's index travels with the result, so the follower can wait for it.
        assert_eq!(from_outcome(ok).unwrap(), Applied { result, log_index: 7 });

        let refused = ForwardOutcome {
            outcome: Some(Outcome::Error(CommandError {
                code: Code::Unavailable as u32,
                message: ProposeError::NotLeader(None).to_string(),
                ..Default::default()
            })),
            log_index: 0,
        };
        assert!(matches!(from_outcome(refused), Err(ProposeError::NotLeader(None))));

        let failed = ForwardOutcome {
            outcome: Some(Outcome::Error(CommandError {
                code: Code::InvalidArgument as u32,
                message: "picket: bad".into(),
                ..Default::default()
            })),
            log_index: 0,
        };
        match from_outcome(failed) {
            Err(ProposeError::Remote(s)) => {
                assert_eq!(s.code(), Code::InvalidArgument);
                assert_eq!(s.message(), "picket: bad");
            }
            other => panic!("expected a remote error, got {other:?}"),
        }
        assert!(matches!(
            from_outcome(ForwardOutcome { outcome: None, log_index: 0 }),
            Err(ProposeError::Timeout)
        ));
    }

    #[test]
    fn rpc_failures_are_retried_only_when_nothing_was_appended() {
        let not_leader = Status::unavailable(ProposeError::NotLeader(None).to_string());
        assert!(matches!(rpc_failure(not_leader), ProposeError::NotLeader(None)));
        assert!(matches!(rpc_failure(Status::unavailable("broken pipe")), ProposeError::Timeout));
        assert!(matches!(rpc_failure(Status::unknown("reset")), ProposeError::Timeout));
        // A reply the follower could not decode (it was over a size limit) after the leader
        // applied the commands: unknown, never a failure. Seen failing on 163ae63 (Remote).
        let too_big = Status::out_of_range("decoded message length too large");
        assert!(matches!(rpc_failure(too_big), ProposeError::Timeout));
        assert!(matches!(
            rpc_failure(Status::resource_exhausted("too big")),
            ProposeError::Timeout
        ));
    }
}
