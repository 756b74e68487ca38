//! Lock and Election services: thin gRPC wrappers over [`crate::concurrency`], which runs on
//! this member's own KV path through [`CtxBackend`] (never by dialing our own endpoint).

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use picket_proto::etcdserverpb::{
    LeaseGrantRequest, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::v3electionpb::election_server::Election;
use picket_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use picket_proto::v3lockpb::lock_server::Lock;
use picket_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::status::concurrency_status;
use super::{unexpected, Ctx};
use crate::concurrency::{election, mutex, Backend};
use crate::storage::state_machine::FeedItem;

/// TTL of the lease Picket grants for a Lock or Campaign that names no lease. etcd keeps such a
/// server-made session lease alive forever (a leak); Picket grants etcd's default session TTL and
/// does not renew it, so the lock or leadership ends on its own after at most this long.
const IMPLICIT_LEASE_TTL: i64 = 60;

/// The store as locks and elections see it: this member's own replicated KV path.
#[derive(Clone)]
pub struct CtxBackend(pub Arc<Ctx>);

impl Backend for CtxBackend {
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, Status> {
        super::kv::txn(&self.0, req).await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse, Status> {
        super::kv::range(&self.0, req).await
    }

    fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        self.0.sm.subscribe()
    }
}

impl CtxBackend {
    async fn lease_or_implicit(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let id = super::lease::random_lease_id();
        match self
            .0
            .propose(Cmd::LeaseGrant(LeaseGrantRequest { ttl: IMPLICIT_LEASE_TTL, id }))
            .await?
        {
            CmdResult::LeaseGrant(r) => Ok(r.id),
            _ => Err(unexpected("implicit lease grant")),
        }
    }
}

pub struct LockService {
    backend: CtxBackend,
}

impl LockService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { backend: CtxBackend(ctx) }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().lease))]
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.backend.0.authorize(&meta, &super::auth::contender_needs(&req.name, true)).await?;
        let lease = self.backend.lease_or_implicit(req.lease).await?;
        let grant = mutex::lock(&self.backend, &req.name, lease)
            .await
            .map_err(|e| concurrency_status(&e))?;
        tracing::debug!(revision = grant.token, "lock granted");
        let mut header = grant.header;
        self.backend.0.stamp(&mut header);
        Ok(Response::new(LockResponse { header, key: grant.key }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.backend.0.authorize(&meta, &[super::auth::write_key(&req.key)]).await?;
        let mut header =
            mutex::unlock(&self.backend, &req.key).await.map_err(|e| concurrency_status(&e))?;
        self.backend.0.stamp(&mut header);
        Ok(Response::new(UnlockResponse { header }))
    }
}

pub struct ElectionService {
    backend: CtxBackend,
}

impl ElectionService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { backend: CtxBackend(ctx) }
    }
}

fn missing_leader() -> Status {
    // etcd's ErrMissingLeaderKey.
    Status::invalid_argument("\"leader\" field must be provided")
}

type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Election for ElectionService {
    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().lease))]
    async fn campaign(
        &self,
        req: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.backend.0.authorize(&meta, &super::auth::contender_needs(&req.name, true)).await?;
        let lease = self.backend.lease_or_implicit(req.lease).await?;
        let (leader, mut header) = election::campaign(&self.backend, &req.name, lease, &req.value)
            .await
            .map_err(|e| concurrency_status(&e))?;
        self.backend.0.stamp(&mut header);
        Ok(Response::new(CampaignResponse { header, leader: Some(leader) }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let leader = req.leader.ok_or_else(missing_leader)?;
        self.backend.0.authorize(&meta, &[super::auth::write_key(&leader.key)]).await?;
        let mut header = election::proclaim(&self.backend, &leader, &req.value)
            .await
            .map_err(|e| concurrency_status(&e))?;
        self.backend.0.stamp(&mut header);
        Ok(Response::new(ProclaimResponse { header }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.backend.0.authorize(&meta, &super::auth::contender_needs(&req.name, false)).await?;
        let (kv, mut header) =
            election::leader(&self.backend, &req.name).await.map_err(|e| concurrency_status(&e))?;
        self.backend.0.stamp(&mut header);
        Ok(Response::new(LeaderResponse { header, kv: Some(kv) }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let (meta, _, req) = req.into_parts();
        let name = req.name;
        self.backend.0.authorize(&meta, &super::auth::contender_needs(&name, false)).await?;
        // Small buffer: an observer only needs the latest leader; a slow reader holds back only
        // its own observe task.
        let (tx, rx) = mpsc::channel(16);
        let backend = self.backend.clone();
        tokio::spawn(async move {
            let tx2 = tx.clone();
            let res = election::observe(&backend, &name, |kv, mut header| {
                backend.0.stamp(&mut header);
                tx.try_send(Ok(LeaderResponse { header, kv: Some(kv) })).is_ok() || !tx.is_closed()
            })
            .await;
            if let Err(e) = res {
                let _ = tx2.send(Err(concurrency_status(&e))).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn resign(
        &self,
        req: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let leader = req.leader.ok_or_else(missing_leader)?;
        self.backend.0.authorize(&meta, &[super::auth::write_key(&leader.key)]).await?;
        let mut header =
            election::resign(&self.backend, &leader).await.map_err(|e| concurrency_status(&e))?;
        self.backend.0.stamp(&mut header);
        Ok(Response::new(ResignResponse { header }))
    }
}
