//! Turns client requests into Raft proposals and linearizable read points on any member.
//!
//! On the leader a proposal goes straight to `client_write`. On a follower it is forwarded to
//! the leader over the peer service; reads ask the leader for a read index and wait until the
//! local state machine has applied it (etcd's ReadIndex on followers). Retries are limited to
//! cases where the outcome is known: a request the leader refused before appending it, or one
//! that never left this node. Anything else is reported as indeterminate, never retried.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use parking_lot::Mutex;
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::{CommandResult, ForwardRequest, ReadIndexRequest};
use thiserror::Error;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::network::peer_channel;
use super::types::{Command, NodeId, Raft};

/// Marker at the start of the status message a member returns when it refused a forwarded
/// request because it is not the leader. The request was not appended, so it is safe to retry.
const NOT_LEADER: &str = "picket: not leader";

/// Pause between attempts while the cluster has no known leader. Short, because an election
/// takes a few hundred milliseconds; bounded overall by the request deadline.
const NO_LEADER_BACKOFF: Duration = Duration::from_millis(50);

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This member is not the leader; the hint names the leader if known. Not applied.
    #[error("{NOT_LEADER}")]
    NotLeader(Option<NodeId>),
    /// No leader could be found before the deadline. Not applied.
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The deadline passed with the outcome unknown: the request may or may not be applied.
    #[error("etcdserver: request timed out")]
    Timeout,
    /// The leader answered with an error (for example a forwarded request it could not finish).
    #[error("{0}")]
    Remote(Status),
    /// Raft stopped on this node (shutdown or a fatal storage error).
    #[error("etcdserver: server stopped")]
    Stopped,
}

impl ProposeError {
    pub fn into_status(self) -> Status {
        match self {
            ProposeError::Remote(s) => s,
            e => Status::new(Code::Unavailable, e.to_string()),
        }
    }
}

#[derive(Clone)]
pub struct Proposer {
    inner: Arc<Inner>,
}

struct Inner {
    raft: Raft,
    node_id: NodeId,
    request_timeout: Duration,
    peers: Mutex<HashMap<String, RaftServiceClient<Channel>>>,
    /// While set and in the future, this member acts as if it were not the leader: a leader
    /// transfer (`raft::transfer`) stops all leader traffic so the followers' leader leases run
    /// out and the chosen member can win an election.
    paused_until: Mutex<Option<Instant>>,
}

impl Proposer {
    pub fn new(raft: Raft, node_id: NodeId, request_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                raft,
                node_id,
                request_timeout,
                peers: Mutex::new(HashMap::new()),
                paused_until: Mutex::new(None),
            }),
        }
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// Refuses local proposals and read indexes until `until` (or [`Proposer::resume`]), as a
    /// non-leader would: callers retry, and find the new leader once the transfer is done.
    pub fn pause_until(&self, until: Instant) {
        *self.inner.paused_until.lock() = Some(until);
    }

    /// Ends a pause started by [`Proposer::pause_until`].
    pub fn resume(&self) {
        *self.inner.paused_until.lock() = None;
    }

    fn paused(&self) -> bool {
        self.inner.paused_until.lock().is_some_and(|t| Instant::now() < t)
    }

    /// Proposes on this member only; fails with `NotLeader` if it is not the leader.
    pub async fn propose_local(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        if self.paused() {
            // Nothing was appended, so the caller may retry (elsewhere) safely.
            return Err(ProposeError::NotLeader(None));
        }
        match self.inner.raft.client_write(cmd).await {
            Ok(resp) => Ok(resp.data.0),
            // openraft answers ForwardToLeader either before appending or after the entry was
            // truncated by a new leader; in both cases it is not and never will be committed.
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(ProposeError::NotLeader(f.leader_id))
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(ProposeError::Remote(Status::internal(e.to_string())))
            }
            Err(RaftError::Fatal(e)) => {
                tracing::error!(error = %e, "raft stopped");
                Err(ProposeError::Stopped)
            }
        }
    }

    /// Proposes a command from any member and returns its deterministic result, within the
    /// request timeout.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        let deadline = Instant::now() + self.inner.request_timeout;
        match tokio::time::timeout_at(deadline, self.propose_until(cmd, deadline)).await {
            Ok(r) => r,
            Err(_) => Err(ProposeError::Timeout),
        }
    }

    async fn propose_until(
        &self,
        cmd: Command,
        deadline: Instant,
    ) -> Result<CommandResult, ProposeError> {
        loop {
            match self.propose_local(cmd.clone()).await {
                Err(ProposeError::NotLeader(Some(leader))) if leader != self.inner.node_id => {
                    let Some(mut client) = self.peer_client(leader) else {
                        tokio::time::sleep(NO_LEADER_BACKOFF).await;
                        continue;
                    };
                    let req = ForwardRequest { command: Some(cmd.0.clone()) };
                    match client.forward(req).await {
                        Ok(resp) => return Ok(resp.into_inner()),
                        // Retry: the leader refused before appending, or the connection was
                        // never made, so the request cannot have been applied.
                        Err(s) if s.message().starts_with(NOT_LEADER) || never_sent(&s) => {
                            tokio::time::sleep(NO_LEADER_BACKOFF).await;
                        }
                        Err(s) if s.code() == Code::Unavailable || s.code() == Code::Unknown => {
                            // The connection broke after the request may have reached the
                            // leader: the outcome is unknown, so do not retry.
                            tracing::warn!(node_id = leader, error = %s, "forwarded proposal failed");
                            return Err(ProposeError::Timeout);
                        }
                        Err(s) => return Err(ProposeError::Remote(s)),
                    }
                }
                Err(ProposeError::NotLeader(_)) => {
                    if Instant::now() + NO_LEADER_BACKOFF >= deadline {
                        return Err(ProposeError::NoLeader);
                    }
                    tokio::time::sleep(NO_LEADER_BACKOFF).await;
                }
                other => return other,
            }
        }
    }

    /// On the leader: confirms leadership with a quorum, waits until the local state machine
    /// has applied everything committed before the call, and returns that index.
    pub async fn local_read_index(&self) -> Result<u64, ProposeError> {
        if self.paused() {
            return Err(ProposeError::NotLeader(None));
        }
        match self.inner.raft.ensure_linearizable().await {
            Ok(log_id) => Ok(log_id.map(|l| l.index).unwrap_or(0)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ProposeError::NotLeader(f.leader_id))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
                Err(ProposeError::NoLeader)
            }
            Err(RaftError::Fatal(_)) => Err(ProposeError::Stopped),
        }
    }

    /// Waits until a read served from the local state machine afterwards is linearizable.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let deadline = Instant::now() + self.inner.request_timeout;
        match tokio::time::timeout_at(deadline, self.read_barrier_until(deadline)).await {
            Ok(r) => r,
            Err(_) => Err(ProposeError::Timeout),
        }
    }

    async fn read_barrier_until(&self, deadline: Instant) -> Result<(), ProposeError> {
        loop {
            match self.local_read_index().await {
                Ok(_) => return Ok(()),
                Err(ProposeError::NotLeader(Some(leader))) if leader != self.inner.node_id => {
                    let Some(mut client) = self.peer_client(leader) else {
                        tokio::time::sleep(NO_LEADER_BACKOFF).await;
                        continue;
                    };
                    match client.read_index(ReadIndexRequest {}).await {
                        Ok(resp) => {
                            let index = resp.into_inner().read_index;
                            let remaining = deadline.saturating_duration_since(Instant::now());
                            return self
                                .inner
                                .raft
                                .wait(Some(remaining))
                                .applied_index_at_least(Some(index), "read index")
                                .await
                                .map(|_| ())
                                .map_err(|_| ProposeError::Timeout);
                        }
                        // Reads change nothing, so any failure is safe to retry until the
                        // deadline.
                        Err(s) => {
                            tracing::debug!(node_id = leader, error = %s, "read index failed");
                            tokio::time::sleep(NO_LEADER_BACKOFF).await;
                        }
                    }
                }
                Err(ProposeError::NotLeader(_)) | Err(ProposeError::NoLeader) => {
                    if Instant::now() + NO_LEADER_BACKOFF >= deadline {
                        return Err(ProposeError::NoLeader);
                    }
                    tokio::time::sleep(NO_LEADER_BACKOFF).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A client for the current leader, if one is known and it is not this member.
    pub fn leader_client(&self) -> Option<RaftServiceClient<Channel>> {
        let leader = self.inner.raft.metrics().borrow().current_leader?;
        if leader == self.inner.node_id {
            return None;
        }
        self.peer_client(leader)
    }

    /// The peer URL of `node_id` according to the current membership, with a cached client.
    fn peer_client(&self, node_id: NodeId) -> Option<RaftServiceClient<Channel>> {
        let url = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow();
            m.membership_config.membership().get_node(&node_id)?.peer_urls.first()?.clone()
        };
        let mut peers = self.inner.peers.lock();
        if let Some(c) = peers.get(&url) {
            return Some(c.clone());
        }
        let client = RaftServiceClient::new(peer_channel(&url).ok()?);
        peers.insert(url, client.clone());
        Some(client)
    }
}

/// True when tonic failed before the request left this node (no connection could be made).
fn never_sent(s: &Status) -> bool {
    use std::error::Error as _;
    let mut source = s.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        source = e.source();
    }
    false
}
