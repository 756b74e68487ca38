//! `etcdserverpb.KV`: Range, Put, DeleteRange, Txn, Compact.

use std::sync::Arc;

use picket_proto::etcdserverpb::kv_server::Kv;
use picket_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use tonic::{Request, Response, Status};

use super::{unexpected, Ctx};
use crate::auth::replicated::Judgement;
use crate::mvcc::validate;

pub struct KvService {
    ctx: Arc<Ctx>,
}

impl KvService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }
}

/// Serves a range from the local store (after a read barrier unless serializable).
pub async fn range(ctx: &Ctx, req: RangeRequest) -> Result<RangeResponse, Status> {
    validate::range(&req)?;
    if !req.serializable {
        ctx.read_barrier().await?;
    }
    local_range(ctx, req)
}

/// Serves a range from the local store as it is now: the caller has taken the read barrier a
/// linearizable read needs (`Ctx::authorize_read` does).
pub(crate) fn local_range(ctx: &Ctx, req: RangeRequest) -> Result<RangeResponse, Status> {
    validate::range(&req)?;
    let mut resp = ctx.sm.reader().range(&req)?;
    ctx.stamp(&mut resp.header);
    Ok(resp)
}

/// The command a txn judged at auth revision `checked` is proposed as: wrapped, so apply
/// refuses it if auth changed since (see `Ctx::guard`), also when auth was off.
pub(crate) fn txn_command(checked: Option<Judgement>, req: TxnRequest) -> Cmd {
    super::auth::guard_cmd(checked, Cmd::Txn(req))
}

/// Validates and replicates a txn judged at auth revision `checked` (what `Ctx::authorize`
/// returned for the request it serves), returning the stamped response. Locks, elections,
/// queues and subscriptions send their txns through here.
pub async fn txn(
    ctx: &Ctx,
    checked: Option<Judgement>,
    req: TxnRequest,
) -> Result<TxnResponse, Status> {
    ctx.check_size(&req)?;
    validate::txn(&req, ctx.max_txn_ops)?;
    match ctx.propose(txn_command(checked, req)).await? {
        CmdResult::Txn(mut r) => {
            ctx.stamp(&mut r.header);
            Ok(r)
        }
        _ => Err(unexpected("txn")),
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn range(&self, req: Request<RangeRequest>) -> Result<Response<RangeResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.ctx.check_size(&req)?;
        let needs = crate::auth::perm::range_needs(&req);
        // Takes the read barrier (before judging auth, see `Ctx::authorize_read`), so the read
        // itself does not take a second one.
        self.ctx.authorize_read(&meta, !req.serializable, &needs).await?;
        local_range(&self.ctx, req).map(Response::new)
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn put(&self, req: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.ctx.check_size(&req)?;
        validate::put(&req)?;
        let mut needs = Vec::new();
        crate::auth::perm::put_needs(&req, &mut needs);
        let write = crate::auth::Need::Write;
        let checked = self.ctx.authorize_lease(&meta, &needs, req.lease, write).await?;
        match self.ctx.propose(self.ctx.guard(checked, Cmd::Put(req))).await? {
            CmdResult::Put(mut r) => {
                self.ctx.stamp(&mut r.header);
                Ok(Response::new(r))
            }
            _ => Err(unexpected("put")),
        }
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn delete_range(
        &self,
        req: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        self.ctx.check_size(&req)?;
        validate::delete_range(&req)?;
        let mut needs = Vec::new();
        crate::auth::perm::delete_needs(&req, &mut needs);
        let checked = self.ctx.authorize(&meta, &needs).await?;
        match self.ctx.propose(self.ctx.guard(checked, Cmd::DeleteRange(req))).await? {
            CmdResult::DeleteRange(mut r) => {
                self.ctx.stamp(&mut r.header);
                Ok(Response::new(r))
            }
            _ => Err(unexpected("delete_range")),
        }
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn txn(&self, req: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Every compare and op of both branches, checked before proposing; a read-only txn
        // is still proposed, so apply re-validates it like any write. Judged also when auth
        // looks off here, so the txn carries the auth revision (issue 19).
        self.ctx.check_size(&req)?;
        validate::txn(&req, self.ctx.max_txn_ops)?;
        let checked = self.ctx.authorize(&meta, &crate::auth::perm::txn_needs(&req)).await?;
        txn(&self.ctx, checked, req).await.map(Response::new)
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn compact(
        &self,
        req: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Any authenticated user may compact, as in etcd 3.4, whose auth applier leaves
        // Compaction out of its admin-only list (`needAdminPermission`) and checks no key:
        // clients such as Kubernetes' apiserver compact as an ordinary user.
        let checked = self.ctx.authorize(&meta, &[]).await?;
        let (revision, physical) = (req.revision, req.physical);
        match self.ctx.propose(self.ctx.guard(checked, Cmd::Compaction(req))).await? {
            CmdResult::Compaction(mut r) => {
                // `physical`: etcd answers once the compacted history is removed from its
                // backend. Here that is the bounded steps reaching the point on this member;
                // waiting is bounded by the request timeout like any request.
                // A subscription group may have clamped the point below `revision`.
                let point = revision.min(self.ctx.sm.with_store(|s| s.compact_revision()));
                let bound = self.ctx.proposer.request_timeout();
                if physical && !self.ctx.wait_physical_compaction(point, bound).await {
                    return Err(Status::deadline_exceeded(format!(
                        "etcdserver: request timed out, compaction at {point} is applied but \
                         its history is still being removed"
                    )));
                }
                self.ctx.stamp(&mut r.header);
                Ok(Response::new(r))
            }
            _ => Err(unexpected("compact")),
        }
    }
}
