//! Leader transfer (`Maintenance.MoveLeader`) on openraft 0.9, which has no transfer API.
//!
//! openraft followers refuse to vote while their *leader lease* is fresh: for
//! `election_timeout_max` after the last message from the leader. So a transfer makes the
//! leader fall silent, lets the leases run out, and has the target campaign first:
//!
//! 1. The leader (holding the membership-change lock) pauses itself: its proposer refuses
//!    writes and read indexes as a non-leader would (callers retry and later find the new
//!    leader) and openraft's heartbeats are switched off.
//! 2. It waits until the target has every log entry, so the target's log is at least as
//!    up-to-date as any voter's and its votes cannot be refused for the log.
//! 3. It waits one leader lease plus a margin, then asks the target to campaign
//!    (`ClusterService/Campaign` -> `trigger().elect()`). The other followers' own election
//!    timers fire only after the lease plus a randomized election timeout, so the target is
//!    normally first. It asks again if a round passes without a new leader.
//! 4. It succeeds once it follows the target. Whatever happens, the pause ends when the
//!    transfer does (a drop guard), so the cluster never stays silent.
//!
//! Writes stall for about one leader lease (`election_timeout_max`) during a transfer, as they
//! would during an election. A transfer that does not finish before the request deadline fails
//! with etcd's "leader transfer took too long"; leadership may still move afterwards.

use std::time::Duration;

use picket_proto::etcdserverpb::MoveLeaderRequest;
use picket_proto::picket::raft::v1::cluster_op::Op;
use picket_proto::picket::raft::v1::{CampaignRequest, ClusterOp, MembershipQuery};
use tokio::time::Instant;

use super::membership::{ClusterControl, MembershipError};
use super::types::NodeId;

/// Added to the leader lease before the target campaigns: covers the last in-flight append
/// reaching the followers after the leader fell silent, and clock granularity.
const LEASE_MARGIN: Duration = Duration::from_millis(200);

/// How often transfer progress is checked.
const POLL: Duration = Duration::from_millis(20);

/// Ends the pause however the transfer ends (success, error or cancellation).
struct Unpause<'a>(&'a ClusterControl);

impl Drop for Unpause<'_> {
    fn drop(&mut self) {
        self.0.proposer().resume();
        self.0.raft().runtime_config().heartbeat(true);
    }
}

/// Polls `cond` until it holds or `until` passes.
async fn wait_for(until: Instant, mut cond: impl FnMut() -> bool) -> bool {
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Moves leadership from this member (the leader) to `target`, before `deadline`.
pub(crate) async fn transfer(
    control: &ClusterControl,
    target: NodeId,
    deadline: Instant,
) -> Result<(), MembershipError> {
    let me = control.node_id();
    if target == me {
        return Ok(());
    }
    let metrics = control.metrics();
    let membership = metrics.membership_config.membership();
    if !membership.voter_ids().any(|v| v == target) {
        return Err(MembershipError::BadTransferee);
    }
    let Some(url) = membership.get_node(&target).and_then(|n| n.peer_urls.first().cloned()) else {
        return Err(MembershipError::BadTransferee);
    };
    let mut client = control.client_for(&url).ok_or(MembershipError::BadTransferee)?;
    tracing::info!(node_id = me, target, "transferring leadership");

    control.proposer().pause_until(deadline);
    control.raft().runtime_config().heartbeat(false);
    let _unpause = Unpause(control);

    // 2. The target must hold every entry the leader has.
    let caught_up = wait_for(deadline, || {
        let m = control.metrics();
        let matched = m.replication.as_ref().and_then(|r| r.get(&target).cloned()).flatten();
        matched.map(|l| l.index) >= m.last_log_index
    })
    .await;
    if !caught_up {
        return Err(MembershipError::TransferTimeout);
    }

    // 3. Let the followers' leases lapse, then have the target campaign, round after round.
    tokio::time::sleep(control.leader_lease() + LEASE_MARGIN).await;
    let round = control.leader_lease() + LEASE_MARGIN;
    while Instant::now() < deadline {
        let term = control.metrics().current_term;
        if let Err(s) = client.campaign(CampaignRequest { leader_id: me, term }).await {
            tracing::warn!(target, error = %s, "campaign request failed");
        }
        let until = (Instant::now() + round).min(deadline);
        if wait_for(until, || control.leader() == Some(target)).await {
            tracing::info!(node_id = me, target, "leadership transferred");
            return Ok(());
        }
    }
    Err(MembershipError::TransferTimeout)
}

/// How long a transfer candidate may take to answer a liveness probe at shutdown. A live peer
/// answers `Membership` from memory in milliseconds; one that does not within this bound is
/// skipped, because a transfer to it would stall writes until the shutdown bound runs out.
const SHUTDOWN_PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What a stopping member did about its leadership.
#[derive(Debug)]
#[non_exhaustive]
pub enum ShutdownTransfer {
    /// Not the leader: nothing to hand over.
    NotLeader,
    /// Leader, but it has not heard from a quorum within a leader lease, so no other member
    /// could win an election through it now; stopping at once is as good as it gets.
    NoQuorum,
    /// The only voter: there is nobody to hand leadership to.
    OnlyVoter,
    /// Leader, but no other voter answered a probe.
    NoTarget,
    /// Leadership moved to this member.
    Transferred(NodeId),
    /// The transfer to this member failed or ran out of time.
    Failed(NodeId, MembershipError),
}

/// Before a graceful stop: if this member leads, hands leadership to the most up-to-date live
/// voter, so the cluster does not sit out an election timeout after we are gone (etcd's
/// `TransferLeadership` on stop). Always returns by `deadline`.
pub(crate) async fn transfer_for_shutdown(
    control: &ClusterControl,
    deadline: Instant,
) -> ShutdownTransfer {
    let me = control.node_id();
    let m = control.metrics();
    if m.current_leader != Some(me) {
        return ShutdownTransfer::NotLeader;
    }
    let fresh = m
        .last_quorum_acked
        .as_ref()
        .is_some_and(|t| openraft::Instant::elapsed(&**t) <= control.leader_lease());
    if !fresh {
        return ShutdownTransfer::NoQuorum;
    }
    // Most caught-up voters first: the transfer waits until the target has every entry.
    let membership = m.membership_config.membership();
    let mut candidates: Vec<(Option<u64>, NodeId)> = membership
        .voter_ids()
        .filter(|&v| v != me)
        .map(|v| {
            let matched = m.replication.as_ref().and_then(|r| r.get(&v).cloned()).flatten();
            (matched.map(|l| l.index), v)
        })
        .collect();
    if candidates.is_empty() {
        return ShutdownTransfer::OnlyVoter;
    }
    candidates.sort_unstable_by(|a, b| b.cmp(a));
    let mut target = None;
    for (_, id) in candidates {
        let Some(url) = membership.get_node(&id).and_then(|n| n.peer_urls.first().cloned()) else {
            continue;
        };
        let Some(mut client) = control.client_for(&url) else { continue };
        let probe = client.membership(MembershipQuery {});
        if matches!(tokio::time::timeout(SHUTDOWN_PROBE_TIMEOUT, probe).await, Ok(Ok(_))) {
            target = Some(id);
            break;
        }
    }
    let Some(target) = target else {
        return ShutdownTransfer::NoTarget;
    };
    // Through `run_on_leader`, so the transfer holds the membership-change lock like a
    // `MoveLeader` would.
    let op = ClusterOp {
        op: Some(Op::MoveLeader(MoveLeaderRequest { target_id: target })),
        retry: false,
    };
    match tokio::time::timeout_at(deadline, control.run_on_leader(&op, deadline)).await {
        Ok(Ok(_)) => ShutdownTransfer::Transferred(target),
        Ok(Err(e)) => ShutdownTransfer::Failed(target, e),
        Err(_) => ShutdownTransfer::Failed(target, MembershipError::TransferTimeout),
    }
}

/// On the transfer target: starts an election now. A stale or repeated request only causes an
/// extra election, which Raft tolerates; it can never make two leaders.
pub(crate) async fn campaign(
    control: &ClusterControl,
    req: CampaignRequest,
) -> Result<(), MembershipError> {
    let m = control.metrics();
    if !m.membership_config.membership().voter_ids().any(|v| v == control.node_id()) {
        return Err(MembershipError::BadTransferee);
    }
    if m.current_leader == Some(control.node_id()) {
        return Ok(());
    }
    tracing::info!(
        node_id = control.node_id(),
        leader = req.leader_id,
        term = req.term,
        "campaigning at the leader's request"
    );
    control.raft().trigger().elect(false).await.map_err(|_| MembershipError::Stopped)
}
