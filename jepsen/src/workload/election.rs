//! The election workload, through etcd's v3 Election API (`v3electionpb.Election`), so it runs
//! against Picket and etcd alike.
//!
//! Two thirds of the workers campaign, the rest observe (spread over the nodes). A campaigner's cycle, on one of
//! [`NAMES`] election names under [`PREFIX`], with a fresh lease (TTL `--lease-ttl`, kept alive
//! every TTL/3 on its own connection, as the lock workload does):
//!
//! 1. `lease_grant`;
//! 2. `campaign {name, lease, value}` -> ok `{key, rev, campaign_rev}` (`rev`: the leader key's
//!    create revision, the leadership's identity; `campaign_rev`: the response header's
//!    revision, at which the server proved the key oldest);
//! 3. 1-3 `proclaim {name, key, rev, lease, value}` with fresh unique values, a few tens of ms
//!    apart (`ok` proves leadership at that point; `fail` with `failed-precondition` is the
//!    server's "not leader");
//! 4. sometimes a `leader {name}` query;
//! 5. `resign {name, key, rev, lease}`, then `lease_revoke`.
//!
//! An observer alternates `leader {name}` queries (-> ok `{key, rev, mod_rev, value, lease}` or
//! `{none: true}`) and `observe {name}` sessions of 2-5 s: one operation whose `ok` lists every
//! leader response received in order (`items`: `{key, rev, mod_rev, value, lease, header_rev}`)
//! and how the session ended (`ended`: `deadline`, `closed`, or `error` with the message).
//! Observations are reads: a session that could not start is `fail`.
//!
//! With the `pause` nemesis, leases expire while nodes are stopped: campaigners then find
//! their proclaims refused, which is what the checker's "only the current leader proclaims"
//! rule looks at. The checker is [`crate::checker::election`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, LeaderKey, ProclaimOptions, ResignOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::leases;
use super::{
    connect, max_iterations, worker_seed, OpCounts, Recorder, WorkerEnv, WorkloadError,
    WorkloadOptions,
};
use crate::client;
use crate::cluster::NodeInfo;
use crate::nemesis::between;

/// Every election name lives under this prefix.
pub const PREFIX: &str = "jepsen/election/";
/// Election names: two, so campaigns contend but not all on one name.
pub const NAMES: usize = 2;

/// Bound on one `Campaign` call, which waits while someone else leads. Holds are short (well
/// under a second), so a few seconds is a long queue; 15 s also rides out a leader paused past
/// its lease TTL (pauses last up to 6 s, the TTL is 2 s). A campaign cut off here is `info` (it
/// may still win later; its lease is revoked right after, which ends such a leadership).
const CAMPAIGN_TIMEOUT: Duration = Duration::from_secs(15);
/// One keep-alive round trip; see the lock workload.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between a leader's proclaims.
const PROCLAIM_GAP: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(80));
/// Length of one observe session.
const SESSION: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(5));
/// Upper bound on the responses one session collects (a backstop: a leader changes at most a
/// few times a second here).
const MAX_SESSION_ITEMS: usize = 10_000;

pub struct ElectionWorkload {
    opts: WorkloadOptions,
    next_value: Arc<AtomicU64>,
}

impl ElectionWorkload {
    pub fn new(opts: WorkloadOptions) -> Self {
        ElectionWorkload { opts, next_value: Arc::default() }
    }

    pub fn spawn_workers(
        &self,
        set: &mut JoinSet<Result<OpCounts, WorkloadError>>,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        seed: u64,
    ) {
        let (n, workers) = (nodes.len().max(1), self.opts.workers);
        for w in 0..workers {
            let node = nodes[w % n].clone();
            let (opts, env, seed) = (self.opts.clone(), env.clone(), worker_seed(seed, w));
            // Workers go round the nodes; every third round observes, so each node has
            // observers as well as campaigners (with fewer workers, the last one observes).
            let observes = (w / n) % 3 == 2 || (workers < 3 * n && w > 0 && w == workers - 1);
            if observes {
                set.spawn(observer(node, opts, env, seed));
            } else {
                set.spawn(campaigner(node, opts, env, seed, self.next_value.clone()));
            }
        }
    }

    /// Nothing to read after healing: the checker works from the operations alone.
    pub async fn final_phase(
        &self,
        _nodes: &[NodeInfo],
        _env: &WorkerEnv,
        _op_timeout: Duration,
    ) -> Result<(OpCounts, Vec<String>), WorkloadError> {
        Ok((OpCounts::default(), Vec::new()))
    }
}

fn name(rng: &mut StdRng) -> String {
    format!("{PREFIX}{}", rng.random_range(0..NAMES))
}

fn leader_json(name: &str, l: &LeaderKey) -> Value {
    json!({
        "name": name,
        "key": String::from_utf8_lossy(l.key()),
        "rev": l.rev(),
        "lease": l.lease(),
    })
}

async fn campaigner(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    seed: u64,
    next_value: Arc<AtomicU64>,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let t = opts.op_timeout;
    let mut c = connect(&node, t).await?;
    // `Campaign` waits; it gets a client with a longer per-request bound.
    let mut slow = connect(&node, CAMPAIGN_TIMEOUT).await?;
    // Keep-alives on their own connection, so a hung request does not hold them back.
    let ka_client = connect(&node, t).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    let value = || format!("v{}", next_value.fetch_add(1, Ordering::Relaxed));
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        let name = name(&mut rng);
        let Some(lease) = leases::grant(&mut rec, &mut c, opts.lease_ttl, t).await? else {
            continue;
        };
        let ka = leases::keep_alive(ka_client.clone(), lease, opts.lease_ttl, KEEPALIVE_TIMEOUT);
        let v = value();
        let args = json!({ "name": name, "lease": lease, "value": v });
        rec.invoke("campaign", Some(&name), args.clone())?;
        let leader = match client::bounded(
            CAMPAIGN_TIMEOUT,
            slow.campaign(name.as_str(), v.as_str(), lease),
        )
        .await
        {
            Ok(r) => match r.leader() {
                Some(l) => {
                    let mut out = leader_json(&name, l);
                    out["value"] = json!(v);
                    out["campaign_rev"] = json!(r.header().map(|h| h.revision()));
                    rec.ok("campaign", Some(&name), out, client::header(r.header()))?;
                    l.clone()
                }
                None => {
                    // An answer without a leader key: the server broke the protocol. Recorded as
                    // unknown (it may have made us leader), not as a success.
                    rec.info("campaign", Some(&name), args, "protocol", "no leader key")?;
                    ka.abort();
                    revoke(&mut rec, &mut c, lease, t).await?;
                    continue;
                }
            },
            Err(e) => {
                rec.error("campaign", Some(&name), args, &e, false)?;
                ka.abort();
                revoke(&mut rec, &mut c, lease, t).await?;
                continue;
            }
        };
        for _ in 0..rng.random_range(1..=3) {
            tokio::time::sleep(between(&mut rng, PROCLAIM_GAP.0, PROCLAIM_GAP.1)).await;
            let mut args = leader_json(&name, &leader);
            args["value"] = json!(value());
            rec.invoke("proclaim", Some(&name), args.clone())?;
            let o = ProclaimOptions::new().with_leader(leader.clone());
            let val = args["value"].as_str().unwrap_or_default().to_string();
            match client::bounded(t, c.proclaim(val, Some(o))).await {
                Ok(r) => rec.ok("proclaim", Some(&name), args, client::header(r.header()))?,
                Err(e) => {
                    rec.error("proclaim", Some(&name), args, &e, false)?;
                }
            }
        }
        if rng.random_range(0..100) < 30 {
            leader_query(&mut rec, &mut c, &name, t).await?;
        }
        let args = leader_json(&name, &leader);
        rec.invoke("resign", Some(&name), args.clone())?;
        let o = ResignOptions::new().with_leader(leader.clone());
        match client::bounded(t, c.resign(Some(o))).await {
            Ok(r) => rec.ok("resign", Some(&name), args, client::header(r.header()))?,
            Err(e) => {
                rec.error("resign", Some(&name), args, &e, false)?;
            }
        }
        ka.abort();
        revoke(&mut rec, &mut c, lease, t).await?;
    }
    Ok(rec.counts)
}

/// Revokes a lease (cleanup after each cycle; also ends a campaign cut off by its timeout).
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

/// `leader {name}`: the current leader's key-value, or `{none: true}` when there is none.
async fn leader_query(
    rec: &mut Recorder,
    c: &mut Client,
    name: &str,
    t: Duration,
) -> Result<(), WorkloadError> {
    let args = json!({ "name": name });
    rec.invoke("leader", Some(name), args.clone())?;
    match client::bounded(t, c.leader(name)).await {
        Ok(r) => {
            let v = match r.kv() {
                Some(kv) => json!({
                    "name": name,
                    "key": String::from_utf8_lossy(kv.key()),
                    "rev": kv.create_revision(),
                    "mod_rev": kv.mod_revision(),
                    "value": String::from_utf8_lossy(kv.value()),
                    "lease": kv.lease(),
                }),
                None => json!({ "name": name, "none": true }),
            };
            rec.ok("leader", Some(name), v, client::header(r.header()))
        }
        Err(e) => {
            // etcd answers "election: no leader" as an error: an answer, recorded as such.
            let msg = e.to_string();
            if msg.contains("no leader") {
                let v = json!({ "name": name, "none": true });
                return rec.ok("leader", Some(name), v, None);
            }
            rec.error("leader", Some(name), args, &e, true).map(|_| ())
        }
    }
}

async fn observer(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let t = opts.op_timeout;
    let mut c = connect(&node, t).await?;
    // Sessions last longer than one operation timeout; they get their own client.
    let mut long = connect(&node, SESSION.1 + t).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        let name = name(&mut rng);
        if rng.random_range(0..100) < 40 {
            leader_query(&mut rec, &mut c, &name, t).await?;
            continue;
        }
        let session = between(&mut rng, SESSION.0, SESSION.1);
        observe(&mut rec, &mut long, &name, session, t).await?;
    }
    Ok(rec.counts)
}

/// One observe session of `length` (never past the workload's deadline).
async fn observe(
    rec: &mut Recorder,
    c: &mut Client,
    name: &str,
    length: Duration,
    t: Duration,
) -> Result<(), WorkloadError> {
    let args = json!({ "name": name });
    rec.invoke("observe", Some(name), args.clone())?;
    let mut stream = match client::bounded(t, c.observe(name)).await {
        Ok(s) => s,
        Err(e) => return rec.error("observe", Some(name), args, &e, true).map(|_| ()),
    };
    let end = tokio::time::Instant::now() + length;
    let end =
        end.min(tokio::time::Instant::from_std(rec.env.deadline).max(tokio::time::Instant::now()));
    let mut items = Vec::new();
    let mut ended = json!("deadline");
    while items.len() < MAX_SESSION_ITEMS {
        match tokio::time::timeout_at(end, stream.message()).await {
            Err(_) => break,
            Ok(Ok(Some(r))) => {
                let header_rev = r.header().map(|h| h.revision());
                if let Some(kv) = r.kv() {
                    items.push(json!({
                        "key": String::from_utf8_lossy(kv.key()),
                        "rev": kv.create_revision(),
                        "mod_rev": kv.mod_revision(),
                        "value": String::from_utf8_lossy(kv.value()),
                        "lease": kv.lease(),
                        "header_rev": header_rev,
                    }));
                }
            }
            Ok(Ok(None)) => {
                ended = json!("closed");
                break;
            }
            Ok(Err(e)) => {
                ended = json!({ "error": e.to_string() });
                break;
            }
        }
    }
    rec.ok("observe", Some(name), json!({ "name": name, "items": items, "ended": ended }), None)
}
