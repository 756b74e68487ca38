//! [`CtxBackend`]: the store as one request's locks, elections or queue operations see it.
//! [`crate::concurrency`] and [`crate::queue`] run on this member's own KV path through it (never
//! by dialing our own endpoint); `v3lock.rs`, `v3election.rs`, `locks.rs` and `queue.rs` build one
//! per request.
//!
//! A [`CtxBackend`] is built per request from what `Ctx::authorize` returned for it, and every
//! write it proposes (the contender txn, unlock, proclaim, resign, an implicit lease grant)
//! carries that auth revision, as a KV Put does (`Ctx::guard`): apply refuses it if auth changed
//! after the check, including "auth looked off on a member that had not applied AuthEnable yet"
//! (issue 19). The one write a request makes after an unbounded wait, a waiter's clean-up
//! delete, is judged again first (`Backend::for_cleanup`).

use std::sync::Arc;

use picket_proto::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{QueueCommand, QueueResult};
use tokio::sync::broadcast;
use tonic::metadata::MetadataMap;
use tonic::Status;

use super::{unexpected, Ctx};
use crate::auth::replicated::Judgement;
use crate::concurrency::{Backend, StoreError};
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
    checked: Option<Judgement>,
    /// The request's metadata (its token), to judge a clean-up write again.
    meta: Arc<MetadataMap>,
}

/// The status a request failed with, carried through the concurrency and queue code untouched;
/// `status::store_status` takes it out again.
fn store(s: Status) -> StoreError {
    StoreError::Backend(Box::new(s))
}

impl Backend for CtxBackend {
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, StoreError> {
        super::kv::txn(&self.ctx, self.checked, req).await.map_err(store)
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse, StoreError> {
        super::kv::range(&self.ctx, req).await.map_err(store)
    }

    fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        self.ctx.sm.subscribe()
    }

    async fn for_cleanup(&self, key: &[u8]) -> Result<Self, StoreError> {
        // The caller's permission to delete its own key, as Unlock would judge it now. If auth
        // was enabled while it waited and it has no token, this fails and the key stays until
        // its lease expires (the caller would not be allowed to delete it by Unlock either).
        let checked =
            self.ctx.authorize(&self.meta, &[super::auth::write_key(key)]).await.map_err(store)?;
        Ok(Self { checked, ..self.clone() })
    }
}

impl crate::queue::QueueBackend for CtxBackend {
    async fn decide(&self, cmd: QueueCommand) -> Result<QueueResult, StoreError> {
        match self.ctx.propose(self.ctx.guard(self.checked, Cmd::Queue(cmd))).await {
            Ok(CmdResult::Queue(r)) => Ok(r),
            Ok(_) => Err(store(unexpected("queue command"))),
            Err(s) => Err(store(s)),
        }
    }
}

impl CtxBackend {
    /// The backend for one request, whose metadata `meta` `Ctx::authorize` judged, returning
    /// `checked`. `None` (nothing judged) proposes writes unwrapped: only for requests that only
    /// read (Leader, Observe, WatchHold, Inspect).
    pub fn new(ctx: Arc<Ctx>, meta: &MetadataMap, checked: Option<Judgement>) -> Self {
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

    pub(super) async fn lease_or_implicit(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let r = super::lease::propose_grant(&self.ctx, self.checked, IMPLICIT_LEASE_TTL, 0).await?;
        Ok(r.id)
    }
}
