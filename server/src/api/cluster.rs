//! `etcdserverpb.Cluster`: MemberList, MemberAdd, MemberRemove, MemberUpdate, MemberPromote,
//! and the request gate every client service runs behind (`hasleader`, removed member).
//!
//! The membership logic is in [`crate::raft::membership`]; this layer only validates, runs the
//! operation through [`ClusterControl::execute`] (which reaches the leader from any member) and
//! builds etcd's responses.

use std::sync::Arc;

use picket_proto::etcdserverpb::cluster_server::Cluster;
use picket_proto::etcdserverpb::{
    MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use picket_proto::picket::raft::v1::cluster_op::Op;
use picket_proto::picket::raft::v1::AddMember;
use tonic::{Request, Response, Status};

use super::status::membership_status;
use super::Ctx;
use crate::raft::membership::{ClusterControl, MembershipError};

/// gRPC metadata key by which a client asks to fail fast when the member has no leader
/// (etcd's `rpctypes.MetadataRequireLeaderKey`), and the value that asks it.
pub const REQUIRE_LEADER_KEY: &str = "hasleader";
pub const REQUIRE_LEADER_VALUE: &str = "true";

/// The interceptor in front of every client service: a removed member refuses everything, and
/// a request carrying `hasleader: true` fails at once with "etcdserver: no leader" while this
/// member knows no leader, instead of waiting for an election.
pub fn request_gate(
    control: ClusterControl,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static {
    move |req: Request<()>| {
        if control.is_removed() {
            return Err(membership_status(MembershipError::Removed));
        }
        let require_leader = req
            .metadata()
            .get(REQUIRE_LEADER_KEY)
            .is_some_and(|v| v.as_bytes() == REQUIRE_LEADER_VALUE.as_bytes());
        if require_leader && control.leader().is_none() {
            return Err(membership_status(MembershipError::NoLeader));
        }
        Ok(req)
    }
}

pub struct ClusterService {
    ctx: Arc<Ctx>,
    control: ClusterControl,
}

impl ClusterService {
    pub fn new(ctx: Arc<Ctx>, control: ClusterControl) -> Self {
        Self { ctx, control }
    }

    fn header(&self) -> Option<picket_proto::etcdserverpb::ResponseHeader> {
        Some(self.ctx.header(self.ctx.sm.revision()))
    }

    async fn execute(&self, op: Op) -> Result<Vec<picket_proto::etcdserverpb::Member>, Status> {
        self.control.execute(op).await.map_err(membership_status)
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    #[tracing::instrument(skip_all, fields(learner = req.get_ref().is_learner))]
    async fn member_add(
        &self,
        req: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        // Membership changes are root's when auth is enabled (etcd); listing is anyone's.
        self.ctx.authorize_admin(req.metadata()).await?;
        let req = req.into_inner();
        let id = self.control.new_member_id();
        let members =
            self.execute(Op::Add(AddMember { id, peer_urls: req.peer_ur_ls.clone() })).await?;
        if !req.is_learner {
            // Added as a learner; promoted once caught up (see raft::membership).
            tokio::spawn(crate::raft::member_tasks::auto_promote(self.control.clone(), id));
        }
        let member = members.iter().find(|m| m.id == id).cloned();
        tracing::info!(node_id = id, peer_urls = ?req.peer_ur_ls, "member added");
        Ok(Response::new(MemberAddResponse { header: self.header(), member, members }))
    }

    #[tracing::instrument(skip_all, fields(node_id = req.get_ref().id))]
    async fn member_remove(
        &self,
        req: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let members = self.execute(Op::Remove(req.into_inner())).await?;
        Ok(Response::new(MemberRemoveResponse { header: self.header(), members }))
    }

    #[tracing::instrument(skip_all, fields(node_id = req.get_ref().id))]
    async fn member_update(
        &self,
        req: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let members = self.execute(Op::Update(req.into_inner())).await?;
        Ok(Response::new(MemberUpdateResponse { header: self.header(), members }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn member_list(
        &self,
        req: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if req.get_ref().linearizable {
            self.ctx.read_barrier().await?;
        }
        Ok(Response::new(MemberListResponse {
            header: self.header(),
            members: self.control.members(),
        }))
    }

    #[tracing::instrument(skip_all, fields(node_id = req.get_ref().id))]
    async fn member_promote(
        &self,
        req: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let members = self.execute(Op::Promote(req.into_inner())).await?;
        Ok(Response::new(MemberPromoteResponse { header: self.header(), members }))
    }
}
