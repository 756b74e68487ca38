//! The `set` workload: workers add unique integers to a set kept under one key prefix, each add
//! a read-modify-write CAS loop (`Txn` guarded on its key's `mod_revision`), and read the set now
//! and then (one linearizable range over the prefix, so one revision); after healing, a final
//! read. Checked by [`crate::checker::set`]: no acknowledged element may be missing from a read
//! that began after the add completed.
//!
//! The set is split over keys of [`SHARD`] consecutive elements each. In one key, every add
//! rewrote the whole set, so the history grew with the square of the adds: a 10-minute long run
//! on a fast host wrote ~2.4 GB, passed `--quota-backend-bytes` (2 GiB), and the members then
//! refused writes with NOSPACE, which the cluster checker rightly reports as unavailable
//! (session 35). With shards an add rewrites at most [`SHARD`] elements. Workers take elements
//! from one counter, so they still contend for the same key (the newest shard) as before.
//!
//! An add is `ok` when its guarded `Txn` succeeded; `fail` when every attempt's comparison failed
//! (so nothing was written); `info` when a `Txn` had an unknown outcome (it may have been applied,
//! now or later).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
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

/// The prefix of the keys holding the set (the name the history records for reads).
pub const KEY: &str = "jepsen/set/";

/// Elements per key: an add rewrites at most this many (~7 KB at six digits each).
const SHARD: u64 = 1_000;

/// The key that holds `element`: its shard's number, zero-padded so the keys sort by it.
fn shard_key(element: u64) -> String {
    format!("{KEY}{:08}", element / SHARD)
}

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

/// A linearizable read of the whole set: the union of every shard's elements, read by one range
/// request over the prefix, so all shards at one revision.
async fn read_shards(
    c: &mut Client,
    timeout: Duration,
) -> Result<(Vec<u64>, Option<Header>), OpError> {
    let resp = client::bounded(timeout, c.get(KEY, Some(GetOptions::new().with_prefix()))).await?;
    let h = client::header(resp.header());
    Ok((union(resp.kvs().iter().map(|kv| kv.value())), h))
}

/// The elements of every shard value, in key order.
fn union<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<u64> {
    values.flat_map(decode).collect()
}

/// Runs a `read` operation of the whole set; returns whether it succeeded.
async fn read_op(
    rec: &mut Recorder,
    c: &mut Client,
    timeout: Duration,
) -> Result<bool, WorkloadError> {
    rec.invoke("read", Some(KEY), Value::Null)?;
    match read_shards(c, timeout).await {
        Ok((els, h)) => {
            rec.ok("read", Some(KEY), json!({ "elements": els }), h)?;
            Ok(true)
        }
        Err(e) => {
            rec.error("read", Some(KEY), Value::Null, &e, true)?;
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
                let ok = read_op(&mut rec, &mut c, op_timeout).await?;
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
    let key = shard_key(element);
    rec.invoke("add", Some(&key), args.clone())?;
    for attempt in 0..CAS_ATTEMPTS {
        // A failed read wrote nothing: try again.
        let Ok((mut els, mod_rev, _)) = read_set(c, &key, timeout).await else { continue };
        els.push(element);
        let cmp = if mod_rev == 0 {
            Compare::version(key.as_str(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(key.as_str(), CompareOp::Equal, mod_rev)
        };
        let txn = Txn::new().when([cmp]).and_then([TxnOp::put(key.as_str(), encode(&els), None)]);
        match client::bounded(timeout, c.txn(txn)).await {
            Ok(r) if r.succeeded() => {
                let h = client::header(r.header());
                let v = json!({"element": element, "attempts": attempt + 1,
                               "mod_rev": h.map(|h| h.revision)});
                return rec.ok("add", Some(&key), v, h);
            }
            // Lost the race: the comparison failed, nothing was written.
            Ok(_) => continue,
            Err(e) => {
                rec.error("add", Some(&key), args, &e, false)?;
                return Ok(());
            }
        }
    }
    rec.fail("add", Some(&key), args, "cas-contention", "every CAS attempt lost its comparison")
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
            read_op(&mut rec, &mut c, opts.op_timeout).await?;
        }
    }
    Ok(rec.counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_hold_runs_of_consecutive_elements_and_sort_by_them() {
        assert_eq!(shard_key(0), "jepsen/set/00000000");
        assert_eq!(shard_key(SHARD - 1), shard_key(0));
        assert_eq!(shard_key(SHARD), "jepsen/set/00000001");
        // Keys sort as their shards do, so a prefix range returns them in element order.
        assert!(shard_key(9 * SHARD) < shard_key(10 * SHARD));
        assert!(shard_key(99_999 * SHARD) < shard_key(100_000 * SHARD));
    }

    #[test]
    fn an_add_rewrites_at_most_one_shard() {
        // The bound that keeps a long run's history linear in its adds: the value an add
        // writes holds only its shard's elements, however many were added before.
        let added: Vec<u64> = (0..5 * SHARD).collect();
        let mut by_key: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
        for e in &added {
            by_key.entry(shard_key(*e)).or_default().push(*e);
        }
        assert_eq!(by_key.len(), 5);
        assert!(by_key.values().all(|els| els.len() as u64 == SHARD));
        let values: Vec<String> = by_key.values().map(|els| encode(els)).collect();
        assert_eq!(union(values.iter().map(|v| v.as_bytes())), added);
    }

    #[test]
    fn union_of_no_shards_is_empty() {
        assert!(union(std::iter::empty()).is_empty());
    }
}
