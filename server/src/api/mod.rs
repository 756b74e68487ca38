//! Client-facing gRPC services (etcd v3 API). Handlers validate, turn writes into Raft
//! commands through the [`Proposer`], serve reads from the local MVCC store after a read
//! barrier, and stamp every response with a [`ResponseHeader`]. Errors become statuses only in
//! [`status`].

pub mod auth;
pub mod auto_compact;
pub mod cluster;
pub mod cluster_peer;
pub mod compact_steps;
pub mod ctx_backend;
pub mod gateway;
pub mod http;
pub mod kv;
pub mod lease;
mod lease_id;
pub mod locks;
pub mod maintenance;
pub mod queue;
pub mod quota_monitor;
pub mod status;
pub mod subscription;
mod time_ids;
pub mod v3election;
pub mod v3lock;
pub mod watch;
mod watch_hub;

use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;
use std::time::Duration;

use picket_proto::etcdserverpb::ResponseHeader;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RaftCommand;
use prost::Message;
use tonic::Status;

use crate::raft::proposer::Proposer;
use crate::raft::types::Command;
use crate::storage::state_machine::Shared;

/// What every handler needs: identity, the replicated state and the way to change it.
pub struct Ctx {
    pub cluster_id: u64,
    pub member_id: u64,
    pub sm: Arc<Shared>,
    pub proposer: Proposer,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    /// The leader's lease clock (idle on followers).
    pub lease_leader: lease::LeaseLeader,
    /// This member's metric families (proposal latency is observed in [`Ctx::propose`]).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Token lifetime and password hashing cost (`crate::api::auth`).
    pub auth: auth::AuthGate,
}

impl Ctx {
    /// A header for a response served at store revision `revision`.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.proposer.raft().metrics().borrow_watched().current_term,
        }
    }

    /// Completes a header that `mvcc` filled with the revision (or none: current revision).
    pub fn stamp(&self, header: &mut Option<ResponseHeader>) {
        let revision = header.as_ref().map(|h| h.revision).unwrap_or_else(|| self.sm.revision());
        *header = Some(self.header(revision));
    }

    /// Rejects requests larger than `--max-request-bytes` with etcd's error.
    pub fn check_size<M: Message>(&self, req: &M) -> Result<(), Status> {
        let size = req.encoded_len();
        if size > self.max_request_bytes {
            return Err(status::request_too_large(size, self.max_request_bytes));
        }
        Ok(())
    }

    /// Whether this member leads now, as its Raft metrics last said (the background drivers
    /// that only the leader runs check it before each proposal).
    pub fn leads(&self) -> bool {
        self.proposer.raft().metrics().borrow_watched().current_leader == Some(self.member_id)
    }

    /// Replicates a command and returns its result, mapping a replicated error to its status.
    pub async fn propose(&self, cmd: Cmd) -> Result<CmdResult, Status> {
        // Refused early (no log entry) while NOSPACE is active; apply checks again.
        crate::quota::check_propose(self.sm.alarms(), &cmd)?;
        let timer = self.metrics.start_proposal();
        let result = self
            .proposer
            .propose(Command::new(RaftCommand { cmd: Some(cmd), forwarded: None }))
            .await;
        timer.finish(result.is_ok());
        let result = result?;
        match result.result {
            Some(CmdResult::Error(e)) => Err(status::command_error_status(&e)),
            Some(r) => Ok(r),
            None => Err(Status::internal("picket: empty command result")),
        }
    }

    /// Waits, at most `bound`, until this member's store has physically removed the history
    /// compacted up to `revision` (the leader's `compact_steps` driver and later writes run the
    /// bounded steps). Returns whether it got there. Polls: the steps are many small applies,
    /// and a 10 ms poll on a maintenance call costs nothing a client would notice.
    pub async fn wait_physical_compaction(&self, revision: i64, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if self.sm.with_store(|s| s.compact_physical()) >= revision {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until local reads are linearizable (ReadIndex through the leader).
    pub async fn read_barrier(&self) -> Result<(), Status> {
        self.proposer.read_barrier().await.map_err(status::propose_status)
    }
}

/// The status for a command result of the wrong kind: a bug, never a user error.
pub(crate) fn unexpected(what: &str) -> Status {
    Status::internal(format!("picket: unexpected command result for {what}"))
}
