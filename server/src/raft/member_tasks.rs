//! Background tasks of a member's lifecycle in the cluster:
//!
//! - [`publish`]: records this member's name and client URLs in its membership entry once it
//!   has joined (etcd's `publish`), so `member list` and `etcdctl --cluster` can reach it.
//! - [`watch_removal`]: notices that this member was removed and stops it. A member learns it
//!   directly when it applies the membership without itself (always the case for a removed
//!   leader). A removed follower usually never receives that entry (the leader stops
//!   replicating to it), so a member that has been without a leader for a while asks its peers
//!   for their membership; a newer membership without it means it was removed.
//! - [`auto_promote`]: promotes a member added as a voter once it has caught up as a learner.
//! - [`leave_joint`]: on the leader, completes a joint configuration that a change cut off
//!   between its two steps left behind (etcd raft's auto-leave).

use std::time::Duration;

use picket_proto::etcdserverpb::MemberPromoteRequest;
use picket_proto::picket::raft::v1::cluster_op::Op;
use picket_proto::picket::raft::v1::{MembershipQuery, PublishMember};
use tokio::sync::watch;
use tokio::time::Instant;

use super::membership::{ClusterControl, MembershipError};
use super::types::NodeId;

/// Pause between publish attempts. Publishing is idempotent, so retrying until it works (or the
/// member stops) is safe; etcd retries its publish the same way.
const PUBLISH_RETRY: Duration = Duration::from_millis(500);

/// How often the removal watcher looks at the membership.
const REMOVAL_POLL: Duration = Duration::from_millis(500);

/// How long a member answers in-flight requests after learning it was removed, before it shuts
/// down: long enough for the reply to the `MemberRemove` that removed it (which it may be
/// serving itself, as leader) to reach the client.
const REMOVED_GRACE: Duration = Duration::from_secs(1);

/// Per-peer timeout of a removal check; a peer that does not answer in time is asked again at
/// the next check.
const PEER_QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a member added as a voter may take to catch up before the background promotion
/// gives up (logged; the operator can still run `member promote`). Generous: catching up may
/// need a large snapshot, and the member may be started some time after `member add`.
const AUTO_PROMOTE_TIMEOUT: Duration = Duration::from_secs(600);

/// Pause between promotion attempts of a learner that is not caught up yet.
const AUTO_PROMOTE_RETRY: Duration = Duration::from_millis(500);

/// How often every member checks for a joint configuration to leave. Cheap (two watch reads
/// when there is none), and short so a removal cut off by its request timeout completes before
/// anyone reads the member list and takes it for not applied.
const JOINT_POLL: Duration = Duration::from_millis(200);

/// Pause after a failed attempt to leave a joint configuration. A failure is a timeout or a
/// failed leader transfer, and each transfer attempt holds the leader's writes back for a
/// leader lease: retrying every [`JOINT_POLL`] while, say, the chosen member is down would stall
/// writes over and over.
const JOINT_RETRY: Duration = Duration::from_secs(2);

/// Sleeps for `d`, or returns `false` early if the member is stopping.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    if *stop.borrow() {
        return false;
    }
    let stopped = tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    !stopped && !*stop.borrow()
}

/// Publishes `name` and `client_urls` into this member's entry, retrying until the applied
/// membership shows them or the member stops.
pub async fn publish(control: ClusterControl, name: String, client_urls: Vec<String>) {
    let mut stop = control.stop_signal();
    let id = control.node_id();
    loop {
        let applied = control.shared().membership();
        match applied.membership().get_node(&id) {
            Some(node) if node.name == name && node.client_urls == client_urls => {
                tracing::info!(node_id = id, %name, ?client_urls, "member published");
                return;
            }
            // Not a member (yet): a joining member waits for the leader to replicate to it.
            None => {}
            Some(_) if control.leader().is_none() => {}
            Some(_) => {
                let op = Op::Publish(PublishMember {
                    id,
                    name: name.clone(),
                    client_urls: client_urls.clone(),
                });
                if let Err(e) = control.execute(op).await {
                    tracing::warn!(node_id = id, error = %e, "publishing member failed; retrying");
                }
            }
        }
        if !pause(&mut stop, PUBLISH_RETRY).await {
            return;
        }
    }
}

/// Whether a peer's view shows that this member was removed: the peer follows a leader and
/// applied a newer membership than ours, without us in it.
async fn removed_per_peers(control: &ClusterControl, our_index: u64) -> bool {
    let applied = control.shared().membership();
    let urls: Vec<String> = applied
        .membership()
        .nodes()
        .filter(|(id, _)| **id != control.node_id())
        .filter_map(|(_, n)| n.peer_urls.first().cloned())
        .collect();
    for url in urls {
        let Some(mut client) = control.client_for(&url) else { continue };
        let view =
            match tokio::time::timeout(PEER_QUERY_TIMEOUT, client.membership(MembershipQuery {}))
                .await
            {
                Ok(Ok(v)) => v.into_inner(),
                _ => continue,
            };
        if view.cluster_id == control.cluster_id()
            && view.leader_id != 0
            && view.config_index > our_index
            && !view.members.iter().any(|m| m.id == control.node_id())
        {
            tracing::info!(peer = view.member_id, "peer's membership no longer contains us");
            return true;
        }
    }
    false
}

/// Watches for this member's removal; on removal refuses client requests, reports NOT_SERVING
/// and stops the member after [`REMOVED_GRACE`].
pub async fn watch_removal(control: ClusterControl, health: tonic_health::server::HealthReporter) {
    let mut stop = control.stop_signal();
    let id = control.node_id();
    // Only a member that has been in the membership can be removed; a joining member waits.
    let mut was_member = false;
    let mut leaderless_since: Option<Instant> = None;
    // Ask peers after this long without a leader: past one leader lease and an election, a
    // healthy member has a leader again.
    let ask_after = 2 * control.leader_lease();
    let mut last_asked: Option<Instant> = None;
    loop {
        if !pause(&mut stop, REMOVAL_POLL).await {
            return;
        }
        let applied = control.shared().membership();
        let in_applied = applied.membership().get_node(&id).is_some();
        let mut removed = false;
        if in_applied {
            was_member = true;
        } else if was_member {
            tracing::info!(node_id = id, "applied membership no longer contains this member");
            removed = true;
        }
        if !removed && was_member {
            if control.leader().is_some() {
                leaderless_since = None;
            } else {
                let since = *leaderless_since.get_or_insert_with(Instant::now);
                let due = last_asked.is_none_or(|t| t.elapsed() >= ask_after);
                if since.elapsed() >= ask_after && due {
                    last_asked = Some(Instant::now());
                    let our_index = applied.log_id().map(|l| l.index + 1).unwrap_or(0);
                    removed = removed_per_peers(&control, our_index).await;
                }
            }
        }
        if removed {
            control.mark_removed();
            tracing::error!(
                node_id = id,
                "this member has been permanently removed from the cluster; shutting down"
            );
            health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
            tokio::time::sleep(REMOVED_GRACE).await;
            control.stop();
            return;
        }
    }
}

/// Promotes learner `id` (added as a voter) once it has caught up.
pub async fn auto_promote(control: ClusterControl, id: NodeId) {
    let mut stop = control.stop_signal();
    let deadline = Instant::now() + AUTO_PROMOTE_TIMEOUT;
    while Instant::now() < deadline {
        match control.execute(Op::Promote(MemberPromoteRequest { id })).await {
            Ok(_) => {
                tracing::info!(node_id = id, "added member promoted to voter");
                return;
            }
            // Already a voter (promoted by hand, or an earlier attempt whose answer was lost).
            Err(MembershipError::NotLearner) => return,
            Err(MembershipError::MemberNotFound) => {
                tracing::info!(node_id = id, "added member was removed before its promotion");
                return;
            }
            Err(MembershipError::Removed) => return,
            Err(MembershipError::LearnerNotReady) => {}
            Err(e) => tracing::debug!(node_id = id, error = %e, "promotion attempt failed"),
        }
        if !pause(&mut stop, AUTO_PROMOTE_RETRY).await {
            return;
        }
    }
    tracing::warn!(
        node_id = id,
        "added member did not catch up within {AUTO_PROMOTE_TIMEOUT:?}; it stays a learner \
         (promote it with `member promote` once it runs)"
    );
}

/// Completes joint configurations while this member leads (see
/// [`ClusterControl::leave_joint`]). A failed attempt (lost leadership, timeout, a transfer
/// handed to another member) is retried at the next poll; completing is idempotent, since the
/// target is read from the membership each time.
pub async fn leave_joint(control: ClusterControl) {
    let mut stop = control.stop_signal();
    while pause(&mut stop, JOINT_POLL).await {
        if control.is_removed() {
            return;
        }
        match control.leave_joint().await {
            Ok(true) => tracing::info!("left the joint configuration"),
            Ok(false) => {}
            Err(MembershipError::NotLeader(Some(next))) => {
                tracing::info!(next, "handed leadership over to leave the joint configuration")
            }
            Err(e) => {
                tracing::warn!(error = %e, "leaving the joint configuration failed; retrying");
                if !pause(&mut stop, JOINT_RETRY).await {
                    return;
                }
            }
        }
    }
}
