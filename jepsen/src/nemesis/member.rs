//! `member`: remove a node from the cluster and add it back as a new member, so the cluster
//! goes from N to N-1 to N members.
//!
//! Inject: through a surviving member, `MemberList` (the target's member id, found by its peer
//! URL), `MemberRemove`, then SIGKILL the target (a removed member stops by itself too; killing
//! it at once keeps its exit out of the "crashed on its own" list) and wipe its data directory.
//! Heal: through a surviving member, `MemberAdd` with the target's peer URL (unless a member
//! with that URL already exists: an earlier attempt whose answer was lost), then start the
//! target with `--initial-cluster-state existing` and an `--initial-cluster` built from the
//! membership `MemberAdd` returned, as an operator adding a member to etcd does. The node comes
//! back with a **new member id**; the cluster records it (`Faults::rejoin`), so leader discovery
//! and the end-of-run checks know the node by its new id.
//!
//! A removal whose answer is an error while the member list read right after still shows the
//! member is **unsure**: a proposal whose caller timed out may still commit (in etcd and in
//! Picket alike). The node is left running, the fault is held as usual, and heal lists the
//! members again (bounded by [`Timings::settle`]): gone -> kill, wipe and add back, as after an
//! answered removal; still listed -> the removal did not happen. No new removal starts while
//! one is unsure. (Found in a 600 s `set` long run: the removal of n1 timed out, committed a
//! moment later, n1 shut down as a removed member does, and nothing added it back.)
//!
//! Picket adds every member as a learner and promotes it once it has caught up; etcd 3.4 adds
//! a voter at once. Both refuse a change while the cluster is unhealthy (etcd's strict
//! reconfiguration check wants every remaining voter connected for 5 s), so a failed change is
//! recorded and, for the re-add, retried.

use std::time::{Duration, Instant};

use etcd_client::Client;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

use super::{
    between, FaultContext, FaultError, FaultEvent, FaultFuture, Faults, Injected, Nemesis,
    NodeState,
};
use crate::client;

/// How long the node stays out of the cluster before it is added again: a few seconds of
/// running with N-1 members (and with a leader possibly elected without it).
const OUT_MIN: Duration = Duration::from_secs(4);
const OUT_MAX: Duration = Duration::from_secs(8);

/// How long each step may take. [`Timings::default`] is what runs use; the unit tests shorten
/// the waits that a fake cluster never ends early.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Bound on one membership call. A membership change is one or two Raft commits (Picket's
    /// joint consensus takes two); 10 s covers an election on the way. A call that times out
    /// may still be applied, which is why every decision is re-read from `MemberList`
    /// afterwards.
    pub call: Duration,
    /// Re-add attempts per heal, and the pause between them. Retrying `MemberAdd` is safe
    /// because each attempt first lists the members and reuses a member that already has the
    /// peer URL (an earlier attempt that was applied although its answer was lost), so at most
    /// one member is ever added for the node. etcd refuses the change until the survivors have
    /// been connected for 5 s, hence 15 attempts a second apart.
    pub rejoin_attempts: usize,
    pub rejoin_backoff: Duration,
    /// How long a re-added node may take to serve a linearizable get: it must fetch its id,
    /// catch up (by snapshot when the log it needs was purged) and, in Picket, be promoted.
    /// Past it the heal is still recorded; the runner's end-of-run recovery check reports a
    /// node that never recovers.
    pub ready: Duration,
    pub ready_poll: Duration,
    /// How long heal keeps reading the member list for an unsure removal to show up, counted
    /// from the heal (the fault's hold, 4-8 s, has passed by then). A removal proposed before
    /// the call's 10 s deadline either commits or is discarded at the next leader change; an
    /// election is ~1 s, so 15 s more settles it in every run seen. A removal that lands even
    /// later is not lost silently: its node stops as a removed member, and the runner reports
    /// it as crashed and, at the end, not recovered.
    pub settle: Duration,
    pub settle_poll: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            call: Duration::from_secs(10),
            rejoin_attempts: 15,
            rejoin_backoff: Duration::from_secs(1),
            ready: Duration::from_secs(20),
            ready_poll: Duration::from_millis(300),
            settle: Duration::from_secs(15),
            settle_poll: Duration::from_millis(500),
        }
    }
}

/// Share of faults that remove the current leader (the rest remove a random node).
const LEADER_SHARE: f64 = 0.35;

#[derive(Debug, Default)]
pub struct MemberNemesis {
    /// The node removed and not yet added again.
    removed: Option<usize>,
    /// A removal that may or may not have been applied; heal settles it.
    unsure: Option<Unsure>,
    t: Timings,
}

/// A `MemberRemove` that answered an error while the member was still listed afterwards.
#[derive(Debug, Clone, Copy)]
struct Unsure {
    target: usize,
    id: u64,
}

/// A member as the cluster lists it.
struct Listed {
    id: u64,
    peer_urls: Vec<String>,
}

async fn list(c: &mut Client, t: &Timings) -> Result<Vec<Listed>, String> {
    let r = client::bounded(t.call, c.member_list()).await.map_err(|e| e.to_string())?;
    Ok(r.members()
        .iter()
        .map(|m| Listed { id: m.id(), peer_urls: m.peer_urls().to_vec() })
        .collect())
}

/// A client to a running node other than `except`, trying them in turn.
async fn survivor(env: &dyn Faults, except: usize, t: &Timings) -> Option<(usize, Client)> {
    for i in 0..env.node_count() {
        if i == except || env.node_state(i) != NodeState::Running {
            continue;
        }
        if let Ok(c) = client::connect(&env.client_url(i), t.call).await {
            return Some((i, c));
        }
    }
    None
}

/// `name=peer_url,...` for every listed member, naming members by the node whose peer URL they
/// have (a member added but not started has no name yet, in etcd).
fn initial_cluster(env: &dyn Faults, members: &[Listed]) -> String {
    let mut parts = Vec::new();
    for m in members {
        if let Some(i) = (0..env.node_count()).find(|&i| m.peer_urls.contains(&env.peer_url(i))) {
            parts.push(format!("{}={}", env.node_name(i), env.peer_url(i)));
        }
    }
    parts.join(",")
}

impl MemberNemesis {
    /// A nemesis with other timings (the unit tests' fake cluster).
    pub fn with_timings(t: Timings) -> Self {
        MemberNemesis { t, ..Default::default() }
    }

    async fn remove(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        if self.removed.is_some() || self.unsure.is_some() {
            return Ok(None);
        }
        let running: Vec<usize> =
            (0..env.node_count()).filter(|&i| env.node_state(i) == NodeState::Running).collect();
        if running.len() < 2 || running.len() < env.node_count() {
            // Removing a member while another is down or paused would leave the cluster
            // without a quorum of live members; that is the kill and pause nemeses' business.
            return Ok(None);
        }
        let leader = ctx.leader.filter(|l| running.contains(l));
        let (target, leader_target) = match leader {
            Some(l) if rng.random_bool(LEADER_SHARE) => (l, true),
            _ => (running[rng.random_range(0..running.len())], false),
        };
        let hold = between(rng, OUT_MIN, OUT_MAX);
        let name = env.node_name(target);
        let Some((via, mut c)) = survivor(env, target, &self.t).await else {
            return Ok(Some(skipped(&name, "no surviving member answered")));
        };
        let via_name = env.node_name(via);
        let url = env.peer_url(target);
        let find =
            |members: &[Listed]| members.iter().find(|m| m.peer_urls.contains(&url)).map(|m| m.id);
        let id = match list(&mut c, &self.t).await {
            Ok(m) => find(&m),
            Err(e) => return Ok(Some(skipped(&name, &format!("member list: {e}")))),
        };
        let Some(id) = id else {
            return Ok(Some(skipped(&name, "not in the member list")));
        };
        let removal = client::bounded(self.t.call, c.member_remove(id)).await;
        let outcome = match &removal {
            Ok(_) => "ok".to_string(),
            // The answer is lost or negative: the member list says what happened, if it says
            // the member is gone. If it still lists it (or cannot be read), the removal may be
            // in flight: the node keeps running and heal settles it (see `settle`).
            Err(e) => match list(&mut c, &self.t).await {
                Ok(m) if find(&m).is_none() => format!("applied despite error: {e}"),
                listed => {
                    let seen = match listed {
                        Ok(_) => "still listed".to_string(),
                        Err(e2) => format!("member list: {e2}"),
                    };
                    self.unsure = Some(Unsure { target, id });
                    format!("unsure: member remove: {e}; {seen}")
                }
            },
        };
        if self.unsure.is_none() {
            env.remove(target)?;
            self.removed = Some(target);
        }
        Ok(Some(Injected {
            event: FaultEvent {
                f: "member".to_string(),
                value: json!({
                    "action": "remove",
                    "nodes": [name],
                    "member_id": format!("{id:x}"),
                    "leader": leader_target,
                    "via": via_name,
                    "outcome": outcome,
                    "hold_ms": hold.as_millis() as u64,
                }),
            },
            hold,
        }))
    }

    /// Settles an unsure removal from the member list, read until the member is gone or
    /// [`Timings::settle`] has passed: gone -> the node is taken out (kill, wipe) and recorded
    /// as removed, so [`Self::add_back`] adds it again; still listed -> nothing was removed.
    /// When no list could be read at all, the removal stays unsure for the next heal (and no
    /// new removal starts meanwhile).
    async fn settle(&mut self, env: &mut dyn Faults) -> Result<Option<FaultEvent>, FaultError> {
        let Some(u) = self.unsure else { return Ok(None) };
        let name = env.node_name(u.target);
        let deadline = Instant::now() + self.t.settle;
        let max = (self.t.settle.as_millis() / self.t.settle_poll.as_millis().max(1)) as usize + 1;
        let mut listed = false;
        let mut errors: Vec<String> = Vec::new();
        for _ in 0..max {
            let seen = match survivor(env, u.target, &self.t).await {
                Some((_, mut c)) => list(&mut c, &self.t).await,
                None => Err("no surviving member answered".to_string()),
            };
            match seen {
                Ok(m) if !m.iter().any(|m| m.id == u.id) => {
                    env.remove(u.target)?;
                    self.unsure = None;
                    self.removed = Some(u.target);
                    return Ok(Some(settled(&name, u.id, "applied", &errors)));
                }
                Ok(_) => listed = true,
                Err(e) => errors.push(e),
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(self.t.settle_poll).await;
        }
        if listed {
            self.unsure = None;
            return Ok(Some(settled(&name, u.id, "not-applied", &errors)));
        }
        Ok(Some(settled(&name, u.id, "unknown", &errors)))
    }

    /// One attempt to add `target` again: `Ok((id, detail))` when it was started as member `id`.
    async fn add_once(&self, env: &mut dyn Faults, target: usize) -> Result<(u64, Value), String> {
        let (via, mut c) =
            survivor(env, target, &self.t).await.ok_or("no surviving member answered")?;
        let url = env.peer_url(target);
        let members = list(&mut c, &self.t).await.map_err(|e| format!("member list: {e}"))?;
        let (id, members, how) = match members.iter().find(|m| m.peer_urls.contains(&url)) {
            Some(m) => (
                m.id,
                members
                    .iter()
                    .map(|m| Listed { id: m.id, peer_urls: m.peer_urls.clone() })
                    .collect(),
                "already-listed",
            ),
            None => {
                let r = client::bounded(self.t.call, c.member_add([url.as_str()], None))
                    .await
                    .map_err(|e| format!("member add: {e}"))?;
                let id = r.member().map(|m| m.id()).ok_or("member add: no member in answer")?;
                let listed: Vec<Listed> = r
                    .member_list()
                    .iter()
                    .map(|m| Listed { id: m.id(), peer_urls: m.peer_urls().to_vec() })
                    .collect();
                (id, listed, "added")
            }
        };
        let ids: Vec<String> = members.iter().map(|m| format!("{:x}", m.id)).collect();
        let cluster = initial_cluster(env, &members);
        env.rejoin(target, &cluster, id).map_err(|e| e.to_string())?;
        Ok((
            id,
            json!({"how": how, "via": env.node_name(via), "initial_cluster": cluster,
                   "members": ids}),
        ))
    }

    async fn add_back(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let Some(target) = self.removed else { return Ok(Vec::new()) };
        let name = env.node_name(target);
        let mut errors: Vec<String> = Vec::new();
        for attempt in 1..=self.t.rejoin_attempts {
            match self.add_once(env, target).await {
                Ok((id, mut detail)) => {
                    self.removed = None;
                    let ready = wait_serving(&env.client_url(target), &self.t).await;
                    detail["nodes"] = json!([name]);
                    detail["member_id"] = json!(format!("{id:x}"));
                    detail["attempts"] = json!(attempt);
                    detail["errors"] = json!(errors);
                    detail["ready"] = json!(ready);
                    return Ok(vec![FaultEvent { f: "rejoin".to_string(), value: detail }]);
                }
                Err(e) => errors.push(e),
            }
            tokio::time::sleep(self.t.rejoin_backoff).await;
        }
        // Still removed; the next heal tries again, and the runner reports a node that never
        // came back.
        Ok(vec![FaultEvent {
            f: "rejoin-failed".to_string(),
            value: json!({"nodes": [name], "errors": errors}),
        }])
    }
}

/// Waits (bounded by [`Timings::ready`]) until the node at `url` answers a linearizable get.
/// Returns whether it did; a node that is slow to catch up is not a fault of the nemesis.
async fn wait_serving(url: &str, t: &Timings) -> bool {
    let deadline = Instant::now() + t.ready;
    let max = t.ready.as_millis() / t.ready_poll.as_millis().max(1) + 1;
    for _ in 0..max {
        if let Ok(mut c) = client::connect(url, t.ready_poll * 4).await {
            if client::bounded(t.ready_poll * 4, c.get("picket-jepsen/ready", None)).await.is_ok() {
                return true;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(t.ready_poll).await;
    }
    false
}

/// The heal record of an unsure removal: `applied` (the node was taken out and is added back
/// next), `not-applied`, or `unknown` (no member list could be read; settled at the next heal).
fn settled(name: &str, id: u64, how: &str, errors: &[String]) -> FaultEvent {
    FaultEvent {
        f: "remove-settled".to_string(),
        value: json!({"nodes": [name], "member_id": format!("{id:x}"), "removal": how,
                      "errors": errors}),
    }
}

fn skipped(name: &str, why: &str) -> Injected {
    Injected {
        event: FaultEvent {
            f: "member".to_string(),
            value: json!({"action": "remove", "nodes": [name], "skipped": why}),
        },
        hold: Duration::ZERO,
    }
}

impl Nemesis for MemberNemesis {
    fn name(&self) -> &'static str {
        "member"
    }

    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>> {
        Box::pin(self.remove(env, ctx, rng))
    }

    fn heal<'a>(&'a mut self, env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>> {
        Box::pin(async move {
            let mut events: Vec<FaultEvent> = self.settle(env).await?.into_iter().collect();
            events.extend(self.add_back(env).await?);
            Ok(events)
        })
    }
}

#[cfg(test)]
#[path = "member_tests.rs"]
mod tests;
