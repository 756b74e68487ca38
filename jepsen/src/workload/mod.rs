//! Workloads: concurrent clients that issue operations and record them in the history.
//!
//! - [`register`]: get/put/cas/delete over many independent keys (checked for linearizability
//!   and etcd revision invariants).
//! - [`set`]: elements added to one key by a CAS loop; no acknowledged element may be lost.
//! - [`lock`]: `lock` (acquire/release on a few names) and the `lock-set` family (a set
//!   changed by read-modify-write under a lock: unfenced, fenced by token, or guarded in a Txn).
//! - [`lease`]: short leases with attached keys, kept alive, left to expire, or revoked.
//! - [`queue`]: producers, claiming workers and a final drain (Picket only).
//! - [`watch`]: writers on a prefix and watchers from random start revisions.
//! - [`election`]: campaign, proclaim, resign and observe through the v3 Election API.
//!
//! [`Workload`] is what the runner sees: spawn the workers, then run the final phase (final
//! reads, or the key-event log a checker needs) once the cluster has healed.
//!
//! A worker is one logical client bound to one node. It records each invocation just before
//! sending and each completion just after the response; after an `info` completion it continues
//! under a fresh process id, because the old process may still have an operation in flight.

pub mod election;
pub mod lease;
mod leases;
pub mod lock;
pub mod queue;
pub mod register;
pub mod set;
pub mod watch;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use thiserror::Error;
use tokio::task::JoinSet;

use crate::client::{self, OpError};
use crate::cluster::NodeInfo;
use crate::history::{
    ErrorInfo, EventDraft, EventType, Header, HistoryError, HistoryWriter, Process,
};

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WorkloadError {
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("cannot build a client for {endpoint}: {message}")]
    Client { endpoint: String, message: String },
}

/// What every worker shares.
#[derive(Clone)]
pub struct WorkerEnv {
    pub history: Arc<HistoryWriter>,
    next_process: Arc<AtomicU64>,
    /// Workers stop issuing operations at this instant.
    pub deadline: Instant,
    /// Set to stop workers early (the run is being aborted).
    pub stop: Arc<AtomicBool>,
}

impl WorkerEnv {
    pub fn new(history: Arc<HistoryWriter>, deadline: Instant) -> Self {
        WorkerEnv {
            history,
            next_process: Arc::new(AtomicU64::new(0)),
            deadline,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A process id never used before in this run.
    pub fn next_process(&self) -> u64 {
        self.next_process.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether workers should stop issuing operations.
    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// Operation counts of one worker (or, summed, of a run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    pub invoked: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

impl OpCounts {
    pub fn count(&mut self, kind: EventType) {
        match kind {
            EventType::Invoke => self.invoked += 1,
            EventType::Ok => self.ok += 1,
            EventType::Fail => self.fail += 1,
            EventType::Info => self.info += 1,
        }
    }

    pub fn add(&mut self, o: OpCounts) {
        self.invoked += o.invoked;
        self.ok += o.ok;
        self.fail += o.fail;
        self.info += o.info;
    }
}

/// One worker's view of the history: its current process id, its node, and its counts. After
/// an `info` completion it moves to a fresh process id (the old one may still have the
/// operation in flight).
pub struct Recorder {
    pub env: WorkerEnv,
    pub process: u64,
    pub node: String,
    pub counts: OpCounts,
}

impl Recorder {
    pub fn new(env: &WorkerEnv, node: &str) -> Self {
        Recorder {
            env: env.clone(),
            process: env.next_process(),
            node: node.to_string(),
            counts: OpCounts::default(),
        }
    }

    fn draft(&self, kind: EventType, f: &str, key: Option<&str>, value: Value) -> EventDraft {
        let mut d =
            EventDraft::new(kind, Process::Client(self.process), f).value(value).node(&self.node);
        d.key = key.map(str::to_string);
        d
    }

    fn record(&mut self, d: EventDraft) -> Result<(), WorkloadError> {
        self.counts.count(d.kind);
        self.env.history.record(d)?;
        Ok(())
    }

    /// Records an invocation just before the request is sent.
    pub fn invoke(
        &mut self,
        f: &str,
        key: Option<&str>,
        value: Value,
    ) -> Result<(), WorkloadError> {
        let d = self.draft(EventType::Invoke, f, key, value);
        self.record(d)
    }

    /// Records an `ok` completion.
    pub fn ok(
        &mut self,
        f: &str,
        key: Option<&str>,
        value: Value,
        header: Option<Header>,
    ) -> Result<(), WorkloadError> {
        let d = self.draft(EventType::Ok, f, key, value).header(header);
        self.record(d)
    }

    /// Records a `fail` (definitely did not happen) with `[kind, message]`.
    pub fn fail(
        &mut self,
        f: &str,
        key: Option<&str>,
        value: Value,
        kind: &str,
        message: &str,
    ) -> Result<(), WorkloadError> {
        let d = self.draft(EventType::Fail, f, key, value).error(ErrorInfo::new(kind, message));
        self.record(d)
    }

    /// Records an `info` (outcome unknown) and moves to a fresh process id.
    pub fn info(
        &mut self,
        f: &str,
        key: Option<&str>,
        value: Value,
        kind: &str,
        message: &str,
    ) -> Result<(), WorkloadError> {
        let d = self.draft(EventType::Info, f, key, value).error(ErrorInfo::new(kind, message));
        self.record(d)?;
        self.process = self.env.next_process();
        Ok(())
    }

    /// Records the completion of a failed request, classified by [`client::classify`]
    /// (`idempotent`: a read, always `fail`). Returns the completion type.
    pub fn error(
        &mut self,
        f: &str,
        key: Option<&str>,
        value: Value,
        err: &OpError,
        idempotent: bool,
    ) -> Result<EventType, WorkloadError> {
        let (kind, e) = client::classify(err, idempotent);
        let d = self.draft(kind, f, key, value).error(e);
        self.record(d)?;
        if kind == EventType::Info {
            self.process = self.env.next_process();
        }
        Ok(kind)
    }

    /// Sleeps a random gap averaging `mean`, never past the deadline.
    pub async fn pace(&self, rng: &mut impl rand::Rng, mean: Duration) {
        let gap = mean.mul_f64(rng.random::<f64>() * 2.0);
        let left = self.env.deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(gap.min(left)).await;
    }
}

/// A client bound to one node, or the reason it could not be built.
pub async fn connect(
    node: &NodeInfo,
    timeout: Duration,
) -> Result<etcd_client::Client, WorkloadError> {
    client::connect(&node.client_url, timeout).await.map_err(|e| WorkloadError::Client {
        endpoint: node.client_url.clone(),
        message: e.to_string(),
    })
}

/// A cap on a worker's loop iterations: even at zero latency a worker cannot issue more than
/// one operation per `mean_gap / 2` on average, so 4x the expected count plus slack is generous
/// while still ending a runaway loop. Every loop is also bounded by the deadline.
pub fn max_iterations(env: &WorkerEnv, mean_gap: Duration) -> u64 {
    let secs = env.deadline.saturating_duration_since(Instant::now()).as_secs_f64();
    (secs / mean_gap.as_secs_f64().max(1e-3) * 4.0) as u64 + 1000
}

/// A distinct, reproducible random stream per worker.
pub fn worker_seed(seed: u64, w: usize) -> u64 {
    seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Settings shared by every workload.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    pub ops_per_key: u64,
    pub op_timeout: Duration,
    pub serializable_reads: bool,
    pub rate: f64,
    pub workers: usize,
    pub nodes: usize,
    /// TTL of the leases the lock and lease workloads grant, in seconds.
    pub lease_ttl: i64,
}

impl WorkloadOptions {
    /// Mean gap between one worker's operations.
    pub fn mean_gap(&self) -> Duration {
        Duration::from_secs_f64(self.workers as f64 / self.rate.max(0.001))
    }
}

/// The workloads by name, as the runner drives them.
pub enum Workload {
    Register(register::Register),
    Set(set::SetWorkload),
    Lock(lock::LockWorkload),
    Lease(lease::LeaseWorkload),
    Watch(watch::WatchWorkload),
    Queue(queue::QueueWorkload),
    Election(election::ElectionWorkload),
}

/// Names accepted by `--workload`.
pub const NAMES: &[&str] = &[
    "register",
    "set",
    "lock",
    "lock-set",
    "lock-fenced-set",
    "lock-kv-set",
    "lease",
    "watch",
    "queue",
    "election",
];

impl Workload {
    pub fn new(name: &str, opts: WorkloadOptions) -> Option<Workload> {
        Some(match name {
            "register" => Workload::Register(register::Register::new(register::RegisterOptions {
                ops_per_key: opts.ops_per_key,
                op_timeout: opts.op_timeout,
                serializable_reads: opts.serializable_reads,
                rate: opts.rate,
                workers: opts.workers,
                group_size: opts.nodes,
            })),
            "set" => Workload::Set(set::SetWorkload::new(opts)),
            "lock" | "lock-set" | "lock-fenced-set" | "lock-kv-set" => {
                Workload::Lock(lock::LockWorkload::new(lock::Variant::parse(name)?, opts))
            }
            "lease" => Workload::Lease(lease::LeaseWorkload::new(opts)),
            "watch" => Workload::Watch(watch::WatchWorkload::new(opts)),
            "queue" => Workload::Queue(queue::QueueWorkload::new(opts)),
            "election" => Workload::Election(election::ElectionWorkload::new(opts)),
            _ => return None,
        })
    }

    pub fn spawn_workers(
        &self,
        set: &mut JoinSet<Result<OpCounts, WorkloadError>>,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        seed: u64,
    ) {
        match self {
            Workload::Register(w) => w.spawn_workers(set, nodes, env, seed),
            Workload::Set(w) => w.spawn_workers(set, nodes, env, seed),
            Workload::Lock(w) => w.spawn_workers(set, nodes, env, seed),
            Workload::Lease(w) => w.spawn_workers(set, nodes, env, seed),
            Workload::Watch(w) => w.spawn_workers(set, nodes, env, seed),
            Workload::Queue(w) => w.spawn_workers(set, nodes, env, seed),
            Workload::Election(w) => w.spawn_workers(set, nodes, env, seed),
        }
    }

    /// After healing: the final reads (or the key-event log) the checkers need. Returns the
    /// counts and notes on what could not be read (which lower the verdict to unknown).
    pub async fn final_phase(
        &self,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        op_timeout: Duration,
    ) -> Result<(OpCounts, Vec<String>), WorkloadError> {
        match self {
            Workload::Register(w) => {
                let keys = w.keys_used();
                let (c, unread) = register::final_reads(&keys, nodes, env, op_timeout).await?;
                let notes = if unread.is_empty() {
                    Vec::new()
                } else {
                    vec![format!("{} keys could not be read after healing", unread.len())]
                };
                Ok((c, notes))
            }
            Workload::Set(w) => w.final_phase(nodes, env, op_timeout).await,
            Workload::Lock(w) => w.final_phase(nodes, env, op_timeout).await,
            Workload::Lease(w) => w.final_phase(nodes, env, op_timeout).await,
            Workload::Watch(w) => w.final_phase(nodes, env, op_timeout).await,
            Workload::Queue(w) => w.final_phase(nodes, env, op_timeout).await,
            Workload::Election(w) => w.final_phase(nodes, env, op_timeout).await,
        }
    }
}

/// Attempts of a final read. Reads are idempotent, so retrying is safe; attempts spread over the
/// nodes ride out a node that is still catching up.
pub const FINAL_ATTEMPTS: usize = 5;
/// Pause between failed final attempts: long enough for an election to finish.
pub const FINAL_BACKOFF: Duration = Duration::from_millis(500);

/// Runs a final read `f` (recorded by the caller through the recorder), trying the nodes in
/// turn, at most [`FINAL_ATTEMPTS`] times. Returns whether one attempt succeeded.
pub async fn final_attempts<F, Fut>(
    nodes: &[NodeInfo],
    env: &WorkerEnv,
    op_timeout: Duration,
    counts: &mut OpCounts,
    mut f: F,
) -> Result<bool, WorkloadError>
where
    F: FnMut(Recorder, etcd_client::Client) -> Fut,
    Fut: std::future::Future<Output = Result<(Recorder, bool), WorkloadError>>,
{
    for attempt in 0..FINAL_ATTEMPTS {
        let node = &nodes[attempt % nodes.len()];
        let rec = Recorder::new(env, &node.name);
        let client = match connect(node, op_timeout).await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(FINAL_BACKOFF).await;
                continue;
            }
        };
        let (rec, done) = f(rec, client).await?;
        counts.add(rec.counts);
        if done {
            return Ok(true);
        }
        tokio::time::sleep(FINAL_BACKOFF).await;
    }
    Ok(false)
}
