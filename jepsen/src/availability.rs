//! The availability checks of a run's end: a member that stops accepting writes is a failure,
//! not an "unknown".
//!
//! Two checks, both part of the runner's final cluster checks (`cluster.json`, the `cluster`
//! checker), both invalid on failure:
//!
//! - **Member probes** (`member-unavailable`): after the final heal and the recovery wait, every
//!   member (every running node that is in the membership) must accept a write (a `put` of
//!   `picket-jepsen/avail/<node>` through that node) followed by a linearizable `get` of it
//!   within [`PROBE_BOUND`] (10 s), retried every [`PROBE_RETRY`] inside the bound. A member that
//!   answers reads but not writes (a wedged proposal path) fails here even though it passed the
//!   readiness probe, which is only a get.
//! - **The last healed window** (`unavailable-after-heal`, and `member-unavailable` per node):
//!   the runner leaves the end of every run free of faults ([`final_quiet`]). Client operations
//!   invoked from [`RECOVERY_GRACE`] after the last nemesis event to the end of the workload must
//!   mostly be served: at least [`MIN_SERVED`] (80 %) of them, and at least half of those sent
//!   through any one node. 80 %: a healthy cluster serves all of them once it has recovered,
//!   and a short blip (an election finishing late) costs a few percent. The counts are of
//!   operations, so a node whose clients time out contributes few of them (one per worker per
//!   operation timeout) against the dozens of a healthy node: a 3-node cluster with one wedged
//!   member can still be above 80 % overall (seen in real runs: 92 %), which is why each node
//!   is also judged on its own share (from [`MIN_NODE_OPS`] operations), and why the member
//!   probes exist. Windows with fewer than [`MIN_WINDOW_OPS`] operations are noted, not judged;
//!   a dead cluster still produces one timed-out operation per worker per operation timeout.
//!
//! "Served" means the cluster answered: `ok`, or a definite `fail` that is an answer (a failed
//! comparison, a stale fencing token, `failed-precondition`, ...). Unserved: `info`, a
//! completion missing, or a `fail` whose kind says the request got no answer (timeouts,
//! `unavailable`, connection and transport errors; [`UNANSWERED_KINDS`]). Operations that block
//! by design are left out, since their waiting says nothing about availability: `lock_acquire`
//! and `campaign` wait for the previous holder, `watch` and `observe` are sessions that last
//! until the client ends them, and `claim` long-polls an empty queue.
//!
//! The verdict logic is pure ([`judge_probes`], [`window_stats`], [`judge_window`]) and unit
//! tested with broken inputs in `availability_tests.rs`; [`probe_members`] does the I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::checker::Anomaly;
use crate::client;
use crate::history::{Op, Outcome, Process};

/// How long a member may take to accept a write and serve a linearizable read of it.
pub const PROBE_BOUND: Duration = Duration::from_secs(10);
/// Pause between probe attempts inside the bound: an election takes a few hundred ms.
const PROBE_RETRY: Duration = Duration::from_millis(200);

/// Time after the last nemesis event before the window's operations are judged: a restarted
/// node starts and catches up, an election completes (1-2 s election timeout plus start-up on a
/// loaded 2-core machine).
pub const RECOVERY_GRACE: Duration = Duration::from_secs(3);
/// Fraction of the window's operations that must be served (see the module docs).
pub const MIN_SERVED: f64 = 0.8;
/// Fraction of one node's window operations that must be served.
pub const MIN_SERVED_PER_NODE: f64 = 0.5;
/// Below this many operations the window is not judged.
pub const MIN_WINDOW_OPS: usize = 5;
/// Below this many operations a node's share of the window is not judged. Lower than for the
/// whole window: the clients of a wedged node each spend an operation timeout (4 s) per
/// attempt, so in a window of a few seconds its three workers produce only three to six
/// operations (seen in real runs), while healthy nodes produce dozens.
pub const MIN_NODE_OPS: usize = 3;

/// Error kinds (see `client::classify` and the workloads) that mean "no answer".
pub const UNANSWERED_KINDS: &[&str] = &[
    "timeout",
    "unavailable",
    "deadline-exceeded",
    "connect",
    "transport",
    "io",
    "cancelled",
    "unknown",
    "internal",
    "aborted",
    "data-loss",
    // lock-kv-set: the resource read inside the critical section failed.
    "read",
];

/// Operations that wait by design (see the module docs).
const BLOCKING: &[&str] = &["lock_acquire", "campaign", "watch", "observe", "claim"];

/// The fault-free time at the end of a run: up to 6 s, at most a quarter of the run, so the
/// window after the last heal is long enough to judge (the grace plus a few seconds).
pub fn final_quiet(time_limit: Duration) -> Duration {
    Duration::from_secs(6).min(time_limit / 4)
}

/// A member that accepted the probe's write and read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeOk {
    /// From the first attempt to the read's answer.
    pub elapsed_ms: u64,
    pub attempts: u32,
}

/// One member's probe: accepted, or the last error within the bound.
pub type ProbeResult = (String, Result<ProbeOk, String>);

/// `member-unavailable` for each member that did not accept the probe within the bound.
pub fn judge_probes(probes: &[ProbeResult]) -> Vec<Anomaly> {
    probes
        .iter()
        .filter_map(|(node, r)| {
            let e = r.as_ref().err()?;
            Some(Anomaly::new(
                "member-unavailable",
                None,
                format!(
                    "after the final heal, member {node} did not accept a write and a \
                     linearizable read within {PROBE_BOUND:?}: {e}"
                ),
                Vec::new(),
            ))
        })
        .collect()
}

/// The probes as `cluster.json` shows them.
pub fn probes_view(probes: &[ProbeResult]) -> Value {
    let m: serde_json::Map<String, Value> = probes
        .iter()
        .map(|(n, r)| {
            let v = match r {
                Ok(ok) => json!(ok),
                Err(e) => json!({ "error": e }),
            };
            (n.clone(), v)
        })
        .collect();
    Value::Object(m)
}

/// Served and unserved operations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub served: usize,
    pub unserved: usize,
}

impl Counts {
    fn total(self) -> usize {
        self.served + self.unserved
    }

    fn fraction(self) -> f64 {
        self.served as f64 / self.total().max(1) as f64
    }
}

/// The operations of the last healed window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Window {
    /// History time (ns) of the last nemesis event before the end of the workload, if any.
    pub last_fault_event_ns: Option<u64>,
    /// Operations invoked in `[start_ns, end_ns]` are judged.
    pub start_ns: u64,
    pub end_ns: u64,
    pub all: Counts,
    pub by_node: BTreeMap<String, Counts>,
    /// A few unserved operations, for the report (`describe()` lines).
    pub examples: Vec<String>,
    /// History indexes of the unserved operations' invocations (at most 20).
    pub events: Vec<u64>,
}

/// Whether the cluster answered `op` (see the module docs).
fn served(op: &Op) -> bool {
    match op.outcome() {
        Outcome::Ok => true,
        Outcome::Info | Outcome::Pending => false,
        Outcome::Fail => {
            let kind = op.complete.as_ref().and_then(|c| c.error.as_ref()).map(|e| e.kind());
            !kind.is_some_and(|k| UNANSWERED_KINDS.contains(&k))
        }
    }
}

/// Counts the operations of the window that starts [`RECOVERY_GRACE`] after the last nemesis
/// event at or before `end_ns` (the end of the workload in history time) and ends at `end_ns`.
/// Without any nemesis event the whole workload is the window.
pub fn window_stats(ops: &[Op], end_ns: u64) -> Window {
    let last = ops
        .iter()
        .filter(|o| o.process() == Process::Nemesis)
        .flat_map(|o| std::iter::once(&o.invoke).chain(o.complete.as_ref()))
        .map(|e| e.time)
        .filter(|&t| t <= end_ns)
        .max();
    let start_ns = last.map_or(0, |t| t + RECOVERY_GRACE.as_nanos() as u64);
    let mut w = Window {
        last_fault_event_ns: last,
        start_ns,
        end_ns,
        all: Counts::default(),
        by_node: BTreeMap::new(),
        examples: Vec::new(),
        events: Vec::new(),
    };
    for op in ops {
        if op.process() == Process::Nemesis || BLOCKING.contains(&op.f()) {
            continue;
        }
        let t = op.invoke.time;
        if t < start_ns || t > end_ns {
            continue;
        }
        let ok = served(op);
        let node = op.invoke.node.clone().unwrap_or_else(|| "?".to_string());
        let c = w.by_node.entry(node).or_default();
        if ok {
            c.served += 1;
            w.all.served += 1;
        } else {
            c.unserved += 1;
            w.all.unserved += 1;
            if w.examples.len() < 5 {
                w.examples.push(op.describe());
            }
            if w.events.len() < 20 {
                w.events.push(op.invoke.index);
            }
        }
    }
    w
}

/// The verdict on the window: anomalies, and notes for what could not be judged.
pub fn judge_window(w: &Window) -> (Vec<Anomaly>, Vec<String>) {
    let mut anomalies = Vec::new();
    let mut notes = Vec::new();
    let secs = |ns: u64| ns as f64 / 1e9;
    if w.start_ns >= w.end_ns {
        notes.push(format!(
            "no healed window to judge: the last nemesis event was at {:.1} s and the workload \
             ended at {:.1} s (the window starts {RECOVERY_GRACE:?} after it)",
            secs(w.last_fault_event_ns.unwrap_or(0)),
            secs(w.end_ns)
        ));
        return (anomalies, notes);
    }
    if w.all.total() < MIN_WINDOW_OPS {
        notes.push(format!(
            "the healed window {:.1}-{:.1} s held only {} operations; not judged",
            secs(w.start_ns),
            secs(w.end_ns),
            w.all.total()
        ));
        return (anomalies, notes);
    }
    if w.all.fraction() < MIN_SERVED {
        anomalies.push(
            Anomaly::new(
                "unavailable-after-heal",
                None,
                format!(
                    "in the healed window {:.1}-{:.1} s only {} of {} client operations were \
                     served ({:.0} %, below {:.0} %); e.g. {}",
                    secs(w.start_ns),
                    secs(w.end_ns),
                    w.all.served,
                    w.all.total(),
                    100.0 * w.all.fraction(),
                    100.0 * MIN_SERVED,
                    w.examples.first().map_or("-", String::as_str)
                ),
                w.events.clone(),
            )
            .with_detail(json!({ "by_node": w.by_node, "examples": w.examples })),
        );
    }
    for (node, c) in &w.by_node {
        if c.total() >= MIN_NODE_OPS && c.fraction() < MIN_SERVED_PER_NODE {
            anomalies.push(Anomaly::new(
                "member-unavailable",
                None,
                format!(
                    "in the healed window {:.1}-{:.1} s, member {node} served only {} of the {} \
                     client operations sent to it",
                    secs(w.start_ns),
                    secs(w.end_ns),
                    c.served,
                    c.total()
                ),
                Vec::new(),
            ));
        }
    }
    (anomalies, notes)
}

/// One probe: a put then a linearizable get through `url`, retried until one pair succeeds or
/// [`PROBE_BOUND`] has passed.
async fn probe(node: String, url: String) -> ProbeResult {
    let start = Instant::now();
    let deadline = start + PROBE_BOUND;
    let key = format!("picket-jepsen/avail/{node}");
    let mut last_error = "no attempt made".to_string();
    // Bounded by the deadline, and in count: each attempt takes at least PROBE_RETRY.
    let max_attempts = (PROBE_BOUND.as_millis() / PROBE_RETRY.as_millis()) as u32 + 1;
    for attempt in 1..=max_attempts {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let result = async {
            let mut c = client::connect(&url, left).await.map_err(|e| e.to_string())?;
            let value = format!("probe-{attempt}");
            client::bounded(left, c.put(key.as_str(), value.as_str(), None))
                .await
                .map_err(|e| format!("put: {e}"))?;
            let left = deadline.saturating_duration_since(Instant::now());
            let r = client::bounded(left, c.get(key.as_str(), None))
                .await
                .map_err(|e| format!("linearizable get: {e}"))?;
            match r.kvs().first() {
                Some(kv) if kv.value() == value.as_bytes() => Ok(()),
                other => Err(format!(
                    "linearizable get after the put read {:?}, not {value:?}",
                    other.map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                )),
            }
        }
        .await;
        match result {
            Ok(()) => {
                let elapsed_ms = start.elapsed().as_millis() as u64;
                return (node, Ok(ProbeOk { elapsed_ms, attempts: attempt }));
            }
            Err(e) => last_error = e,
        }
        tokio::time::sleep(PROBE_RETRY.min(deadline.saturating_duration_since(Instant::now())))
            .await;
    }
    (node, Err(format!("last error: {last_error}")))
}

/// Probes every `(name, client URL)` at once; results in the order given.
pub async fn probe_members(members: Vec<(String, String)>) -> Vec<ProbeResult> {
    let mut set = JoinSet::new();
    let order: Vec<String> = members.iter().map(|(n, _)| n.clone()).collect();
    for (name, url) in members {
        set.spawn(probe(name, url));
    }
    let mut out = Vec::new();
    // Every probe ends by its own deadline; the outer bound only guards against a harness bug.
    let until = tokio::time::Instant::now() + PROBE_BOUND * 2;
    while let Ok(Some(joined)) = tokio::time::timeout_at(until, set.join_next()).await {
        match joined {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!(error = %e, "an availability probe task failed"),
        }
    }
    set.abort_all();
    for name in &order {
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name.clone(), Err("the probe did not finish".to_string())));
        }
    }
    out.sort_by_key(|(n, _)| order.iter().position(|o| o == n));
    out
}

#[cfg(test)]
#[path = "availability_tests.rs"]
mod tests;
