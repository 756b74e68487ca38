//! Cluster membership: etcd's MemberAdd/Promote/Remove/Update, the members' own "publish" of
//! their name and client URLs, and leader transfer, all on openraft's joint-consensus
//! membership.
//!
//! # Design
//! - **One source of truth.** The membership is openraft's: each node id maps to a
//!   [`Member`] `{ name, peer_urls, client_urls }`; voters are the ids in the (possibly joint)
//!   configuration, learners the other nodes. There is no second replicated member table, so
//!   `MemberList`, peer addressing and Raft can never disagree.
//! - **Client URLs are published through the membership.** Flags only tell a member the *peer*
//!   URLs of the others. After a member starts it proposes a `SetNodes` change that records its
//!   name and `--advertise-client-urls` in its own entry (etcd's `publish`), retrying until it
//!   is in place (see `member_tasks`). `SetNodes` keeps the voter set, so it is a single,
//!   uniform step; it is safe because it never changes peer URLs.
//! - **Changes run on the leader, one at a time.** Any member accepts a request and forwards it
//!   over `picket.raft.v1.ClusterService/Execute` to the leader, which serializes changes with a
//!   mutex.
//! - **No joint configuration is left behind.** openraft runs a voter change as two entries
//!   (joint, then new) from one call; a leader change or a request timeout between them leaves
//!   the joint configuration committed and nothing to take the second step. The leader
//!   completes such a configuration on its own (`member_tasks::leave_joint`, etcd raft's
//!   auto-leave) and before every change it runs, handing leadership over first when the new
//!   configuration leaves it out.
//! - **Retries are idempotent.** Each operation names its target state; a new member's id is
//!   chosen by the member that received the request, before anything is proposed. When an
//!   attempt's outcome is lost (leader change, broken connection), the next attempt is marked
//!   `retry`, and "already done" then counts as success.
//! - **Voters join as learners.** `MemberAdd` always adds a learner. Adding a voter then
//!   promotes it in the background once it has caught up (by snapshot if the log it needs was
//!   purged), so an added but not yet started member never counts towards the quorum.
//! - **Promotion needs a caught-up learner** (etcd's rule: its matched log index is at least
//!   90% of the leader's), else etcd's "can only promote a learner member which is in sync with
//!   leader".
//! - **Removed members stop.** A member that sees itself leave the applied membership, or that
//!   is told by a peer with a newer membership that it is no longer in it, refuses every client
//!   request and shuts down (see `member_tasks`).

use openraft::async_runtime::WatchReceiver;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, RaftMetrics, ServerState};
use parking_lot::Mutex;
use picket_proto::etcdserverpb::{
    Member as PbMember, MemberPromoteRequest, MemberRemoveRequest, MemberUpdateRequest,
    MoveLeaderRequest,
};
use picket_proto::picket::raft::v1::cluster_op::Op;
use picket_proto::picket::raft::v1::cluster_service_client::ClusterServiceClient;
use picket_proto::picket::raft::v1::{AddMember, ClusterOp, MembershipView, PublishMember};
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::network::peer_channel;
use super::proposer::Proposer;
use super::types::{Member, NodeId, Raft, TypeConfig};
use crate::storage::state_machine::Shared;

/// Marker at the start of the status a member returns when it cannot run an operation because
/// it is not the leader; the caller retries with the leader.
pub const NOT_LEADER: &str = "picket: not leader";

/// Pause between attempts while no leader is known or the leader is busy with another change.
/// Short because both last one election or one commit round trip; every loop using it is bounded
/// by a request deadline.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// How long a committed membership change may take to show in this member's metrics
/// (`until_visible`). The core publishes metrics right after it handles the change, within
/// milliseconds; 5 s covers a loaded 2-core machine.
const VISIBLE_TIMEOUT: Duration = Duration::from_secs(5);

/// A learner may be promoted once its matched log index is at least this share of the leader's
/// last log index (etcd's `readyPercent`).
const PROMOTE_READY_PERCENT: u64 = 90;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// This member is not the leader (hint: the leader, if known). Retry with the leader.
    #[error("{NOT_LEADER}")]
    NotLeader(Option<NodeId>),
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The deadline passed; the change may or may not have happened (check `member list`).
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: member not found")]
    MemberNotFound,
    #[error("etcdserver: member ID already exist")]
    MemberExists,
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlExists,
    #[error("etcdserver: given member URLs are invalid")]
    BadUrls,
    /// An `https` peer URL on members without peer TLS: no member could dial it.
    #[error(
        "picket: https peer URLs need peer TLS on the members: start them with \
         --peer-trusted-ca-file (and --peer-cert-file/--peer-key-file), or use http peer URLs"
    )]
    HttpsWithoutPeerTls,
    #[error("etcdserver: can only promote a learner member")]
    NotLearner,
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    #[error("etcdserver: re-configuration failed due to not enough started members")]
    NotEnoughMembers,
    #[error("etcdserver: bad leader transferee")]
    BadTransferee,
    #[error("etcdserver: request timed out, leader transfer took too long")]
    TransferTimeout,
    /// This member was removed from the cluster and no longer serves.
    #[error("etcdserver: the member has been permanently removed from the cluster")]
    Removed,
    #[error("etcdserver: server stopped")]
    Stopped,
    /// The leader answered with this status.
    #[error("{}", .0.message())]
    Remote(Status),
}

/// The etcd view of an openraft membership: every node, voters and learners, by id.
pub fn etcd_members(m: &openraft::Membership<NodeId, Member>) -> Vec<PbMember> {
    let voters: BTreeSet<NodeId> = m.voter_ids().collect();
    m.nodes()
        .map(|(id, node)| PbMember {
            id: *id,
            name: node.name.clone(),
            peer_ur_ls: node.peer_urls.clone(),
            client_ur_ls: node.client_urls.clone(),
            is_learner: !voters.contains(id),
        })
        .collect()
}

/// Checks that every URL is an `http://host:port` or `https://host:port` URL, as peer URLs
/// must be. `https` URLs are accepted only when `peer_tls` (this member has peer TLS
/// configured): the members dial peers with their peer certificates exactly for `https` URLs
/// (`tls::PeerDialer`), and without them no member could reach the new one.
fn check_urls(urls: &[String], peer_tls: bool) -> Result<(), MembershipError> {
    if urls.is_empty() {
        return Err(MembershipError::BadUrls);
    }
    for u in urls {
        let parsed = url::Url::parse(u).map_err(|_| MembershipError::BadUrls)?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none()
            || parsed.port().is_none()
        {
            return Err(MembershipError::BadUrls);
        }
    }
    if !peer_tls && urls.iter().any(|u| crate::tls::is_https(u)) {
        return Err(MembershipError::HttpsWithoutPeerTls);
    }
    Ok(())
}

fn urls_overlap(a: &[String], b: &[String]) -> bool {
    a.iter().any(|u| b.contains(u))
}

/// Cluster operations of one member. Cheap to clone.
#[derive(Clone)]
pub struct ClusterControl {
    inner: Arc<Inner>,
}

struct Inner {
    node_id: NodeId,
    cluster_id: u64,
    raft: Raft,
    proposer: Proposer,
    sm: Arc<Shared>,
    /// openraft's leader lease: how long followers refuse to vote after hearing from a leader.
    leader_lease: Duration,
    /// Serializes membership changes (and leader transfers) on this member while it leads.
    ops: tokio::sync::Mutex<()>,
    peers: Mutex<HashMap<String, ClusterServiceClient<Channel>>>,
    removed: AtomicBool,
    /// Sending `true` stops the member (its servers, then Raft).
    stop: watch::Sender<bool>,
}

impl ClusterControl {
    pub fn new(
        cluster_id: u64,
        proposer: Proposer,
        sm: Arc<Shared>,
        leader_lease: Duration,
        stop: watch::Sender<bool>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                node_id: proposer.node_id(),
                cluster_id,
                raft: proposer.raft().clone(),
                proposer,
                sm,
                leader_lease,
                ops: tokio::sync::Mutex::new(()),
                peers: Mutex::new(HashMap::new()),
                removed: AtomicBool::new(false),
                stop,
            }),
        }
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    pub fn cluster_id(&self) -> u64 {
        self.inner.cluster_id
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    pub(crate) fn proposer(&self) -> &Proposer {
        &self.inner.proposer
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.sm
    }

    pub(crate) fn leader_lease(&self) -> Duration {
        self.inner.leader_lease
    }

    /// The leader this member follows (or is), while it hears from it (`leader_contact`).
    pub fn leader(&self) -> Option<NodeId> {
        self.inner.proposer.leader()
    }

    pub fn metrics(&self) -> RaftMetrics<TypeConfig> {
        self.inner.raft.metrics().borrow_watched().clone()
    }

    /// True once this member has learned it was removed from the cluster.
    pub fn is_removed(&self) -> bool {
        self.inner.removed.load(Ordering::Acquire)
    }

    /// Marks this member removed: it refuses client requests from now on.
    pub(crate) fn mark_removed(&self) {
        self.inner.removed.store(true, Ordering::Release);
    }

    /// Asks the member to stop (servers, then Raft).
    pub(crate) fn stop(&self) {
        let _ = self.inner.stop.send(true);
    }

    pub(crate) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.inner.stop.subscribe()
    }

    /// The members in this member's applied (committed) membership.
    pub fn members(&self) -> Vec<PbMember> {
        etcd_members(self.inner.sm.membership().membership())
    }

    /// This member's answer to a `Membership` query from a peer.
    pub fn view(&self) -> MembershipView {
        let applied = self.inner.sm.membership();
        MembershipView {
            cluster_id: self.inner.cluster_id,
            member_id: self.inner.node_id,
            leader_id: self.leader().unwrap_or(0),
            config_index: applied.log_id().map(|l| l.index + 1).unwrap_or(0),
            members: etcd_members(applied.membership()),
        }
    }

    /// A fresh member id for `MemberAdd`: random, non-zero and unused in the current membership.
    /// Chosen before proposing, so apply stays deterministic and a retried add reuses it.
    #[allow(clippy::disallowed_methods)]
    pub fn new_member_id(&self) -> NodeId {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        loop {
            // Not in apply: the id travels inside the proposal, so every replica sees the same.
            let id = rand::random::<u64>();
            if id != 0 && m.membership_config.membership().get_node(&id).is_none() {
                return id;
            }
        }
    }

    /// Runs a cluster operation on the leader, from any member, within the request timeout.
    /// Returns the membership after it.
    pub async fn execute(&self, op: Op) -> Result<Vec<PbMember>, MembershipError> {
        let deadline = Instant::now() + self.inner.proposer.request_timeout();
        let req = ClusterOp { op: Some(op), retry: false };
        match tokio::time::timeout_at(deadline, self.execute_until(req, deadline)).await {
            Ok(r) => r,
            Err(_) => Err(MembershipError::Timeout),
        }
    }

    async fn execute_until(
        &self,
        mut req: ClusterOp,
        deadline: Instant,
    ) -> Result<Vec<PbMember>, MembershipError> {
        loop {
            if self.is_removed() {
                return Err(MembershipError::Removed);
            }
            let leader = self.leader();
            let outcome = match leader {
                Some(l) if l == self.inner.node_id => self.run_on_leader(&req, deadline).await,
                Some(l) => self.forward(l, req.clone()).await,
                None => Err(MembershipError::NotLeader(None)),
            };
            match outcome {
                // A leader that lost leadership mid-change may have committed part of it; a
                // broken connection may have lost the answer. The operations are idempotent
                // with `retry` set, so trying again (until the deadline) is safe.
                Err(MembershipError::NotLeader(_)) => {
                    if leader.is_some() {
                        req.retry = true;
                    }
                    if Instant::now() + RETRY_BACKOFF >= deadline {
                        return Err(if leader.is_some() {
                            MembershipError::Timeout
                        } else {
                            MembershipError::NoLeader
                        });
                    }
                    tokio::time::sleep(RETRY_BACKOFF).await;
                }
                other => return other,
            }
        }
    }

    fn peer_client(&self, node_id: NodeId) -> Option<ClusterServiceClient<Channel>> {
        let url = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow_watched();
            m.membership_config.membership().get_node(&node_id)?.peer_urls.first()?.clone()
        };
        self.client_for(&url)
    }

    pub(crate) fn client_for(&self, url: &str) -> Option<ClusterServiceClient<Channel>> {
        let mut peers = self.inner.peers.lock();
        if let Some(c) = peers.get(url) {
            return Some(c.clone());
        }
        let client =
            ClusterServiceClient::new(peer_channel(url, self.inner.proposer.dialer()).ok()?);
        peers.insert(url.to_string(), client.clone());
        Some(client)
    }

    async fn forward(
        &self,
        leader: NodeId,
        req: ClusterOp,
    ) -> Result<Vec<PbMember>, MembershipError> {
        let Some(mut client) = self.peer_client(leader) else {
            return Err(MembershipError::NotLeader(None));
        };
        match client.execute(req).await {
            Ok(resp) => Ok(resp.into_inner().members),
            Err(s) if s.message().starts_with(NOT_LEADER) => Err(MembershipError::NotLeader(None)),
            // Transport failures: the leader may be gone; the caller retries idempotently.
            Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                tracing::debug!(node_id = leader, error = %s, "forwarded cluster operation failed");
                Err(MembershipError::NotLeader(None))
            }
            Err(s) => Err(MembershipError::Remote(s)),
        }
    }

    /// Runs `req` on this member, which must be the leader.
    pub(crate) async fn run_on_leader(
        &self,
        req: &ClusterOp,
        deadline: Instant,
    ) -> Result<Vec<PbMember>, MembershipError> {
        let _guard = self.inner.ops.lock().await;
        self.ensure_leader()?;
        self.finish_joint(deadline).await?;
        let retry = req.retry;
        match req.op.clone() {
            Some(Op::Add(AddMember { id, peer_urls })) => self.add(id, peer_urls, retry).await?,
            Some(Op::Promote(MemberPromoteRequest { id })) => self.promote(id, retry).await?,
            Some(Op::Remove(MemberRemoveRequest { id })) => {
                self.remove(id, retry, deadline).await?
            }
            Some(Op::Update(MemberUpdateRequest { id, peer_ur_ls })) => {
                self.update(id, peer_ur_ls).await?
            }
            Some(Op::Publish(p)) => self.publish(p).await?,
            Some(Op::MoveLeader(MoveLeaderRequest { target_id })) => {
                super::transfer::transfer(self, target_id, deadline).await?
            }
            None => {
                return Err(MembershipError::Remote(Status::invalid_argument("picket: empty op")))
            }
        }
        Ok(etcd_members(self.inner.raft.metrics().borrow_watched().membership_config.membership()))
    }

    /// This member must be the leader by vote, by server state *and* as a voter: a leader that
    /// committed its own removal still names itself leader in its vote for a while, but
    /// openraft 0.9 has already demoted its server state, and a membership change submitted then
    /// trips openraft's "Only leader is allowed to call update_effective_membership()" assertion
    /// (found by the Jepsen member nemesis). `remove` hands leadership over before the leader
    /// removes itself, so this only guards the window in between.
    fn ensure_leader(&self) -> Result<(), MembershipError> {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let me = self.inner.node_id;
        let voter = m.membership_config.membership().voter_ids().any(|v| v == me);
        match m.current_leader {
            Some(l) if l == me && m.state == ServerState::Leader && voter => Ok(()),
            Some(l) if l == me => Err(MembershipError::NotLeader(None)),
            other => Err(MembershipError::NotLeader(other)),
        }
    }

    /// The leader's latest (possibly not yet committed) membership.
    fn effective(&self) -> openraft::Membership<NodeId, Member> {
        self.inner.raft.metrics().borrow_watched().membership_config.membership().clone()
    }

    /// Submits one membership change, waiting while an earlier change is still uncommitted.
    async fn change(
        &self,
        changes: ChangeMembers<NodeId, Member>,
        retain: bool,
    ) -> Result<(), MembershipError> {
        loop {
            match self.inner.raft.change_membership(changes.clone(), retain).await {
                Ok(resp) => {
                    self.until_visible(resp.log_id.index).await;
                    return Ok(());
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                    return Err(MembershipError::NotLeader(f.leader_id))
                }
                // Appended here, then truncated by a new leader (openraft 0.10): as above, the
                // caller learns who leads now and re-reads the membership before any retry.
                Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
                    return Err(MembershipError::NotLeader(f.leader_id))
                }
                Err(RaftError::APIError(ClientWriteError::PreconditionFailed(e))) => {
                    return Err(MembershipError::Remote(Status::internal(e.to_string())))
                }
                Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => match e {
                    // The previous membership entry (or, on a new leader, its first entry)
                    // commits within a round trip; the caller's deadline bounds the wait.
                    ChangeMembershipError::InProgress(_)
                    | ChangeMembershipError::UncommittedLeaderLog(_) => {
                        tokio::time::sleep(RETRY_BACKOFF).await;
                    }
                    // Picket changes membership one voter at a time through joint configs and
                    // node URLs through `SetNodes`, so neither is expected; refuse, never loop.
                    e @ (ChangeMembershipError::UnsupportedMembershipTransition(_)
                    | ChangeMembershipError::NodeMetadataChanged(_)) => {
                        return Err(MembershipError::Remote(Status::failed_precondition(
                            e.to_string(),
                        )))
                    }
                    ChangeMembershipError::EmptyMembership(_) => {
                        return Err(MembershipError::NotEnoughMembers)
                    }
                    ChangeMembershipError::LearnerNotFound(_) => {
                        return Err(MembershipError::MemberNotFound)
                    }
                },
                Err(RaftError::Fatal(e)) => {
                    tracing::error!(error = %e, "raft stopped during a membership change");
                    return Err(MembershipError::Stopped);
                }
            }
        }
    }

    /// Waits until this member's metrics show the membership written at `index`. openraft 0.10
    /// answers `change_membership` before the metrics carry the new membership, and every
    /// membership read here (the answer to MemberAdd, the promotion of an added voter, the next
    /// change) goes through the metrics: without the wait a MemberAdd answered without its
    /// member, and the promoter took a just-added learner for a removed one (seen in a
    /// fresh-machine run on dd57e35). Bounded by [`VISIBLE_TIMEOUT`]: the change is committed
    /// either way, and past the bound the caller sees what the metrics show, as it did before.
    async fn until_visible(&self, index: u64) {
        let seen = self
            .inner
            .raft
            .wait(Some(VISIBLE_TIMEOUT))
            .metrics(
                |m| m.membership_config.log_id().as_ref().is_some_and(|l| l.index >= index),
                "membership change visible in the metrics",
            )
            .await;
        if let Err(e) = seen {
            tracing::warn!(index, error = %e, "membership change not yet in the metrics");
        }
    }

    /// Completes a joint configuration by moving to its newer half. One is left behind when a
    /// change stops between its two steps: its leader lost leadership, or its request timed out
    /// (which drops openraft's `change_membership` before the second step). A leader that the
    /// newer half leaves out hands leadership to the most caught-up voter of that half first
    /// (as `remove` does) and answers `NotLeader`; the new leader then completes it.
    async fn finish_joint(&self, deadline: Instant) -> Result<(), MembershipError> {
        let m = self.effective();
        let configs = m.get_joint_config();
        if configs.len() <= 1 {
            return Ok(());
        }
        let target = configs.last().cloned().unwrap_or_default();
        let me = self.inner.node_id;
        if !target.contains(&me) {
            let Some(next) = self.most_caught_up_voter(&target, me) else {
                return Err(MembershipError::NotEnoughMembers);
            };
            tracing::warn!(
                voters = ?target,
                next,
                "membership is joint and leaves this leader out; transferring first"
            );
            super::transfer::transfer(self, next, deadline).await?;
            return Err(MembershipError::NotLeader(Some(next)));
        }
        tracing::warn!(voters = ?target, "membership is joint; completing the change");
        self.change(ChangeMembers::ReplaceAllVoters(target), false).await
    }

    /// Called periodically on every member (`member_tasks::leave_joint`): if this member leads,
    /// has applied (so committed) a joint configuration and runs no membership change of its
    /// own, completes the joint configuration, within the request timeout. Returns whether it
    /// acted. An operation in progress holds `ops` and completes (or, cut off, leaves) the
    /// configuration itself, so skipping while `ops` is held never races with it.
    pub(crate) async fn leave_joint(&self) -> Result<bool, MembershipError> {
        // Leadership first: a follower (most calls) then never copies the membership.
        if self.leader() != Some(self.inner.node_id)
            || self.inner.sm.membership().membership().get_joint_config().len() <= 1
        {
            return Ok(false);
        }
        let Ok(_guard) = self.inner.ops.try_lock() else { return Ok(false) };
        self.ensure_leader()?;
        let deadline = Instant::now() + self.inner.proposer.request_timeout();
        match tokio::time::timeout_at(deadline, self.finish_joint(deadline)).await {
            Ok(r) => r.map(|()| true),
            Err(_) => Err(MembershipError::Timeout),
        }
    }

    async fn add(
        &self,
        id: NodeId,
        peer_urls: Vec<String>,
        retry: bool,
    ) -> Result<(), MembershipError> {
        check_urls(&peer_urls, self.inner.proposer.dialer().has_peer_tls())?;
        let m = self.effective();
        if let Some(node) = m.get_node(&id) {
            if retry && node.peer_urls == peer_urls {
                return Ok(());
            }
            return Err(MembershipError::MemberExists);
        }
        if m.nodes().any(|(_, n)| urls_overlap(&n.peer_urls, &peer_urls)) {
            return Err(MembershipError::PeerUrlExists);
        }
        tracing::info!(node_id = id, ?peer_urls, "adding learner");
        let node = Member { name: String::new(), peer_urls, client_urls: Vec::new() };
        self.change(ChangeMembers::AddNodes(BTreeMap::from([(id, node)])), true).await
    }

    /// Whether learner `id` has caught up enough to be promoted (etcd's `isLearnerReady`).
    fn learner_ready(&self, id: NodeId) -> bool {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        let last = m.last_log_index.unwrap_or(0);
        let matched =
            m.replication.as_ref().and_then(|r| r.get(&id).cloned()).flatten().map(|l| l.index);
        match matched {
            Some(matched) => matched * 100 >= last * PROMOTE_READY_PERCENT,
            None => false,
        }
    }

    async fn promote(&self, id: NodeId, retry: bool) -> Result<(), MembershipError> {
        let m = self.effective();
        if m.get_node(&id).is_none() {
            return Err(MembershipError::MemberNotFound);
        }
        if m.voter_ids().any(|v| v == id) {
            return if retry { Ok(()) } else { Err(MembershipError::NotLearner) };
        }
        if !self.learner_ready(id) {
            return Err(MembershipError::LearnerNotReady);
        }
        tracing::info!(node_id = id, "promoting learner to voter");
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true).await
    }

    async fn remove(
        &self,
        id: NodeId,
        retry: bool,
        deadline: Instant,
    ) -> Result<(), MembershipError> {
        let m = self.effective();
        if m.get_node(&id).is_none() {
            return if retry { Ok(()) } else { Err(MembershipError::MemberNotFound) };
        }
        if m.voter_ids().any(|v| v == id) {
            let last = m.get_joint_config().last().cloned().unwrap_or_default();
            if last.iter().all(|v| *v == id) {
                return Err(MembershipError::NotEnoughMembers);
            }
            if id == self.inner.node_id {
                // The leader removing itself: openraft 0.9 keeps a removed leader leading (and
                // asserts on its next membership change), so hand leadership to the most
                // caught-up remaining voter first and let the caller retry there. Retrying is
                // safe: nothing was changed yet, and the retried removal is idempotent.
                let target = self.most_caught_up_voter(&last, id);
                let Some(target) = target else { return Err(MembershipError::NotEnoughMembers) };
                tracing::info!(
                    node_id = id,
                    target,
                    "leader asked to remove itself; transferring first"
                );
                super::transfer::transfer(self, target, deadline).await?;
                return Err(MembershipError::NotLeader(Some(target)));
            }
            tracing::info!(node_id = id, "removing voter");
            self.change(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await
        } else {
            tracing::info!(node_id = id, "removing learner");
            self.change(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await
        }
    }

    /// The voter in `voters` other than `except` whose replicated log reaches furthest.
    fn most_caught_up_voter(&self, voters: &BTreeSet<NodeId>, except: NodeId) -> Option<NodeId> {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow_watched();
        voters.iter().copied().filter(|v| *v != except).max_by_key(|v| {
            let matched = m.replication.as_ref().and_then(|r| r.get(v).cloned()).flatten();
            (matched.map(|l| l.index), std::cmp::Reverse(*v))
        })
    }

    async fn update(&self, id: NodeId, peer_urls: Vec<String>) -> Result<(), MembershipError> {
        check_urls(&peer_urls, self.inner.proposer.dialer().has_peer_tls())?;
        let m = self.effective();
        let node = m.get_node(&id).ok_or(MembershipError::MemberNotFound)?;
        if m.nodes().any(|(other, n)| *other != id && urls_overlap(&n.peer_urls, &peer_urls)) {
            return Err(MembershipError::PeerUrlExists);
        }
        if node.peer_urls == peer_urls {
            return Ok(());
        }
        tracing::info!(node_id = id, ?peer_urls, "updating peer URLs");
        let node = Member { peer_urls, ..node.clone() };
        self.change(ChangeMembers::SetNodes(BTreeMap::from([(id, node)])), true).await
    }

    async fn publish(&self, p: PublishMember) -> Result<(), MembershipError> {
        let m = self.effective();
        let node = m.get_node(&p.id).ok_or(MembershipError::MemberNotFound)?;
        if node.name == p.name && node.client_urls == p.client_urls {
            return Ok(());
        }
        tracing::info!(node_id = p.id, name = %p.name, client_urls = ?p.client_urls, "publishing member");
        let node = Member { name: p.name, client_urls: p.client_urls, ..node.clone() };
        self.change(ChangeMembers::SetNodes(BTreeMap::from([(p.id, node)])), true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_checks() {
        assert!(check_urls(&["http://127.0.0.1:2380".into()], false).is_ok());
        assert!(check_urls(&[], true).is_err());
        assert!(check_urls(&["127.0.0.1:2380".into()], true).is_err());
        assert!(check_urls(&["ftp://127.0.0.1:2380".into()], true).is_err());
        assert!(check_urls(&["http://127.0.0.1".into()], true).is_err());
        assert!(check_urls(&["https://127.0.0.1".into()], true).is_err());
        // https peer URLs need peer TLS (issue 19): with it they are fine, without it the
        // refusal says what is missing.
        assert!(check_urls(&["https://127.0.0.1:2380".into()], true).is_ok());
        let err = check_urls(&["https://127.0.0.1:2380".into()], false).unwrap_err();
        assert!(err.to_string().contains("--peer-trusted-ca-file"), "{err}");
        assert!(check_urls(&["http://a:1".into(), "https://b:2".into()], false).is_err());
        assert!(urls_overlap(&["a".into(), "b".into()], &["b".into()]));
        assert!(!urls_overlap(&["a".into()], &["b".into()]));
    }

    #[test]
    fn etcd_members_marks_learners_and_joint_voters() {
        let node = |n: &str| Member { name: n.into(), ..Default::default() };
        let m = openraft::Membership::new(
            vec![BTreeSet::from([1, 2]), BTreeSet::from([2, 3])],
            BTreeMap::from([(1, node("a")), (2, node("b")), (3, node("c")), (4, node("d"))]),
        )
        .expect("valid membership");
        let got: Vec<(u64, bool)> = etcd_members(&m).iter().map(|m| (m.id, m.is_learner)).collect();
        assert_eq!(got, vec![(1, false), (2, false), (3, false), (4, true)]);
    }
}
