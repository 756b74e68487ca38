//! The peer-facing `picket.raft.v1.ClusterService`, served on the peer listener: a member that
//! is not the leader forwards a client's membership change (or a leadership transfer's
//! `Campaign`) here. Its replies reach the client verbatim, so it maps errors with the same table
//! as every client handler (`status::membership_status`); the work is
//! `crate::raft::membership::ClusterControl`'s.

use picket_proto::picket::raft::v1::cluster_service_server::ClusterService;
use picket_proto::picket::raft::v1::{
    CampaignRequest, CampaignResponse, ClusterOp, ClusterOpResponse, MembershipQuery,
    MembershipView,
};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::status::membership_status;
use crate::raft::membership::{ClusterControl, MembershipError};

/// The peer-facing `ClusterService`.
pub struct ClusterPeerService {
    control: ClusterControl,
}

impl ClusterPeerService {
    pub fn new(control: ClusterControl) -> Self {
        Self { control }
    }
}

#[tonic::async_trait]
impl ClusterService for ClusterPeerService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn execute(
        &self,
        req: Request<ClusterOp>,
    ) -> Result<Response<ClusterOpResponse>, Status> {
        let req = req.into_inner();
        // Only run locally: a forwarded operation is never forwarded again, so a stale leader
        // hint cannot bounce it around the cluster.
        let deadline = Instant::now() + self.control.proposer().request_timeout();
        let run = self.control.run_on_leader(&req, deadline);
        match tokio::time::timeout_at(deadline, run).await {
            Ok(Ok(members)) => Ok(Response::new(ClusterOpResponse { members })),
            Ok(Err(e)) => Err(membership_status(e)),
            Err(_) => Err(membership_status(MembershipError::Timeout)),
        }
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn membership(
        &self,
        _req: Request<MembershipQuery>,
    ) -> Result<Response<MembershipView>, Status> {
        Ok(Response::new(self.control.view()))
    }

    #[tracing::instrument(level = "info", skip_all, fields(leader = req.get_ref().leader_id))]
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        crate::raft::transfer::campaign(&self.control, req.into_inner())
            .await
            .map(|()| Response::new(CampaignResponse {}))
            .map_err(membership_status)
    }
}
