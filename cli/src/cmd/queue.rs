//! `picket queue`: durable work queues (Picket's `picket.v1.Queue`; not on etcd).
//!
//! `claim` holds its job under a lease: `--lease` names one you keep alive yourself (`picket
//! lease grant` + `keep-alive`), otherwise `claim` grants one with `--ttl` that nothing renews,
//! so a job that is not acked or nacked within the TTL goes back to the queue by itself. Stale
//! claims (the lease ended, someone else claimed the job since) exit 7, like a lost lock.

use std::time::Duration;

use anyhow::Result;
use picket_client::queue::{JobInfo, JobState};
use picket_client::{ClaimOptions, EnqueueOptions, Error as ClientError};
use serde_json::{json, Value};

use super::Ctx;
use crate::args::{parse_duration, parse_lease};
use crate::exit;
use crate::output::{self, lease_hex, text, Format, Table};

#[derive(Debug, clap::Subcommand)]
pub enum QueueCmd {
    /// Add a job: `picket queue enqueue emails 'to=ann'`.
    Enqueue(EnqueueArgs),
    /// Claim the best ready job (highest priority, then oldest) and print it with its token.
    Claim(ClaimArgs),
    /// Complete a claimed job.
    Ack(TokenArgs),
    /// Give a claimed job back for a retry (exponential backoff unless --delay).
    Nack(NackArgs),
    /// Counts (ready, delayed, in flight, dead) and the pending jobs in claim order.
    Inspect(InspectArgs),
    /// List dead-lettered jobs, or move one back into the queue with --requeue.
    Dlq(DlqArgs),
    /// Measure job cycles per second and their latency on a scratch queue: each worker enqueues,
    /// then acks the job it holds and claims the next in one call (Ack with claim_next).
    Bench(BenchArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The queue to use; it should be empty (jobs already in it are claimed and acked too).
    #[arg(default_value = "picket-bench")]
    pub queue: String,
    /// Cycles in all.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Concurrent workers, each with its own lease.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
}

#[derive(Debug, Clone, clap::Args)]
pub struct EnqueueArgs {
    /// The queue name ([A-Za-z0-9._:-], at most 128 characters).
    pub queue: String,
    /// The job's payload.
    pub payload: String,
    /// Claimable only after this long (e.g. 30s).
    #[arg(long, value_parser = parse_duration)]
    pub delay: Option<Duration>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0)]
    pub priority: u32,
    /// Idempotency key: a known dedup id returns the existing job instead of adding one.
    #[arg(long)]
    pub dedup_id: Option<String>,
    /// Claims allowed before the job is dead-lettered (server default 5).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Base of the exponential backoff of a nack without --delay (server default 1s).
    #[arg(long, value_parser = parse_duration)]
    pub backoff: Option<Duration>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClaimArgs {
    pub queue: String,
    /// Hold the claim under this lease (hex, as `picket lease grant` prints it).
    #[arg(long, value_parser = parse_lease)]
    pub lease: Option<i64>,
    /// Without --lease: TTL in seconds of the lease granted for the claim (not renewed).
    #[arg(long, default_value_t = 60)]
    pub ttl: i64,
    /// Wait at most this long for a job (0 = do not wait); exits 3 if none came.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Also end the claim this long after claiming, even while the lease lives.
    #[arg(long, value_parser = parse_duration)]
    pub visibility: Option<Duration>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    pub queue: String,
    /// The job id `claim` printed.
    pub job: String,
    /// The claim's fencing token `claim` printed.
    pub token: i64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct NackArgs {
    #[command(flatten)]
    pub claim: TokenArgs,
    /// Retry after this long instead of the exponential backoff.
    #[arg(long, value_parser = parse_duration)]
    pub delay: Option<Duration>,
    /// Why the attempt failed (kept on the job and in the dead-letter queue).
    #[arg(long, default_value = "")]
    pub error: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct InspectArgs {
    pub queue: String,
    /// List at most this many jobs (at most 1000; 0 = counts only).
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DlqArgs {
    pub queue: String,
    /// List at most this many (at most 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: u32,
    /// Move this dead-lettered job back into the queue (attempts reset) instead of listing.
    #[arg(long)]
    pub requeue: Option<String>,
}

/// A stale claim is a lost hold: exit 7, like a lost lock.
fn fenced(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Fenced(m) => exit::fail(exit::LOST, m),
        e => e.into(),
    }
}

fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Ready => "ready",
        JobState::Delayed => "delayed",
        JobState::Claimed => "claimed",
        JobState::Dead => "dead",
        _ => "unknown",
    }
}

fn job_json(j: &JobInfo) -> Value {
    json!({
        "id": j.id, "state": state_name(j.state), "priority": j.priority,
        "attempts": j.attempts, "max_attempts": j.max_attempts, "ready_at_ms": j.ready_at_ms,
        "token": j.token, "lease": j.lease.map(lease_hex), "last_error": j.last_error,
    })
}

pub async fn run(ctx: &Ctx, cmd: QueueCmd) -> Result<u8> {
    let client = ctx.client().await?;
    match cmd {
        QueueCmd::Enqueue(a) => {
            let mut opts = EnqueueOptions::new().priority(a.priority);
            if let Some(d) = a.delay {
                opts = opts.delay(d);
            }
            if let Some(d) = a.dedup_id {
                opts = opts.dedup_id(d);
            }
            if let Some(n) = a.max_attempts {
                opts = opts.max_attempts(n);
            }
            if let Some(b) = a.backoff {
                opts = opts.backoff(b);
            }
            let out = client.queue(&a.queue).enqueue_with(a.payload, opts).await?;
            match ctx.format() {
                Format::Json => output::json_line(&json!({
                    "queue": a.queue, "id": out.id, "revision": out.revision,
                    "duplicate": out.duplicate,
                })),
                Format::Simple => output::line(&out.id),
                Format::Table if out.duplicate => output::line(format!(
                    "job {} already enqueued at revision {} (same dedup id)",
                    out.id, out.revision
                )),
                Format::Table => {
                    output::line(format!("enqueued job {} at revision {}", out.id, out.revision))
                }
            }
            Ok(exit::OK)
        }
        QueueCmd::Claim(a) => {
            let lease = match a.lease {
                Some(l) => l,
                None => client.lease_grant(a.ttl, 0).await?.id,
            };
            let mut opts = ClaimOptions::new().wait(a.wait);
            if let Some(v) = a.visibility {
                opts = opts.visibility(v);
            }
            let Some(job) = client.queue(&a.queue).claim_with(lease, opts).await? else {
                if a.lease.is_none() {
                    // Nothing was claimed: the lease we granted is not needed.
                    let _ = client.lease_revoke(lease).await;
                }
                return Err(exit::fail(
                    exit::NOT_FOUND,
                    format!("no job ready in queue {:?} within {:?}", a.queue, a.wait),
                ));
            };
            match ctx.format() {
                Format::Json => output::json_line(&json!({
                    "queue": a.queue, "id": job.id, "token": job.token, "attempt": job.attempt,
                    "max_attempts": job.max_attempts, "priority": job.priority,
                    "lease": lease_hex(lease), "deadline_ms": job.deadline_ms,
                    "payload": text(&job.payload),
                })),
                Format::Simple => {
                    output::line(format!("{} {}", job.id, job.token));
                    output::line(text(&job.payload));
                }
                Format::Table => {
                    output::line(format!(
                        "claimed job {} (attempt {} of {}), fencing token {}, lease {}",
                        job.id,
                        job.attempt,
                        job.max_attempts,
                        job.token,
                        lease_hex(lease)
                    ));
                    output::line(text(&job.payload));
                }
            }
            Ok(exit::OK)
        }
        QueueCmd::Ack(a) => {
            client.queue(&a.queue).ack(&a.job, a.token).await.map_err(fenced)?;
            output::line(format!("acked job {}", a.job));
            Ok(exit::OK)
        }
        QueueCmd::Nack(a) => {
            let c = a.claim;
            let q = client.queue(&c.queue);
            let dead = q.nack(&c.job, c.token, a.delay, &a.error).await.map_err(fenced)?;
            match (ctx.format(), dead) {
                (Format::Json, _) => {
                    output::json_line(&json!({"id": c.job, "dead_lettered": dead}))
                }
                (_, true) => {
                    output::line(format!("job {} used its attempts: dead-lettered", c.job))
                }
                (_, false) => output::line(format!("nacked job {}", c.job)),
            }
            Ok(exit::OK)
        }
        QueueCmd::Inspect(a) => {
            let s = client.queue(&a.queue).inspect(a.limit).await?;
            match ctx.format() {
                Format::Json => output::json_line(&json!({
                    "queue": a.queue, "revision": s.revision, "ready": s.ready,
                    "delayed": s.delayed, "in_flight": s.in_flight, "dead": s.dead,
                    "jobs": s.jobs.iter().map(job_json).collect::<Vec<_>>(),
                })),
                _ => {
                    output::line(format!(
                        "queue {}: {} ready, {} delayed, {} in flight, {} dead (revision {})",
                        a.queue, s.ready, s.delayed, s.in_flight, s.dead, s.revision
                    ));
                    if !s.jobs.is_empty() {
                        let mut t = Table::new([
                            "JOB", "STATE", "PRIORITY", "ATTEMPTS", "TOKEN", "LEASE", "ERROR",
                        ]);
                        for j in &s.jobs {
                            t.row([
                                j.id.clone(),
                                state_name(j.state).to_string(),
                                j.priority.to_string(),
                                format!("{}/{}", j.attempts, j.max_attempts),
                                j.token.map(|t| t.to_string()).unwrap_or_default(),
                                j.lease.map(lease_hex).unwrap_or_default(),
                                j.last_error.clone(),
                            ]);
                        }
                        t.print();
                    }
                }
            }
            Ok(exit::OK)
        }
        QueueCmd::Bench(a) => bench(ctx, &client, a).await,
        QueueCmd::Dlq(a) => {
            let q = client.queue(&a.queue);
            if let Some(id) = a.requeue {
                q.requeue(&id).await?;
                output::line(format!("requeued job {id}"));
                return Ok(exit::OK);
            }
            let (dead, count) = q.dead_letters(a.limit).await?;
            match ctx.format() {
                Format::Json => output::json_line(&json!({
                    "queue": a.queue, "count": count,
                    "jobs": dead.iter().map(|d| {
                        let mut v = job_json(&d.job);
                        v["reason"] = json!(d.reason);
                        v["payload"] = json!(text(&d.payload));
                        v
                    }).collect::<Vec<_>>(),
                })),
                _ => {
                    output::line(format!("queue {}: {count} dead letters", a.queue));
                    if !dead.is_empty() {
                        let mut t =
                            Table::new(["JOB", "ATTEMPTS", "REASON", "LAST ERROR", "PAYLOAD"]);
                        for d in &dead {
                            t.row([
                                d.job.id.clone(),
                                d.job.attempts.to_string(),
                                d.reason.clone(),
                                d.job.last_error.clone(),
                                text(&d.payload),
                            ]);
                        }
                        t.print();
                    }
                }
            }
            Ok(exit::OK)
        }
    }
}

/// One worker's cycles: enqueue a job, then ack the job it holds and claim the next in one call
/// (the first cycle claims only). Returns each cycle's latency. The job held at the end is
/// acked.
async fn bench_worker(
    client: picket_client::Client,
    queue: String,
    cycles: usize,
) -> Result<Vec<Duration>> {
    let q = client.queue(queue);
    // A session keeps the worker's lease alive however long the run takes (a plain 60 s lease
    // ended a long run's claims under it), and revokes it at the end.
    let session = picket_client::Session::new(&client, 60).await?;
    let lease = session.lease_id();
    let mut lat = Vec::with_capacity(cycles);
    let mut held: Option<picket_client::ClaimedJob> = None;
    // Bounded wait: there is always at least our own job to claim.
    let wait = Duration::from_secs(10);
    for _ in 0..cycles {
        let t = std::time::Instant::now();
        q.enqueue("x").await?;
        let next = match held.take() {
            Some(job) => job.ack_and_claim(lease, ClaimOptions::new().wait(wait)).await?,
            None => q.claim(lease, Some(wait)).await?,
        };
        held = Some(next.ok_or_else(|| {
            exit::fail(exit::ERROR, "no job within 10 s, though one was enqueued")
        })?);
        lat.push(t.elapsed());
    }
    if let Some(job) = held {
        job.ack().await?;
    }
    let _ = session.close().await;
    Ok(lat)
}

async fn bench(ctx: &Ctx, client: &picket_client::Client, a: BenchArgs) -> Result<u8> {
    if a.concurrency == 0 || a.count < a.concurrency {
        return Err(exit::fail(exit::USAGE, "--count must be at least --concurrency (>= 1)"));
    }
    let per = a.count / a.concurrency;
    let start = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        tasks.push(tokio::spawn(bench_worker(client.clone(), a.queue.clone(), per)));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    let rate = lat.len() as f64 / secs;
    match ctx.format() {
        Format::Json => output::json_line(&json!({
            "cycles": lat.len(), "seconds": secs, "cycles_per_s": rate,
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": pct(1.0),
            "concurrency": a.concurrency,
        })),
        _ => output::line(format!(
            "{} enqueue, ack-and-claim cycles in {secs:.2} s with {} workers: {rate:.1} cycles/s, \
             latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            lat.len(),
            a.concurrency,
            pct(0.5),
            pct(0.99),
            pct(1.0)
        )),
    }
    Ok(exit::OK)
}
