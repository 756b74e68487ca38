//! `picket.v1.Queue`: authorization and status mapping around [`crate::queue`] (requests are
//! validated by [`crate::queue::validate`], one function per RPC), which runs on this
//! member's own KV path through [`CtxBackend`] (never by dialing our own endpoint). The member
//! serving a request reads its wall clock here, outside apply (see the clock argument in
//! [`crate::queue`]).

use std::sync::Arc;
use std::time::Duration;

use picket_proto::picket::v1::queue_server::Queue;
use picket_proto::picket::v1::{
    AckJobRequest, AckJobResponse, ClaimRequest, ClaimResponse, DeadLettersRequest,
    DeadLettersResponse, EnqueueRequest, EnqueueResponse, ExtendClaimRequest, ExtendClaimResponse,
    NackJobRequest, NackJobResponse, QueueDeadLetter, QueueInspectRequest, QueueInspectResponse,
    QueueJobRecord, RequeueJobRequest, RequeueJobResponse,
};
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::ctx_backend::CtxBackend;
use super::time_ids::{now_ms, TimeIds};
use super::Ctx;
use crate::auth::{KeyRange, Need};
use crate::queue::{self, ops, validate};

/// Dead letters listed when the request names no limit.
const DEFAULT_DEAD_LIST: u32 = 100;

static JOB_IDS: TimeIds = TimeIds::new(64, 20);

/// A fresh job id, chosen before proposing (not in apply): 16 hex digits, the serving member's
/// clock in milliseconds (44 bits) and then 20 bits that start at a random value each
/// millisecond ([`TimeIds`]: ids that sort by time keep a queue's job and claim keys beside the
/// ones just written in RocksDB's memtable). Ids are opaque to clients; only their uniqueness
/// matters, and `ops::enqueue` retries a collision with another member's id.
fn new_job_id() -> String {
    job_id(JOB_IDS.next())
}

fn job_id(id: u64) -> String {
    format!("{id:016x}")
}

pub struct QueueService {
    ctx: Arc<Ctx>,
}

impl QueueService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }

    /// With auth enabled, a queue's operations need READ (inspecting) or READ and WRITE
    /// (everything else) on the queue's key prefix, the keys they read and write. Checked once
    /// here, before the operation's transactions, like the lock service's checks. Judged also
    /// when auth looks off here: the returned backend's txns carry the auth revision judged at,
    /// so apply refuses them if auth changed since (issue 19; a Claim that waited through an
    /// AuthEnable gets "user name is empty", as it carried no user, and its claim txn, the last
    /// step, did not run).
    async fn backend(
        &self,
        meta: &MetadataMap,
        queue: &str,
        write: bool,
    ) -> Result<CtxBackend, Status> {
        let range = KeyRange::prefix(&queue::keys::queue_prefix(queue));
        let mut needs = vec![Need::Read(range.clone())];
        if write {
            needs.push(Need::Write(range));
        }
        CtxBackend::authorize(&self.ctx, meta, &needs).await
    }

    fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    fn header(&self, revision: i64) -> Option<picket_proto::etcdserverpb::ResponseHeader> {
        let mut h = (revision > 0).then(|| self.ctx().header(revision));
        self.ctx().stamp(&mut h);
        h
    }
}

#[tonic::async_trait]
impl Queue for QueueService {
    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    async fn enqueue(
        &self,
        req: Request<EnqueueRequest>,
    ) -> Result<Response<EnqueueResponse>, Status> {
        let backend = self.backend(req.metadata(), &req.get_ref().queue, true).await?;
        let req = req.into_inner();
        self.ctx().check_size(&req)?;
        validate::enqueue(&req)?;
        let now = now_ms();
        let record = QueueJobRecord {
            payload: req.payload,
            priority: req.priority,
            max_attempts: if req.max_attempts == 0 {
                queue::DEFAULT_MAX_ATTEMPTS
            } else {
                req.max_attempts
            },
            backoff_ms: if req.backoff_ms == 0 {
                queue::DEFAULT_BACKOFF_MS
            } else {
                req.backoff_ms
            },
            dedup_id: req.dedup_id,
            enqueued_at_ms: now,
        };
        let job = ops::NewJob { record, delay_ms: req.delay_ms };
        let out = ops::enqueue(&backend, &req.queue, job, now, new_job_id).await?;
        tracing::debug!(queue = %req.queue, job = %out.id, revision = out.revision, duplicate = out.duplicate, "enqueued");
        Ok(Response::new(EnqueueResponse {
            header: self.header(0),
            job_id: out.id,
            revision: out.revision,
            duplicate: out.duplicate,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, lease_id = req.get_ref().lease))]
    async fn claim(&self, req: Request<ClaimRequest>) -> Result<Response<ClaimResponse>, Status> {
        let backend = self.backend(req.metadata(), &req.get_ref().queue, true).await?;
        let req = req.into_inner();
        validate::claim(&req)?;
        // Without a wait limit the call waits until a job is ready; tonic drops this future when
        // the client's gRPC deadline passes or it disconnects, and an unfinished claim leaves
        // nothing behind (the claim Txn is the last step and either committed or did not run).
        let wait = req.wait_timeout_ms.map(Duration::from_millis);
        let job = ops::claim(
            &backend,
            &req.queue,
            req.lease,
            req.visibility_timeout_ms,
            &req.request_id,
            wait,
            now_ms,
        )
        .await?;
        if let Some(j) = &job {
            tracing::debug!(queue = %req.queue, job = %j.job_id, revision = j.token, attempt = j.attempt, "claimed");
        }
        let rev = job.as_ref().map(|j| j.token).unwrap_or_default();
        Ok(Response::new(ClaimResponse { header: self.header(rev), job }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, revision = req.get_ref().token))]
    async fn ack(&self, req: Request<AckJobRequest>) -> Result<Response<AckJobResponse>, Status> {
        let backend = self.backend(req.metadata(), &req.get_ref().queue, true).await?;
        let req = req.into_inner();
        let Some(next) = validate::ack(&req)? else {
            let rev = ops::ack(&backend, &req.queue, &req.job_id, req.token).await?;
            let resp = AckJobResponse { header: self.header(rev), next: None, ack_revision: rev };
            return Ok(Response::new(resp));
        };
        // As for Claim: without a wait limit the call waits until a job is ready, and tonic
        // drops this future when the client's deadline passes; the ack is then done or not
        // (one proposal), and an unfinished wait leaves nothing behind.
        let done = ops::ack_then_claim(&backend, &req.queue, &req.job_id, req.token, &next, now_ms)
            .await?;
        if let Some(j) = &done.next {
            tracing::debug!(queue = %req.queue, job = %j.job_id, revision = j.token, attempt = j.attempt, "claimed with an ack");
        }
        let rev = done.next.as_ref().map_or(done.ack_revision, |j| j.token);
        Ok(Response::new(AckJobResponse {
            header: self.header(rev),
            next: done.next,
            ack_revision: done.ack_revision,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, revision = req.get_ref().token))]
    async fn nack(
        &self,
        req: Request<NackJobRequest>,
    ) -> Result<Response<NackJobResponse>, Status> {
        let backend = self.backend(req.metadata(), &req.get_ref().queue, true).await?;
        let req = req.into_inner();
        let error = validate::nack(&req)?;
        let out =
            ops::nack(&backend, &req.queue, &req.job_id, req.token, req.delay_ms, &error, now_ms())
                .await?;
        Ok(Response::new(NackJobResponse {
            header: self.header(out.revision),
            dead_lettered: out.dead_lettered,
            ready_at_ms: out.ready_at_ms,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue, revision = req.get_ref().token))]
    async fn extend(
        &self,
        req: Request<ExtendClaimRequest>,
    ) -> Result<Response<ExtendClaimResponse>, Status> {
        let backend = self.backend(req.metadata(), &req.get_ref().queue, true).await?;
        let req = req.into_inner();
        validate::extend(&req)?;
        let (deadline_ms, rev) = ops::extend(
            &backend,
            &req.queue,
            &req.job_id,
            req.token,
            req.visibility_timeout_ms,
            now_ms(),
        )
        .await?;
        Ok(Response::new(ExtendClaimResponse { header: self.header(rev), deadline_ms }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    async fn inspect(
        &self,
        req: Request<QueueInspectRequest>,
    ) -> Result<Response<QueueInspectResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        validate::inspect(&req)?;
        // Read first (its read barrier brings this member's auth store up to the request), then
        // judge, then answer (issue 19): a refused caller learns nothing of the read.
        let reader = CtxBackend::new(self.ctx.clone(), &meta, None);
        let read = ops::inspect(&reader, &req.queue, req.limit as usize, now_ms()).await;
        self.backend(&meta, &req.queue, false).await?;
        let out = read?;
        Ok(Response::new(QueueInspectResponse {
            header: self.header(out.revision),
            ready: out.ready,
            delayed: out.delayed,
            in_flight: out.in_flight,
            dead: out.dead,
            jobs: out.jobs,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    async fn dead_letters(
        &self,
        req: Request<DeadLettersRequest>,
    ) -> Result<Response<DeadLettersResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        validate::dead_letters(&req)?;
        let limit = if req.limit == 0 { DEFAULT_DEAD_LIST } else { req.limit };
        // Read, then judge, as Inspect does.
        let reader = CtxBackend::new(self.ctx.clone(), &meta, None);
        let read = ops::dead_letters(&reader, &req.queue, limit as usize).await;
        self.backend(&meta, &req.queue, false).await?;
        let (dead, count, rev) = read?;
        let jobs = dead
            .into_iter()
            .map(|d| QueueDeadLetter { job: Some(d.info), payload: d.payload, reason: d.reason })
            .collect();
        Ok(Response::new(DeadLettersResponse { header: self.header(rev), jobs, count }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(queue = %req.get_ref().queue))]
    async fn requeue(
        &self,
        req: Request<RequeueJobRequest>,
    ) -> Result<Response<RequeueJobResponse>, Status> {
        let backend = self.backend(req.metadata(), &req.get_ref().queue, true).await?;
        let req = req.into_inner();
        validate::requeue(&req)?;
        let rev = ops::requeue(&backend, &req.queue, &req.job_id, now_ms()).await?;
        Ok(Response::new(RequeueJobResponse { header: self.header(rev) }))
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
