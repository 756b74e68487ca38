//! [`ProcessCluster`]: N real server processes (`picketd`, or `etcd` started the same way),
//! controlled as processes: spawn, SIGKILL, SIGSTOP/SIGCONT, restart. In loopback mode every node
//! listens on free `127.0.0.1` ports; in network-namespace mode (a [`Network`] is given) node `i`
//! runs inside its own namespace and listens on its own address, ports 2379 and 2380, and the
//! cluster can also cut links between nodes ([`Faults::cut`]).
//!
//! Each node logs (stdout and stderr) to `<out>/nodes/<name>.log` and keeps its data in
//! `<out>/data/<name>`. A restart reuses exactly the same flags and data directory, as an
//! operator restarting etcd would.
//!
//! No process outlives the cluster: `Drop` SIGKILLs every child it started, by its PID, which
//! also runs when the harness panics or its run future is dropped on Ctrl-C. Nodes are also
//! started through `setpriv --pdeathsig KILL` (util-linux, essential on Debian), which gives them
//! a parent-death signal without `unsafe` `pre_exec` (the workspace forbids `unsafe`), so a
//! SIGKILLed harness takes its nodes with it. The signal fires when the *thread* that spawned the
//! node exits; nodes are spawned from the run future, which `block_on` polls on the main thread,
//! so the signal fires only when the process ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tracing::{info, warn};

use picket_procs::child::{open_log, wait_ready, Managed, ProcError, ReadyError, State};

use crate::client;
use crate::nemesis::{FaultError, Faults, NodeState};
use crate::netns::Network;

/// Client and peer ports of every node in network-namespace mode (each node has its own
/// address, so they can all use etcd's well-known ports).
const NETNS_CLIENT_PORT: u16 = 2379;
const NETNS_PEER_PORT: u16 = 2380;

/// Pause between readiness probes: an election takes a few hundred milliseconds, so polling
/// faster would only load the 2-core machine.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Per-attempt timeout of a readiness probe. Short, so a probe against a node that is still
/// electing is retried rather than using up the whole readiness budget in one call.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Per-call timeout when asking a node for cluster status (leader discovery). A node that does
/// not answer in 2 s is treated as not knowing the leader, which only makes a "kill the leader"
/// fault pick a random node instead.
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);

/// Which server the cluster runs. Both take etcd's flag names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Picket,
    Etcd,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Picket => "picket",
            Target::Etcd => "etcd",
        }
    }
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The cause is in the message, not a `#[source]`, so reporters do not print it twice.
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    #[error("node {node} exited ({status}) before serving; log tail:\n{log_tail}")]
    Exited { node: String, status: String, log_tail: String },
    #[error(
        "node {node} did not answer a linearizable get within {waited:?}; last error: {last_error}"
    )]
    NotReady { node: String, waited: Duration, last_error: String },
    #[error(transparent)]
    Proc(#[from] ProcError),
    #[error("reserving loopback ports: {0}")]
    Ports(#[from] picket_procs::ports::PortError),
}

impl ClusterError {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ClusterError::Io { what: what.into(), cause: source }
    }
}

/// Where a node listens and keeps its files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
}

struct Node {
    info: NodeInfo,
    /// The process: started, signalled and stopped by its PID only.
    proc: Managed,
    /// `header.member_id` as last reported by this node (or, after the `member` nemesis added
    /// it again, the id the cluster gave it).
    member_id: Option<u64>,
    /// Removed from the membership by the `member` nemesis and not yet added again.
    removed: bool,
    /// After it was added again: the `--initial-cluster` it joins with (state `existing`).
    join: Option<String>,
    /// Extra environment variables of the process (the `clock` nemesis's libfaketime).
    env: Vec<(String, String)>,
}

/// How to start the cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub target: Target,
    pub bin: PathBuf,
    pub nodes: usize,
    /// The result folder; logs go to `nodes/`, data to `data/`.
    pub out: PathBuf,
    /// `--log-level` for every node (picketd's default when `None`).
    pub log_level: Option<String>,
    /// Further flags, appended verbatim.
    pub extra_args: Vec<String>,
    /// Network-namespace mode when set; loopback mode otherwise.
    pub network: Option<Arc<Network>>,
}

/// A set of real server processes forming one cluster.
pub struct ProcessCluster {
    cfg: ClusterConfig,
    initial_cluster: String,
    nodes: Vec<Node>,
    /// Exits nobody asked for (crashes), noticed by [`ProcessCluster::reap_unexpected`].
    unexpected_exits: Vec<(String, String)>,
}

/// The true wall-clock time in seconds since the epoch, written into the marker line of every
/// node start so that a node's own log timestamps can be compared with it (the `clock` nemesis
/// skews them). The harness is not a replicated state machine, so the crate-wide ban on
/// wall-clock reads (which protects apply) does not apply here.
#[allow(clippy::disallowed_methods)]
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub use picket_procs::logs::tail;

impl ProcessCluster {
    /// Lays out `cfg.nodes` nodes on free loopback ports. Starts nothing.
    pub fn create(cfg: ClusterConfig) -> Result<ProcessCluster, ClusterError> {
        let logs = cfg.out.join("nodes");
        let data = cfg.out.join("data");
        for d in [&logs, &data] {
            std::fs::create_dir_all(d)
                .map_err(|e| ClusterError::io(format!("creating {}", d.display()), e))?;
        }
        let urls: Vec<(String, String)> = match &cfg.network {
            Some(net) => (0..cfg.nodes)
                .map(|i| {
                    let a = net.addr(i);
                    (
                        format!("http://{a}:{NETNS_CLIENT_PORT}"),
                        format!("http://{a}:{NETNS_PEER_PORT}"),
                    )
                })
                .collect(),
            None => {
                let ports = picket_procs::ports::reserve(2 * cfg.nodes)?;
                (0..cfg.nodes)
                    .map(|i| {
                        (
                            format!("http://127.0.0.1:{}", ports[2 * i]),
                            format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                        )
                    })
                    .collect()
            }
        };
        let nodes: Vec<Node> = urls
            .into_iter()
            .enumerate()
            .map(|(i, (client_url, peer_url))| {
                let name = format!("n{}", i + 1);
                Node {
                    proc: Managed::new(name.clone()),
                    info: NodeInfo {
                        client_url,
                        peer_url,
                        data_dir: data.join(&name),
                        log: logs.join(format!("{name}.log")),
                        name,
                    },
                    member_id: None,
                    removed: false,
                    join: None,
                    env: Vec::new(),
                }
            })
            .collect();
        let initial_cluster = nodes
            .iter()
            .map(|n| format!("{}={}", n.info.name, n.info.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        Ok(ProcessCluster { cfg, initial_cluster, nodes, unexpected_exits: Vec::new() })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn info(&self, i: usize) -> &NodeInfo {
        &self.nodes[i].info
    }

    pub fn infos(&self) -> Vec<NodeInfo> {
        self.nodes.iter().map(|n| n.info.clone()).collect()
    }

    /// Nodes that are members of the cluster (every node but one the `member` nemesis removed
    /// and could not add again).
    pub fn member_infos(&self) -> Vec<NodeInfo> {
        self.nodes.iter().filter(|n| !n.removed).map(|n| n.info.clone()).collect()
    }

    pub fn state(&self, i: usize) -> NodeState {
        let n = &self.nodes[i];
        match n.proc.state() {
            State::Down if n.removed => NodeState::Removed,
            State::Down => NodeState::Down,
            State::Paused => NodeState::Paused,
            State::Running => NodeState::Running,
        }
    }

    fn args(&self, i: usize) -> Vec<String> {
        let node = &self.nodes[i];
        let n = &node.info;
        let (cluster, state) = match &node.join {
            Some(c) => (c.clone(), "existing"),
            None => (self.initial_cluster.clone(), "new"),
        };
        let mut a: Vec<String> = [
            ("name", n.name.clone()),
            ("data-dir", n.data_dir.display().to_string()),
            ("listen-client-urls", n.client_url.clone()),
            ("advertise-client-urls", n.client_url.clone()),
            ("listen-peer-urls", n.peer_url.clone()),
            ("initial-advertise-peer-urls", n.peer_url.clone()),
            ("initial-cluster", cluster),
            ("initial-cluster-state", state.to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [format!("--{k}"), v])
        .collect();
        if let Some(l) = &self.cfg.log_level {
            a.push("--log-level".to_string());
            a.push(l.clone());
        }
        a.extend(self.cfg.extra_args.iter().cloned());
        a
    }

    /// Starts node `i`'s process without waiting for it to serve.
    pub fn spawn(&mut self, i: usize) -> Result<(), ClusterError> {
        if self.nodes[i].proc.is_running() {
            return Ok(());
        }
        let argv = self.command_line(i)?;
        let n = &mut self.nodes[i];
        let env_text: Vec<String> = n.env.iter().map(|(k, v)| format!("{k}={v:?} ")).collect();
        let header = format!(
            "=== picket-jepsen: start #{} of {} at unix {:.3}: {}{} ===",
            n.proc.starts() + 1,
            n.info.name,
            unix_now(),
            env_text.concat(),
            argv.join(" ")
        );
        let log = open_log(&n.info.log, &header)?;
        let log2 = log.try_clone().map_err(|e| ClusterError::io("duplicating the log", e))?;
        let mut cmd = Managed::command(&argv[0], log2, log)?;
        cmd.args(&argv[1..]).envs(n.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let pid = n.proc.start(cmd)?;
        info!(node = %n.info.name, pid, start = n.proc.starts(), "spawned node");
        n.removed = false;
        Ok(())
    }

    /// Kills node `i` (if running), wipes its data directory and marks it removed from the
    /// membership.
    pub fn remove(&mut self, i: usize) -> Result<(), ClusterError> {
        if self.nodes[i].proc.is_running() {
            self.kill(i)?;
        }
        let n = &mut self.nodes[i];
        match std::fs::remove_dir_all(&n.info.data_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ClusterError::io(format!("wiping {}", n.info.data_dir.display()), e))
            }
        }
        info!(node = %n.info.name, "removed: data wiped");
        n.removed = true;
        n.member_id = None;
        Ok(())
    }

    /// Starts removed node `i` as a member joining the cluster `initial_cluster`.
    pub fn rejoin(
        &mut self,
        i: usize,
        initial_cluster: &str,
        member_id: u64,
    ) -> Result<(), ClusterError> {
        let n = &mut self.nodes[i];
        n.join = Some(initial_cluster.to_string());
        n.member_id = Some(member_id);
        self.spawn(i)
    }

    /// The command line of node `i`: `[ip netns exec <ns>] <server> <flags>`, started behind
    /// `setpriv --pdeathsig KILL` ([`Managed::command`]). setpriv and `ip netns exec` both exec
    /// the next program, so the child's PID is the server's own and signals sent by PID reach
    /// the server.
    fn command_line(&self, i: usize) -> Result<Vec<String>, ClusterError> {
        let mut argv: Vec<String> = Vec::new();
        if let Some(net) = &self.cfg.network {
            argv.extend(["ip", "netns", "exec", net.node_namespace(i)].map(String::from));
        }
        argv.push(self.cfg.bin.display().to_string());
        argv.extend(self.args(i));
        Ok(argv)
    }

    pub fn spawn_all(&mut self) -> Result<(), ClusterError> {
        for i in 0..self.len() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// Notices nodes whose process exited although the harness did not kill it, and remembers
    /// them (a crash is a finding, reported by the cluster checks).
    pub fn reap_unexpected(&mut self) {
        for n in &mut self.nodes {
            if !n.proc.is_running() {
                continue;
            }
            match n.proc.try_wait() {
                Ok(Some(status)) => {
                    warn!(node = %n.info.name, %status, "node exited on its own");
                    self.unexpected_exits.push((n.info.name.clone(), status.to_string()));
                }
                Ok(None) => {}
                Err(e) => warn!(node = %n.info.name, error = %e, "cannot poll node process"),
            }
        }
    }

    /// `(node, exit status)` of every exit the harness did not cause.
    pub fn unexpected_exits(&self) -> &[(String, String)] {
        &self.unexpected_exits
    }

    /// SIGKILLs node `i` and reaps it.
    pub fn kill(&mut self, i: usize) -> Result<(), ClusterError> {
        let n = &mut self.nodes[i];
        info!(node = %n.info.name, pid = n.proc.pid()?, "SIGKILL");
        Ok(n.proc.kill()?)
    }

    /// SIGSTOPs node `i`: it keeps its sockets but does nothing, like a long GC pause.
    pub fn pause(&mut self, i: usize) -> Result<(), ClusterError> {
        let n = &mut self.nodes[i];
        info!(node = %n.info.name, pid = n.proc.pid()?, "SIGSTOP");
        Ok(n.proc.pause()?)
    }

    /// SIGCONTs a paused node.
    pub fn resume(&mut self, i: usize) -> Result<(), ClusterError> {
        let n = &mut self.nodes[i];
        info!(node = %n.info.name, pid = n.proc.pid()?, "SIGCONT");
        Ok(n.proc.resume()?)
    }

    /// Waits (at most `timeout`, and at most `timeout / PROBE_INTERVAL + 1` attempts) until node
    /// `i` answers a linearizable `get`, failing early if its process exits (recorded as an
    /// exit nobody asked for).
    pub async fn wait_ready(&mut self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        let url = self.nodes[i].info.client_url.clone();
        let probe = || probe(url.clone());
        let node = self.nodes[i].info.name.clone();
        match wait_ready(&mut self.nodes[i].proc, timeout, PROBE_INTERVAL, probe).await {
            Ok(id) => {
                self.nodes[i].member_id = Some(id);
                Ok(())
            }
            Err(ReadyError::Exited { status, .. }) => {
                self.unexpected_exits.push((node.clone(), status.to_string()));
                Err(ClusterError::Exited {
                    node,
                    status: status.to_string(),
                    log_tail: tail(&self.nodes[i].info.log, 40),
                })
            }
            Err(ReadyError::Timeout { last, .. }) => {
                Err(ClusterError::NotReady { node, waited: timeout, last_error: last })
            }
            Err(ReadyError::Proc(e)) => Err(e.into()),
        }
    }

    /// Waits until every running node is ready, sharing one `timeout`.
    /// Records node `i`'s member id (a node added again has a new one).
    pub fn set_member_id(&mut self, i: usize, id: u64) {
        self.nodes[i].member_id = Some(id);
    }

    pub async fn wait_all_ready(&mut self, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        for i in 0..self.len() {
            if self.state(i) == NodeState::Running {
                let left = deadline.saturating_duration_since(Instant::now()).max(PROBE_INTERVAL);
                self.wait_ready(i, left).await?;
            }
        }
        Ok(())
    }

    /// The index of the current leader, if a running node can say (`Maintenance.Status`).
    /// `None` when no node answers, or when the server does not implement `Status`.
    pub async fn leader(&self) -> Option<usize> {
        for i in 0..self.len() {
            if self.state(i) != NodeState::Running {
                continue;
            }
            let Ok(mut c) = client::connect(&self.nodes[i].info.client_url, STATUS_TIMEOUT).await
            else {
                continue;
            };
            let Ok(Ok(status)) = tokio::time::timeout(STATUS_TIMEOUT, c.status()).await else {
                continue;
            };
            let leader = status.leader();
            if let Some(j) = self.nodes.iter().position(|n| n.member_id == Some(leader)) {
                return Some(j);
            }
        }
        None
    }

    /// SIGKILLs every node still running (by its PID) and reaps it.
    pub fn kill_all(&mut self) {
        for n in &mut self.nodes {
            if n.proc.is_running() {
                // Errors are ignored: the process may have exited on its own already.
                let _ = n.proc.kill();
            }
        }
    }

    /// Removes every node's data directory (after the nodes are killed).
    pub fn remove_data(&mut self) {
        self.kill_all();
        let data = self.cfg.out.join("data");
        if let Err(e) = std::fs::remove_dir_all(&data) {
            warn!(dir = %data.display(), error = %e, "cannot remove node data");
        }
    }
}

/// One linearizable `get` against `url`, returning the member id in its header.
async fn probe(url: String) -> Result<u64, String> {
    let mut c = client::connect(&url, PROBE_TIMEOUT).await.map_err(|e| e.to_string())?;
    let fut = c.get("picket-jepsen/ready", None);
    // The client has its own request timeout; this outer bound also covers connecting.
    let resp = tokio::time::timeout(PROBE_TIMEOUT, fut)
        .await
        .map_err(|_| format!("no answer within {PROBE_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    resp.header().map(|h| h.member_id()).ok_or_else(|| "response without a header".into())
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

impl Faults for ProcessCluster {
    fn mode(&self) -> &'static str {
        match self.cfg.network {
            Some(_) => "netns",
            None => "loopback",
        }
    }

    fn node_count(&self) -> usize {
        self.len()
    }

    fn node_name(&self, i: usize) -> String {
        self.nodes[i].info.name.clone()
    }

    fn node_state(&self, i: usize) -> NodeState {
        self.state(i)
    }

    fn kill(&mut self, i: usize) -> Result<(), FaultError> {
        ProcessCluster::kill(self, i).map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn restart(&mut self, i: usize) -> Result<(), FaultError> {
        self.spawn(i).map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn pause(&mut self, i: usize) -> Result<(), FaultError> {
        ProcessCluster::pause(self, i).map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn resume(&mut self, i: usize) -> Result<(), FaultError> {
        ProcessCluster::resume(self, i).map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn supports_network_faults(&self) -> bool {
        self.cfg.network.is_some()
    }

    fn cut(&mut self, links: &[(usize, usize)]) -> Result<(), FaultError> {
        let net = self
            .cfg
            .network
            .as_ref()
            .ok_or(FaultError::Unsupported { fault: "partition", mode: "loopback" })?;
        info!(?links, "cutting links");
        net.cut(links).map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn heal_network(&mut self) -> Result<(), FaultError> {
        match &self.cfg.network {
            Some(net) => net.heal().map_err(|e| FaultError::Failed(e.to_string())),
            None => Ok(()),
        }
    }

    fn client_url(&self, i: usize) -> String {
        self.nodes[i].info.client_url.clone()
    }

    fn peer_url(&self, i: usize) -> String {
        self.nodes[i].info.peer_url.clone()
    }

    fn member_id(&self, i: usize) -> Option<u64> {
        self.nodes[i].member_id
    }

    fn remove(&mut self, i: usize) -> Result<(), FaultError> {
        ProcessCluster::remove(self, i).map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn rejoin(
        &mut self,
        i: usize,
        initial_cluster: &str,
        member_id: u64,
    ) -> Result<(), FaultError> {
        ProcessCluster::rejoin(self, i, initial_cluster, member_id)
            .map_err(|e| FaultError::Failed(e.to_string()))
    }

    fn set_env(&mut self, i: usize, env: Vec<(String, String)>) -> Result<(), FaultError> {
        self.nodes[i].env = env;
        Ok(())
    }
}
