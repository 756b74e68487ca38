//! `picket.v1.Locks`: what etcd's lock API lacks — try-lock, bounded waits, inspection, token
//! checks (Chubby's CheckSequencer) and fenced writes.
//!
//! Writes carry the auth revision their request was checked at (a per-request [`CtxBackend`],
//! or `Ctx::guard` for FencedTxn), and reads are judged after their read barrier (issue 19): see
//! `api::v3lock` and `api::ctx_backend`.

use std::sync::Arc;
use std::time::Duration;

use picket_proto::etcdserverpb::LeaseTimeToLiveRequest;
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::FencedTxn;
use picket_proto::picket::v1::locks_server::Locks;
use picket_proto::picket::v1::{
    CheckTokenRequest, CheckTokenResponse, Contender, FencedTxnRequest, FencedTxnResponse,
    HoldState, InspectRequest, InspectResponse, LockRequest, LockResponse, TryLockRequest,
    TryLockResponse, WatchHoldRequest,
};
use tonic::{Request, Response, Status};

use super::ctx_backend::CtxBackend;
use super::status::concurrency_status;
use super::{unexpected, Ctx};
use crate::concurrency::mutex::{self, TryLock};
use crate::mvcc::validate;

/// Waiters whose remaining TTL `Inspect` asks the leader for; the rest report -1. Bounds the
/// cost of inspecting a lock with a very long queue.
const INSPECT_TTL_LIMIT: usize = 100;

pub struct LocksService {
    ctx: Arc<Ctx>,
}

impl LocksService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }

    fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    async fn contender(&self, kv: &KeyValue, with_ttl: bool) -> Contender {
        let ttl = if with_ttl && kv.lease != 0 {
            let req = LeaseTimeToLiveRequest { id: kv.lease, keys: false };
            super::lease::time_to_live_any(self.ctx(), req).await.map(|r| r.ttl).unwrap_or(-1)
        } else {
            -1
        };
        Contender { key: kv.key.clone(), token: kv.create_revision, lease: kv.lease, ttl }
    }
}

impl LocksService {
    async fn hold_state(
        &self,
        held: bool,
        holder: Option<KeyValue>,
        mut header: Option<picket_proto::etcdserverpb::ResponseHeader>,
    ) -> HoldState {
        self.ctx().stamp(&mut header);
        let holder = match holder {
            Some(kv) => Some(self.contender(&kv, false).await),
            None => None,
        };
        HoldState { header, held, holder }
    }
}

fn require_lease(lease: i64) -> Result<(), Status> {
    if lease == 0 {
        return Err(Status::invalid_argument(
            "picket: a lock needs a lease: grant one and keep it alive, so a crashed holder's lock ends",
        ));
    }
    Ok(())
}

type HoldStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<HoldState, Status>> + Send>>;

#[tonic::async_trait]
impl Locks for LocksService {
    type WatchHoldStream = HoldStream;

    async fn watch_hold(
        &self,
        req: Request<WatchHoldRequest>,
    ) -> Result<Response<HoldStream>, Status> {
        let (meta, _, req) = req.into_parts();
        // Judged after the read barrier, which also serves the first read below: one round.
        self.ctx()
            .authorize_read(&meta, true, &super::auth::contender_needs(&req.name, false))
            .await?;
        // WatchHold only reads: no write carries the revision.
        let backend = CtxBackend::new(self.ctx.clone(), &meta, None);
        // Two messages at most, so a tiny buffer suffices.
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let svc = LocksService { ctx: self.ctx.clone() };
        tokio::spawn(async move {
            let first =
                super::kv::local_range(svc.ctx(), crate::concurrency::holder_range(&req.name));
            let (holder, header) = match first {
                Ok(r) => (r.kvs.into_iter().next(), r.header),
                Err(s) => {
                    let _ = tx.send(Err(s)).await;
                    return;
                }
            };
            let held = holder.as_ref().is_some_and(|kv| kv.create_revision == req.token);
            if tx.send(Ok(svc.hold_state(held, holder, header).await)).await.is_err() || !held {
                return;
            }
            let lost = tokio::select! {
                r = mutex::wait_lost(&backend, &req.name, req.token) => r,
                // The holder stopped listening: stop watching for it.
                _ = tx.closed() => return,
            };
            match lost {
                Ok((holder, header)) => {
                    let state = svc.hold_state(false, holder, header).await;
                    let _ = tx.send(Ok(state)).await;
                }
                Err(e) => {
                    let _ = tx.send(Err(concurrency_status(&e))).await;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().lease))]
    async fn try_lock(
        &self,
        req: Request<TryLockRequest>,
    ) -> Result<Response<TryLockResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let needs = super::auth::contender_needs(&req.name, true);
        let backend = CtxBackend::authorize(&self.ctx, &meta, &needs).await?;
        require_lease(req.lease)?;
        let out = mutex::try_lock(&backend, &req.name, req.lease).await?;
        let resp = match out {
            TryLock::Acquired(g) => {
                let mut header = g.header;
                self.ctx().stamp(&mut header);
                TryLockResponse { header, acquired: true, key: g.key, token: g.token, holder: None }
            }
            TryLock::Held { holder, mut header } => {
                self.ctx().stamp(&mut header);
                TryLockResponse {
                    header,
                    acquired: false,
                    key: Vec::new(),
                    token: 0,
                    holder: Some(self.contender(&holder, true).await),
                }
            }
        };
        Ok(Response::new(resp))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().lease))]
    async fn lock(&self, req: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let needs = super::auth::contender_needs(&req.name, true);
        let backend = CtxBackend::authorize(&self.ctx, &meta, &needs).await?;
        require_lease(req.lease)?;
        let wait = mutex::lock(&backend, &req.name, req.lease);
        let grant = if req.wait_timeout_ms > 0 {
            // Dropping the waiting future on timeout removes the waiter's key (see
            // `mutex::lock`), so a timed-out caller leaves nothing queued.
            match tokio::time::timeout(Duration::from_millis(req.wait_timeout_ms), wait).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(Status::deadline_exceeded(format!(
                        "picket: lock not acquired within {} ms",
                        req.wait_timeout_ms
                    )))
                }
            }
        } else {
            wait.await
        }?;
        let mut header = grant.header;
        self.ctx().stamp(&mut header);
        Ok(Response::new(LockResponse { header, key: grant.key, token: grant.token }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn inspect(
        &self,
        req: Request<InspectRequest>,
    ) -> Result<Response<InspectResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Read first (its read barrier brings this member's auth store up to the request), then
        // judge, then answer: one ReadIndex round, and nothing is told to a refused caller.
        let backend = CtxBackend::new(self.ctx.clone(), &meta, None);
        let read = mutex::contenders(&backend, &req.name).await;
        self.ctx().authorize(&meta, &super::auth::contender_needs(&req.name, false)).await?;
        let (kvs, mut header) = read?;
        let mut all = Vec::with_capacity(kvs.len());
        for (i, kv) in kvs.iter().enumerate() {
            all.push(self.contender(kv, i < INSPECT_TTL_LIMIT).await);
        }
        let mut iter = all.into_iter();
        let holder = iter.next();
        self.ctx().stamp(&mut header);
        Ok(Response::new(InspectResponse { header, holder, waiters: iter.collect() }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(revision = req.get_ref().token))]
    async fn check_token(
        &self,
        req: Request<CheckTokenRequest>,
    ) -> Result<Response<CheckTokenResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Judged after the read barrier, which also serves the read: one round.
        self.ctx()
            .authorize_read(&meta, true, &super::auth::contender_needs(&req.name, false))
            .await?;
        let resp = super::kv::local_range(self.ctx(), crate::concurrency::holder_range(&req.name))?;
        let holder = match resp.kvs.first() {
            Some(kv) => Some(self.contender(kv, false).await),
            None => None,
        };
        let mut header = resp.header;
        self.ctx().stamp(&mut header);
        Ok(Response::new(CheckTokenResponse {
            header,
            current: holder.as_ref().is_some_and(|h| h.token == req.token),
            holder,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(revision = req.get_ref().token))]
    async fn fenced_txn(
        &self,
        req: Request<FencedTxnRequest>,
    ) -> Result<Response<FencedTxnResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        let txn = req.txn.unwrap_or_default();
        self.ctx().check_size(&txn)?;
        validate::txn(&txn, self.ctx().max_txn_ops)?;
        if req.name.is_empty() {
            return Err(Status::invalid_argument("etcdserver: key is not provided"));
        }
        // The fence reads the holder under `name/`; the txn needs what any txn needs.
        let mut needs = super::auth::contender_needs(&req.name, false);
        needs.extend(crate::auth::perm::txn_needs(&txn));
        let checked = self.ctx().authorize(&meta, &needs).await?;
        let cmd = Cmd::FencedTxn(FencedTxn { name: req.name, token: req.token, txn: Some(txn) });
        match self.ctx().propose(self.ctx().guard(checked, cmd)).await {
            Ok(CmdResult::Txn(mut r)) => {
                self.ctx().stamp(&mut r.header);
                Ok(Response::new(FencedTxnResponse { header: r.header, txn: Some(r) }))
            }
            Ok(_) => Err(unexpected("fenced_txn")),
            // Includes the stale-token error, which names the current holder's token.
            Err(s) => Err(s),
        }
    }
}
