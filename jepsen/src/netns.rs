//! Network-namespace mode: every node in its own network namespace with its own address, the
//! harness (clients, nemesis, leader discovery) in a control namespace, and partitions made of
//! iptables DROP rules inside the node namespaces.
//!
//! Layout for a run by harness PID `P` (every name starts with `pkj-P-`, see [`PREFIX`]):
//!
//! ```text
//!  pkj-P-ctl (the harness)                       pkj-P-n1 (picketd n1)
//!  +------------------------------+   veth    +----------------------------------+
//!  | bridge pkjbr 10.77.0.1/24    |--- v1 ----| eth0 10.77.0.11                  |
//!  |   ports: v1, v2, ...         |           | iptables chain PICKET-JEPSEN     |
//!  +------------------------------+           |   (jumped to from INPUT)         |
//!                |                            +----------------------------------+
//!                +------ v2 ----- pkj-P-n2 (eth0 10.77.0.12) ...
//! ```
//!
//! - Nothing is added to the root namespace except the `ip netns` mount points in `/run/netns`,
//!   which are how named namespaces exist at all.
//! - The harness process enters the control namespace with `setns(2)` on its main thread
//!   *before* the tokio runtime starts, so every runtime thread inherits it and every client
//!   socket (a socket stays in the namespace it was created in) lives there. The bridge
//!   connects it to every node; partitions are rules between node addresses only, so clients
//!   always reach every node (as in Jepsen) and a partitioned node keeps serving its clients.
//! - Nodes are started with `ip netns exec pkj-P-n<i> <server> ...` (which execs, so the child's
//!   PID is the server's and SIGKILL/SIGSTOP by PID still work).
//! - A partition is a set of directed links `(from, to)`: packets from `from`'s address arriving
//!   in `to`'s namespace are dropped by a rule in `to`'s dedicated chain. A symmetric cut is both
//!   directions; an asymmetric one only one. Healing flushes the chains.
//! - [`Network`]'s `Drop` SIGKILLs whatever still runs in the node namespaces and deletes every
//!   namespace it created (veths and the bridge go with them). A run that could not clean up (the
//!   harness was SIGKILLed) leaves named namespaces behind (its nodes die with it: see
//!   [`crate::cluster`] on the parent-death signal); [`sweep`] at the next start deletes those
//!   whose owner PID no longer exists.
//!
//! Related: [`crate::cluster`] spawns the nodes through [`Network::command`], and
//! [`crate::nemesis::partition`] chooses the links to cut.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use thiserror::Error;
use tracing::{info, warn};

/// Every namespace the harness creates is named `pkj-<harness pid>-<role>`.
pub const PREFIX: &str = "pkj-";

/// The iptables chain holding a node's partition rules (one per node namespace).
pub const CHAIN: &str = "PICKET-JEPSEN";

/// The bridge in the control namespace.
const BRIDGE: &str = "pkjbr";

/// Where `ip netns` keeps its named namespaces (iproute2's `NETNS_RUN_DIR`).
const NETNS_DIR: &str = "/run/netns";

/// Seconds iptables waits for the xtables lock (`-w`). The lock file is shared by every
/// namespace on the machine, so another engineer's iptables call can hold it briefly; waiting is
/// safe because our rules only touch our own namespaces, and the bound keeps a stuck lock from
/// hanging the run (the fault then fails and the run reports a harness error).
const XTABLES_WAIT_S: &str = "10";

/// Most nodes one run can place (addresses `.11` up to `.250` of the /24).
pub const MAX_NODES: usize = 240;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NetError {
    /// Network-namespace mode cannot run here; the reason says what is missing.
    #[error("network-namespace mode is unavailable: {0}")]
    Unavailable(String),
    #[error("`{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("entering namespace {ns}: {message}")]
    Enter { ns: String, message: String },
    #[error("{0} nodes: network-namespace mode supports 1 to {MAX_NODES}")]
    NodeCount(usize),
}

/// Runs a command to completion and returns its stdout; a non-zero exit is an error carrying
/// stderr.
fn run(program: &str, args: &[&str]) -> Result<String, NetError> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetError::Command { command: command.clone(), message: e.to_string() })?;
    if !out.status.success() {
        return Err(NetError::Command {
            command,
            message: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Why network-namespace mode cannot run on this machine, or `None` when it can: it needs
/// root, `ip netns` and `iptables`.
pub fn unavailable_reason() -> Option<String> {
    use picket_procs::tools;
    if !tools::is_root() {
        return Some("not running as root (namespaces and iptables need it)".into());
    }
    for found in [tools::ip(), tools::iptables()] {
        if let Err(missing) = found {
            return Some(missing.to_string());
        }
    }
    if let Err(e) = run("ip", &["netns", "list"]) {
        return Some(format!("`ip netns` does not work: {e}"));
    }
    if let Err(e) = run("iptables", &["--version"]) {
        return Some(format!("iptables does not work: {e}"));
    }
    None
}

/// Every named namespace, from `ip netns list` ("name" or "name (id: N)" per line).
fn list_namespaces() -> Result<Vec<String>, NetError> {
    Ok(run("ip", &["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// The harness PID in a name `pkj-<pid>-<role>`.
fn owner_pid(name: &str) -> Option<u32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether a process `pid` exists. A reused PID makes a dead run's namespaces look alive, which
/// only delays their sweep until that process exits; the opposite mistake (sweeping a live run)
/// cannot happen. Any process may own namespaces (the harness, or a test using [`Network`]
/// directly), so the check does not look at the program name.
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// SIGKILLs every process inside namespace `ns` except this one, then deletes it. Only called
/// on namespaces this harness (or a dead earlier harness) created, so every process inside is
/// a node it started.
fn destroy(ns: &str) -> Result<(), NetError> {
    let me = std::process::id().to_string();
    match run("ip", &["netns", "pids", ns]) {
        Ok(pids) => {
            for pid in pids.split_whitespace().filter(|p| *p != me) {
                // A process that exited meanwhile makes `kill` fail; nothing to do then.
                let _ = run("kill", &["-KILL", pid]);
            }
        }
        Err(e) => warn!(ns, error = %e, "cannot list processes in namespace"),
    }
    run("ip", &["netns", "del", ns]).map(|_| ())
}

/// Deletes the namespaces of crashed earlier runs: names with [`PREFIX`] whose owner PID no
/// longer exists. Namespaces of live harnesses (concurrent runs) are left alone.
/// Returns the names removed.
pub fn sweep() -> Result<Vec<String>, NetError> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        let Some(pid) = owner_pid(&ns) else { continue };
        if pid_alive(pid) {
            continue;
        }
        match destroy(&ns) {
            Ok(()) => {
                info!(ns = %ns, "swept a namespace left by a crashed run");
                removed.push(ns);
            }
            Err(e) => warn!(ns = %ns, error = %e, "cannot sweep a leftover namespace"),
        }
    }
    Ok(removed)
}

/// The namespaces, bridge, veths and iptables chains of one run. See the module docs.
#[derive(Debug)]
pub struct Network {
    ctl: String,
    nodes: Vec<String>,
    addrs: Vec<Ipv4Addr>,
    /// Namespaces created so far (for `Drop`, also after a half-finished `create`).
    created: Vec<String>,
}

impl Network {
    /// Sweeps leftovers of crashed runs, then builds the namespaces for `n` nodes. On error,
    /// whatever was created is removed again.
    pub fn create(n: usize) -> Result<Network, NetError> {
        if let Some(reason) = unavailable_reason() {
            return Err(NetError::Unavailable(reason));
        }
        if n == 0 || n > MAX_NODES {
            return Err(NetError::NodeCount(n));
        }
        let removed = sweep()?;
        if !removed.is_empty() {
            info!(count = removed.len(), "removed namespaces of crashed runs");
        }
        let prefix = format!("{PREFIX}{}-", std::process::id());
        let mut net = Network {
            ctl: format!("{prefix}ctl"),
            nodes: (1..=n).map(|i| format!("{prefix}n{i}")).collect(),
            addrs: (0..n).map(|i| Ipv4Addr::new(10, 77, 0, 11 + i as u8)).collect(),
            created: Vec::new(),
        };
        net.build()?;
        info!(ctl = %net.ctl, nodes = n, "network namespaces ready");
        Ok(net)
    }

    fn build(&mut self) -> Result<(), NetError> {
        let ctl = self.ctl.clone();
        run("ip", &["netns", "add", &ctl])?;
        self.created.push(ctl.clone());
        let ip_ctl = |args: &[&str]| {
            let mut a = vec!["-n", ctl.as_str()];
            a.extend_from_slice(args);
            run("ip", &a)
        };
        ip_ctl(&["link", "set", "lo", "up"])?;
        ip_ctl(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip_ctl(&["addr", "add", "10.77.0.1/24", "dev", BRIDGE])?;
        ip_ctl(&["link", "set", BRIDGE, "up"])?;
        for i in 0..self.nodes.len() {
            let ns = self.nodes[i].clone();
            run("ip", &["netns", "add", &ns])?;
            self.created.push(ns.clone());
            let veth = format!("v{}", i + 1);
            ip_ctl(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip_ctl(&["link", "set", &veth, "master", BRIDGE, "up"])?;
            let addr = format!("{}/24", self.addrs[i]);
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            self.iptables(i, &["-N", CHAIN])?;
            self.iptables(i, &["-A", "INPUT", "-j", CHAIN])?;
        }
        Ok(())
    }

    /// Runs `iptables` with `args` inside node `i`'s namespace.
    fn iptables(&self, i: usize, args: &[&str]) -> Result<(), NetError> {
        let mut a = vec!["netns", "exec", self.nodes[i].as_str(), "iptables", "-w", XTABLES_WAIT_S];
        a.extend_from_slice(args);
        run("ip", &a).map(|_| ())
    }

    pub fn control_namespace(&self) -> &str {
        &self.ctl
    }

    pub fn node_namespace(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// Node `i`'s address on the bridge.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        self.addrs[i]
    }

    /// Moves the calling thread into the control namespace. Threads it creates afterwards (the
    /// tokio runtime's) inherit the namespace, so call it on the main thread before the runtime
    /// is built.
    pub fn enter_control(&self) -> Result<(), NetError> {
        enter(&self.ctl)
    }

    /// A command that runs `program` inside node `i`'s namespace. `ip netns exec` execs the
    /// program (it forks only in batch mode), so the child's PID is the program's.
    pub fn command(&self, i: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.nodes[i]]).arg(program);
        c
    }

    /// Drops packets from `from` to `to` for every `(from, to)` in `links`, in addition to any
    /// rule already in place.
    pub fn cut(&self, links: &[(usize, usize)]) -> Result<(), NetError> {
        for &(from, to) in links {
            let src = self.addrs[from].to_string();
            self.iptables(to, &["-A", CHAIN, "-s", &src, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Removes every partition rule (flushes each node's chain). Tries every node even when one
    /// fails, and returns the first error.
    pub fn heal(&self) -> Result<(), NetError> {
        let mut first = None;
        for i in 0..self.nodes.len() {
            if let Err(e) = self.iptables(i, &["-F", CHAIN]) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The rules currently in node `i`'s chain (`iptables -S` lines), for tests and debugging.
    pub fn rules(&self, i: usize) -> Result<Vec<String>, NetError> {
        let ns = self.nodes[i].as_str();
        let out = run("ip", &["netns", "exec", ns, "iptables", "-w", XTABLES_WAIT_S, "-S", CHAIN])?;
        Ok(out.lines().filter(|l| l.starts_with("-A")).map(str::to_string).collect())
    }
}

/// Moves the calling thread into the named network namespace `ns` (see
/// [`Network::control_namespace`], [`Network::node_namespace`]). Sockets the thread creates
/// afterwards belong to that namespace; sockets it already had stay where they were.
pub fn enter(ns: &str) -> Result<(), NetError> {
    let path = Path::new(NETNS_DIR).join(ns);
    let enter_err = |message: String| NetError::Enter { ns: ns.to_string(), message };
    let f = File::open(&path).map_err(|e| enter_err(format!("{}: {e}", path.display())))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&f),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| enter_err(e.to_string()))
}

impl Drop for Network {
    fn drop(&mut self) {
        // Node namespaces first: that kills any node the cluster did not (it normally has) and
        // takes the veths with them; the control namespace (holding the bridge) last. The
        // harness itself stays in the now unnamed control namespace until it exits.
        for ns in self.created.iter().rev() {
            if let Err(e) = destroy(ns) {
                warn!(ns = %ns, error = %e, "cannot delete namespace");
            }
        }
        info!(count = self.created.len(), "network namespaces removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_parses_only_our_names() {
        assert_eq!(owner_pid("pkj-1234-n1"), Some(1234));
        assert_eq!(owner_pid("pkj-77-ctl"), Some(77));
        assert_eq!(owner_pid("pkj-x-ctl"), None);
        assert_eq!(owner_pid("other-1234-n1"), None);
    }
}
