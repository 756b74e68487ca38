//! The peer-facing gRPC service: openraft's three RPCs plus the two a follower needs to serve
//! any client request (forwarding a proposal, asking for a read index).

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use picket_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use picket_proto::picket::raft::v1::raft_service_server::RaftService;
use picket_proto::picket::raft::v1::{
    CommandResult, ForwardBatchRequest, ForwardBatchResponse, ForwardRequest, RaftFrame,
    RaftPayload, ReadIndexRequest, ReadIndexResponse, RelayRequest,
};
use tonic::{Request, Response, Status, Streaming};

use super::network::{decode, encode};
use super::proposer::{ProposeError, Proposer};
use super::snapshot_transfer::{Chunk, Receiver};
use super::types::{Command, NodeId, TypeConfig, Vote};
use super::vote_hold::VoteHold;
use crate::storage::shared::Shared;

/// The snapshot chunks' receiver and the state machine that names their temp files.
pub struct SnapshotReceiver {
    pub receiver: Receiver,
    pub shared: Arc<Shared>,
}

/// A vote request in openraft 0.9's layout lacks 0.10's trailing `leadership_transfer` flag,
/// and postcard reads every field (`serde(default)` does not help it): one zero byte appended
/// reads as "no transfer" for a 0.9 request and is an ignored trailing byte for a 0.10 one.
pub(crate) fn vote_request_bytes(payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(payload.len() + 1);
    bytes.extend_from_slice(payload);
    bytes.push(0);
    bytes
}

/// What the leader answers for leases relayed by followers (implemented by the API layer,
/// which owns the leader's lease clock).
#[tonic::async_trait]
pub trait LeaderLeases: Send + Sync + 'static {
    async fn keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse, Status>;
    async fn time_to_live(
        &self,
        req: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, Status>;
}

/// Serves peer RPCs for one node.
pub struct PeerService {
    proposer: Proposer,
    /// Where snapshot chunks go (`snapshot_transfer`); shared by every peer listener.
    snapshots: Arc<SnapshotReceiver>,
    leases: Arc<dyn LeaderLeases>,
    /// Turns true when the member stops: replication streams end then, since a graceful server
    /// shutdown waits for every open stream and the leader would otherwise keep them open.
    stop: watch::Receiver<bool>,
    /// Refuses votes for a while after a restart (`super::vote_hold`).
    votes: VoteHold,
}

impl PeerService {
    pub fn new(
        proposer: Proposer,
        snapshots: Arc<SnapshotReceiver>,
        leases: Arc<dyn LeaderLeases>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self { proposer, snapshots, leases, stop, votes: VoteHold::none() }
    }

    /// Refuses vote and Pre-Vote requests as `votes` says.
    pub fn with_vote_hold(mut self, votes: VoteHold) -> Self {
        self.votes = votes;
        self
    }
}

/// The member a vote names as leader: the sender of an append or a snapshot chunk.
pub(super) fn vote_leader(vote: &Vote) -> NodeId {
    *openraft::vote::RaftLeaderId::node_id(vote.leader_id())
}

/// Hands an append to Raft and, when Raft accepted its sender as leader (anything but a higher
/// vote), records the contact (`leader_contact`).
async fn append(
    proposer: &Proposer,
    rpc: AppendEntriesRequest<TypeConfig>,
) -> Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> {
    let leader = vote_leader(&rpc.vote);
    let answer = proposer.raft().append_entries(rpc).await;
    record_contact(proposer, leader, &answer);
    answer
}

/// Records contact with `leader` (`leader_contact`) when Raft's `answer` to its append accepted
/// it as leader: anything but an error or a higher vote.
pub(super) fn record_contact(
    proposer: &Proposer,
    leader: NodeId,
    answer: &Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>,
) {
    if matches!(answer, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
        proposer.heard_from(leader);
    }
}

pub(super) fn bad_payload(e: postcard::Error) -> Status {
    Status::invalid_argument(format!("picket: undecodable raft payload: {e}"))
}

pub(super) fn encode_reply<T: serde::Serialize>(v: &T) -> Result<RaftPayload, Status> {
    encode(v).map_err(|e| Status::internal(format!("picket: cannot encode raft reply: {e}")))
}

fn reply<T: serde::Serialize>(v: &T) -> Result<Response<RaftPayload>, Status> {
    encode_reply(v).map(Response::new)
}

#[tonic::async_trait]
impl RaftService for PeerService {
    #[tracing::instrument(level = "trace", skip_all)]
    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(&req.get_ref().payload).map_err(bad_payload)?;
        reply(&append(&self.proposer, rpc).await)
    }

    type AppendEntriesStreamStream = super::append_serve::Answers;

    /// One replication session, pipelined: `append_serve`.
    #[tracing::instrument(level = "trace", skip_all)]
    async fn append_entries_stream(
        &self,
        req: Request<Streaming<RaftFrame>>,
    ) -> Result<Response<Self::AppendEntriesStreamStream>, Status> {
        let (proposer, stop) = (self.proposer.clone(), self.stop.clone());
        Ok(Response::new(super::append_serve::serve(proposer, req.into_inner(), stop)))
    }

    #[tracing::instrument(level = "trace", skip_all)]
    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.votes.check(Instant::now())?;
        let rpc = decode(&vote_request_bytes(&req.get_ref().payload)).map_err(bad_payload)?;
        reply(&self.proposer.raft().vote(rpc).await)
    }

    #[tracing::instrument(level = "trace", skip_all)]
    async fn pre_vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.votes.check(Instant::now())?;
        // Only members that know Pre-Vote send it, all in openraft 0.10's layout.
        let rpc = decode(&req.get_ref().payload).map_err(bad_payload)?;
        reply(&self.proposer.raft().pre_vote(rpc).await)
    }

    #[tracing::instrument(level = "trace", skip_all)]
    async fn install_snapshot(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let chunk: Chunk = decode(&req.get_ref().payload).map_err(bad_payload)?;
        let vote = chunk.vote;
        let shared = &self.snapshots.shared;
        let answer = self
            .snapshots
            .receiver
            .chunk(self.proposer.raft(), chunk, || shared.snapshot_receiving_path())
            .await?;
        // The receiver answers its own vote; the sender is this member's leader unless that vote
        // is newer than the sender's (a follower busy installing a large snapshot keeps naming
        // its leader).
        if matches!(&answer, Ok(r) if r.vote == vote) {
            self.proposer.heard_from(vote_leader(&vote));
        }
        reply(&answer)
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn forward(
        &self,
        req: Request<ForwardRequest>,
    ) -> Result<Response<CommandResult>, Status> {
        let command = req
            .into_inner()
            .command
            .ok_or_else(|| Status::invalid_argument("picket: forward without a command"))?;
        // Only propose locally: a forwarded request is never forwarded again, so a stale leader
        // hint cannot bounce a proposal around the cluster.
        match self.proposer.propose_local(Command::new(command)).await {
            // The single-command reply has no room for the entry's index; only a follower
            // talking to a leader from before `ForwardBatch` uses it, and such a leader would not
            // send one either.
            Ok(applied) => Ok(Response::new(applied.result)),
            Err(e) => Err(ProposeError::into_status(e)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(commands = req.get_ref().commands.len()))]
    async fn forward_batch(
        &self,
        req: Request<ForwardBatchRequest>,
    ) -> Result<Response<ForwardBatchResponse>, Status> {
        // Like `forward`, each command is proposed only locally, never forwarded again.
        let commands = req.into_inner().commands;
        let outcomes = super::forward::serve_group(&self.proposer, commands).await;
        Ok(Response::new(ForwardBatchResponse { outcomes }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn read_index(
        &self,
        _req: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        let index = self.proposer.local_read_index().await.map_err(ProposeError::into_status)?;
        Ok(Response::new(ReadIndexResponse {
            read_index: index,
            leader_id: self.proposer.node_id(),
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().id))]
    async fn lease_keep_alive(
        &self,
        req: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        // Answered only by the leader itself: a relayed keep-alive is never relayed again.
        self.leases.keep_alive(req.get_ref().id).await.map(Response::new)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().id))]
    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.leases.time_to_live(req.into_inner()).await.map(Response::new)
    }

    type RelayStream = super::relay_serve::Answers;

    /// A follower's forwarded groups, read indexes and keep-alives on one stream
    /// (`relay_serve`): each call as its unary RPC above, answered as it finishes.
    #[tracing::instrument(level = "debug", skip_all)]
    async fn relay(
        &self,
        req: Request<Streaming<RelayRequest>>,
    ) -> Result<Response<Self::RelayStream>, Status> {
        let answers = super::relay_serve::serve(
            req.into_inner(),
            self.stop.clone(),
            self.proposer.clone(),
            self.leases.clone(),
        );
        Ok(Response::new(answers))
    }
}
