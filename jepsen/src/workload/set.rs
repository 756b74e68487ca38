//! The `set` workload: workers add unique integers to a set kept in one key, each add a
//! read-modify-write CAS loop (`Txn` guarded on the key's `mod_revision`), and read the set now
//! and then; after healing, a final read. Checked by [`crate::checker::set`]: no acknowledged
//! element may be missing from a read that began after the add completed.
//!
//! An add is `ok` when its guarded `Txn` succeeded; `fail` when every attempt's comparison failed
//! (so nothing was written); `info` when a `Txn` had an unknown outcome (it may have been applied,
//! now or later).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{
    connect, final_attempts, max_iterations, worker_seed, OpCounts, Recorder, WorkerEnv,
    WorkloadError, WorkloadOptions,
};
use crate::client::{self, OpError};
use crate::cluster::NodeInfo;
use crate::history::Header;

/// The key holding the set.
pub const KEY: &str = "jepsen/set";

/// CAS attempts per add. Nine workers contend for one key, so a few attempts lose; each lost
/// attempt wrote nothing, so giving up after 8 is a definite `fail`, never a guess.
const CAS_ATTEMPTS: usize = 8;

pub struct SetWorkload {
    opts: WorkloadOptions,
    next_element: Arc<AtomicU64>,
}

/// The set's elements encoded in a value: comma-separated integers.
pub fn decode(v: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(v).split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

pub fn encode(els: &[u64]) -> String {
    els.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// A linearizable read of the set: its elements, its `mod_revision` (0 when absent) and header.
pub async fn read_set(
    c: &mut Client,
    key: &str,
    timeout: Duration,
) -> Result<(Vec<u64>, i64, Option<Header>), OpError> {
    let resp = client::bounded(timeout, c.get(key, None)).await?;
    let h = client::header(resp.header());
    Ok(match resp.kvs().first() {
        Some(kv) => (decode(kv.value()), kv.mod_revision(), h),
        None => (Vec::new(), 0, h),
    })
}

/// Runs a `read` operation; returns whether it succeeded.
pub async fn read_op(
    rec: &mut Recorder,
    c: &mut Client,
    key: &str,
    timeout: Duration,
) -> Result<bool, WorkloadError> {
    rec.invoke("read", Some(key), Value::Null)?;
    match read_set(c, key, timeout).await {
        Ok((els, _, h)) => {
            rec.ok("read", Some(key), json!({ "elements": els }), h)?;
            Ok(true)
        }
        Err(e) => {
            rec.error("read", Some(key), Value::Null, &e, true)?;
            Ok(false)
        }
    }
}

impl SetWorkload {
    pub fn new(opts: WorkloadOptions) -> Self {
        SetWorkload { opts, next_element: Arc::new(AtomicU64::new(0)) }
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
            set.spawn(worker(
                node,
                self.opts.clone(),
                env.clone(),
                self.next_element.clone(),
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
        let done =
            final_attempts(nodes, env, op_timeout, &mut counts, |mut rec, mut c| async move {
                let ok = read_op(&mut rec, &mut c, KEY, op_timeout).await?;
                Ok((rec, ok))
            })
            .await?;
        let notes = if done { Vec::new() } else { vec!["the final read of the set failed".into()] };
        Ok((counts, notes))
    }
}

async fn add(
    rec: &mut Recorder,
    c: &mut Client,
    element: u64,
    timeout: Duration,
) -> Result<(), WorkloadError> {
    let args = json!({ "element": element });
    rec.invoke("add", Some(KEY), args.clone())?;
    for attempt in 0..CAS_ATTEMPTS {
        // A failed read wrote nothing: try again.
        let Ok((mut els, mod_rev, _)) = read_set(c, KEY, timeout).await else { continue };
        els.push(element);
        let cmp = if mod_rev == 0 {
            Compare::version(KEY, CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(KEY, CompareOp::Equal, mod_rev)
        };
        let txn = Txn::new().when([cmp]).and_then([TxnOp::put(KEY, encode(&els), None)]);
        match client::bounded(timeout, c.txn(txn)).await {
            Ok(r) if r.succeeded() => {
                let h = client::header(r.header());
                let v = json!({"element": element, "attempts": attempt + 1,
                               "mod_rev": h.map(|h| h.revision)});
                return rec.ok("add", Some(KEY), v, h);
            }
            // Lost the race: the comparison failed, nothing was written.
            Ok(_) => continue,
            Err(e) => {
                rec.error("add", Some(KEY), args, &e, false)?;
                return Ok(());
            }
        }
    }
    rec.fail("add", Some(KEY), args, "cas-contention", "every CAS attempt lost its comparison")
}

async fn worker(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    next_element: Arc<AtomicU64>,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = connect(&node, opts.op_timeout).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        if rng.random_range(0..100) < 80 {
            let e = next_element.fetch_add(1, Ordering::Relaxed);
            add(&mut rec, &mut c, e, opts.op_timeout).await?;
        } else {
            read_op(&mut rec, &mut c, KEY, opts.op_timeout).await?;
        }
    }
    Ok(rec.counts)
}
