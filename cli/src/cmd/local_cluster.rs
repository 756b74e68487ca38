//! `local-cluster`: three real `picketd` processes on 127.0.0.1, the same cluster
//! `scripts/local-cluster.sh` starts (same names, ports and flags, so either can restart the
//! other's data). A second run with the same data dir restarts the members from disk.
//! Ctrl-C (or SIGTERM) stops all three: SIGTERM, then SIGKILL after `--stop-timeout`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use picket_client::{Client, ConnectOptions, GetOptions};
use picket_procs::child::{open_log, Managed};

use super::signals::interrupted;
use super::Ctx;
use crate::args::parse_duration;
use crate::exit;
use crate::output::{self, Format};

/// Client ports of etcd's local Procfile; each member's peer port is its client port + 1.
const DEFAULT_CLIENT_PORTS: [u16; 3] = [2379, 22379, 32379];

#[derive(Debug, Clone, clap::Args)]
pub struct LocalClusterArgs {
    /// Where the members keep their data (DIR/n1, DIR/n2, DIR/n3) and logs (DIR/n*.log).
    #[arg(long, default_value = "picket-data", env = "PICKET_DATA")]
    pub data_dir: PathBuf,
    /// The three client ports; each member's peer port is its client port + 1.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_CLIENT_PORTS)]
    pub client_ports: Vec<u16>,
    /// The picketd binary; default: next to this picket executable, else on PATH.
    #[arg(long)]
    pub picketd: Option<PathBuf>,
    /// How long the members may take to elect a leader and serve before giving up.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ready_timeout: Duration,
    /// How long each member gets to exit after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub stop_timeout: Duration,
}

/// `picketd` next to the running `picket` (both are built into the same target directory and
/// installed side by side), else the first one on PATH.
fn find_picketd() -> Result<PathBuf> {
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let p = dir.join("picketd");
        if p.is_file() {
            return Ok(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("picketd");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(exit::fail(
        exit::USAGE,
        "picketd not found next to picket or on PATH (build it with `cargo build --workspace`, or pass --picketd)",
    ))
}

/// How often `first_exit` looks at the members. A member that dies is reported within this;
/// nothing waits on it to be faster.
const EXIT_POLL: Duration = Duration::from_millis(200);

struct Member {
    name: String,
    client_url: String,
    /// Started with a parent-death signal (if `picket` dies without stopping them, the members
    /// do not linger), signalled and stopped by its PID only.
    proc: Managed,
}

pub async fn run(ctx: &Ctx, a: LocalClusterArgs) -> Result<u8> {
    if a.client_ports.len() != 3 {
        return Err(exit::fail(exit::USAGE, "--client-ports takes exactly three ports"));
    }
    let bin = match &a.picketd {
        Some(p) => p.clone(),
        None => find_picketd()?,
    };
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("creating {}", a.data_dir.display()))?;
    let cluster = a
        .client_ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("n{}=http://127.0.0.1:{}", i + 1, p + 1))
        .collect::<Vec<_>>()
        .join(",");
    let restart = a.data_dir.join("n1").exists();
    let mut members = Vec::new();
    for (i, port) in a.client_ports.iter().enumerate() {
        let name = format!("n{}", i + 1);
        let client_url = format!("http://127.0.0.1:{port}");
        let mut proc = Managed::new(name.clone());
        let child = start_member(&mut proc, &bin, &a.data_dir, &name, *port, &cluster);
        match child {
            Ok(()) => members.push(Member { name, client_url, proc }),
            Err(e) => {
                stop_all(&mut members, a.stop_timeout).await;
                return Err(e);
            }
        }
    }
    let endpoints: Vec<String> = members.iter().map(|m| m.client_url.clone()).collect();
    let bare: Vec<String> =
        endpoints.iter().map(|e| e.trim_start_matches("http://").to_string()).collect();
    output::note(format!(
        "{} three members with {} (data in {}/, logs in {}/n*.log); waiting until they serve ...",
        if restart { "restarting" } else { "starting" },
        bin.display(),
        a.data_dir.display(),
        a.data_dir.display()
    ));
    let outcome = tokio::select! {
        r = wait_ready(&endpoints, a.ready_timeout) => r.map(|_| None),
        m = first_exit(&mut members) => Ok(Some(m)),
        r = interrupted() => { r?; Ok(Some("interrupted".to_string())) }
    };
    match outcome {
        Ok(None) => {}
        Ok(Some(why)) => {
            stop_all(&mut members, a.stop_timeout).await;
            return Err(exit::fail(
                exit::ERROR,
                format!("cluster did not start: {why}; see {}/n*.log", a.data_dir.display()),
            ));
        }
        Err(e) => {
            stop_all(&mut members, a.stop_timeout).await;
            return Err(e.context(format!("see {}/n*.log", a.data_dir.display())));
        }
    }
    let pids: Vec<String> =
        members.iter().map(|m| m.proc.pid().map_or(0, |p| p).to_string()).collect();
    let list = bare.join(",");
    if ctx.format() == Format::Json {
        output::json_line(&serde_json::json!({
            "endpoints": endpoints, "pids": pids, "data_dir": a.data_dir.display().to_string(),
        }));
    } else {
        output::line(format!(
            "picket: three members running (pids {}), data in {}/",
            pids.join(" "),
            a.data_dir.display()
        ));
        output::line(format!("endpoints: {list}"));
        output::line(format!("try:       picket --endpoints={list} put greeting hello"));
        output::line(format!(
            "           ETCDCTL_API=3 etcdctl --endpoints={list} get greeting -w json"
        ));
        output::line("Ctrl-C stops the cluster.");
    }
    let code = tokio::select! {
        r = interrupted() => { r?; exit::OK }
        m = first_exit(&mut members) => {
            output::note(format!("{m}; stopping the others (see {}/n*.log)", a.data_dir.display()));
            exit::ERROR
        }
    };
    stop_all(&mut members, a.stop_timeout).await;
    output::note("stopped");
    Ok(code)
}

/// Waits until a linearizable read through all the endpoints succeeds (a leader is elected
/// and applying). Bounded by `timeout`; each attempt by the client's own timeouts.
async fn wait_ready(endpoints: &[String], timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let opts = ConnectOptions::default()
        .with_dial_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(3));
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        let attempt = async {
            let c = Client::connect_with(endpoints, opts.clone()).await?;
            c.get_with("health", GetOptions::new()).await
        };
        match attempt.await {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        // Safe to retry: the probe is a read; the pause keeps a starting cluster from being
        // hammered while it elects a leader.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(exit::fail(exit::UNAVAILABLE, format!("cluster not serving after {timeout:?}: {last}")))
}

/// Resolves when any member exits, describing which and how. Polls (every [`EXIT_POLL`]): the
/// members are ours and reaped only here or in `stop_all`, so a PID never names another process.
async fn first_exit(members: &mut [Member]) -> String {
    loop {
        for m in members.iter_mut() {
            match m.proc.try_wait() {
                Ok(Some(s)) => return format!("member {} exited ({s})", m.name),
                Ok(None) => {}
                Err(e) => return format!("member {} could not be waited on: {e}", m.name),
            }
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// SIGTERM to every member, then SIGKILL to those still running after `grace`.
async fn stop_all(members: &mut [Member], grace: Duration) {
    for m in members.iter_mut() {
        if m.proc.is_running() {
            let _ = m.proc.term();
        }
    }
    for m in members.iter_mut() {
        if !m.proc.is_running() {
            continue;
        }
        // Bounded by `grace`; a member that ignores SIGTERM that long is killed.
        if m.proc.wait_exit(grace).await.is_err() && m.proc.is_running() {
            output::note(format!(
                "member {} did not stop within {grace:?}; sending SIGKILL",
                m.name
            ));
            let _ = m.proc.kill();
        }
    }
}

/// Starts member `name` of `cluster` on `proc`, serving clients on `port` and peers on
/// `port + 1`, logging to `<data_dir>/<name>.log`.
fn start_member(
    proc: &mut Managed,
    bin: &Path,
    data_dir: &Path,
    name: &str,
    port: u16,
    cluster: &str,
) -> Result<()> {
    let client_url = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{}", port + 1);
    let log_path = data_dir.join(format!("{name}.log"));
    let header = format!("=== picket local-cluster: start of {name}: {} ===", bin.display());
    let log = open_log(&log_path, &header)?;
    let mut cmd = Managed::command(bin, log.try_clone()?, log)?;
    cmd.args(["--name", name])
        .arg("--data-dir")
        .arg(data_dir.join(name))
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", cluster, "--initial-cluster-state", "new"]);
    proc.start(cmd).with_context(|| format!("starting {}", bin.display()))?;
    Ok(())
}
