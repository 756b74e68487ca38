//! The `queue` workload (Picket only: `picket.v1.Queue` has no etcd equivalent, so the run
//! refuses `--target etcd`). Producers enqueue unique integers into one queue; workers claim
//! jobs under their own kept-alive lease, then ack most and nack some (short delays, so jobs
//! come back); after healing, a drain with a fresh lease claims and acks whatever is left, and
//! reads the dead-letter queue and the final counts. Checked by [`crate::checker::queue`].
//!
//! Requests go through the generated `picket_proto` Queue client on one node's channel; leases
//! through `etcd-client`. Status errors are classified like every other workload's (a definite
//! rejection is `fail`, anything ambiguous is `info`).
//!
//! Operations (`value` of the invocation -> of the ok completion):
//! - `enqueue {payload}` -> `{payload, id, revision}`
//! - `claim {lease}` -> `{id, payload, token, attempt}` or `{empty: true}`
//! - `ack {id, token, payload}` -> `{id, token, payload, revision}`; half the acks of workers ask
//!   for `claim_next` (`"claim_next": true` in the invocation): the same write claims the
//!   worker's next job, recorded after the ack as the `claim` it is (invoked and completed with
//!   the ack's answer; `info` when the ack's outcome is unknown)
//! - `nack {id, token, payload}` -> `{..., revision, dead}`
//! - final: `claim`/`ack` as above with `"final": true`, `dead_letters` -> `{payloads: [...]}`,
//!   `inspect` -> `{ready, delayed, in_flight, dead}`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use picket_proto::picket::v1::queue_client::QueueClient;
use picket_proto::picket::v1::{
    AckJobRequest, ClaimRequest, ClaimedJob, DeadLettersRequest, EnqueueRequest, NackJobRequest,
    QueueInspectRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tonic::transport::Channel;

use super::leases;
use super::{
    connect, max_iterations, worker_seed, OpCounts, Recorder, WorkerEnv, WorkloadError,
    WorkloadOptions,
};
use crate::client::{self, OpError};
use crate::cluster::NodeInfo;
use crate::history::{EventType, Header};

/// The queue every operation uses.
pub const QUEUE: &str = "jepsen";
/// Attempts per job before it is dead-lettered: high, so nacks and dead claimants rarely
/// exhaust it, but reachable (the dead-letter path is exercised when faults pile up).
const MAX_ATTEMPTS: u32 = 8;
/// How long a worker's Claim waits server-side for a job.
const CLAIM_WAIT_MS: u64 = 500;
const CLAIM_WAIT: Duration = Duration::from_millis(CLAIM_WAIT_MS);
/// Claims of the drain: it stops after this many empty claims in a row (each waits
/// [`DRAIN_WAIT_MS`]) once nothing is pending, or after [`DRAIN_MAX`] claims.
const DRAIN_EMPTY: usize = 3;
const DRAIN_WAIT_MS: u64 = 2000;
const DRAIN_MAX: usize = 100_000;
/// Longest delay the run asks for (a nack's `delay_ms`).
const NACK_DELAY_MAX_MS: u64 = 100;
/// Keep-alive request bound.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

pub struct QueueWorkload {
    opts: WorkloadOptions,
    next_payload: Arc<AtomicU64>,
}

fn status_err(s: tonic::Status) -> OpError {
    OpError::Client(etcd_client::Error::GRpcStatus(s))
}

fn hdr(h: Option<&picket_proto::etcdserverpb::ResponseHeader>) -> Option<Header> {
    h.map(|h| Header { revision: h.revision, raft_term: h.raft_term, member_id: h.member_id })
}

/// A lazily connected channel to one node with a per-request bound.
fn channel(node: &NodeInfo, timeout: Duration) -> Result<Channel, WorkloadError> {
    let ep = Channel::from_shared(node.client_url.clone()).map_err(|e| WorkloadError::Client {
        endpoint: node.client_url.clone(),
        message: e.to_string(),
    })?;
    Ok(ep.connect_timeout(timeout.min(Duration::from_secs(2))).timeout(timeout).connect_lazy())
}

async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, OpError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(status_err(s)),
        Err(_) => Err(OpError::Timeout(timeout)),
    }
}

impl QueueWorkload {
    pub fn new(opts: WorkloadOptions) -> Self {
        QueueWorkload { opts, next_payload: Arc::new(AtomicU64::new(0)) }
    }

    pub fn spawn_workers(
        &self,
        set: &mut JoinSet<Result<OpCounts, WorkloadError>>,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        seed: u64,
    ) {
        for w in 0..self.opts.workers {
            let node = nodes[w % nodes.len()].clone();
            let (opts, env, next) = (self.opts.clone(), env.clone(), self.next_payload.clone());
            // A third of the workers produce, the rest consume.
            if w % 3 == 0 {
                set.spawn(producer(node, opts, env, next, worker_seed(seed, w)));
            } else {
                set.spawn(consumer(node, opts, env, worker_seed(seed, w)));
            }
        }
    }

    /// The drain: after healing, claims and acks everything left (jobs of dead workers come
    /// back when their leases expire), then reads the dead letters and the counts.
    pub async fn final_phase(
        &self,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        op_timeout: Duration,
    ) -> Result<(OpCounts, Vec<String>), WorkloadError> {
        let mut counts = OpCounts::default();
        let mut notes = Vec::new();
        for attempt in 0..super::FINAL_ATTEMPTS {
            let node = &nodes[attempt % nodes.len()];
            let mut rec = Recorder::new(env, &node.name);
            let done = drain(&mut rec, node, op_timeout, self.opts.lease_ttl).await;
            counts.add(rec.counts);
            match done {
                Ok(Drain::Done) => return Ok((counts, notes)),
                Ok(Drain::Retry) => {}
                // The queue's state is replicated: another member would show the same jobs.
                Ok(Drain::Stalled(why)) => {
                    notes.push(format!("drain through {}: {why}", node.name));
                    break;
                }
                Err(e) => notes.push(format!("drain through {}: {e}", node.name)),
            }
            tokio::time::sleep(super::FINAL_BACKOFF).await;
        }
        notes.push("the final drain did not complete".into());
        Ok((counts, notes))
    }
}

async fn producer(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    next: Arc<AtomicU64>,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut q = QueueClient::new(channel(&node, opts.op_timeout)?);
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        let payload = next.fetch_add(1, Ordering::Relaxed);
        let args = json!({ "payload": payload });
        rec.invoke("enqueue", Some(QUEUE), args.clone())?;
        let req = EnqueueRequest {
            queue: QUEUE.into(),
            payload: payload.to_string().into_bytes(),
            max_attempts: MAX_ATTEMPTS,
            backoff_ms: 50,
            priority: rng.random_range(0..3),
            ..Default::default()
        };
        match bounded(opts.op_timeout, q.enqueue(req)).await {
            Ok(r) => {
                let v = json!({"payload": payload, "id": r.job_id, "revision": r.revision});
                rec.ok("enqueue", Some(QUEUE), v, hdr(r.header.as_ref()))?;
            }
            Err(e) => {
                rec.error("enqueue", Some(QUEUE), args, &e, false)?;
            }
        }
    }
    Ok(rec.counts)
}

/// A claimed job as the history records it.
struct Claimed {
    id: String,
    payload: Value,
    token: i64,
}

/// One `claim` operation. `Ok(None)`: nothing claimed (empty, or failed: see the history).
async fn claim(
    rec: &mut Recorder,
    q: &mut QueueClient<Channel>,
    lease: i64,
    wait_ms: u64,
    timeout: Duration,
    fin: bool,
) -> Result<(Option<Claimed>, bool), WorkloadError> {
    let args = json!({ "lease": lease, "final": fin });
    rec.invoke("claim", Some(QUEUE), args.clone())?;
    let req = ClaimRequest {
        queue: QUEUE.into(),
        lease,
        wait_timeout_ms: Some(wait_ms),
        ..Default::default()
    };
    match bounded(timeout + Duration::from_millis(wait_ms), q.claim(req)).await {
        Ok(r) => Ok((claim_ok(rec, r.job, lease, fin, hdr(r.header.as_ref()))?, true)),
        Err(e) => {
            // A claim with an unknown outcome is `info`: a claim may exist under our lease that
            // nobody will ack; it ends with the lease and the job comes back.
            rec.error("claim", Some(QUEUE), args, &e, false)?;
            Ok((None, false))
        }
    }
}

/// Records a claim's `ok` completion: the job it got, or `{empty: true}`.
fn claim_ok(
    rec: &mut Recorder,
    job: Option<ClaimedJob>,
    lease: i64,
    fin: bool,
    header: Option<Header>,
) -> Result<Option<Claimed>, WorkloadError> {
    let Some(j) = job else {
        let v = json!({"empty": true, "lease": lease, "final": fin});
        rec.ok("claim", Some(QUEUE), v, header)?;
        return Ok(None);
    };
    let payload: Value = String::from_utf8_lossy(&j.payload)
        .parse::<u64>()
        .map(Value::from)
        .unwrap_or_else(|_| Value::from(String::from_utf8_lossy(&j.payload)));
    let v = json!({"id": j.job_id, "payload": payload, "token": j.token,
                   "attempt": j.attempt, "lease": lease, "final": fin});
    rec.ok("claim", Some(QUEUE), v, header)?;
    Ok(Some(Claimed { id: j.job_id, payload, token: j.token }))
}

/// One `ack` operation. With `next_lease`, an ack with `claim_next` for that lease: one write
/// that also claims the next job, recorded as the `ack` and then the `claim` it made. Returns
/// whether the ack succeeded, and the job claimed, if any.
async fn ack(
    rec: &mut Recorder,
    q: &mut QueueClient<Channel>,
    job: &Claimed,
    next_lease: Option<i64>,
    timeout: Duration,
    fin: bool,
) -> Result<(bool, Option<Claimed>), WorkloadError> {
    let mut args = json!({"id": job.id, "token": job.token, "payload": job.payload, "final": fin});
    if next_lease.is_some() {
        args["claim_next"] = true.into();
    }
    rec.invoke("ack", Some(QUEUE), args.clone())?;
    let claim_next = next_lease.map(|lease| ClaimRequest {
        lease,
        wait_timeout_ms: Some(CLAIM_WAIT_MS),
        ..Default::default()
    });
    // The claim may wait server-side for a job: the bound covers that wait too.
    let bound = timeout + claim_next.as_ref().map_or(Duration::ZERO, |_| CLAIM_WAIT);
    let req =
        AckJobRequest { queue: QUEUE.into(), job_id: job.id.clone(), token: job.token, claim_next };
    match bounded(bound, q.ack(req)).await {
        Ok(r) => {
            let v = json!({"id": job.id, "token": job.token, "payload": job.payload,
                           "revision": r.ack_revision, "final": fin});
            let h = hdr(r.header.as_ref());
            rec.ok("ack", Some(QUEUE), v, h)?;
            let Some(lease) = next_lease else { return Ok((true, None)) };
            rec.invoke("claim", Some(QUEUE), json!({ "lease": lease, "final": fin }))?;
            Ok((true, claim_ok(rec, r.next, lease, fin, h)?))
        }
        Err(e) => {
            // A refusal (fail) claimed nothing: the command is refused whole. An unknown
            // outcome may have claimed a job under our lease, which ends with the lease.
            let kind = rec.error("ack", Some(QUEUE), args, &e, false)?;
            if let (Some(lease), EventType::Info) = (next_lease, kind) {
                let claim_args = json!({ "lease": lease, "final": fin });
                rec.invoke("claim", Some(QUEUE), claim_args.clone())?;
                rec.error("claim", Some(QUEUE), claim_args, &e, false)?;
            }
            Ok((false, None))
        }
    }
}

async fn consumer(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let timeout = opts.op_timeout;
    let mut q = QueueClient::new(channel(&node, timeout)?);
    let mut c = connect(&node, timeout).await?;
    let ka_client = connect(&node, timeout).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    let ttl = opts.lease_ttl.max(1);
    let mut lease: Option<(i64, tokio::task::JoinHandle<()>)> = None;
    // A job claimed by the last ack's claim_next, worked on next.
    let mut held: Option<Claimed> = None;
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        let l = match &lease {
            Some((l, _)) => *l,
            None => match leases::grant(&mut rec, &mut c, ttl, timeout).await? {
                Some(l) => {
                    lease =
                        Some((l, leases::keep_alive(ka_client.clone(), l, ttl, KEEPALIVE_TIMEOUT)));
                    l
                }
                None => continue,
            },
        };
        let (job, answered) = match held.take() {
            Some(job) => (Some(job), true),
            None => claim(&mut rec, &mut q, l, CLAIM_WAIT_MS, timeout, false).await?,
        };
        let Some(job) = job else {
            if !answered {
                // Maybe the lease is gone (a pause outlasted it): start over with a new one.
                if let Some((_, ka)) = lease.take() {
                    ka.abort();
                }
            }
            continue;
        };
        // "Work": a short pause, so claims overlap with faults.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
        let roll = rng.random_range(0..100);
        if roll < 42 {
            // The worker's next job comes in the ack's own write (same lease: a held job is
            // only ever taken under the lease it was claimed with).
            held = ack(&mut rec, &mut q, &job, Some(l), timeout, false).await?.1;
        } else if roll < 85 {
            ack(&mut rec, &mut q, &job, None, timeout, false).await?;
        } else {
            let args = json!({"id": job.id, "token": job.token, "payload": job.payload});
            rec.invoke("nack", Some(QUEUE), args.clone())?;
            let req = NackJobRequest {
                queue: QUEUE.into(),
                job_id: job.id.clone(),
                token: job.token,
                delay_ms: Some(rng.random_range(0..NACK_DELAY_MAX_MS)),
                error: "jepsen nack".into(),
            };
            match bounded(timeout, q.nack(req)).await {
                Ok(r) => {
                    let rev = r.header.as_ref().map(|h| h.revision).unwrap_or_default();
                    let v = json!({"id": job.id, "token": job.token, "payload": job.payload,
                                   "revision": rev, "dead": r.dead_lettered});
                    rec.ok("nack", Some(QUEUE), v, hdr(r.header.as_ref()))?;
                }
                Err(e) => {
                    rec.error("nack", Some(QUEUE), args, &e, false)?;
                }
            }
        }
    }
    if let Some((l, ka)) = lease.take() {
        ka.abort();
        // Best effort: an unrevoked lease expires on its own within its TTL.
        let _ = client::bounded(timeout, c.lease_revoke(l)).await;
    }
    Ok(rec.counts)
}

/// How one drain attempt ended.
#[derive(Debug, PartialEq)]
enum Drain {
    /// Nothing pending, and the dead letters were read.
    Done,
    /// Cut short (an error, an unanswered call): another attempt may finish it.
    Retry,
    /// Jobs stayed pending with nothing claimable for longer than any of them may: the queue
    /// will not drain, and another attempt would wait as long again.
    Stalled(String),
}

/// What `inspect` counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    ready: u64,
    delayed: u64,
    in_flight: u64,
}

impl Pending {
    fn total(&self) -> u64 {
        self.ready + self.delayed + self.in_flight
    }
}

/// How long the drain may claim nothing while jobs are pending. A job in flight comes back
/// once its claimant's lease expires (the TTL); a delayed one within the longest delay the run
/// asks for ([`NACK_DELAY_MAX_MS`]) plus the server's tolerance for a clock that ran ahead
/// (1 s, `queue::CLOCK_TOLERANCE_MS`); a ready one at the next claim. Three TTLs plus 10 s is
/// well past each, so a drain stopped by it found jobs stuck, not slow.
fn stall_bound(lease_ttl: i64) -> Duration {
    Duration::from_secs(3 * lease_ttl.max(1) as u64 + 10) + Duration::from_millis(NACK_DELAY_MAX_MS)
}

/// The drain's finding when it has claimed nothing for `idle` while `pending` jobs remain, once
/// `idle` is past `bound`.
fn stalled(pending: Pending, idle: Duration, bound: Duration) -> Option<String> {
    (pending.total() > 0 && idle > bound).then(|| {
        format!(
            "nothing claimable for {} s while jobs stayed pending ({} ready, {} delayed, {} in \
             flight), longer than any lease or delay of the run allows ({} ms delays at most)",
            idle.as_secs(),
            pending.ready,
            pending.delayed,
            pending.in_flight,
            NACK_DELAY_MAX_MS
        )
    })
}

/// Drains the queue through `node`: [`Drain::Done`] when the queue had no pending job and the
/// dead letters and counts were read. Bounded: at most [`DRAIN_MAX`] claims, and
/// [`stall_bound`] without a claim while jobs are pending.
async fn drain(
    rec: &mut Recorder,
    node: &NodeInfo,
    timeout: Duration,
    lease_ttl: i64,
) -> Result<Drain, WorkloadError> {
    let mut q = QueueClient::new(channel(node, timeout)?);
    let mut c = connect(node, timeout).await?;
    // Long enough to outlive the drain's pauses between claims; revoked at the end.
    let Some(lease) = leases::grant(rec, &mut c, 60, timeout).await? else {
        return Ok(Drain::Retry);
    };
    let bound = stall_bound(lease_ttl);
    let mut last_claim = Instant::now();
    let mut empty = 0;
    let mut outcome = Drain::Retry;
    for _ in 0..DRAIN_MAX {
        let (job, answered) = claim(rec, &mut q, lease, DRAIN_WAIT_MS, timeout, true).await?;
        match job {
            Some(job) => {
                empty = 0;
                last_claim = Instant::now();
                if !ack(rec, &mut q, &job, None, timeout, true).await?.0 {
                    break;
                }
            }
            None if !answered => break,
            None => {
                // Empty now: jobs of workers whose leases have not expired yet are in flight.
                let Some(pending) = inspect(rec, &mut q, timeout).await? else { break };
                if pending.total() == 0 {
                    empty += 1;
                    if empty >= DRAIN_EMPTY {
                        outcome = Drain::Done;
                        break;
                    }
                    continue;
                }
                if let Some(why) = stalled(pending, last_claim.elapsed(), bound) {
                    outcome = Drain::Stalled(why);
                    break;
                }
                // In flight under a dead worker's lease: it expires within the TTL.
                tokio::time::sleep(Duration::from_secs(lease_ttl.max(1) as u64)).await;
            }
        }
    }
    if outcome == Drain::Done && !dead_letters(rec, &mut q, timeout).await? {
        outcome = Drain::Retry;
    }
    let _ = client::bounded(timeout, c.lease_revoke(lease)).await;
    Ok(outcome)
}

/// Records `inspect`; returns what is pending.
async fn inspect(
    rec: &mut Recorder,
    q: &mut QueueClient<Channel>,
    timeout: Duration,
) -> Result<Option<Pending>, WorkloadError> {
    rec.invoke("inspect", Some(QUEUE), Value::Null)?;
    let req = QueueInspectRequest { queue: QUEUE.into(), limit: 0 };
    match bounded(timeout, q.inspect(req)).await {
        Ok(r) => {
            let v = json!({"ready": r.ready, "delayed": r.delayed, "in_flight": r.in_flight,
                           "dead": r.dead});
            rec.ok("inspect", Some(QUEUE), v, hdr(r.header.as_ref()))?;
            Ok(Some(Pending { ready: r.ready, delayed: r.delayed, in_flight: r.in_flight }))
        }
        Err(e) => {
            rec.error("inspect", Some(QUEUE), Value::Null, &e, true)?;
            Ok(None)
        }
    }
}

/// Records `dead_letters` with every dead letter's payload.
async fn dead_letters(
    rec: &mut Recorder,
    q: &mut QueueClient<Channel>,
    timeout: Duration,
) -> Result<bool, WorkloadError> {
    rec.invoke("dead_letters", Some(QUEUE), Value::Null)?;
    let req = DeadLettersRequest { queue: QUEUE.into(), limit: 1000 };
    match bounded(timeout, q.dead_letters(req)).await {
        Ok(r) if r.count as usize > r.jobs.len() => {
            let msg = format!("{} dead letters, more than one page", r.count);
            rec.fail("dead_letters", Some(QUEUE), Value::Null, "too-many", &msg)?;
            Ok(false)
        }
        Ok(r) => {
            let payloads: Vec<Value> = r
                .jobs
                .iter()
                .map(|d| {
                    String::from_utf8_lossy(&d.payload)
                        .parse::<u64>()
                        .map(Value::from)
                        .unwrap_or_else(|_| Value::from(String::from_utf8_lossy(&d.payload)))
                })
                .collect();
            let ids: Vec<String> =
                r.jobs.iter().filter_map(|d| d.job.as_ref().map(|j| j.job_id.clone())).collect();
            let v = json!({"payloads": payloads, "ids": ids, "final": true});
            rec.ok("dead_letters", Some(QUEUE), v, hdr(r.header.as_ref()))?;
            Ok(true)
        }
        Err(e) => {
            rec.error("dead_letters", Some(QUEUE), Value::Null, &e, true)?;
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A drain once waited on 187 jobs that a member's clock, an hour ahead for six seconds, had
    /// delayed by an hour (the server now bounds that, `queue::CLOCK_TOLERANCE_MS`); its only
    /// bound was 100,000 claims of 2 s each. It now stops once nothing was claimable for longer
    /// than any lease or delay of the run allows, and says what was stuck.
    #[test]
    fn a_drain_stops_with_what_is_stuck_once_no_lease_or_delay_explains_it() {
        let ttl = 2;
        let bound = stall_bound(ttl);
        let lease_and_delay =
            Duration::from_secs(ttl as u64 + 1) + Duration::from_millis(NACK_DELAY_MAX_MS);
        assert!(bound > lease_and_delay * 2, "the bound must leave every lease and delay time");
        assert!(bound < Duration::from_secs(60), "and still end a stuck drain within a minute");

        let delayed = Pending { ready: 0, delayed: 187, in_flight: 0 };
        assert_eq!(stalled(delayed, bound - Duration::from_millis(1), bound), None);
        let why = stalled(delayed, bound + Duration::from_secs(1), bound).expect("stalled");
        assert!(why.contains("187 delayed"), "{why}");
        let held = Pending { ready: 0, delayed: 0, in_flight: 3 };
        let why = stalled(held, bound * 2, bound).expect("stalled");
        assert!(why.contains("3 in flight"), "{why}");
        // An empty queue is the drain's success, however long it took.
        let none = Pending { ready: 0, delayed: 0, in_flight: 0 };
        assert_eq!(stalled(none, bound * 10, bound), None);
    }
}
