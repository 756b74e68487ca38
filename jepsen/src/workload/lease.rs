//! The `lease` workload: short leases with keys attached, some kept alive, some left to expire,
//! some revoked; reads of the attached keys observe when each lease ended.
//!
//! Operations: `lease_grant {ttl}` -> ok `{id, ttl}`; `put {value, lease}` of a fresh key under
//! `jepsen/lease/` -> ok adds `mod_rev` (a put on a lease that is gone fails with `NotFound`,
//! a definite `fail`); `lease_keepalive {id}` -> ok `{id, ttl}` (`ttl <= 0`: the lease is gone);
//! `lease_revoke {id}`; `get` of an attached key -> ok `{value|null, mod_rev?, lease?}`.
//! After healing, the key-event log of the prefix is recorded (`watch` with `log: true`).
//! Checked by [`crate::checker::lease`].

use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{
    connect, max_iterations, watch, worker_seed, OpCounts, Recorder, WorkerEnv, WorkloadError,
    WorkloadOptions,
};
use crate::client;
use crate::cluster::NodeInfo;

pub const PREFIX: &str = "jepsen/lease/";
/// Leases a worker holds at once.
const MAX_LEASES: usize = 3;
/// Keys attached at grant.
const KEYS_PER_LEASE: usize = 2;

pub struct LeaseWorkload {
    opts: WorkloadOptions,
}

struct Held {
    id: i64,
    ttl: i64,
    keep: bool,
    revoked: bool,
    keys: Vec<String>,
    last_keepalive: Instant,
    /// Forgotten after this instant (a while after it must have expired).
    forget: Instant,
}

impl LeaseWorkload {
    pub fn new(opts: WorkloadOptions) -> Self {
        LeaseWorkload { opts }
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
            set.spawn(worker(node, w, self.opts.clone(), env.clone(), worker_seed(seed, w)));
        }
    }

    pub async fn final_phase(
        &self,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        op_timeout: Duration,
    ) -> Result<(OpCounts, Vec<String>), WorkloadError> {
        watch::final_log(nodes, env, op_timeout, PREFIX, 1).await
    }
}

async fn put(
    rec: &mut Recorder,
    c: &mut Client,
    key: &str,
    lease: i64,
    t: Duration,
) -> Result<bool, WorkloadError> {
    let value = format!("p{}-{key}", rec.process);
    let args = json!({ "value": value, "lease": lease });
    rec.invoke("put", Some(key), args.clone())?;
    let opts = PutOptions::new().with_lease(lease);
    match client::bounded(t, c.put(key, value.as_str(), Some(opts))).await {
        Ok(r) => {
            let h = client::header(r.header());
            let v = json!({"value": value, "lease": lease, "mod_rev": h.map(|h| h.revision)});
            rec.ok("put", Some(key), v, h)?;
            Ok(true)
        }
        Err(e) => {
            rec.error("put", Some(key), args, &e, false)?;
            Ok(false)
        }
    }
}

async fn keepalive(
    rec: &mut Recorder,
    c: &mut Client,
    id: i64,
    t: Duration,
) -> Result<Option<i64>, WorkloadError> {
    let args = json!({ "id": id });
    rec.invoke("lease_keepalive", None, args.clone())?;
    let r = client::bounded(t, async {
        let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
        keeper.keep_alive().await?;
        stream.message().await
    })
    .await;
    match r {
        Ok(Some(resp)) => {
            let h = client::header(resp.header());
            rec.ok("lease_keepalive", None, json!({"id": id, "ttl": resp.ttl()}), h)?;
            Ok(Some(resp.ttl()))
        }
        Ok(None) => {
            // The stream closed without an answer: whether the renewal happened is unknown.
            rec.info("lease_keepalive", None, args, "stream", "keep-alive stream closed")?;
            Ok(None)
        }
        // etcd-client turns the server's `TTL: 0` answer (the lease does not exist) into this
        // error: a definite answer, recorded as such.
        Err(client::OpError::Client(etcd_client::Error::LeaseKeepAliveError(m)))
            if m.contains("not found") =>
        {
            rec.ok("lease_keepalive", None, json!({"id": id, "ttl": 0, "not_found": true}), None)?;
            Ok(Some(0))
        }
        Err(e) => {
            rec.error("lease_keepalive", None, args, &e, false)?;
            Ok(None)
        }
    }
}

async fn worker(
    node: NodeInfo,
    w: usize,
    opts: WorkloadOptions,
    env: WorkerEnv,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let t = opts.op_timeout;
    let mut c = connect(&node, t).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    let mut leases: Vec<Held> = Vec::new();
    let mut n = 0u64;
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        let now = Instant::now();
        leases.retain(|l| l.forget > now);
        // Kept leases are renewed every third of their TTL, before anything else.
        if let Some(l) = leases.iter_mut().find(|l| {
            l.keep
                && !l.revoked
                && now.duration_since(l.last_keepalive).as_millis() as i64 * 3 > l.ttl * 1000
        }) {
            l.last_keepalive = now;
            let id = l.id;
            if let Some(ttl) = keepalive(&mut rec, &mut c, id, t).await? {
                if ttl <= 0 {
                    l_gone(&mut leases, id);
                }
            }
            continue;
        }
        let live = leases.iter().filter(|l| !l.revoked).count();
        match rng.random_range(0..100) {
            0..25 if live < MAX_LEASES => {
                let ttl = rng.random_range(opts.lease_ttl..=opts.lease_ttl + 1);
                rec.invoke("lease_grant", None, json!({ "ttl": ttl }))?;
                let id = match client::bounded(t, c.lease_grant(ttl, None)).await {
                    Ok(r) => {
                        let h = client::header(r.header());
                        rec.ok("lease_grant", None, json!({"ttl": r.ttl(), "id": r.id()}), h)?;
                        r.id()
                    }
                    Err(e) => {
                        rec.error("lease_grant", None, json!({ "ttl": ttl }), &e, false)?;
                        continue;
                    }
                };
                let mut held = Held {
                    id,
                    ttl,
                    keep: rng.random_range(0..100) < 60,
                    revoked: false,
                    keys: Vec::new(),
                    last_keepalive: Instant::now(),
                    forget: Instant::now() + Duration::from_secs(3 * ttl as u64 + 5),
                };
                for _ in 0..KEYS_PER_LEASE {
                    n += 1;
                    let key = format!("{PREFIX}{w}/{id:x}/{n}");
                    if put(&mut rec, &mut c, &key, id, t).await? {
                        held.keys.push(key);
                    }
                }
                leases.push(held);
            }
            0..60 => {
                let keys: Vec<&String> = leases.iter().flat_map(|l| &l.keys).collect();
                let Some(key) = keys.choose(&mut rng).map(|k| k.to_string()) else { continue };
                rec.invoke("get", Some(&key), Value::Null)?;
                match client::bounded(t, c.get(key.as_str(), None)).await {
                    Ok(r) => {
                        let v = match r.kvs().first() {
                            Some(kv) => json!({
                                "value": String::from_utf8_lossy(kv.value()),
                                "mod_rev": kv.mod_revision(),
                                "lease": kv.lease(),
                            }),
                            None => json!({ "value": null }),
                        };
                        rec.ok("get", Some(&key), v, client::header(r.header()))?;
                    }
                    Err(e) => {
                        rec.error("get", Some(&key), Value::Null, &e, true)?;
                    }
                }
            }
            60..70 => {
                let Some(l) = leases.iter_mut().filter(|l| !l.revoked).last() else { continue };
                l.revoked = true;
                let id = l.id;
                rec.invoke("lease_revoke", None, json!({ "id": id }))?;
                match client::bounded(t, c.lease_revoke(id)).await {
                    Ok(r) => {
                        rec.ok("lease_revoke", None, json!({"id": id}), client::header(r.header()))?
                    }
                    Err(e) => {
                        rec.error("lease_revoke", None, json!({ "id": id }), &e, false)?;
                    }
                }
            }
            70..80 => {
                // A put on a lease that may have expired: it must fail if the lease is gone.
                let Some(l) = leases.iter_mut().filter(|l| !l.revoked).last() else { continue };
                n += 1;
                let key = format!("{PREFIX}{w}/{:x}/{n}", l.id);
                let id = l.id;
                if put(&mut rec, &mut c, &key, id, t).await? {
                    if let Some(l) = leases.iter_mut().find(|l| l.id == id) {
                        l.keys.push(key);
                    }
                }
            }
            _ => {
                let Some(id) = leases.choose(&mut rng).map(|l| l.id) else { continue };
                if let Some(ttl) = keepalive(&mut rec, &mut c, id, t).await? {
                    if ttl <= 0 {
                        l_gone(&mut leases, id);
                    }
                }
            }
        }
    }
    Ok(rec.counts)
}

/// Stops renewing a lease the server says is gone (its keys are still read for a while).
fn l_gone(leases: &mut [Held], id: i64) {
    for l in leases.iter_mut().filter(|l| l.id == id) {
        l.keep = false;
    }
}
