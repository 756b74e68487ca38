//! One test run end to end, and the result folder.
//!
//! [`run_test`]: start the cluster, start the workers, run the nemesis schedule (warm-up, one
//! fault every 5-10 s, heal), stop the workers, wait for every node to recover, run the final
//! reads, ask every node for (revision, hash of its KV state), scan node logs for panics, then
//! check the history. [`check_dir`] re-checks a result folder without re-running anything.
//!
//! The folder holds `history.jsonl`, `test.json` (the options, git sha and the command that
//! re-runs the test), `cluster.json` (the end-of-run cluster checks, which cannot be derived from
//! the history), `results.json` (every checker's verdict and anomalies) and `nodes/<name>.log`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use thiserror::Error;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::availability;
use crate::checker::{self, Anomaly, Budget, CheckError, CheckResult, Report, Validity};
use crate::client;
use crate::cluster::{self, ClusterConfig, ClusterError, NodeInfo, ProcessCluster, Target};
use crate::history::{
    pair, read_history, EventDraft, EventType, HistoryError, HistoryWriter, Outcome, Process,
};
use crate::nemesis::{self, between, FaultContext, FaultError, Faults, Nemesis, NodeState};
use crate::netns::Network;
use crate::workload::{self, OpCounts, WorkerEnv, Workload, WorkloadError, WorkloadOptions};

/// How long a fresh cluster may take to serve a linearizable get. Starting a node takes well
/// under a second and an election a few election timeouts; 60 s is ample on a loaded 2-core
/// machine while a wedged cluster still fails the run in bounded time.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the healed cluster may take to serve again on every node (a restarted node must
/// replay its log and catch up). Past it the node is reported as not recovered, an anomaly.
pub const RECOVERY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the nodes may take to agree on (revision, KV hash) after the final reads. With no
/// more writes, followers catch up within a few heartbeats; 30 s covers a slow machine.
const AGREEMENT_TIMEOUT: Duration = Duration::from_secs(30);
const AGREEMENT_POLL: Duration = Duration::from_millis(500);
/// Bound on one node's answer during the agreement check. A serializable read of a few hundred
/// keys takes milliseconds; a node that needs more than 5 s is retried on the next poll, and
/// one that never answers is reported, so the bound cannot hide a disagreement.
const NODE_VIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// Warm-up before the first fault (at most a quarter of the run).
const WARMUP: Duration = Duration::from_secs(5);
/// A fault starts every 5-10 s (spec), and only if at least this much of the run is left.
const FAULT_EVERY_MIN: Duration = Duration::from_secs(5);
const FAULT_EVERY_MAX: Duration = Duration::from_secs(10);
const MIN_FAULT_WINDOW: Duration = Duration::from_secs(3);

/// Extra time workers get past the deadline to finish their last operation: each operation is
/// bounded by the operation timeout, so two of them plus slack means a worker that is still
/// running is stuck (a harness bug), not slow.
const WORKER_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RunError {
    #[error("invalid options: {0}")]
    Options(String),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Fault(#[from] FaultError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The cause is in the message, not a `#[source]`, so reporters do not print it twice.
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    #[error("{what}: {message}")]
    Json { what: String, message: String },
    #[error("workers: {0}")]
    Workers(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |cause| RunError::Io { what, cause }
}

/// Everything that defines a run.
#[derive(Debug, Clone)]
pub struct TestOptions {
    pub workload: String,
    pub nemeses: Vec<String>,
    pub time_limit: Duration,
    pub nodes: usize,
    pub target: Target,
    /// The server binary (`picketd` or `etcd`).
    pub bin: PathBuf,
    pub out: PathBuf,
    pub seed: u64,
    pub rate: f64,
    pub concurrency: usize,
    pub op_timeout: Duration,
    pub ops_per_key: u64,
    /// TTL of the leases the lock and lease workloads grant, in seconds.
    pub lease_ttl: i64,
    pub unsafe_serializable_reads: bool,
    pub keep_data: bool,
    pub node_log_level: Option<String>,
    pub budget: Budget,
    /// The namespaces of network-namespace mode, already entered by the calling thread (see
    /// [`Network::enter_control`]); `None` runs in loopback mode.
    pub network: Option<Arc<Network>>,
    /// Why this mode was chosen, for `test.json` and the output.
    pub mode_note: String,
}

impl TestOptions {
    /// The command line that re-runs this test (same seed, same generator choices; the
    /// interleaving with faults depends on timing and is not reproducible).
    pub fn command(&self) -> String {
        let mut c = format!(
            "picket-jepsen test --workload {} --nemesis {} --time-limit {} --nodes {} --target {} \
             --out {} --seed {} --rate {} --concurrency {} --op-timeout-ms {} --ops-per-key {} \
             --lease-ttl {} --mode {}",
            self.workload,
            if self.nemeses.is_empty() { "none".to_string() } else { self.nemeses.join(",") },
            self.time_limit.as_secs(),
            self.nodes,
            self.target.as_str(),
            self.out.display(),
            self.seed,
            self.rate,
            self.concurrency,
            self.op_timeout.as_millis(),
            self.ops_per_key,
            self.lease_ttl,
            self.mode(),
        );
        if self.unsafe_serializable_reads {
            c.push_str(" --unsafe-serializable-reads");
        }
        c
    }

    /// `netns` or `loopback`.
    pub fn mode(&self) -> &'static str {
        if self.network.is_some() {
            "netns"
        } else {
            "loopback"
        }
    }

    fn validate(&self) -> Result<(), RunError> {
        let bad = |m: &str| Err(RunError::Options(m.to_string()));
        if self.network.is_none() && self.nemeses.iter().any(|n| n == "partition") {
            return Err(RunError::Options(format!(
                "the partition nemesis needs network-namespace mode, but this run is in loopback \
                 mode ({})",
                self.mode_note
            )));
        }
        if !workload::NAMES.contains(&self.workload.as_str()) {
            return Err(RunError::Options(format!(
                "unknown workload {:?} (known: {})",
                self.workload,
                workload::NAMES.join(", ")
            )));
        }
        if self.lease_ttl < 1 {
            return bad("--lease-ttl must be at least 1 second");
        }
        if self.nodes == 0 {
            return bad("--nodes must be at least 1");
        }
        if self.rate.is_nan() || self.rate <= 0.0 {
            return bad("--rate must be positive");
        }
        if self.concurrency == 0 {
            return bad("--concurrency must be at least 1");
        }
        if self.time_limit.is_zero() {
            return bad("--time-limit must be positive");
        }
        if self.ops_per_key == 0 {
            return bad("--ops-per-key must be positive");
        }
        if self.nemeses.iter().any(|n| n == "clock" || n == "clock-rate") {
            if let Some(why) = nemesis::clock::unavailable_reason() {
                return Err(RunError::Options(format!("the clock nemesis cannot run: {why}")));
            }
        }
        if !self.bin.is_file() {
            return Err(RunError::Options(format!(
                "server binary {} does not exist",
                self.bin.display()
            )));
        }
        Ok(())
    }
}

/// `test.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestManifest {
    pub workload: String,
    pub nemesis: Vec<String>,
    pub nodes: usize,
    pub seed: u64,
    pub time_limit_s: u64,
    pub rate: f64,
    pub concurrency: usize,
    pub ops_per_key: u64,
    pub op_timeout_ms: u64,
    #[serde(default)]
    pub lease_ttl_s: i64,
    pub unsafe_serializable_reads: bool,
    pub target: Target,
    pub binary: String,
    pub git_sha: String,
    pub git_dirty: bool,
    /// `loopback` (process faults only) or `netns` (also network faults).
    pub mode: String,
    pub mode_note: String,
    /// Server timing: picketd's and etcd's defaults (the harness passes no timing flags).
    pub ttls: Value,
    pub node_info: Vec<NodeInfo>,
    pub command: String,
}

/// `results.json`: the verdicts plus a summary of what was run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    pub valid: Validity,
    pub checkers: BTreeMap<String, CheckResult>,
    pub summary: Value,
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn write_json(path: &Path, v: &impl Serialize) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| RunError::Json { what: path.display().to_string(), message: e.to_string() })?;
    std::fs::write(path, text + "\n").map_err(io_err(format!("writing {}", path.display())))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, RunError> {
    let text =
        std::fs::read_to_string(path).map_err(io_err(format!("reading {}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| RunError::Json { what: path.display().to_string(), message: e.to_string() })
}

/// Records a nemesis invocation and its `info` completion.
fn record_nemesis(h: &HistoryWriter, f: &str, invoke: Value, done: Value) -> Result<(), RunError> {
    h.record(EventDraft::new(EventType::Invoke, Process::Nemesis, f).value(invoke))?;
    h.record(EventDraft::new(EventType::Info, Process::Nemesis, f).value(done))?;
    Ok(())
}

/// Undoes every active fault and records what was done.
async fn heal_all(
    cluster: &mut ProcessCluster,
    nemeses: &mut [Box<dyn Nemesis>],
    h: &HistoryWriter,
) -> Result<(), RunError> {
    for n in nemeses.iter_mut() {
        let events = n.heal(cluster).await?;
        if events.is_empty() {
            continue;
        }
        let actions: Vec<Value> =
            events.iter().map(|e| json!({"f": e.f, "value": e.value})).collect();
        record_nemesis(
            h,
            "heal",
            json!({"nemesis": n.name()}),
            json!({"nemesis": n.name(), "actions": actions}),
        )?;
    }
    cluster.heal_network()?;
    Ok(())
}

/// The fault schedule; returns the number of faults injected. Heals everything before
/// returning, also when a fault fails.
async fn run_nemesis(
    cluster: &mut ProcessCluster,
    nemeses: &mut [Box<dyn Nemesis>],
    h: &HistoryWriter,
    rng: &mut StdRng,
    time_limit: Duration,
    deadline: Instant,
) -> Result<u64, RunError> {
    let sleep_until = |t: Instant| tokio::time::sleep_until(tokio::time::Instant::from_std(t));
    if nemeses.is_empty() {
        sleep_until(deadline).await;
        return Ok(0);
    }
    sleep_until((Instant::now() + WARMUP.min(time_limit / 4)).min(deadline)).await;
    // Faults end this long before the workload does, so the availability checks have a healed
    // window to judge (see `availability`).
    let fault_deadline = deadline - availability::final_quiet(time_limit);
    let mut injected = 0u64;
    // Bounded in count: one cycle takes at least FAULT_EVERY_MIN.
    let max_cycles = time_limit.as_secs() / FAULT_EVERY_MIN.as_secs() + 2;
    let result: Result<(), RunError> = async {
        for _ in 0..max_cycles {
            let now = Instant::now();
            if fault_deadline.saturating_duration_since(now) < MIN_FAULT_WINDOW {
                break;
            }
            let cycle_end = (now + between(rng, FAULT_EVERY_MIN, FAULT_EVERY_MAX)).min(deadline);
            let k = rng.random_range(0..nemeses.len());
            let leader = cluster.leader().await;
            let ctx = FaultContext { leader };
            let name = nemeses[k].name();
            let leader_name = leader.map(|l| cluster.info(l).name.clone());
            h.record(
                EventDraft::new(EventType::Invoke, Process::Nemesis, name)
                    .value(json!({"leader": leader_name})),
            )?;
            match nemeses[k].inject(cluster, &ctx, rng).await? {
                Some(inj) => {
                    injected += 1;
                    info!(fault = name, value = %inj.event.value, "fault injected");
                    h.record(
                        EventDraft::new(EventType::Info, Process::Nemesis, name)
                            .value(inj.event.value),
                    )?;
                    let until = (Instant::now() + inj.hold).min(fault_deadline);
                    sleep_until(until).await;
                }
                None => {
                    h.record(
                        EventDraft::new(EventType::Info, Process::Nemesis, name)
                            .value(json!({"skipped": "no node to fault"})),
                    )?;
                }
            }
            heal_all(cluster, nemeses, h).await?;
            cluster.reap_unexpected();
            sleep_until(cycle_end).await;
        }
        Ok(())
    }
    .await;
    // Heal even when a fault failed, so the run can still recover and report.
    let healed = heal_all(cluster, nemeses, h).await;
    result?;
    healed?;
    Ok(injected)
}

/// Waits for every worker, at most `grace` past the deadline.
async fn join_workers(
    mut set: JoinSet<Result<OpCounts, WorkloadError>>,
    deadline: Instant,
    grace: Duration,
) -> Result<OpCounts, RunError> {
    let mut total = OpCounts::default();
    let until = tokio::time::Instant::from_std(deadline + grace);
    loop {
        match tokio::time::timeout_at(until, set.join_next()).await {
            Err(_) => {
                set.abort_all();
                return Err(RunError::Workers(format!(
                    "{} workers still running {grace:?} after the time limit",
                    set.len()
                )));
            }
            Ok(None) => return Ok(total),
            Ok(Some(Ok(Ok(c)))) => total.add(c),
            Ok(Some(Ok(Err(e)))) => return Err(e.into()),
            Ok(Some(Err(e))) => return Err(RunError::Workers(format!("a worker failed: {e}"))),
        }
    }
}

/// One node's view of the store, from a serializable read of every key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    /// `header.revision`: the node's current store revision.
    revision: i64,
    /// SHA-256 (first 8 bytes, hex) over every key-value with its revisions, version and lease.
    hash: String,
    keys: usize,
}

async fn node_view(url: &str) -> Result<NodeView, String> {
    let mut c = client::connect(url, NODE_VIEW_TIMEOUT).await.map_err(|e| e.to_string())?;
    let opts = GetOptions::new().with_all_keys().with_serializable();
    let resp = client::bounded(NODE_VIEW_TIMEOUT, c.get("", Some(opts)))
        .await
        .map_err(|e| e.to_string())?;
    let revision = resp.header().map(|h| h.revision()).ok_or("response without a header")?;
    let mut hasher = Sha256::new();
    for kv in resp.kvs() {
        for part in [kv.key(), kv.value()] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        for n in [kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()] {
            hasher.update(n.to_le_bytes());
        }
    }
    let hash: String = hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(NodeView { revision, hash, keys: resp.kvs().len() })
}

/// What [`agreement`] found.
pub(crate) struct Agreement {
    anomalies: Vec<Anomaly>,
    notes: Vec<String>,
    /// Each node's last answer, for `cluster.json`.
    view: Value,
}

/// Asks every running node for (revision, KV hash) until all agree, for at most
/// [`AGREEMENT_TIMEOUT`]. Serializable reads, so each node answers from its own state.
async fn agreement(cluster: &ProcessCluster) -> Agreement {
    let deadline = Instant::now() + AGREEMENT_TIMEOUT;
    let max_attempts = AGREEMENT_TIMEOUT.as_millis() / AGREEMENT_POLL.as_millis() + 1;
    let mut last: Vec<(String, Result<NodeView, String>)> = Vec::new();
    for _ in 0..max_attempts {
        last.clear();
        for i in 0..cluster.len() {
            if cluster.state(i) != NodeState::Running {
                continue;
            }
            let info = cluster.info(i);
            last.push((info.name.clone(), node_view(&info.client_url).await));
        }
        let answers: Vec<&NodeView> = last.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
        if (answers.len() == last.len() && !disagree(&answers)) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(AGREEMENT_POLL).await;
    }
    judge_agreement(&last)
}

/// Whether any two answering nodes report a different (revision, KV hash).
fn disagree(answers: &[&NodeView]) -> bool {
    answers.windows(2).any(|w| w[0].revision != w[1].revision || w[0].hash != w[1].hash)
}

/// The verdict on the nodes' last answers: disagreeing (revision, KV hash) pairs are an anomaly;
/// nodes that did not answer are noted.
fn judge_agreement(last: &[(String, Result<NodeView, String>)]) -> Agreement {
    let view: serde_json::Map<String, Value> = last
        .iter()
        .map(|(n, r)| {
            let v = match r {
                Ok(v) => json!({"revision": v.revision, "hash": v.hash, "keys": v.keys}),
                Err(e) => json!({"error": e}),
            };
            (n.clone(), v)
        })
        .collect();
    let view = Value::Object(view);
    let answers: Vec<&NodeView> = last.iter().filter_map(|(_, r)| r.as_ref().ok()).collect();
    let mut anomalies = Vec::new();
    if disagree(&answers) {
        anomalies.push(Anomaly::new(
            "nodes-disagree",
            None,
            format!(
                "after healing, the nodes still disagree on (revision, KV hash) after \
                 {AGREEMENT_TIMEOUT:?}: {view}"
            ),
            Vec::new(),
        ));
    }
    let notes = last
        .iter()
        .filter_map(|(n, r)| {
            r.as_ref().err().map(|e| format!("node {n} did not report its state: {e}"))
        })
        .collect();
    Agreement { anomalies, notes, view }
}

/// Lines of node logs that show a crash: Rust panics, Go panics and fatal errors.
pub(crate) fn scan_logs(nodes: &[NodeInfo]) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for n in nodes {
        let Ok(text) = std::fs::read_to_string(&n.log) else { continue };
        let hits: Vec<&str> = text
            .lines()
            .filter(|l| {
                let t = l.trim_start();
                l.contains("panicked at")
                    || t.starts_with("panic:")
                    || t.starts_with("fatal error:")
            })
            .take(5)
            .collect();
        if !hits.is_empty() {
            out.push(Anomaly::new(
                "node-panic",
                None,
                format!("node {} logged a crash: {}", n.name, hits.join(" | ")),
                Vec::new(),
            ));
        }
    }
    out
}

/// What picketd logs when a member installs a snapshot sent by the leader
/// (`storage/state_machine.rs`, `install_snapshot`).
pub(crate) const SNAPSHOT_INSTALL_LINE: &str = "installing snapshot";

/// How many snapshot installs each node logged (every node is listed, zeros included).
pub(crate) fn count_snapshot_installs(nodes: &[NodeInfo]) -> BTreeMap<String, usize> {
    nodes
        .iter()
        .map(|n| {
            let text = std::fs::read_to_string(&n.log).unwrap_or_default();
            (n.name.clone(), text.lines().filter(|l| l.contains(SNAPSHOT_INSTALL_LINE)).count())
        })
        .collect()
}

/// Counts and facts derived from a history, for `results.json`.
fn summarize(events: &[crate::history::Event]) -> Result<Value, RunError> {
    let ops = pair(events)?;
    let mut by_f: BTreeMap<String, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for op in &ops {
        if op.process() == Process::Nemesis {
            if op.f() != "heal" && op.value().get("skipped").is_none() {
                *faults.entry(op.f().to_string()).or_default() += 1;
            }
            continue;
        }
        let outcome = match op.outcome() {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "pending",
        };
        *by_f.entry(op.f().to_string()).or_default().entry(outcome).or_default() += 1;
    }
    let duration_s = events.last().map(|e| e.time as f64 / 1e9).unwrap_or(0.0);
    Ok(json!({
        "events": events.len(),
        "client_ops": ops.iter().filter(|o| o.process() != Process::Nemesis).count(),
        "ops": by_f,
        "faults": faults,
        "history_duration_s": duration_s,
    }))
}

/// Re-checks a result folder: reads `test.json`, `history.jsonl` and `cluster.json` (when
/// present) and writes `results.json`.
pub fn check_dir(dir: &Path, budget: &Budget) -> Result<Results, RunError> {
    let manifest: Option<TestManifest> = read_json(&dir.join("test.json")).ok();
    let workload = manifest.as_ref().map(|m| m.workload.clone()).unwrap_or("register".into());
    let events = read_history(&dir.join("history.jsonl"))?;
    let report = checker::check_history(&workload, &events, budget)?;
    let mut checkers = report.checkers;
    let cluster_path = dir.join("cluster.json");
    if cluster_path.exists() {
        let c: CheckResult = read_json(&cluster_path)?;
        checkers.insert("cluster".to_string(), c);
    }
    let report = Report::new(checkers);
    let mut summary = summarize(&events)?;
    if let Some(m) = &manifest {
        summary["command"] = json!(m.command);
        summary["mode"] = json!(m.mode);
    }
    let results = Results { valid: report.valid, checkers: report.checkers, summary };
    write_json(&dir.join("results.json"), &results)?;
    let title = match &manifest {
        Some(m) => format!("{} / {} / {}", m.workload, m.nemesis.join(","), m.target.as_str()),
        None => workload.clone(),
    };
    let html = crate::report::render(&title, &events, &pair(&events)?, &results);
    let path = dir.join("report.html");
    std::fs::write(&path, html).map_err(io_err(format!("writing {}", path.display())))?;
    Ok(results)
}

/// Runs one test and checks it. Returns the results (also written to `results.json`); an `Err`
/// is a harness failure (exit status 3), never a verdict.
pub async fn run_test(opts: TestOptions) -> Result<Results, RunError> {
    opts.validate()?;
    std::fs::create_dir_all(&opts.out)
        .map_err(io_err(format!("creating {}", opts.out.display())))?;
    let mut nemeses = nemesis::build(&opts.nemeses, &opts.workload)?;
    let extra_args = nemesis::merge_node_args(&nemeses);
    let mut cluster = ProcessCluster::create(ClusterConfig {
        target: opts.target,
        bin: opts.bin.clone(),
        nodes: opts.nodes,
        out: opts.out.clone(),
        log_level: opts.node_log_level.clone(),
        extra_args,
        network: opts.network.clone(),
    })?;
    let sha = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    let manifest = TestManifest {
        workload: opts.workload.clone(),
        nemesis: opts.nemeses.clone(),
        nodes: opts.nodes,
        seed: opts.seed,
        time_limit_s: opts.time_limit.as_secs(),
        rate: opts.rate,
        concurrency: opts.concurrency,
        ops_per_key: opts.ops_per_key,
        op_timeout_ms: opts.op_timeout.as_millis() as u64,
        lease_ttl_s: opts.lease_ttl,
        unsafe_serializable_reads: opts.unsafe_serializable_reads,
        target: opts.target,
        binary: opts.bin.display().to_string(),
        git_sha: sha,
        git_dirty: dirty,
        mode: cluster.mode().to_string(),
        mode_note: opts.mode_note.clone(),
        ttls: json!({"heartbeat_ms": 100, "election_timeout_ms": 1000,
                     "lease_ttl_s": opts.lease_ttl}),
        node_info: cluster.infos(),
        command: opts.command(),
    };
    write_json(&opts.out.join("test.json"), &manifest)?;
    info!(mode = cluster.mode(), note = %opts.mode_note, "cluster mode");

    info!(nodes = opts.nodes, target = opts.target.as_str(), "phase: starting the cluster");
    cluster.spawn_all()?;
    cluster.wait_all_ready(READY_TIMEOUT).await?;

    let history = Arc::new(HistoryWriter::create(&opts.out.join("history.jsonl"))?);
    let deadline = Instant::now() + opts.time_limit;
    let env = WorkerEnv::new(history.clone(), deadline);
    let wopts = WorkloadOptions {
        ops_per_key: opts.ops_per_key,
        op_timeout: opts.op_timeout,
        serializable_reads: opts.unsafe_serializable_reads,
        rate: opts.rate,
        workers: opts.concurrency,
        nodes: opts.nodes,
        lease_ttl: opts.lease_ttl,
    };
    if opts.workload == "queue" && opts.target != crate::cluster::Target::Picket {
        return Err(RunError::Options(
            "the queue workload is Picket-only (picket.v1.Queue has no etcd equivalent)".into(),
        ));
    }
    let workload = match Workload::new(&opts.workload, wopts) {
        // Client stalls (a holder sleeping past its TTL) come with the pause nemesis.
        Some(Workload::Lock(l)) => {
            Workload::Lock(l.with_stalls(opts.nemeses.iter().any(|n| n == "pause")))
        }
        Some(w) => w,
        None => return Err(RunError::Options(format!("unknown workload {}", opts.workload))),
    };
    info!(workers = opts.concurrency, rate = opts.rate, "phase: running the workload");
    let mut workers = JoinSet::new();
    workload.spawn_workers(&mut workers, &cluster.infos(), &env, opts.seed);

    let mut rng = StdRng::seed_from_u64(opts.seed);
    let nemesis_result =
        run_nemesis(&mut cluster, &mut nemeses, &history, &mut rng, opts.time_limit, deadline)
            .await;
    if nemesis_result.is_err() {
        env.stop.store(true, Ordering::Relaxed);
    }
    let counts = join_workers(workers, deadline, opts.op_timeout * 2 + WORKER_GRACE).await?;
    let faults = nemesis_result?;
    info!(?counts, faults, "phase: workload done; waiting for every node to recover");

    let mut anomalies = Vec::new();
    let mut notes = Vec::new();
    cluster.reap_unexpected();
    for (node, status) in cluster.unexpected_exits().to_vec() {
        anomalies.push(Anomaly::new(
            "node-exited",
            None,
            format!("node {node} exited on its own ({status}) during the run"),
            Vec::new(),
        ));
    }
    // Restart crashed nodes so that recovery and agreement cover the whole cluster. A node the
    // `member` nemesis removed and could not add again is not a member: starting it would
    // only fail, so it is left out of recovery, final reads and agreement, and said so.
    for i in 0..cluster.len() {
        match cluster.state(i) {
            NodeState::Down => cluster.spawn(i)?,
            NodeState::Removed => notes.push(format!(
                "node {} was removed from the cluster and could not be added again; the checks \
                 cover the other nodes only",
                cluster.info(i).name
            )),
            NodeState::Running | NodeState::Paused => {}
        }
    }
    if let Err(e) = cluster.wait_all_ready(RECOVERY_TIMEOUT).await {
        warn!(error = %e, "a node did not recover");
        anomalies.push(Anomaly::new(
            "node-not-recovered",
            None,
            format!("after healing: {e}"),
            Vec::new(),
        ));
    }

    info!("phase: availability probes");
    let members: Vec<(String, String)> = (0..cluster.len())
        .filter(|&i| cluster.state(i) == NodeState::Running)
        .map(|i| (cluster.info(i).name.clone(), cluster.info(i).client_url.clone()))
        .collect();
    let probes = availability::probe_members(members).await;
    anomalies.extend(availability::judge_probes(&probes));

    info!("phase: final reads");
    let (final_counts, final_notes) =
        workload.final_phase(&cluster.member_infos(), &env, opts.op_timeout).await?;
    let unread = !final_notes.is_empty();
    notes.extend(final_notes);

    info!("phase: node agreement and log scan");
    cluster.reap_unexpected();
    let agreed = agreement(&cluster).await;
    anomalies.extend(agreed.anomalies);
    notes.extend(agreed.notes);
    cluster.kill_all();
    anomalies.extend(scan_logs(&cluster.infos()));
    let installs = count_snapshot_installs(&cluster.infos());
    // Facts, not doubts: they do not lower the verdict.
    let mut facts = Vec::new();
    if opts.nemeses.iter().any(|n| n == "snapshot-lag")
        && opts.target == Target::Picket
        && installs.values().sum::<usize>() == 0
    {
        facts.push(
            "the snapshot-lag nemesis ran but no member logged a snapshot install: the fault did \
             not exercise catching up by snapshot"
                .to_string(),
        );
    }
    history.flush()?;
    // The last healed window, from the history as written (workload time ends at the limit).
    let ops = pair(&read_history(&opts.out.join("history.jsonl"))?)?;
    let window = availability::window_stats(&ops, opts.time_limit.as_nanos() as u64);
    let (window_anomalies, window_notes) = availability::judge_window(&window);
    anomalies.extend(window_anomalies);
    facts.extend(window_notes);
    if !opts.keep_data {
        cluster.remove_data();
    }

    let mut cluster_check = CheckResult::from_anomalies(anomalies);
    if cluster_check.valid == Validity::Valid && (unread || !notes.is_empty()) {
        cluster_check = cluster_check.at_most_unknown("some nodes or keys could not be checked");
    }
    cluster_check.notes.extend(notes);
    // A window too short to judge does not lower the verdict (the member probes still ran).
    cluster_check.notes.extend(facts);
    cluster_check = cluster_check
        .stat("node_states", agreed.view)
        .stat("faults_injected", faults)
        .stat("worker_ops", serde_json::to_value(counts).unwrap_or(Value::Null))
        .stat("final_reads", serde_json::to_value(final_counts).unwrap_or(Value::Null))
        .stat("availability_probes", availability::probes_view(&probes))
        .stat("healed_window", serde_json::to_value(&window).unwrap_or(Value::Null))
        .stat("snapshot_installs", serde_json::to_value(&installs).unwrap_or(Value::Null));
    write_json(&opts.out.join("cluster.json"), &cluster_check)?;
    drop(cluster);

    info!("phase: checking the history");
    check_dir(&opts.out, &opts.budget)
}

/// Prints a human-readable verdict for a result folder.
pub fn print_results(dir: &Path, r: &Results) {
    for (name, c) in &r.checkers {
        println!("{name:>14}: {:?}", c.valid);
        for a in c.anomalies.iter().take(5) {
            println!("{:>16} {}: {}", "-", a.kind, a.message);
        }
        if c.anomalies.len() > 5 {
            println!("{:>16} ... and {} more (see results.json)", "-", c.anomalies.len() - 5);
        }
        for n in c.notes.iter().take(3) {
            println!("{:>16} note: {n}", "-");
        }
    }
    if let Some(cmd) = r.summary.get("command").and_then(Value::as_str) {
        println!("re-run: {cmd}");
    }
    println!("results: {}", dir.join("results.json").display());
    let verdict = match r.valid {
        Validity::Valid => "valid",
        Validity::Invalid => "INVALID",
        Validity::Unknown => "unknown",
    };
    println!("verdict: {verdict}");
}

/// The log tail of a node, for error messages.
pub fn node_log_tail(info: &NodeInfo) -> String {
    cluster::tail(&info.log, 40)
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
