//! etcd's `v3election.Election` service (Campaign, Proclaim, Leader, Observe, Resign): a thin
//! gRPC wrapper over [`crate::concurrency::election`] on a per-request [`CtxBackend`]. Reads
//! that only look (Leader, Observe) are judged after their read barrier, as KV Range is: Leader
//! reads first and judges after, so it still costs one ReadIndex round; Observe, a stream, takes
//! its barrier when it opens.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use picket_proto::v3electionpb::election_server::Election;
use picket_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::status::concurrency_status;
use super::Ctx;
use crate::concurrency::election;

use super::ctx_backend::CtxBackend;

pub struct ElectionService {
    ctx: Arc<Ctx>,
}

impl ElectionService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
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
        let needs = super::auth::contender_needs(&req.name, true);
        let backend = CtxBackend::authorize(&self.ctx, &meta, &needs).await?;
        let lease = backend.lease_or_implicit(req.lease).await?;
        let (leader, mut header) =
            election::campaign(&backend, &req.name, lease, &req.value).await?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(CampaignResponse { header, leader: Some(leader) }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn proclaim(
        &self,
        req: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let leader = req.leader.ok_or_else(missing_leader)?;
        let backend =
            CtxBackend::authorize(&self.ctx, &meta, &[super::auth::write_key(&leader.key)]).await?;
        let mut header = election::proclaim(&backend, &leader, &req.value).await?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(ProclaimResponse { header }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn leader(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Read first (its read barrier brings this member's auth store up to the request), then
        // judge, then answer: one ReadIndex round, and nothing about the election, not even
        // "no leader", reaches a caller the judgment refuses.
        let backend = CtxBackend::new(self.ctx.clone(), &meta, None);
        let read = election::leader(&backend, &req.name).await;
        self.ctx.authorize(&meta, &super::auth::contender_needs(&req.name, false)).await?;
        let (kv, mut header) = read?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(LeaderResponse { header, kv: Some(kv) }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let (meta, _, req) = req.into_parts();
        let name = req.name;
        // Judged after a read barrier (the stream's own first read takes another: one extra
        // round when the stream opens).
        self.ctx.authorize_read(&meta, true, &super::auth::contender_needs(&name, false)).await?;
        // Small buffer: an observer only needs the latest leader; a slow reader holds back only
        // its own observe task.
        let (tx, rx) = mpsc::channel(16);
        // Observe only reads: no write carries the revision.
        let backend = CtxBackend::new(self.ctx.clone(), &meta, None);
        tokio::spawn(async move {
            let tx2 = tx.clone();
            let res = election::observe(&backend, &name, |kv, mut header| {
                backend.ctx().stamp(&mut header);
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
        let backend =
            CtxBackend::authorize(&self.ctx, &meta, &[super::auth::write_key(&leader.key)]).await?;
        let mut header = election::resign(&backend, &leader).await?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(ResignResponse { header }))
    }
}
