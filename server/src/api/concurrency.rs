//! Lock and Election services: thin gRPC wrappers over [`crate::concurrency`], which runs on
//! this member's own KV path through [`CtxBackend`] (never by dialing our own endpoint).
//!
//! A [`CtxBackend`] is built per request from what `Ctx::authorize` returned for it, and every
//! write it proposes (the contender txn, unlock, proclaim, resign, an implicit lease grant)
//! carries that auth revision, as a KV Put does (`Ctx::guard`): apply refuses it if auth changed
//! after the check, including "auth looked off on a member that had not applied AuthEnable yet"
//! (issue 19). The one write a request makes after an unbounded wait, a waiter's clean-up
//! delete, is judged again first (`Backend::for_cleanup`).
//!
//! Reads that only look (Leader, Observe) are judged after their read barrier, as KV Range is:
//! Leader reads first and judges after, so it still costs one ReadIndex round; Observe, a
//! stream, takes its barrier when it opens.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use picket_proto::etcdserverpb::{
    LeaseGrantRequest, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::v3electionpb::election_server::Election;
use picket_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use picket_proto::v3lockpb::lock_server::Lock;
use picket_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::status::concurrency_status;
use super::{unexpected, Ctx};
use crate::concurrency::{election, mutex, Backend};
use crate::storage::state_machine::FeedItem;

/// TTL of the lease Picket grants for a Lock or Campaign that names no lease. etcd keeps such a
/// server-made session lease alive forever (a leak); Picket grants etcd's default session TTL and
/// does not renew it, so the lock or leadership ends on its own after at most this long.
const IMPLICIT_LEASE_TTL: i64 = 60;

/// The store as one request's locks, elections or queue operations see it: this member's own
/// replicated KV path, writing as judged at the auth revision the request was checked at.
#[derive(Clone)]
pub struct CtxBackend {
    ctx: Arc<Ctx>,
    /// What `Ctx::authorize` returned for the request: every write proposed through this
    /// backend carries it (`Ctx::guard`).
    checked: Option<u64>,
    /// The request's metadata (its token), to judge a clean-up write again.
    meta: Arc<MetadataMap>,
}

impl Backend for CtxBackend {
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, Status> {
        super::kv::txn(&self.ctx, self.checked, req).await
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse, Status> {
        super::kv::range(&self.ctx, req).await
    }

    fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        self.ctx.sm.subscribe()
    }

    async fn for_cleanup(&self, key: &[u8]) -> Result<Self, Status> {
        // The caller's permission to delete its own key, as Unlock would judge it now. If auth
        // was enabled while it waited and it has no token, this fails and the key stays until
        // its lease expires (the caller would not be allowed to delete it by Unlock either).
        let checked = self.ctx.authorize(&self.meta, &[super::auth::write_key(key)]).await?;
        Ok(Self { checked, ..self.clone() })
    }
}

impl CtxBackend {
    /// The backend for one request, whose metadata `meta` `Ctx::authorize` judged, returning
    /// `checked`. `None` (nothing judged) proposes writes unwrapped: only for requests that only
    /// read (Leader, Observe, WatchHold, Inspect).
    pub fn new(ctx: Arc<Ctx>, meta: &MetadataMap, checked: Option<u64>) -> Self {
        Self { ctx, checked, meta: Arc::new(meta.clone()) }
    }

    /// Judges `meta` for `needs` and returns the backend for the request (see [`Self::new`]).
    pub async fn authorize(
        ctx: &Arc<Ctx>,
        meta: &MetadataMap,
        needs: &[crate::auth::Need],
    ) -> Result<Self, Status> {
        let checked = ctx.authorize(meta, needs).await?;
        Ok(Self::new(ctx.clone(), meta, checked))
    }

    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    async fn lease_or_implicit(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let id = super::lease::random_lease_id();
        let grant = LeaseGrantRequest { ttl: IMPLICIT_LEASE_TTL, id };
        match self.ctx.propose(super::lease::grant_command(self.checked, grant)).await? {
            CmdResult::LeaseGrant(r) => Ok(r.id),
            _ => Err(unexpected("implicit lease grant")),
        }
    }
}

pub struct LockService {
    ctx: Arc<Ctx>,
}

impl LockService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().lease))]
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let needs = super::auth::contender_needs(&req.name, true);
        let backend = CtxBackend::authorize(&self.ctx, &meta, &needs).await?;
        let lease = backend.lease_or_implicit(req.lease).await?;
        let grant =
            mutex::lock(&backend, &req.name, lease).await.map_err(|e| concurrency_status(&e))?;
        tracing::debug!(revision = grant.token, "lock granted");
        let mut header = grant.header;
        self.ctx.stamp(&mut header);
        Ok(Response::new(LockResponse { header, key: grant.key }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn unlock(
        &self,
        req: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let backend =
            CtxBackend::authorize(&self.ctx, &meta, &[super::auth::write_key(&req.key)]).await?;
        let mut header =
            mutex::unlock(&backend, &req.key).await.map_err(|e| concurrency_status(&e))?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(UnlockResponse { header }))
    }
}

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
        let (leader, mut header) = election::campaign(&backend, &req.name, lease, &req.value)
            .await
            .map_err(|e| concurrency_status(&e))?;
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
        let mut header = election::proclaim(&backend, &leader, &req.value)
            .await
            .map_err(|e| concurrency_status(&e))?;
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
        let (kv, mut header) = read.map_err(|e| concurrency_status(&e))?;
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
        let mut header =
            election::resign(&backend, &leader).await.map_err(|e| concurrency_status(&e))?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(ResignResponse { header }))
    }
}
