//! `admin`: the operations an operator runs on a live cluster, one per fault:
//!
//! - `compact` (35 %): the KV `Compact` RPC to a recent revision (0-20 behind the current one,
//!   physical half of the time), through a random node. Only for workloads whose checkers do
//!   not need the key-event log from revision 1 ([`compaction_allowed`]); the watch checker
//!   reads the nemesis's compactions from the history (`admin` events with `action: compact`),
//!   so watches started below them must be refused with `compact_revision`.
//! - `move-leader` (30 %): `Maintenance.MoveLeader` from the leader to a random follower.
//! - `defragment` (20 %): `Maintenance.Defragment` on a random node.
//! - `snapshot` (15 %): `Maintenance.Snapshot` streamed (and discarded) from a random node.
//!
//! Snapshots and log purges also happen on their own: with this nemesis every node runs with
//! `--snapshot-count 200` (picketd and etcd both take it), so at the harness's default rate a
//! node snapshots and purges its log every few seconds, and a node that falls behind (or one
//! the `member` nemesis added again) catches up by snapshot installation.
//!
//! Every action is recorded with its outcome (`ok`, `fail` with the error, or `info` for an
//! unknown outcome); nothing needs healing.

use std::time::Duration;

use etcd_client::CompactionOptions;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use super::{
    FaultContext, FaultError, FaultEvent, FaultFuture, Faults, Injected, Nemesis, NodeState,
};
use crate::client::{self, OpError};
use crate::history::EventType;

/// `--snapshot-count` on every node while this nemesis is on: low enough that snapshots and
/// log purges happen several times in a 30 s run.
pub const SNAPSHOT_COUNT: u64 = 200;

/// Bound on one admin call. Compaction, defragmentation and leader transfer of a small store
/// take milliseconds to a second; a transfer may wait for the target to catch up and for an
/// election. A call past it is recorded with an unknown outcome; nothing is retried.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on streaming a whole snapshot (a few MB at most here).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(20);
/// Snapshot chunks read at most (a backstop; the stream ends or times out long before).
const MAX_CHUNKS: usize = 100_000;

/// How far behind the current revision a compaction goes.
const COMPACT_BEHIND_MAX: i64 = 20;

/// Pause after an action before the next fault (nothing is held).
const HOLD: Duration = Duration::from_secs(1);

/// Whether the admin nemesis may compact under `workload`: not for the lock and lease
/// workloads, whose checkers read the key-event log from revision 1.
pub fn compaction_allowed(workload: &str) -> bool {
    matches!(workload, "register" | "set" | "watch")
}

#[derive(Debug)]
pub struct AdminNemesis {
    compact: bool,
}

impl AdminNemesis {
    pub fn new(compact: bool) -> Self {
        AdminNemesis { compact }
    }
}

/// `{outcome, error?}` for a call's result; `idempotent` calls that failed are `fail`.
fn outcome<T>(r: &Result<T, OpError>, idempotent: bool) -> Value {
    match r {
        Ok(_) => json!({"outcome": "ok"}),
        Err(e) => {
            let (kind, info) = client::classify(e, idempotent);
            let o = if kind == EventType::Fail { "fail" } else { "info" };
            json!({"outcome": o, "error": [info.kind(), info.message()]})
        }
    }
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Some(o), Some(e)) = (a.as_object_mut(), b.as_object()) {
        o.extend(e.clone());
    }
    a
}

async fn compact(env: &dyn Faults, node: usize, rng: &mut StdRng) -> Value {
    let behind = rng.random_range(0..=COMPACT_BEHIND_MAX);
    let physical = rng.random_bool(0.5);
    let mut c = match client::connect(&env.client_url(node), CALL_TIMEOUT).await {
        Ok(c) => c,
        Err(e) => return json!({"outcome": "fail", "error": ["connect", e.to_string()]}),
    };
    // The current revision, from a linearizable read's header.
    let rev = match client::bounded(CALL_TIMEOUT, c.get("picket-jepsen/admin", None)).await {
        Ok(r) => r.header().map(|h| h.revision()).unwrap_or(0),
        Err(e) => return json!({"outcome": "fail", "error": ["get", e.to_string()]}),
    };
    let target = rev - behind;
    if target < 2 {
        return json!({"outcome": "fail", "error": ["skipped", format!("revision {rev} too low")]});
    }
    let opts = physical.then(|| CompactionOptions::new().with_physical());
    let r = client::bounded(CALL_TIMEOUT, c.compact(target, opts)).await;
    merge(json!({"revision": target, "current": rev, "physical": physical}), outcome(&r, false))
}

async fn defragment(env: &dyn Faults, node: usize) -> Value {
    match client::connect(&env.client_url(node), CALL_TIMEOUT).await {
        Ok(mut c) => outcome(&client::bounded(CALL_TIMEOUT, c.defragment()).await, false),
        Err(e) => json!({"outcome": "fail", "error": ["connect", e.to_string()]}),
    }
}

async fn snapshot(env: &dyn Faults, node: usize) -> Value {
    let mut c = match client::connect(&env.client_url(node), SNAPSHOT_TIMEOUT).await {
        Ok(c) => c,
        Err(e) => return json!({"outcome": "fail", "error": ["connect", e.to_string()]}),
    };
    let read = async {
        let mut s = c.snapshot().await?;
        let mut bytes = 0usize;
        for _ in 0..MAX_CHUNKS {
            match s.message().await? {
                Some(m) => bytes += m.blob().len(),
                None => break,
            }
        }
        Ok(bytes)
    };
    let r = client::bounded(SNAPSHOT_TIMEOUT, read).await;
    let bytes = r.as_ref().ok().copied();
    merge(json!({"bytes": bytes}), outcome(&r, true))
}

async fn move_leader(env: &dyn Faults, leader: usize, to: usize) -> Value {
    let Some(id) = env.member_id(to) else {
        return json!({"outcome": "fail", "error": ["skipped", "target member id unknown"]});
    };
    let base = json!({"from": env.node_name(leader), "to": env.node_name(to),
                      "to_id": format!("{id:x}")});
    let r = match client::connect(&env.client_url(leader), CALL_TIMEOUT).await {
        Ok(mut c) => client::bounded(CALL_TIMEOUT, c.move_leader(id)).await,
        Err(e) => {
            return merge(base, json!({"outcome": "fail", "error": ["connect", e.to_string()]}))
        }
    };
    merge(base, outcome(&r, false))
}

impl AdminNemesis {
    async fn act(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        let running: Vec<usize> =
            (0..env.node_count()).filter(|&i| env.node_state(i) == NodeState::Running).collect();
        if running.is_empty() {
            return Ok(None);
        }
        let node = running[rng.random_range(0..running.len())];
        let leader = ctx.leader.filter(|l| running.contains(l));
        let followers: Vec<usize> =
            running.iter().copied().filter(|&i| Some(i) != leader).collect();
        let draw = rng.random_range(0..100);
        let (action, result) = match draw {
            0..35 if self.compact => ("compact", compact(env, node, rng).await),
            0..65 => match (leader, followers.is_empty()) {
                (Some(l), false) => {
                    let to = followers[rng.random_range(0..followers.len())];
                    ("move-leader", move_leader(env, l, to).await)
                }
                _ => ("defragment", defragment(env, node).await),
            },
            65..85 => ("defragment", defragment(env, node).await),
            _ => ("snapshot", snapshot(env, node).await),
        };
        let mut value = merge(json!({"action": action, "nodes": [env.node_name(node)]}), result);
        if action == "move-leader" {
            value["nodes"] = json!([value["to"].clone()]);
        }
        Ok(Some(Injected { event: FaultEvent { f: "admin".to_string(), value }, hold: HOLD }))
    }
}

impl Nemesis for AdminNemesis {
    fn name(&self) -> &'static str {
        "admin"
    }

    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>> {
        Box::pin(self.act(env, ctx, rng))
    }

    fn heal<'a>(&'a mut self, _env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>> {
        Box::pin(std::future::ready(Ok(Vec::new())))
    }

    fn node_args(&self) -> Vec<String> {
        vec!["--snapshot-count".to_string(), SNAPSHOT_COUNT.to_string()]
    }
}
