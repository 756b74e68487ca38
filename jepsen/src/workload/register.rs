//! The `register` workload: get / put / cas / delete over many independent keys.
//!
//! Workers are split into groups of `group_size` (by default one worker per node, so at most
//! one worker per node per key, within the spec's "at most 2"). A group works on one key at a
//! time and moves to a fresh key after `ops_per_key` operations (200 by default), which keeps
//! each key's history small enough for the linearizability search. Keys are
//! `jepsen/r<group>/<epoch>`.
//!
//! Operations (value shapes in [`crate::checker::register`]):
//! - `get`: a linearizable `Range` on the key (serializable with `--unsafe-serializable-reads`,
//!   a deliberately broken mode the checker should catch);
//! - `sget`: a serializable `Range` on the key, recorded as what it is: not linearizable, but
//!   held to the per-member guarantees ([`crate::checker::member_reads`]: the member's reads
//!   never go back and show the writes that member acknowledged);
//! - `put`: a `Put` of a value unique in the run (`p<process>-<seq>`);
//! - `cas`: a `Txn` comparing on **value equality** (unique values make that the same as "the
//!   latest write is the one I saw"), with `version == 0` when the expected value is "absent",
//!   because etcd fails a value comparison on a missing key; the failure branch reads the key
//!   so a failed cas also reports what it saw (`current`);
//! - `delete`: a `DeleteRange` of the key.
//!
//! The expected value of a cas is the last value this worker saw on the key, so many of them
//! succeed when the key is not contended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{OpCounts, WorkerEnv, WorkloadError};
use crate::client::{self, OpError};
use crate::cluster::NodeInfo;
use crate::history::{EventDraft, EventType, Header, Process};

/// Prefix of every key this workload writes.
pub const KEY_PREFIX: &str = "jepsen/r";

/// Attempts per key of the final reads. Reads are idempotent, so retrying is safe; 5 attempts
/// spread over different nodes ride out a node that is still catching up.
const FINAL_READ_ATTEMPTS: usize = 5;

/// Pause between failed final-read attempts: long enough for an election to finish.
const FINAL_READ_BACKOFF: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct RegisterOptions {
    /// Operations on one key before its group moves to the next key.
    pub ops_per_key: u64,
    /// Bound on every operation; past it a write is recorded `info`, a read `fail`.
    pub op_timeout: Duration,
    /// Serve gets as serializable (node-local) reads: unsafe, for checking the checker.
    pub serializable_reads: bool,
    /// Total operations per second over all workers (a target; each worker sleeps a random
    /// delay averaging `workers / rate` between operations).
    pub rate: f64,
    pub workers: usize,
    pub group_size: usize,
}

/// The workload's shared state: one operation counter per group of workers.
pub struct Register {
    opts: RegisterOptions,
    groups: Vec<Arc<AtomicU64>>,
}

/// One register operation before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RegisterOp {
    Get,
    SerializableGet,
    Put(String),
    Cas { expect: Option<String>, new: String },
    Delete,
}

impl RegisterOp {
    fn f(&self) -> &'static str {
        match self {
            RegisterOp::Get => "get",
            RegisterOp::SerializableGet => "sget",
            RegisterOp::Put(_) => "put",
            RegisterOp::Cas { .. } => "cas",
            RegisterOp::Delete => "delete",
        }
    }

    fn args(&self) -> Value {
        match self {
            RegisterOp::Get | RegisterOp::SerializableGet | RegisterOp::Delete => Value::Null,
            RegisterOp::Put(v) => json!({ "value": v }),
            RegisterOp::Cas { expect, new } => json!({ "expect": expect, "new": new }),
        }
    }

    fn is_read(&self) -> bool {
        matches!(self, RegisterOp::Get | RegisterOp::SerializableGet)
    }
}

fn utf8(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Sends `op` and returns its completion value, header, and the value the register is now
/// known to hold (for the worker's next cas), if known.
async fn execute(
    client: &mut Client,
    key: &str,
    op: &RegisterOp,
    serializable: bool,
    timeout: Duration,
) -> Result<(Value, Option<Header>, Option<Option<String>>), OpError> {
    match op {
        RegisterOp::Get | RegisterOp::SerializableGet => {
            let serializable = serializable || *op == RegisterOp::SerializableGet;
            let opts = serializable.then(|| GetOptions::new().with_serializable());
            let resp = client::bounded(timeout, client.get(key, opts)).await?;
            let h = client::header(resp.header());
            let value = match resp.kvs().first() {
                Some(kv) => json!({
                    "value": utf8(kv.value()),
                    "mod_rev": kv.mod_revision(),
                    "create_rev": kv.create_revision(),
                    "version": kv.version(),
                }),
                None => json!({ "value": null }),
            };
            let seen = resp.kvs().first().map(|kv| utf8(kv.value()));
            Ok((value, h, Some(seen)))
        }
        RegisterOp::Put(v) => {
            let resp = client::bounded(timeout, client.put(key, v.as_str(), None)).await?;
            let h = client::header(resp.header());
            let rev = h.map(|h| h.revision);
            Ok((json!({ "value": v, "mod_rev": rev }), h, Some(Some(v.clone()))))
        }
        RegisterOp::Cas { expect, new } => {
            let cmp = match expect {
                Some(e) => Compare::value(key, CompareOp::Equal, e.as_str()),
                None => Compare::version(key, CompareOp::Equal, 0),
            };
            let txn = Txn::new()
                .when([cmp])
                .and_then([TxnOp::put(key, new.as_str(), None)])
                .or_else([TxnOp::get(key, None)]);
            let resp = client::bounded(timeout, client.txn(txn)).await?;
            let h = client::header(resp.header());
            if resp.succeeded() {
                let rev = h.map(|h| h.revision);
                let v = json!({"expect": expect, "new": new, "succeeded": true, "mod_rev": rev});
                return Ok((v, h, Some(Some(new.clone()))));
            }
            let current = resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            });
            match current {
                Some(g) => {
                    let kv = g.kvs().first();
                    let cur = kv.map(|kv| utf8(kv.value()));
                    let v = json!({
                        "expect": expect,
                        "new": new,
                        "succeeded": false,
                        "current": cur,
                        "current_mod_rev": kv.map(|kv| kv.mod_revision()),
                    });
                    Ok((v, h, Some(cur)))
                }
                None => {
                    let v = json!({"expect": expect, "new": new, "succeeded": false});
                    Ok((v, h, None))
                }
            }
        }
        RegisterOp::Delete => {
            let resp = client::bounded(timeout, client.delete(key, None)).await?;
            let h = client::header(resp.header());
            let deleted = resp.deleted();
            let v = if deleted > 0 {
                json!({ "deleted": deleted, "mod_rev": h.map(|h| h.revision) })
            } else {
                json!({ "deleted": deleted })
            };
            Ok((v, h, Some(None)))
        }
    }
}

impl Register {
    pub fn new(opts: RegisterOptions) -> Self {
        let groups = opts.workers.div_ceil(opts.group_size.max(1));
        Register { opts, groups: (0..groups).map(|_| Arc::new(AtomicU64::new(0))).collect() }
    }

    pub fn key(group: usize, epoch: u64) -> String {
        format!("{KEY_PREFIX}{group}/{epoch}")
    }

    /// Every key some worker may have touched.
    pub fn keys_used(&self) -> Vec<String> {
        let mut keys = Vec::new();
        for (g, counter) in self.groups.iter().enumerate() {
            let n = counter.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            for epoch in 0..=(n - 1) / self.opts.ops_per_key {
                keys.push(Self::key(g, epoch));
            }
        }
        keys
    }

    /// Spawns one worker per configured worker; worker `w` talks to node `w % nodes.len()` and
    /// belongs to group `w / group_size`.
    pub fn spawn_workers(
        &self,
        set: &mut JoinSet<Result<OpCounts, WorkloadError>>,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        seed: u64,
    ) {
        for w in 0..self.opts.workers {
            let node = nodes[w % nodes.len()].clone();
            let g = w / self.opts.group_size.max(1);
            let group = self.groups[g].clone();
            let opts = self.opts.clone();
            let env = env.clone();
            // A distinct, reproducible stream per worker.
            let wseed = seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            set.spawn(worker(node, g, group, opts, env, wseed));
        }
    }
}

/// Records `draft` and counts it.
fn record(env: &WorkerEnv, counts: &mut OpCounts, draft: EventDraft) -> Result<(), WorkloadError> {
    counts.count(draft.kind);
    env.history.record(draft)?;
    Ok(())
}

async fn worker(
    node: NodeInfo,
    group_id: usize,
    group: Arc<AtomicU64>,
    opts: RegisterOptions,
    env: WorkerEnv,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = client::connect(&node.client_url, opts.op_timeout).await.map_err(|e| {
        WorkloadError::Client { endpoint: node.client_url.clone(), message: e.to_string() }
    })?;
    let mut counts = OpCounts::default();
    let mut process = env.next_process();
    let mut seq = 0u64;
    // The last value this worker saw on each key (`None` inside: absent).
    let mut last_seen: HashMap<String, Option<String>> = HashMap::new();
    let mean_gap = Duration::from_secs_f64(opts.workers as f64 / opts.rate.max(0.001));
    // Bounded in count as well as time: even at zero latency a worker cannot issue more than
    // one operation per `mean_gap / 2` on average, so 4x the expected count plus slack is a
    // generous cap that still ends a runaway loop.
    let secs = env.deadline.saturating_duration_since(Instant::now()).as_secs_f64();
    let max_ops = (secs / mean_gap.as_secs_f64().max(1e-6) * 4.0) as u64 + 1000;
    for _ in 0..max_ops {
        if env.should_stop() {
            break;
        }
        let gap = mean_gap.mul_f64(rng.random::<f64>() * 2.0);
        let left = env.deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(gap.min(left)).await;
        if env.should_stop() {
            break;
        }
        let n = group.fetch_add(1, Ordering::Relaxed);
        let key = Register::key(group_id, n / opts.ops_per_key);
        let op = match rng.random_range(0..100) {
            0..27 => RegisterOp::Get,
            27..35 => RegisterOp::SerializableGet,
            35..60 => {
                seq += 1;
                RegisterOp::Put(format!("p{process}-{seq}"))
            }
            60..90 => {
                seq += 1;
                let expect = last_seen.get(&key).cloned().unwrap_or(None);
                RegisterOp::Cas { expect, new: format!("p{process}-{seq}") }
            }
            _ => RegisterOp::Delete,
        };
        record(
            &env,
            &mut counts,
            EventDraft::new(EventType::Invoke, Process::Client(process), op.f())
                .key(&key)
                .value(op.args())
                .node(&node.name),
        )?;
        let result =
            execute(&mut client, &key, &op, opts.serializable_reads, opts.op_timeout).await;
        match result {
            Ok((value, header, seen)) => {
                record(
                    &env,
                    &mut counts,
                    EventDraft::new(EventType::Ok, Process::Client(process), op.f())
                        .key(&key)
                        .value(value)
                        .node(&node.name)
                        .header(header),
                )?;
                if let Some(seen) = seen {
                    last_seen.insert(key, seen);
                }
            }
            Err(e) => {
                let (kind, error) = client::classify(&e, op.is_read());
                record(
                    &env,
                    &mut counts,
                    EventDraft::new(kind, Process::Client(process), op.f())
                        .key(&key)
                        .value(op.args())
                        .node(&node.name)
                        .error(error),
                )?;
                if kind == EventType::Info {
                    // The old process may still have this write in flight.
                    process = env.next_process();
                }
                // What the register holds is now unknown to this worker.
                last_seen.remove(&key);
            }
        }
    }
    Ok(counts)
}

/// Reads every key once, linearizably (even in the unsafe mode), through the nodes in turn,
/// after the cluster has healed. Each key's read is retried on other nodes up to
/// [`FINAL_READ_ATTEMPTS`] times. Returns the counts and the keys no attempt could read.
pub async fn final_reads(
    keys: &[String],
    nodes: &[NodeInfo],
    env: &WorkerEnv,
    op_timeout: Duration,
) -> Result<(OpCounts, Vec<String>), WorkloadError> {
    let mut counts = OpCounts::default();
    let mut unread = Vec::new();
    let mut clients = Vec::new();
    for n in nodes {
        let c = client::connect(&n.client_url, op_timeout).await.map_err(|e| {
            WorkloadError::Client { endpoint: n.client_url.clone(), message: e.to_string() }
        })?;
        clients.push(c);
    }
    let process = env.next_process();
    for (k, key) in keys.iter().enumerate() {
        let mut done = false;
        for attempt in 0..FINAL_READ_ATTEMPTS {
            let i = (k + attempt) % nodes.len();
            let node = &nodes[i].name;
            record(
                env,
                &mut counts,
                EventDraft::new(EventType::Invoke, Process::Client(process), "get")
                    .key(key)
                    .node(node),
            )?;
            match execute(&mut clients[i], key, &RegisterOp::Get, false, op_timeout).await {
                Ok((value, header, _)) => {
                    record(
                        env,
                        &mut counts,
                        EventDraft::new(EventType::Ok, Process::Client(process), "get")
                            .key(key)
                            .value(value)
                            .node(node)
                            .header(header),
                    )?;
                    done = true;
                    break;
                }
                Err(e) => {
                    let (kind, error) = client::classify(&e, true);
                    record(
                        env,
                        &mut counts,
                        EventDraft::new(kind, Process::Client(process), "get")
                            .key(key)
                            .node(node)
                            .error(error),
                    )?;
                    tokio::time::sleep(FINAL_READ_BACKOFF).await;
                }
            }
        }
        if !done {
            unread.push(key.clone());
        }
    }
    Ok((counts, unread))
}
