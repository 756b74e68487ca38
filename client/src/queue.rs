//! Durable work queues (Picket's `picket.v1.Queue`; not available on etcd).
//!
//! A [`Queue`] handle enqueues jobs and claims them for a worker's lease. A claim carries a
//! **fencing token** and lives as long as the lease (or until its optional visibility deadline):
//! if the worker dies, its lease expires, the claim goes with it and another worker gets the
//! job. [`ClaimedJob::ack`] completes the job, [`ClaimedJob::nack`] retries it later (with
//! exponential backoff unless a delay is given), and a job that has used its attempts (5 by
//! default) moves to the dead-letter queue. Each job has at most one live claim, and an ack or
//! nack with a stale token fails with [`Error::Fenced`], naming the current token.
//!
//! # Examples
//!
//! ```no_run
//! # async fn demo() -> Result<(), picket_client::Error> {
//! use std::time::Duration;
//! use picket_client::{Client, Session};
//!
//! let client = Client::connect(["127.0.0.1:2379"]).await?;
//! let emails = client.queue("emails");
//! emails.enqueue("to=ann@example.com").await?;
//!
//! let session = Session::new(&client, 10).await?;
//! if let Some(job) = emails.claim(session.lease_id(), Some(Duration::from_secs(5))).await? {
//!     // ... send the email, passing job.token to anything that can check it ...
//!     job.ack().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Failures
//!
//! Enqueue with a dedup id and Claim are retried on another endpoint after an ambiguous failure:
//! a dedup id makes a retried Enqueue return the first one's job, and every Claim call carries a
//! request id that makes a retried Claim return the job its first try claimed. Enqueue without a
//! dedup id, Ack, Nack and Extend are writes that are never sent twice; they fail with
//! [`Error::OutcomeUnknown`] when their outcome is unknown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use picket_proto::picket::v1::queue_client::QueueClient;
use picket_proto::picket::v1::{
    AckJobRequest, ClaimRequest, DeadLettersRequest, EnqueueRequest, ExtendClaimRequest,
    NackJobRequest, QueueInspectRequest, QueueJobState, RequeueJobRequest,
};

use crate::client::{request, Client, Retry};
use crate::error::Error;

/// Options of an enqueue. The defaults: no delay, priority 0, no dedup id, the server's
/// default attempts (5) and backoff base (1 s).
#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    delay: Duration,
    priority: u32,
    dedup_id: Option<String>,
    max_attempts: u32,
    backoff: Duration,
}

impl EnqueueOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }
    /// The job becomes claimable this long after the enqueue.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = d;
        self
    }
    /// Higher runs first.
    pub fn priority(mut self, p: u32) -> Self {
        self.priority = p;
        self
    }
    /// An idempotency key: enqueueing a known dedup id returns the existing job. It also makes
    /// the client retry an enqueue whose outcome is unknown.
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }
    /// Claims allowed before the job is dead-lettered.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }
    /// Base of the exponential backoff of a nack without a delay.
    pub fn backoff(mut self, d: Duration) -> Self {
        self.backoff = d;
        self
    }
}

/// The result of an enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The job id (the existing job's, for a duplicate).
    pub id: String,
    /// The revision at which the job was enqueued.
    pub revision: i64,
    /// True when the dedup id was known and nothing was added.
    pub duplicate: bool,
}

/// Options of a claim.
#[derive(Debug, Clone, Default)]
pub struct ClaimOptions {
    wait: Option<Duration>,
    visibility: Option<Duration>,
}

impl ClaimOptions {
    /// Wait without a time limit, claim lives as long as the lease.
    pub fn new() -> Self {
        Self::default()
    }
    /// Give up (returning `None`) after waiting this long; zero means do not wait.
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = Some(d);
        self
    }
    /// The claim also ends this long after the claim unless extended, even while the lease
    /// lives (for workers that may hang without dying).
    pub fn visibility(mut self, d: Duration) -> Self {
        self.visibility = Some(d);
        self
    }
}

/// A handle to one queue. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Queue {
    client: Client,
    name: String,
}

/// A job claimed by this worker. Complete it with [`ClaimedJob::ack`] or give it back with
/// [`ClaimedJob::nack`]; dropping it does nothing (the claim ends with the lease).
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    /// The job id.
    pub id: String,
    /// The payload given at enqueue.
    pub payload: Vec<u8>,
    /// Which claim of the job this is (1 for the first).
    pub attempt: u32,
    /// The fencing token: larger means claimed later.
    pub token: i64,
    /// The job's priority.
    pub priority: u32,
    /// Claims allowed before the job is dead-lettered.
    pub max_attempts: u32,
    /// The claim's visibility deadline (unix ms by the serving member's clock), if it has one.
    pub deadline_ms: Option<u64>,
    queue: Queue,
}

impl ClaimedJob {
    /// Completes the job. Fails with [`Error::Fenced`] if this claim is no longer live.
    pub async fn ack(&self) -> Result<(), Error> {
        self.queue.ack(&self.id, self.token).await
    }
    /// Completes the job and claims the queue's next one for `lease` in the same Raft write
    /// (one round trip instead of an ack and a claim), waiting as [`Queue::claim_with`] does
    /// with `opts`. Returns the next job, or `None` when the wait ended without one (the ack is
    /// done either way). Fails with [`Error::Fenced`] if this claim is no longer live; nothing
    /// is claimed then. After an error whose outcome is unknown (a timeout), the ack may have
    /// applied and a job may be claimed under `lease`: it is claimable again when the lease
    /// ends or the claim's visibility deadline passes, as after any lost claim.
    pub async fn ack_and_claim(
        &self,
        lease: i64,
        opts: ClaimOptions,
    ) -> Result<Option<ClaimedJob>, Error> {
        self.queue.ack_and_claim(&self.id, self.token, lease, opts).await
    }
    /// Gives the job back for a retry after `delay` (None: exponential backoff), recording
    /// `error`. Returns true when the job used its last attempt and was dead-lettered.
    pub async fn nack(&self, delay: Option<Duration>, error: &str) -> Result<bool, Error> {
        self.queue.nack(&self.id, self.token, delay, error).await
    }
    /// Checks the claim is live and, with `visibility`, moves its deadline to now + visibility.
    /// Returns the deadline (unix ms), if the claim has one.
    pub async fn extend(&self, visibility: Option<Duration>) -> Result<Option<u64>, Error> {
        self.queue.extend(&self.id, self.token, visibility).await
    }
    /// The queue the job came from.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }
}

/// A job's state, as [`Queue::inspect`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobState {
    /// Claimable now.
    Ready,
    /// Waiting for its delay or backoff.
    Delayed,
    /// Held by a live claim.
    Claimed,
    /// In the dead-letter queue.
    Dead,
}

/// One job as listed by [`Queue::inspect`] or [`Queue::dead_letters`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The job id.
    pub id: String,
    /// Its state.
    pub state: JobState,
    /// Its priority.
    pub priority: u32,
    /// Claims so far.
    pub attempts: u32,
    /// Claims allowed.
    pub max_attempts: u32,
    /// When it is (or was) claimable, unix ms; 0 for dead letters.
    pub ready_at_ms: u64,
    /// The live claim's token, when claimed.
    pub token: Option<i64>,
    /// The claimant's lease, when claimed.
    pub lease: Option<i64>,
    /// The error of the last nack.
    pub last_error: String,
}

/// Counts and jobs of a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStats {
    /// Unclaimed jobs that may be claimed now.
    pub ready: u64,
    /// Unclaimed jobs waiting for a delay or backoff.
    pub delayed: u64,
    /// Jobs with a live claim.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// Pending jobs in claim order, as many as asked for.
    pub jobs: Vec<JobInfo>,
    /// The revision the counts are as of.
    pub revision: i64,
}

/// A job in the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The job.
    pub job: JobInfo,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Why it was dead-lettered.
    pub reason: String,
}

fn job_info(j: picket_proto::picket::v1::QueueJobInfo) -> JobInfo {
    let state = match QueueJobState::try_from(j.state) {
        Ok(QueueJobState::Delayed) => JobState::Delayed,
        Ok(QueueJobState::Claimed) => JobState::Claimed,
        Ok(QueueJobState::Dead) => JobState::Dead,
        _ => JobState::Ready,
    };
    JobInfo {
        id: j.job_id,
        state,
        priority: j.priority,
        attempts: j.attempts,
        max_attempts: j.max_attempts,
        ready_at_ms: j.ready_at_ms,
        token: (j.token != 0).then_some(j.token),
        lease: (j.lease != 0).then_some(j.lease),
        last_error: j.last_error,
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// A request id unique across this process's claims: the lease makes it unique across the
/// cluster's workers, the process id and a counter within the lease's holders.
/// A claim's "lease not found" names the caller's lease: the server's message does not carry
/// the id.
fn naming(lease: i64) -> impl FnOnce(Error) -> Error {
    move |e| match e {
        Error::LeaseNotFound(_) => Error::LeaseNotFound(lease),
        e => e,
    }
}

fn request_id(lease: i64) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{lease:x}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Client {
    /// A handle to queue `name` (1 to 128 characters of `[A-Za-z0-9._:-]`; the server checks).
    pub fn queue(&self, name: impl Into<String>) -> Queue {
        Queue { client: self.clone(), name: name.into() }
    }
}

impl Queue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a job with the default options.
    pub async fn enqueue(&self, payload: impl Into<Vec<u8>>) -> Result<Enqueued, Error> {
        self.enqueue_with(payload, EnqueueOptions::default()).await
    }

    /// Adds a job. With a dedup id the request is retried after an ambiguous failure (the
    /// dedup id makes a retry return the first try's job).
    pub async fn enqueue_with(
        &self,
        payload: impl Into<Vec<u8>>,
        opts: EnqueueOptions,
    ) -> Result<Enqueued, Error> {
        let retry = if opts.dedup_id.is_some() { Retry::Idempotent } else { Retry::Write };
        let req = EnqueueRequest {
            queue: self.name.clone(),
            payload: payload.into(),
            delay_ms: ms(opts.delay),
            priority: opts.priority,
            dedup_id: opts.dedup_id.unwrap_or_default(),
            max_attempts: opts.max_attempts,
            backoff_ms: ms(opts.backoff),
        };
        let resp = self
            .client
            .call(retry, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).enqueue(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(Enqueued { id: resp.job_id, revision: resp.revision, duplicate: resp.duplicate })
    }

    /// Claims the best ready job for `lease`, waiting up to `wait` (None: until one is ready).
    /// Returns `None` when the wait ends without a job.
    pub async fn claim(
        &self,
        lease: i64,
        wait: Option<Duration>,
    ) -> Result<Option<ClaimedJob>, Error> {
        let mut opts = ClaimOptions::new();
        opts.wait = wait;
        self.claim_with(lease, opts).await
    }

    /// Claims a job with options (see [`ClaimOptions`]).
    ///
    /// The wait is split into server-side waits shorter than the client's attempt timeout, so a
    /// silent endpoint is detected as fast as for any other request; each is a watch on the
    /// server, not a poll.
    pub async fn claim_with(
        &self,
        lease: i64,
        opts: ClaimOptions,
    ) -> Result<Option<ClaimedJob>, Error> {
        let id = request_id(lease);
        let end = opts.wait.map(|w| tokio::time::Instant::now() + w);
        self.claim_until(lease, &opts, &id, end).await
    }

    /// Completes job `id` claimed with `token` and claims the next one for `lease` in the same
    /// write (see [`ClaimedJob::ack_and_claim`]).
    pub async fn ack_and_claim(
        &self,
        id: &str,
        token: i64,
        lease: i64,
        opts: ClaimOptions,
    ) -> Result<Option<ClaimedJob>, Error> {
        let rid = request_id(lease);
        let end = opts.wait.map(|w| tokio::time::Instant::now() + w);
        let (req, left, wait) = self.claim_request(lease, &opts, &rid, end);
        let req = AckJobRequest {
            queue: self.name.clone(),
            job_id: id.to_string(),
            token,
            claim_next: Some(req),
        };
        // Retried only when certainly not applied, as an ack is: a retry after an applied
        // ack whose claim found nothing would be refused as stale. (One whose claim got a job
        // is recognised by the request id and answered with that job.)
        let resp = self
            .client
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).ack(request(req)).await?.into_inner()) }
            })
            .await
            .map_err(naming(lease))?;
        if let Some(j) = resp.next {
            return Ok(Some(self.claimed(j)));
        }
        if left.is_some_and(|l| l <= wait) {
            return Ok(None);
        }
        // The ack is done; the rest of the wait is plain claims, with the same request id.
        self.claim_until(lease, &opts, &rid, end).await
    }

    /// One server-side wait's claim request: at most the attempt budget's chunk, at most what is
    /// left until `end`. Returns the request, what was left and the wait it asks for.
    fn claim_request(
        &self,
        lease: i64,
        opts: &ClaimOptions,
        id: &str,
        end: Option<tokio::time::Instant>,
    ) -> (ClaimRequest, Option<Duration>, Duration) {
        let attempt = self.client.inner.opts.attempt_timeout;
        // Leave a quarter of the attempt budget for the round trip and the claim Txn itself.
        let chunk = (attempt - attempt / 4).max(Duration::from_millis(100));
        let left = end.map(|e| e.saturating_duration_since(tokio::time::Instant::now()));
        let wait = left.map_or(chunk, |l| l.min(chunk));
        let req = ClaimRequest {
            queue: self.name.clone(),
            lease,
            wait_timeout_ms: Some(ms(wait)),
            visibility_timeout_ms: opts.visibility.map(ms).unwrap_or_default(),
            request_id: id.to_string(),
        };
        (req, left, wait)
    }

    fn claimed(&self, j: picket_proto::picket::v1::ClaimedJob) -> ClaimedJob {
        ClaimedJob {
            id: j.job_id,
            payload: j.payload,
            attempt: j.attempt,
            token: j.token,
            priority: j.priority,
            max_attempts: j.max_attempts,
            deadline_ms: (j.deadline_ms != 0).then_some(j.deadline_ms),
            queue: self.clone(),
        }
    }

    /// Claims until a job comes or `end` passes, in server-side waits (see [`Self::claim_with`]).
    async fn claim_until(
        &self,
        lease: i64,
        opts: &ClaimOptions,
        id: &str,
        end: Option<tokio::time::Instant>,
    ) -> Result<Option<ClaimedJob>, Error> {
        loop {
            let (req, left, wait) = self.claim_request(lease, opts, id, end);
            // Idempotent thanks to the request id: a retry returns the first try's claim.
            let resp = self
                .client
                .call(Retry::Idempotent, |ch| {
                    let req = req.clone();
                    async move { Ok(QueueClient::new(ch).claim(request(req)).await?.into_inner()) }
                })
                .await
                .map_err(naming(lease))?;
            if let Some(j) = resp.job {
                return Ok(Some(self.claimed(j)));
            }
            if left.is_some_and(|l| l <= wait) {
                return Ok(None);
            }
        }
    }

    /// Completes job `id` claimed with `token`.
    pub async fn ack(&self, id: &str, token: i64) -> Result<(), Error> {
        let req = AckJobRequest {
            queue: self.name.clone(),
            job_id: id.to_string(),
            token,
            claim_next: None,
        };
        self.client
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).ack(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(())
    }

    /// Gives back job `id` claimed with `token` (see [`ClaimedJob::nack`]).
    pub async fn nack(
        &self,
        id: &str,
        token: i64,
        delay: Option<Duration>,
        error: &str,
    ) -> Result<bool, Error> {
        let req = NackJobRequest {
            queue: self.name.clone(),
            job_id: id.to_string(),
            token,
            delay_ms: delay.map(ms),
            error: error.to_string(),
        };
        let resp = self
            .client
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).nack(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(resp.dead_lettered)
    }

    /// Checks the claim and optionally pushes its deadline (see [`ClaimedJob::extend`]).
    pub async fn extend(
        &self,
        id: &str,
        token: i64,
        visibility: Option<Duration>,
    ) -> Result<Option<u64>, Error> {
        let req = ExtendClaimRequest {
            queue: self.name.clone(),
            job_id: id.to_string(),
            token,
            visibility_timeout_ms: visibility.map(ms).unwrap_or_default(),
        };
        let resp = self
            .client
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).extend(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok((resp.deadline_ms != 0).then_some(resp.deadline_ms))
    }

    /// Counts the queue's jobs and lists up to `limit` of them (at most 1000) in claim order.
    pub async fn inspect(&self, limit: u32) -> Result<QueueStats, Error> {
        let req = QueueInspectRequest { queue: self.name.clone(), limit };
        let resp = self
            .client
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).inspect(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(QueueStats {
            ready: resp.ready,
            delayed: resp.delayed,
            in_flight: resp.in_flight,
            dead: resp.dead,
            jobs: resp.jobs.into_iter().map(job_info).collect(),
            revision: resp.header.map(|h| h.revision).unwrap_or_default(),
        })
    }

    /// Lists up to `limit` dead letters (0: 100; at most 1000) and returns their total count.
    pub async fn dead_letters(&self, limit: u32) -> Result<(Vec<DeadLetter>, u64), Error> {
        let req = DeadLettersRequest { queue: self.name.clone(), limit };
        let resp =
            self.client
                .call(Retry::Idempotent, |ch| {
                    let req = req.clone();
                    async move {
                        Ok(QueueClient::new(ch).dead_letters(request(req)).await?.into_inner())
                    }
                })
                .await?;
        let jobs = resp
            .jobs
            .into_iter()
            .map(|d| DeadLetter {
                job: job_info(d.job.unwrap_or_default()),
                payload: d.payload,
                reason: d.reason,
            })
            .collect();
        Ok((jobs, resp.count))
    }

    /// Moves dead letter `id` back into the queue with its attempts reset.
    pub async fn requeue(&self, id: &str) -> Result<(), Error> {
        let req = RequeueJobRequest { queue: self.name.clone(), job_id: id.to_string() };
        self.client
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(QueueClient::new(ch).requeue(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_differ_per_call() {
        assert_ne!(request_id(7), request_id(7));
        assert!(request_id(0x1f).starts_with("1f-"));
    }

    #[test]
    fn job_info_maps_states_and_absent_claims() {
        let j = job_info(picket_proto::picket::v1::QueueJobInfo {
            job_id: "a".into(),
            state: QueueJobState::Delayed as i32,
            ..Default::default()
        });
        assert_eq!((j.state, j.token, j.lease), (JobState::Delayed, None, None));
    }
}
