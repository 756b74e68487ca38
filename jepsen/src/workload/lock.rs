//! The lock workloads, through etcd's v3 Lock API (`v3lockpb.Lock`), so they run against
//! Picket and etcd alike. Each acquisition uses a fresh lease (TTL `--lease-ttl`, 2 s by default)
//! that a background task keeps alive through the worker's node.
//!
//! One cycle of a worker: `lease_grant`; `lock_acquire {name, lease}` -> ok `{key, token,
//! grant_rev}` (the token is the lock key's `create_revision`, read right after the grant, and
//! `grant_rev` the response's header revision, at which the key must be the oldest under
//! `name/`); then the variant's critical section; `lock_release {name, key, token}` as a `Txn`
//! that deletes the key only if `create_revision(key) == token` -> ok `{held}` (so the lock
//! checker knows whether the holder still held the lock when it let go); `lease_revoke`.
//!
//! Variants:
//! - `lock`: a few names, a short hold.
//! - `lock-set`: one name; the critical section reads a set kept in harness memory, does a slow
//!   "work" request through its node, and writes the set back plus one element
//!   (`resource_add`). Unsafe on purpose: a holder stalled past its lease's TTL (its node
//!   SIGSTOPped by the pause nemesis, or the worker itself stalled, see below) writes back a
//!   stale set after another holder was granted the lock, and the other holder's element is lost.
//! - `lock-fenced-set`: the same resource, but it remembers the highest token it has seen (on
//!   reads and writes) and rejects a write whose token is lower (`fail`, `fenced`).
//! - `lock-kv-set`: the resource is a key, and the write is a `Txn` guarded on
//!   `create_revision(lock key) == token` (`fail`, `not-holder`, when the guard fails).
//!
//! With the `pause` nemesis the set variants also stall clients: now and then a holder stops
//! its keep-alives and sleeps past its lease's TTL inside the critical section, as a process
//! paused by the scheduler or a GC would (the harness cannot SIGSTOP one of its own tasks).
//! The stall is recorded in the `resource_add` completion (`stalled_ms`).
//!
//! After healing, the final phase reads the set (set variants) and records the key-event log of
//! the lock prefix (`watch` with `log: true`), which the lock checker uses to verify that each
//! grantee's key was the oldest live key at the grant revision.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, LockOptions, Txn, TxnOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::leases;
use super::set::{encode, read_set};
use super::{
    connect, final_attempts, max_iterations, watch, worker_seed, OpCounts, Recorder, WorkerEnv,
    WorkloadError, WorkloadOptions,
};
use crate::client;
use crate::cluster::NodeInfo;
use crate::nemesis::between;

/// Every lock name lives under this prefix (the key log covers it).
pub const PREFIX: &str = "jepsen/lock/";
/// The resource key of `lock-kv-set`.
pub const KV_RESOURCE: &str = "jepsen/lkv/set";
/// The in-memory resource's name in the history.
pub const MEM_RESOURCE: &str = "memory/set";

/// Names of the `lock` workload.
const LOCK_NAMES: usize = 3;

/// Bound on a `Lock` call: waiting behind up to eight other holders, each holding for a
/// fraction of a second, or for a stall of up to 4 s. Past it the acquisition is `info` (it may still be granted; the lease is then
/// revoked, which frees the lock), so the bound only trades ambiguity for progress.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on the "work" request in the critical section. It must outlast the pause nemesis's
/// longest SIGSTOP (6 s): the point of the request is to hang while the holder's node is paused,
/// so that the holder's lease expires under it.
const WORK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a holder works (sleeps) in the critical section, so that a pause or a stall is
/// likely to land inside it.
const WORK_MIN: Duration = Duration::from_millis(50);
const WORK_MAX: Duration = Duration::from_millis(250);
/// Probability (percent) that a holder stalls in the critical section when client stalls are on.
const STALL_PERCENT: u32 = 15;
/// How far past the lease TTL a stall lasts.
const STALL_EXTRA: (Duration, Duration) =
    (Duration::from_millis(1000), Duration::from_millis(2000));
/// Bound on one keep-alive round trip. A keep-alive that does not come back in time is simply
/// tried again at the next tick; the lease's fate is decided by the server, and the checkers
/// never assume a keep-alive worked.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Which lock workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Lock,
    LockSet,
    LockFencedSet,
    LockKvSet,
}

impl Variant {
    pub fn parse(name: &str) -> Option<Variant> {
        Some(match name {
            "lock" => Variant::Lock,
            "lock-set" => Variant::LockSet,
            "lock-fenced-set" => Variant::LockFencedSet,
            "lock-kv-set" => Variant::LockKvSet,
            _ => return None,
        })
    }

    fn is_set(self) -> bool {
        self != Variant::Lock
    }

    fn resource(self) -> &'static str {
        if self == Variant::LockKvSet {
            KV_RESOURCE
        } else {
            MEM_RESOURCE
        }
    }
}

/// The resource kept in harness memory (`lock-set`, `lock-fenced-set`).
#[derive(Debug, Default)]
struct Memory {
    set: Vec<u64>,
    /// Highest token seen, for the fenced variant.
    highest: i64,
}

pub struct LockWorkload {
    variant: Variant,
    opts: WorkloadOptions,
    memory: Arc<Mutex<Memory>>,
    next_element: Arc<AtomicU64>,
    /// Stall holders past their TTL (on with the pause nemesis, set variants only).
    stalls: bool,
}

impl LockWorkload {
    pub fn new(variant: Variant, opts: WorkloadOptions) -> Self {
        LockWorkload {
            variant,
            opts,
            memory: Arc::default(),
            next_element: Arc::default(),
            stalls: false,
        }
    }

    /// Turns client stalls on (the runner does so with the pause nemesis).
    pub fn with_stalls(mut self, on: bool) -> Self {
        self.stalls = on && self.variant.is_set();
        self
    }

    pub fn stalls(&self) -> bool {
        self.stalls
    }

    pub fn spawn_workers(
        &self,
        set: &mut JoinSet<Result<OpCounts, WorkloadError>>,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        seed: u64,
    ) {
        for w in 0..self.opts.workers {
            let ctx = Ctx {
                variant: self.variant,
                opts: self.opts.clone(),
                memory: self.memory.clone(),
                next_element: self.next_element.clone(),
                stalls: self.stalls,
            };
            set.spawn(worker(
                nodes[w % nodes.len()].clone(),
                ctx,
                env.clone(),
                worker_seed(seed, w),
            ));
        }
    }

    pub async fn final_phase(
        &self,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        op_timeout: Duration,
    ) -> Result<(OpCounts, Vec<String>), WorkloadError> {
        let mut counts = OpCounts::default();
        let mut notes = Vec::new();
        if self.variant.is_set() {
            let variant = self.variant;
            let memory = self.memory.clone();
            let done = final_attempts(nodes, env, op_timeout, &mut counts, |mut rec, mut c| {
                let memory = memory.clone();
                async move {
                    let ok = resource_read(&mut rec, &mut c, variant, &memory, op_timeout).await?;
                    Ok((rec, ok))
                }
            })
            .await?;
            if !done {
                notes.push("the final read of the resource failed".to_string());
            }
        }
        let (c, n) = watch::final_log(nodes, env, op_timeout, PREFIX, 1).await?;
        counts.add(c);
        notes.extend(n);
        Ok((counts, notes))
    }
}

#[derive(Clone)]
struct Ctx {
    variant: Variant,
    opts: WorkloadOptions,
    memory: Arc<Mutex<Memory>>,
    next_element: Arc<AtomicU64>,
    stalls: bool,
}

fn lock_memory(m: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    // A poisoned lock means a worker panicked mid-update; the set itself is still a valid
    // vector, and the panic fails the run anyway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads the resource (`resource_read`): harness memory, or a linearizable get of the key.
async fn resource_read(
    rec: &mut Recorder,
    c: &mut Client,
    variant: Variant,
    memory: &Mutex<Memory>,
    timeout: Duration,
) -> Result<bool, WorkloadError> {
    let key = variant.resource();
    rec.invoke("resource_read", Some(key), Value::Null)?;
    if variant == Variant::LockKvSet {
        match read_set(c, key, timeout).await {
            Ok((els, _, h)) => {
                rec.ok("resource_read", Some(key), json!({ "elements": els }), h)?;
                Ok(true)
            }
            Err(e) => {
                rec.error("resource_read", Some(key), Value::Null, &e, true)?;
                Ok(false)
            }
        }
    } else {
        let els = lock_memory(memory).set.clone();
        rec.ok("resource_read", Some(key), json!({ "elements": els }), None)?;
        Ok(true)
    }
}

async fn worker(
    node: NodeInfo,
    ctx: Ctx,
    env: WorkerEnv,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let timeout = ctx.opts.op_timeout;
    let mut c = connect(&node, timeout).await?;
    // The `Lock` call and the work request need a longer per-request bound than other
    // operations (see ACQUIRE_TIMEOUT and WORK_TIMEOUT): a client of their own.
    let mut slow = connect(&node, ACQUIRE_TIMEOUT.max(WORK_TIMEOUT)).await?;
    // A separate connection for keep-alives, so they are not queued behind a hung request.
    let ka_client = connect(&node, timeout).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = ctx.opts.mean_gap();
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        if ctx.variant.is_set() && rng.random_range(0..100) < 25 {
            resource_read(&mut rec, &mut c, ctx.variant, &ctx.memory, timeout).await?;
            continue;
        }
        let name = match ctx.variant {
            Variant::Lock => format!("{PREFIX}{}", rng.random_range(0..LOCK_NAMES)),
            _ => format!("{PREFIX}set"),
        };
        let clients = Clients { c: &mut c, slow: &mut slow, ka: &ka_client };
        cycle(&mut rec, clients, &ctx, &name, &mut rng).await?;
    }
    Ok(rec.counts)
}

/// Revokes a lease (cleanup after each cycle; also frees a lock whose acquisition timed out).
async fn revoke(
    rec: &mut Recorder,
    c: &mut Client,
    id: i64,
    t: Duration,
) -> Result<(), WorkloadError> {
    rec.invoke("lease_revoke", None, json!({ "id": id }))?;
    match client::bounded(t, c.lease_revoke(id)).await {
        Ok(r) => rec.ok("lease_revoke", None, json!({ "id": id }), client::header(r.header())),
        Err(e) => rec.error("lease_revoke", None, json!({ "id": id }), &e, false).map(|_| ()),
    }
}

/// A worker's connections to its node.
struct Clients<'a> {
    /// Ordinary operations, bounded by `--op-timeout-ms`.
    c: &'a mut Client,
    /// `Lock` and the work request.
    slow: &'a mut Client,
    /// Keep-alives.
    ka: &'a Client,
}

/// One acquire / critical section / release cycle with a fresh lease.
async fn cycle(
    rec: &mut Recorder,
    clients: Clients<'_>,
    ctx: &Ctx,
    name: &str,
    rng: &mut StdRng,
) -> Result<(), WorkloadError> {
    let Clients { c, slow, ka: ka_client } = clients;
    let t = ctx.opts.op_timeout;
    let ttl = ctx.opts.lease_ttl;
    let Some(lease) = leases::grant(rec, c, ttl, t).await? else { return Ok(()) };
    let ka = leases::keep_alive(ka_client.clone(), lease, ttl, KEEPALIVE_TIMEOUT);
    let args = json!({ "name": name, "lease": lease });
    rec.invoke("lock_acquire", Some(name), args.clone())?;
    let acquired = client::bounded(ACQUIRE_TIMEOUT, async {
        let r = slow.lock(name, Some(LockOptions::new().with_lease(lease))).await?;
        let key = String::from_utf8_lossy(r.key()).into_owned();
        let grant_rev = r.header().map(|h| h.revision());
        let header = client::header(r.header());
        // The token is the key's create revision; the Lock API does not return it.
        let g = slow.get(key.as_str(), None).await?;
        let token = g.kvs().first().map(|kv| kv.create_revision());
        Ok((key, token, grant_rev, header))
    })
    .await;
    let (key, token) = match acquired {
        Ok((key, token, grant_rev, header)) => {
            let v = json!({"name": name, "lease": lease, "key": key, "token": token,
                           "grant_rev": grant_rev});
            rec.ok("lock_acquire", Some(name), v, header)?;
            (key, token)
        }
        Err(e) => {
            rec.error("lock_acquire", Some(name), args, &e, false)?;
            ka.abort();
            return revoke(rec, c, lease, t).await;
        }
    };
    if ctx.variant.is_set() {
        resource_add(rec, c, slow, ctx, name, &key, token, &ka, rng).await?;
    } else {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
    }
    release(rec, c, name, &key, token, t).await?;
    ka.abort();
    revoke(rec, c, lease, t).await
}

/// Releases with a guarded delete: `held` says whether our key (with our token) still existed.
async fn release(
    rec: &mut Recorder,
    c: &mut Client,
    name: &str,
    key: &str,
    token: Option<i64>,
    t: Duration,
) -> Result<(), WorkloadError> {
    let args = json!({ "name": name, "key": key, "token": token });
    rec.invoke("lock_release", Some(name), args.clone())?;
    let Some(token) = token else {
        // Without a token the key was already gone when it was read: nothing to release.
        return rec.ok(
            "lock_release",
            Some(name),
            json!({"name": name, "key": key, "held": false}),
            None,
        );
    };
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, token)])
        .and_then([TxnOp::delete(key, None)]);
    match client::bounded(t, c.txn(txn)).await {
        Ok(r) => {
            let v = json!({"name": name, "key": key, "token": token, "held": r.succeeded()});
            rec.ok("lock_release", Some(name), v, client::header(r.header()))
        }
        Err(e) => rec.error("lock_release", Some(name), args, &e, false).map(|_| ()),
    }
}

/// The slow part of the critical section: a sleep, then a linearizable get through the node
/// (which hangs while the node is paused). Its result does not matter.
async fn work(c: &mut Client, key: &str, rng: &mut StdRng) {
    let ms = rng.random_range(WORK_MIN.as_millis() as u64..=WORK_MAX.as_millis() as u64);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let _ = client::bounded(WORK_TIMEOUT, c.get(key, None)).await;
}

#[allow(clippy::too_many_arguments)]
async fn resource_add(
    rec: &mut Recorder,
    c: &mut Client,
    slow: &mut Client,
    ctx: &Ctx,
    name: &str,
    lock_key: &str,
    token: Option<i64>,
    ka: &tokio::task::JoinHandle<()>,
    rng: &mut StdRng,
) -> Result<(), WorkloadError> {
    let element = ctx.next_element.fetch_add(1, Ordering::Relaxed);
    let res = ctx.variant.resource();
    let args = json!({ "element": element, "token": token, "lock": name });
    rec.invoke("resource_add", Some(res), args.clone())?;
    let stalled: Option<Duration> =
        (ctx.stalls && rng.random_range(0..100) < STALL_PERCENT).then(|| {
            Duration::from_secs(ctx.opts.lease_ttl.max(0) as u64)
                + between(rng, STALL_EXTRA.0, STALL_EXTRA.1)
        });
    let stalled_ms = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
    // A stalled client sends no keep-alives: its lease runs out while it sleeps.
    let stall = || async {
        if let Some(d) = stalled {
            ka.abort();
            tokio::time::sleep(d).await;
        }
    };
    match ctx.variant {
        Variant::Lock => unreachable!("the lock workload has no resource"),
        Variant::LockSet | Variant::LockFencedSet => {
            let fenced = ctx.variant == Variant::LockFencedSet;
            let tok = token.unwrap_or(i64::MIN);
            let snapshot = {
                let mut m = lock_memory(&ctx.memory);
                if fenced && tok < m.highest {
                    let msg = format!("token {tok} below the highest seen, {}", m.highest);
                    drop(m);
                    return rec.fail("resource_add", Some(res), args, "fenced", &msg);
                }
                m.highest = m.highest.max(tok);
                m.set.clone()
            };
            stall().await;
            work(slow, lock_key, rng).await;
            let mut m = lock_memory(&ctx.memory);
            if fenced && tok < m.highest {
                let msg = format!("token {tok} below the highest seen, {}", m.highest);
                drop(m);
                return rec.fail("resource_add", Some(res), args, "fenced", &msg);
            }
            m.highest = m.highest.max(tok);
            let mut set = snapshot;
            set.push(element);
            m.set = set;
            drop(m);
            let v = json!({"element": element, "token": token, "lock": name,
                           "stalled_ms": stalled_ms(stalled)});
            rec.ok("resource_add", Some(res), v, None)
        }
        Variant::LockKvSet => {
            let Some(tok) = token else {
                return rec.fail("resource_add", Some(res), args, "no-token", "lock key gone");
            };
            let mut set = match read_set(c, res, ctx.opts.op_timeout).await {
                Ok((els, _, _)) => els,
                // Nothing was written.
                Err(e) => return rec.fail("resource_add", Some(res), args, "read", &e.to_string()),
            };
            stall().await;
            work(slow, lock_key, rng).await;
            set.push(element);
            let txn = Txn::new()
                .when([Compare::create_revision(lock_key, CompareOp::Equal, tok)])
                .and_then([TxnOp::put(res, encode(&set), None)]);
            match client::bounded(ctx.opts.op_timeout, c.txn(txn)).await {
                Ok(r) if r.succeeded() => {
                    let h = client::header(r.header());
                    let v = json!({"element": element, "token": token, "lock": name,
                                   "stalled_ms": stalled_ms(stalled), "mod_rev": h.map(|h| h.revision)});
                    rec.ok("resource_add", Some(res), v, h)
                }
                Ok(_) => rec.fail(
                    "resource_add",
                    Some(res),
                    json!({"element": element, "token": token, "lock": name,
                           "stalled_ms": stalled_ms(stalled)}),
                    "not-holder",
                    "the lock key no longer has our token: the write was not applied",
                ),
                Err(e) => rec.error("resource_add", Some(res), args, &e, false).map(|_| ()),
            }
        }
    }
}
