//! etcd's `v3lock.Lock` service (Lock, Unlock): a thin gRPC wrapper over
//! [`crate::concurrency::mutex`] on a per-request [`CtxBackend`]. Picket's own lock API, with
//! TryLock, fencing tokens and hold watches, is `locks.rs` (`picket.v1.Locks`).

use std::sync::Arc;

use picket_proto::v3lockpb::lock_server::Lock;
use picket_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

use super::Ctx;
use crate::concurrency::mutex;

use super::ctx_backend::CtxBackend;

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
        let grant = mutex::lock(&backend, &req.name, lease).await?;
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
        let mut header = mutex::unlock(&backend, &req.key).await?;
        self.ctx.stamp(&mut header);
        Ok(Response::new(UnlockResponse { header }))
    }
}
