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

use picket_proto::picket::raft::v1::CampaignRequest;
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
    control.raft().trigger().elect().await.map_err(|_| MembershipError::Stopped)
}
