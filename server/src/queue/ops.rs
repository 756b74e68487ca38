//! Queue operations. Claim and Ack propose a `QueueCommand` that apply decides
//! ([`super::decide`]); the others read, build a Txn ([`super::txns`]), run it and interpret the
//! result. Each function takes the serving member's clock reading (`now_ms`, unix ms) as an
//! argument, so nothing here reads a clock and the replicated path stays deterministic.

use std::collections::HashMap;
use std::time::Duration;

use picket_proto::etcdserverpb::response_op::Response as OpResp;
use picket_proto::etcdserverpb::{RangeRequest, TxnResponse};
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::raft::v1::queue_ack_claimed::Next;
use picket_proto::picket::raft::v1::queue_command::Op as QueueOp;
use picket_proto::picket::raft::v1::queue_result::Outcome;
use picket_proto::picket::raft::v1::{
    QueueAckClaimOp, QueueAckOp, QueueClaimOp, QueueCommand, QueueEmpty, QueueResult, QueueStale,
};
use picket_proto::picket::v1::{
    ClaimRequest, ClaimedJob, QueueClaimRecord, QueueDeadRecord, QueueJobInfo, QueueJobRecord,
    QueueJobState, QueuePendingRecord,
};
use prost::Message;
use tokio::sync::broadcast::error::RecvError;

use super::{keys, txns, Backend, QueueBackend, QueueError, StoreError};
use crate::storage::state_machine::FeedItem;
use picket_proto::prefix_end;

fn decode<M: Message + Default>(kv: &KeyValue) -> Result<M, QueueError> {
    M::decode(kv.value.as_slice()).map_err(|e| QueueError::Corrupt {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        why: e.to_string(),
    })
}

fn range_kv(resp: &TxnResponse, i: usize) -> Option<KeyValue> {
    match resp.responses.get(i)?.response.as_ref()? {
        OpResp::ResponseRange(r) => r.kvs.first().cloned(),
        _ => None,
    }
}

fn rev(resp: &TxnResponse) -> i64 {
    resp.header.as_ref().map(|h| h.revision).unwrap_or_default()
}

async fn get<B: Backend>(b: &B, key: Vec<u8>) -> Result<Option<KeyValue>, QueueError> {
    Ok(b.range(RangeRequest { key, ..Default::default() }).await?.kvs.into_iter().next())
}

fn prefix_range(prefix: Vec<u8>) -> RangeRequest {
    RangeRequest { range_end: prefix_end(&prefix), key: prefix, ..Default::default() }
}

/// What Enqueue asks for, validated by the caller.
#[derive(Debug, Clone, Default)]
pub struct NewJob {
    /// The job's payload and options.
    pub record: QueueJobRecord,
    /// Delay before it may be claimed.
    pub delay_ms: u64,
}

/// The outcome of [`enqueue`].
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    /// The job's id (the existing one for a duplicate).
    pub id: String,
    /// The revision of the enqueue (of the dedup key for a duplicate).
    pub revision: i64,
    /// True when the dedup id was already known.
    pub duplicate: bool,
}

/// Adds a job with an id from `new_id`; with a known dedup id, returns the existing job.
pub async fn enqueue<B: Backend>(
    b: &B,
    queue: &str,
    job: NewJob,
    now_ms: u64,
    mut new_id: impl FnMut() -> String,
) -> Result<Enqueued, QueueError> {
    let dedup = Some(job.record.dedup_id.as_str()).filter(|d| !d.is_empty());
    // One member never repeats an id; two collide only when drawn in the same millisecond with
    // overlapping runs of the same 20 random bits (`api::time_ids`), so a few tries suffice.
    for _ in 0..4 {
        let id = new_id();
        let txn = txns::enqueue(queue, &id, &job.record, now_ms, job.delay_ms, dedup);
        let resp = b.txn(txn).await?;
        if resp.succeeded {
            return Ok(Enqueued { id, revision: rev(&resp), duplicate: false });
        }
        if let Some(kv) = dedup.and_then(|_| range_kv(&resp, 0)) {
            let id = String::from_utf8_lossy(&kv.value).into_owned();
            return Ok(Enqueued { id, revision: kv.create_revision, duplicate: true });
        }
    }
    Err(QueueError::Contended(queue.to_string()))
}

struct Claims {
    /// Job id -> the live claim's key-value.
    by_job: HashMap<String, KeyValue>,
}

async fn read_claims<B: Backend>(b: &B, queue: &str) -> Result<Claims, QueueError> {
    let prefix = keys::claim_prefix(queue);
    let resp = b.range(prefix_range(prefix.clone())).await?;
    let mut by_job = HashMap::new();
    for kv in resp.kvs {
        if let Some(id) = keys::id_after(&prefix, &kv.key) {
            by_job.insert(id, kv);
        }
    }
    Ok(Claims { by_job })
}

/// The queue command a member proposes, stamped with its clock reading.
fn command(queue: &str, now_ms: u64, op: QueueOp) -> QueueCommand {
    QueueCommand { queue: queue.to_string(), now_ms, op: Some(op) }
}

/// What apply decided, or the corrupt record it found.
fn outcome(queue: &str, r: QueueResult) -> Result<Outcome, QueueError> {
    match r.outcome {
        Some(Outcome::Corrupt(c)) => Err(QueueError::Corrupt { key: c.key, why: c.why }),
        Some(o) => Ok(o),
        None => Err(QueueError::Corrupt {
            key: queue.to_string(),
            why: "apply answered a queue command with no outcome".into(),
        }),
    }
}

/// Whether an applied batch may make a job of `queue` claimable: an index write, or a claim
/// deleted (acked, nacked, reaped, or its lease ended).
fn may_wake(queue: &str, batch: &crate::storage::state_machine::RevisionEvents) -> bool {
    let pending = keys::pending_prefix(queue);
    let claim = keys::claim_prefix(queue);
    batch.events.iter().any(|e| {
        e.kv.as_ref().is_some_and(|kv| {
            kv.key.starts_with(&pending)
                || (e.r#type == EventType::Delete as i32 && kv.key.starts_with(&claim))
        })
    })
}

/// Claims a job, waiting up to `wait` (None: without limit) for one to become claimable.
/// `clock` reads the serving member's wall clock (unix ms). Returns `None` when the wait ended
/// with nothing claimed. Each attempt is one proposal; apply picks the job ([`super::decide`]).
pub async fn claim<B: QueueBackend>(
    b: &B,
    queue: &str,
    lease: i64,
    visibility_ms: u64,
    request_id: &str,
    wait: Option<Duration>,
    clock: impl Fn() -> u64,
) -> Result<Option<ClaimedJob>, QueueError> {
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    // Subscribe before proposing, so every revision after apply's decision is in the feed.
    let mut feed = b.subscribe();
    let op = QueueClaimOp { lease, visibility_ms, request_id: request_id.to_string() };
    claim_loop(b, queue, &op, deadline, &clock, &mut feed).await
}

/// What [`ack_then_claim`] did: the ack's revision and the job claimed, if one became ready
/// within the wait.
#[derive(Debug, Clone, PartialEq)]
pub struct AckClaimed {
    /// The revision of the ack (for a retried request id, the claim's token: see
    /// `QueueAckClaimed`).
    pub ack_revision: i64,
    /// The next job, or `None` when the wait ended with nothing claimed.
    pub next: Option<ClaimedJob>,
}

/// Completes the job claimed with `token` and, in the same proposal, makes the claim `next`
/// describes (validated; its queue is `queue`); if nothing is claimable then, waits up to its
/// `wait_timeout_ms` (from the ack; absent: without limit) as [`claim`] does. A stale token is
/// refused as [`ack`] refuses it, and nothing is claimed.
pub async fn ack_then_claim<B: QueueBackend>(
    b: &B,
    queue: &str,
    id: &str,
    token: i64,
    next: &ClaimRequest,
    clock: impl Fn() -> u64,
) -> Result<AckClaimed, QueueError> {
    let deadline =
        next.wait_timeout_ms.map(|w| tokio::time::Instant::now() + Duration::from_millis(w));
    let claim = || QueueClaimOp {
        lease: next.lease,
        visibility_ms: next.visibility_timeout_ms,
        request_id: next.request_id.clone(),
    };
    // Subscribe before proposing, as `claim` does.
    let mut feed = b.subscribe();
    let ack = QueueAckOp { job_id: id.to_string(), token };
    let op = QueueOp::AckClaim(QueueAckClaimOp { ack: Some(ack), claim: Some(claim()) });
    let done = match outcome(queue, b.decide(command(queue, clock(), op)).await?)? {
        Outcome::AckClaimed(done) => done,
        Outcome::Stale(s) => return Err(stale_outcome(queue, id, token, &s)),
        other => return Err(unexpected(queue, "an ack_claim", &other)),
    };
    let ack_revision = done.ack_revision;
    let seen = match done.next {
        Some(Next::Claimed(job)) => return Ok(AckClaimed { ack_revision, next: Some(job) }),
        Some(Next::Empty(e)) => e,
        None => {
            return Err(QueueError::Corrupt {
                key: queue.to_string(),
                why: "apply answered an ack_claim with neither a job nor an empty queue".into(),
            })
        }
    };
    if !wait_for_change(queue, &seen, deadline, &clock, &mut feed).await? {
        return Ok(AckClaimed { ack_revision, next: None });
    }
    let next = claim_loop(b, queue, &claim(), deadline, &clock, &mut feed).await?;
    Ok(AckClaimed { ack_revision, next })
}

/// Proposes claims until one gets a job or the caller's wait ends (`deadline`), sleeping
/// between them until the queue changes ([`wait_for_change`]). `feed` was subscribed before
/// the first proposal of the caller's operation.
async fn claim_loop<B: QueueBackend>(
    b: &B,
    queue: &str,
    op: &QueueClaimOp,
    deadline: Option<tokio::time::Instant>,
    clock: &impl Fn() -> u64,
    feed: &mut tokio::sync::broadcast::Receiver<FeedItem>,
) -> Result<Option<ClaimedJob>, QueueError> {
    loop {
        let cmd = command(queue, clock(), QueueOp::Claim(op.clone()));
        let empty = match outcome(queue, b.decide(cmd).await?)? {
            Outcome::Claimed(job) => return Ok(Some(job)),
            Outcome::Empty(e) => e,
            other => return Err(unexpected(queue, "a claim", &other)),
        };
        if !wait_for_change(queue, &empty, deadline, clock, feed).await? {
            return Ok(None);
        }
    }
}

/// After apply found nothing claimable (`empty`), sleeps until something may be: a later
/// revision that writes the queue's index or deletes a claim, a snapshot install, the next
/// delayed job's due time (by this member's clock), or the caller's `deadline`. Returns false
/// when the deadline has passed (the caller's wait is over), true to propose again.
async fn wait_for_change(
    queue: &str,
    empty: &QueueEmpty,
    deadline: Option<tokio::time::Instant>,
    clock: &impl Fn() -> u64,
    feed: &mut tokio::sync::broadcast::Receiver<FeedItem>,
) -> Result<bool, QueueError> {
    let wake_at = Some(empty.wake_at_ms).filter(|&t| t > 0);
    let now = tokio::time::Instant::now();
    if deadline.is_some_and(|d| d <= now) {
        return Ok(false);
    }
    // Sleep until the next delayed job is due (by this member's clock), but at most until the
    // caller's wait ends; a far-off due time is re-checked hourly (a clock step).
    let due = wake_at.map(|t| Duration::from_millis(t.saturating_sub(clock()).max(1)));
    let mut until = now + due.unwrap_or(Duration::from_secs(3600)).min(Duration::from_secs(3600));
    if let Some(d) = deadline {
        until = until.min(d);
    }
    let sleep = tokio::time::sleep_until(until);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return Ok(true),
            batch = feed.recv() => match batch {
                // A snapshot install: jobs may have become claimable inside it. Re-read.
                Ok(FeedItem::SnapshotInstalled { .. }) => return Ok(true),
                Ok(FeedItem::Revision(batch)) if batch.revision <= empty.revision => {}
                Ok(FeedItem::Revision(batch)) => if may_wake(queue, &batch) { return Ok(true) },
                // Fell behind the feed: propose again instead of trusting it.
                Err(RecvError::Lagged(_)) => return Ok(true),
                Err(RecvError::Closed) => return Err(QueueError::Store(StoreError::Stopped)),
            },
        }
    }
}

fn unexpected(queue: &str, what: &str, other: &Outcome) -> QueueError {
    QueueError::Corrupt {
        key: queue.to_string(),
        why: format!("apply answered {what} with {other:?}"),
    }
}

fn stale_outcome(queue: &str, id: &str, token: i64, s: &QueueStale) -> QueueError {
    QueueError::StaleClaim {
        queue: queue.to_string(),
        job: id.to_string(),
        token,
        current: Some(s.current).filter(|&c| c != 0),
        job_exists: s.job_exists,
    }
}

/// The claim of `id`, if any, decoded.
async fn read_claim<B: Backend>(
    b: &B,
    queue: &str,
    id: &str,
) -> Result<Option<(KeyValue, QueueClaimRecord)>, QueueError> {
    match get(b, keys::claim_key(queue, id)).await? {
        Some(kv) => {
            let rec = decode(&kv)?;
            Ok(Some((kv, rec)))
        }
        None => Ok(None),
    }
}

async fn stale<B: Backend>(b: &B, queue: &str, id: &str, token: i64) -> QueueError {
    let current = match get(b, keys::claim_key(queue, id)).await {
        Ok(kv) => kv.map(|kv| kv.create_revision),
        Err(e) => return e,
    };
    let job_exists = match get(b, keys::job_key(queue, id)).await {
        Ok(kv) => kv.is_some(),
        Err(e) => return e,
    };
    QueueError::StaleClaim {
        queue: queue.to_string(),
        job: id.to_string(),
        token,
        current,
        job_exists,
    }
}

fn stale_from(queue: &str, id: &str, token: i64, resp: &TxnResponse) -> QueueError {
    QueueError::StaleClaim {
        queue: queue.to_string(),
        job: id.to_string(),
        token,
        current: range_kv(resp, 0).map(|kv| kv.create_revision),
        job_exists: range_kv(resp, 1).is_some(),
    }
}

/// Reads the claim of `id` and checks it is `token`'s.
async fn held<B: Backend>(
    b: &B,
    queue: &str,
    id: &str,
    token: i64,
) -> Result<(KeyValue, QueueClaimRecord), QueueError> {
    match read_claim(b, queue, id).await? {
        Some((kv, rec)) if kv.create_revision == token => Ok((kv, rec)),
        _ => Err(stale(b, queue, id, token).await),
    }
}

/// Completes the job claimed with `token` (one proposal, decided in apply). Returns the
/// revision of the ack.
pub async fn ack<B: QueueBackend>(
    b: &B,
    queue: &str,
    id: &str,
    token: i64,
) -> Result<i64, QueueError> {
    let op = QueueOp::Ack(QueueAckOp { job_id: id.to_string(), token });
    // The clock plays no part in an ack.
    match outcome(queue, b.decide(command(queue, 0, op)).await?)? {
        Outcome::Acked(done) => Ok(done.revision),
        Outcome::Stale(s) => Err(stale_outcome(queue, id, token, &s)),
        other => Err(unexpected(queue, "an ack", &other)),
    }
}

/// The outcome of [`nack`].
#[derive(Debug, Clone, PartialEq)]
pub struct Nacked {
    /// The job used its last attempt and is now a dead letter.
    pub dead_lettered: bool,
    /// When it is claimable again, unless dead-lettered.
    pub ready_at_ms: u64,
    /// The revision of the nack.
    pub revision: i64,
}

/// Gives back the job claimed with `token`, for a retry after `delay_ms` (None: exponential
/// backoff) or to the dead-letter queue if it has used its attempts.
pub async fn nack<B: Backend>(
    b: &B,
    queue: &str,
    id: &str,
    token: i64,
    delay_ms: Option<u64>,
    error: &str,
    now_ms: u64,
) -> Result<Nacked, QueueError> {
    let (_, claim) = held(b, queue, id, token).await?;
    let pending_key = claim.pending_key.into_bytes();
    let Some(pending_kv) = get(b, pending_key.clone()).await? else {
        return Err(stale(b, queue, id, token).await);
    };
    let rec: QueuePendingRecord = decode(&pending_kv)?;
    let Some(pk) = keys::parse_pending_key(queue, &pending_key) else {
        return Err(QueueError::Corrupt {
            key: String::from_utf8_lossy(&pending_key).into_owned(),
            why: "claim names a key outside the index".into(),
        });
    };
    let rec = QueuePendingRecord { last_error: error.to_string(), ..rec };
    if rec.attempts >= rec.max_attempts.max(1) {
        let Some(job_kv) = get(b, keys::job_key(queue, id)).await? else {
            return Err(stale(b, queue, id, token).await);
        };
        let dead = QueueDeadRecord {
            job: Some(decode(&job_kv)?),
            attempts: rec.attempts,
            last_error: rec.last_error.clone(),
            reason: format!(
                "nacked on its last attempt ({} of {})",
                rec.attempts, rec.max_attempts
            ),
        };
        let guard = vec![txns::holds(queue, id, token)];
        let resp = b.txn(txns::dead_letter(queue, id, guard, &pending_key, &dead, true)).await?;
        if !resp.succeeded {
            return Err(stale_from(queue, id, token, &resp));
        }
        return Ok(Nacked { dead_lettered: true, ready_at_ms: 0, revision: rev(&resp) });
    }
    let delay = delay_ms.unwrap_or_else(|| super::backoff_ms(rec.backoff_ms, rec.attempts));
    let ready_at_ms = now_ms.saturating_add(delay);
    let rec = QueuePendingRecord { delay_ms: Some(delay), ..rec };
    let new_key = keys::pending_key(queue, pk.priority, ready_at_ms, id);
    let resp = b.txn(txns::nack(queue, id, token, &pending_key, &new_key, &rec)).await?;
    if !resp.succeeded {
        return Err(stale_from(queue, id, token, &resp));
    }
    Ok(Nacked { dead_lettered: false, ready_at_ms, revision: rev(&resp) })
}

/// Checks the claim `token` is live and, with `visibility_ms > 0`, sets its deadline to
/// `now_ms + visibility_ms`. Returns the deadline (0: none) and the revision.
pub async fn extend<B: Backend>(
    b: &B,
    queue: &str,
    id: &str,
    token: i64,
    visibility_ms: u64,
    now_ms: u64,
) -> Result<(u64, i64), QueueError> {
    let (kv, rec) = held(b, queue, id, token).await?;
    if visibility_ms == 0 {
        return Ok((rec.deadline_ms, kv.mod_revision));
    }
    let rec = QueueClaimRecord { deadline_ms: now_ms + visibility_ms, ..rec };
    let resp = b.txn(txns::extend(queue, id, token, kv.lease, &rec)).await?;
    if !resp.succeeded {
        return Err(stale_from(queue, id, token, &resp));
    }
    Ok((rec.deadline_ms, rev(&resp)))
}

/// Counts and (up to `limit`) lists the jobs of `queue`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inspection {
    /// Unclaimed and due.
    pub ready: u64,
    /// Unclaimed, waiting for a delay or backoff.
    pub delayed: u64,
    /// With a live claim.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Pending jobs in claim order.
    pub jobs: Vec<QueueJobInfo>,
    /// The revision read at.
    pub revision: i64,
}

fn info(
    pk: &keys::PendingKey,
    rec: &QueuePendingRecord,
    claim: Option<&KeyValue>,
    now_ms: u64,
) -> QueueJobInfo {
    let state = match claim {
        Some(_) => QueueJobState::Claimed,
        None if super::waiting(pk.ready_at_ms, rec.delay_ms, now_ms) => QueueJobState::Delayed,
        None => QueueJobState::Ready,
    };
    QueueJobInfo {
        job_id: pk.id.clone(),
        state: state as i32,
        priority: pk.priority,
        attempts: rec.attempts,
        max_attempts: rec.max_attempts,
        ready_at_ms: pk.ready_at_ms,
        token: claim.map(|c| c.create_revision).unwrap_or_default(),
        lease: claim.map(|c| c.lease).unwrap_or_default(),
        last_error: rec.last_error.clone(),
        payload_size: 0,
        dedup_id: String::new(),
    }
}

/// Reads every index entry and claim of `queue` (one linearizable read each) and classifies
/// them at `now_ms`.
pub async fn inspect<B: Backend>(
    b: &B,
    queue: &str,
    limit: usize,
    now_ms: u64,
) -> Result<Inspection, QueueError> {
    let claims = read_claims(b, queue).await?;
    let pending = b.range(prefix_range(keys::pending_prefix(queue))).await?;
    let mut dead_req = prefix_range(keys::dead_prefix(queue));
    dead_req.count_only = true;
    let dead = b.range(dead_req).await?;
    let mut out = Inspection {
        dead: dead.count.max(0) as u64,
        revision: dead.header.map(|h| h.revision).unwrap_or_default(),
        ..Default::default()
    };
    for kv in &pending.kvs {
        let Some(pk) = keys::parse_pending_key(queue, &kv.key) else { continue };
        let rec: QueuePendingRecord = decode(kv)?;
        let job = info(&pk, &rec, claims.by_job.get(&pk.id), now_ms);
        match QueueJobState::try_from(job.state) {
            Ok(QueueJobState::Claimed) => out.in_flight += 1,
            Ok(QueueJobState::Delayed) => out.delayed += 1,
            _ => out.ready += 1,
        }
        if out.jobs.len() < limit {
            out.jobs.push(job);
        }
    }
    Ok(out)
}

/// A dead letter as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct Dead {
    /// The job.
    pub info: QueueJobInfo,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Why it was dead-lettered.
    pub reason: String,
}

/// Lists up to `limit` dead letters of `queue` and counts them all.
pub async fn dead_letters<B: Backend>(
    b: &B,
    queue: &str,
    limit: usize,
) -> Result<(Vec<Dead>, u64, i64), QueueError> {
    let prefix = keys::dead_prefix(queue);
    let mut req = prefix_range(prefix.clone());
    req.limit = limit as i64;
    let resp = b.range(req).await?;
    let mut out = Vec::with_capacity(resp.kvs.len());
    for kv in &resp.kvs {
        let Some(id) = keys::id_after(&prefix, &kv.key) else { continue };
        let rec: QueueDeadRecord = decode(kv)?;
        let job = rec.job.unwrap_or_default();
        out.push(Dead {
            info: QueueJobInfo {
                job_id: id,
                state: QueueJobState::Dead as i32,
                priority: job.priority,
                attempts: rec.attempts,
                max_attempts: job.max_attempts,
                last_error: rec.last_error,
                payload_size: job.payload.len() as u64,
                dedup_id: job.dedup_id,
                ..Default::default()
            },
            payload: job.payload,
            reason: rec.reason,
        });
    }
    let revision = resp.header.map(|h| h.revision).unwrap_or_default();
    Ok((out, resp.count.max(0) as u64, revision))
}

/// Moves dead letter `id` back into `queue`, attempts reset, claimable at `now_ms`.
pub async fn requeue<B: Backend>(
    b: &B,
    queue: &str,
    id: &str,
    now_ms: u64,
) -> Result<i64, QueueError> {
    let not_dead = || QueueError::NotDead { queue: queue.to_string(), job: id.to_string() };
    let Some(kv) = get(b, keys::dead_key(queue, id)).await? else { return Err(not_dead()) };
    let rec: QueueDeadRecord = decode(&kv)?;
    let job = rec.job.unwrap_or_default();
    let resp = b.txn(txns::requeue(queue, id, kv.mod_revision, &job, now_ms)).await?;
    if !resp.succeeded {
        // Requeued (or requeued and finished) by someone else meanwhile.
        return Err(not_dead());
    }
    Ok(rev(&resp))
}
