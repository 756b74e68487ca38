//! The `watch` workload, and the key-event log that other workloads record at the end.
//!
//! Writers put unique values (`p<process>-<seq>`) on a few keys under `jepsen/w/`; one of them
//! also compacts now and then (`compact {revision}`, about 50 revisions behind). Watchers open
//! watch sessions on the prefix from a random start revision: 0 (now), 1, the current revision,
//! a future one, or one below the last compaction; every session asks for progress notifications
//! now and then and lasts 2-5 s or until its stream breaks. A session that broke is resumed from
//! its last event's revision + 1 (`resume_of`). Each session is one `watch` operation whose `ok`
//! completion lists what arrived, in order (`items`: events `{rev, key, type, value,
//! create_rev, lease}` and progress notifications `{progress: revision}`), plus `created_rev`,
//! `canceled`, `compact_revision` and the error that ended it, if any. A watch is a read: what it
//! delivered is a fact even when the stream broke afterwards, so it is `ok`; only a watch that
//! could not be created is `fail`.
//!
//! [`final_log`]: after healing, a sentinel put under the prefix and a watch from a given start
//! until the sentinel's event, so the log is complete up to the sentinel (watch delivery is
//! ordered). Recorded as a `watch` with `log: true`.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType as WatchEventType, WatchOptions, WatchResponse};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use super::{
    connect, final_attempts, max_iterations, worker_seed, OpCounts, Recorder, WorkerEnv,
    WorkloadError, WorkloadOptions,
};
use crate::client;
use crate::cluster::NodeInfo;

/// Every key of the workload lives under this prefix.
pub const PREFIX: &str = "jepsen/w/";
/// Keys written under the prefix.
const KEYS: usize = 8;
/// Bound on collecting a key-event log: replaying a few thousand events takes well under a
/// second; 20 s covers a slow, just-healed cluster. Past it the log is `fail` (a read), and the
/// checkers that need it say `unknown`.
const LOG_TIMEOUT: Duration = Duration::from_secs(20);
/// How often a session asks for a progress notification.
const PROGRESS_EVERY: Duration = Duration::from_millis(700);
/// Compaction cadence and distance behind the current revision.
const COMPACT_EVERY: Duration = Duration::from_secs(6);
const COMPACT_BEHIND: i64 = 50;
/// Sessions last this long (uniform), unless the stream breaks first.
const SESSION: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(5));

pub struct WatchWorkload {
    opts: WorkloadOptions,
    /// The highest header revision any worker has seen.
    current: Arc<AtomicI64>,
    /// The highest revision an `ok` compaction used.
    compacted: Arc<AtomicI64>,
}

/// One watch response as history items.
fn items_of(resp: &WatchResponse, out: &mut Vec<Value>) {
    if resp.events().is_empty() && !resp.created() && !resp.canceled() {
        if let Some(h) = resp.header() {
            out.push(json!({ "progress": h.revision() }));
        }
        return;
    }
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        let (t, value) = match ev.event_type() {
            WatchEventType::Put => ("put", json!(String::from_utf8_lossy(kv.value()))),
            WatchEventType::Delete => ("delete", Value::Null),
        };
        out.push(json!({
            "rev": kv.mod_revision(),
            "key": String::from_utf8_lossy(kv.key()),
            "type": t,
            "value": value,
            "create_rev": kv.create_revision(),
            "lease": kv.lease(),
        }));
    }
}

/// What one watch session saw.
#[derive(Debug, Default)]
struct Session {
    items: Vec<Value>,
    created_rev: Option<i64>,
    canceled: bool,
    compact_revision: i64,
    cancel_reason: String,
    error: Option<String>,
    /// Revision of the last event delivered.
    last: Option<i64>,
}

impl Session {
    fn value(&self, start: i64, resume_of: Option<i64>, extra: Value) -> Value {
        let mut v = json!({
            "prefix": PREFIX,
            "start": start,
            "resume_of": resume_of,
            "created_rev": self.created_rev,
            "items": self.items,
            "canceled": self.canceled,
            "compact_revision": self.compact_revision,
            "error": self.error,
        });
        if !self.cancel_reason.is_empty() {
            v["cancel_reason"] = json!(self.cancel_reason);
        }
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        v
    }

    fn absorb(&mut self, resp: &WatchResponse) {
        if resp.created() && self.created_rev.is_none() {
            self.created_rev = resp.header().map(|h| h.revision());
        }
        if resp.canceled() {
            self.canceled = true;
            self.compact_revision = resp.compact_revision();
            self.cancel_reason = resp.cancel_reason().to_string();
        }
        let before = self.items.len();
        items_of(resp, &mut self.items);
        for it in &self.items[before..] {
            if let Some(r) = it.get("rev").and_then(Value::as_i64) {
                self.last = Some(r);
            }
        }
    }
}

/// Watches `prefix` from `start` (0: now) until `until` (an instant), or until an event at or
/// past `stop_at_rev` arrived, asking for progress every [`PROGRESS_EVERY`]. Errors end the
/// session and are recorded in it. `Err` only when the watch could not be created.
async fn session(
    c: &mut Client,
    prefix: &str,
    start: i64,
    until: Instant,
    stop_at_rev: Option<i64>,
    connect_timeout: Duration,
) -> Result<Session, client::OpError> {
    let mut opts = WatchOptions::new().with_prefix();
    if start > 0 {
        opts = opts.with_start_revision(start);
    }
    let mut stream = client::bounded(connect_timeout, c.watch(prefix, Some(opts))).await?;
    let mut s = Session::default();
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    let end = tokio::time::Instant::from_std(until);
    // Bounded by `until`; the count bound is a backstop (one iteration per message or tick).
    for _ in 0..1_000_000 {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            _ = tick.tick() => {
                if let Err(e) = stream.request_progress().await {
                    s.error = Some(format!("progress request: {e}"));
                    break;
                }
            }
            m = stream.message() => match m {
                Ok(Some(resp)) => {
                    s.absorb(&resp);
                    if s.canceled {
                        break;
                    }
                    if stop_at_rev.is_some_and(|r| s.last.is_some_and(|l| l >= r)) {
                        break;
                    }
                }
                Ok(None) => {
                    s.error = Some("stream ended".to_string());
                    break;
                }
                Err(e) => {
                    s.error = Some(e.to_string());
                    break;
                }
            }
        }
    }
    Ok(s)
}

/// After healing: puts a sentinel under `prefix`, then records the key-event log of `prefix`
/// from `start` up to the sentinel's revision (a `watch` with `log: true`). A start below the
/// compaction is moved up to the compaction revision the server reports.
pub async fn final_log(
    nodes: &[NodeInfo],
    env: &WorkerEnv,
    op_timeout: Duration,
    prefix: &str,
    start: i64,
) -> Result<(OpCounts, Vec<String>), WorkloadError> {
    let mut counts = OpCounts::default();
    let prefix = prefix.to_string();
    let done = final_attempts(nodes, env, op_timeout, &mut counts, |mut rec, mut c| {
        let prefix = prefix.clone();
        async move {
            let sentinel = format!("{prefix}~end");
            let value = format!("end-{}", rec.process);
            rec.invoke("put", Some(&sentinel), json!({ "value": value }))?;
            let rev =
                match client::bounded(op_timeout, c.put(sentinel.as_str(), value.as_str(), None))
                    .await
                {
                    Ok(r) => {
                        let h = client::header(r.header());
                        let rev = h.map(|h| h.revision).unwrap_or(0);
                        rec.ok("put", Some(&sentinel), json!({"value": value, "mod_rev": rev}), h)?;
                        rev
                    }
                    Err(e) => {
                        rec.error("put", Some(&sentinel), json!({ "value": value }), &e, false)?;
                        return Ok((rec, false));
                    }
                };
            let mut from = start;
            // A compacted start is retried once from the compaction revision the server names.
            for _ in 0..2 {
                let args = json!({"prefix": prefix, "start": from, "log": true, "until": rev});
                rec.invoke("watch", Some(&prefix), args.clone())?;
                let until = Instant::now() + LOG_TIMEOUT;
                match session(&mut c, &prefix, from, until, Some(rev), op_timeout).await {
                    Ok(s) if s.last.is_some_and(|l| l >= rev) => {
                        let v = s.value(from, None, json!({"log": true, "until": rev}));
                        rec.ok("watch", Some(&prefix), v, None)?;
                        return Ok((rec, true));
                    }
                    Ok(s) if s.canceled && s.compact_revision > from => {
                        let v = s.value(from, None, json!({"log": true, "until": rev}));
                        rec.ok("watch", Some(&prefix), v, None)?;
                        from = s.compact_revision;
                    }
                    Ok(s) => {
                        let why = s.error.clone().unwrap_or_else(|| "log incomplete".into());
                        rec.fail("watch", Some(&prefix), args, "incomplete", &why)?;
                        return Ok((rec, false));
                    }
                    Err(e) => {
                        rec.error("watch", Some(&prefix), args, &e, true)?;
                        return Ok((rec, false));
                    }
                }
            }
            Ok((rec, false))
        }
    })
    .await?;
    let notes =
        if done { Vec::new() } else { vec![format!("the key-event log of {prefix} is missing")] };
    Ok((counts, notes))
}

impl WatchWorkload {
    pub fn new(opts: WorkloadOptions) -> Self {
        WatchWorkload { opts, current: Arc::default(), compacted: Arc::default() }
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
            let (opts, env) = (self.opts.clone(), env.clone());
            let (cur, comp) = (self.current.clone(), self.compacted.clone());
            let wseed = worker_seed(seed, w);
            // A third of the workers watch; worker 0 also compacts.
            if w % 3 == 2 {
                set.spawn(watcher(node, opts, env, cur, comp, wseed));
            } else {
                set.spawn(writer(node, opts, env, cur, comp, w == 0, wseed));
            }
        }
    }

    pub async fn final_phase(
        &self,
        nodes: &[NodeInfo],
        env: &WorkerEnv,
        op_timeout: Duration,
    ) -> Result<(OpCounts, Vec<String>), WorkloadError> {
        let start = self.compacted.load(Ordering::Relaxed).max(1);
        final_log(nodes, env, op_timeout, PREFIX, start).await
    }
}

async fn writer(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    current: Arc<AtomicI64>,
    compacted: Arc<AtomicI64>,
    compactor: bool,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = connect(&node, opts.op_timeout).await?;
    let mut rec = Recorder::new(&env, &node.name);
    let gap = opts.mean_gap();
    let mut seq = 0u64;
    let mut next_compact = Instant::now() + COMPACT_EVERY;
    for _ in 0..max_iterations(&env, gap) {
        rec.pace(&mut rng, gap).await;
        if env.should_stop() {
            break;
        }
        if compactor && Instant::now() >= next_compact {
            next_compact = Instant::now() + COMPACT_EVERY;
            let rev = current.load(Ordering::Relaxed) - COMPACT_BEHIND;
            if rev > compacted.load(Ordering::Relaxed) && rev > 1 {
                let args = json!({ "revision": rev });
                rec.invoke("compact", None, args.clone())?;
                match client::bounded(opts.op_timeout, c.compact(rev, None)).await {
                    Ok(r) => {
                        compacted.fetch_max(rev, Ordering::Relaxed);
                        rec.ok("compact", None, args, client::header(r.header()))?;
                    }
                    Err(e) => {
                        rec.error("compact", None, args, &e, false)?;
                    }
                }
                continue;
            }
        }
        seq += 1;
        let key = format!("{PREFIX}{}", rng.random_range(0..KEYS));
        let value = format!("p{}-{seq}", rec.process);
        rec.invoke("put", Some(&key), json!({ "value": value }))?;
        match client::bounded(opts.op_timeout, c.put(key.as_str(), value.as_str(), None)).await {
            Ok(r) => {
                let h = client::header(r.header());
                if let Some(h) = h {
                    current.fetch_max(h.revision, Ordering::Relaxed);
                }
                let v = json!({"value": value, "mod_rev": h.map(|h| h.revision)});
                rec.ok("put", Some(&key), v, h)?;
            }
            Err(e) => {
                rec.error("put", Some(&key), json!({ "value": value }), &e, false)?;
            }
        }
    }
    Ok(rec.counts)
}

async fn watcher(
    node: NodeInfo,
    opts: WorkloadOptions,
    env: WorkerEnv,
    current: Arc<AtomicI64>,
    compacted: Arc<AtomicI64>,
    seed: u64,
) -> Result<OpCounts, WorkloadError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = connect(&node, opts.op_timeout).await?;
    let mut rec = Recorder::new(&env, &node.name);
    // The last event revision of a session that broke, to resume from.
    let mut resume: Option<i64> = None;
    // Bounded by the deadline; each session lasts at least a moment (a failed create sleeps).
    for _ in 0..100_000 {
        if env.should_stop() {
            break;
        }
        let cur = current.load(Ordering::Relaxed);
        let (start, kind) = match resume {
            Some(last) => (last + 1, "resume"),
            None => match rng.random_range(0..5) {
                0 => (0, "now"),
                1 => (1, "first"),
                2 => (cur.max(1), "current"),
                3 => (cur.max(1) + rng.random_range(5..20), "future"),
                _ => {
                    let comp = compacted.load(Ordering::Relaxed);
                    if comp > 2 {
                        (rng.random_range(1..comp), "compacted")
                    } else {
                        (1, "first")
                    }
                }
            },
        };
        let args = json!({"prefix": PREFIX, "start": start, "from": kind, "resume_of": resume});
        rec.invoke("watch", Some(PREFIX), args.clone())?;
        let len = crate::nemesis::between(&mut rng, SESSION.0, SESSION.1);
        let until = (Instant::now() + len).min(env.deadline);
        match session(&mut c, PREFIX, start, until, None, opts.op_timeout).await {
            Ok(s) => {
                let v = s.value(start, resume, json!({ "from": kind }));
                rec.ok("watch", Some(PREFIX), v, None)?;
                resume = match (&s.error, s.canceled) {
                    // A broken stream resumes after the last event it delivered (or where it
                    // started, if it delivered none).
                    (Some(_), false) => {
                        s.last.or(if start == 0 { s.created_rev } else { Some(start - 1) })
                    }
                    _ => None,
                };
                if resume.is_some() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Err(e) => {
                rec.error("watch", Some(PREFIX), args, &e, true)?;
                // Keep the resume point: the next session picks up where the last one stopped.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    Ok(rec.counts)
}
