//! `picket-jepsen`: parses the command line, starts tracing and calls the library.
//!
//! Exit status: 0 every checker valid; 1 an anomaly; 2 unknown (a checker could not decide);
//! 3 the harness itself failed (or was interrupted).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use picket_jepsen::checker::Budget;
use picket_jepsen::cluster::Target;
use picket_jepsen::netns::{self, Network};
use picket_jepsen::runner::{self, TestOptions};
use rand::Rng;

/// Exit status for a harness failure.
const HARNESS_FAILED: u8 = 3;

#[derive(Debug, Parser)]
#[command(name = "picket-jepsen", version, about = "Fault-injection tests for Picket and etcd")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    /// Wall-clock limit of the checkers, in seconds; past it a verdict is `unknown`.
    #[arg(long, default_value_t = 300)]
    checker_time_limit: u64,
    /// Search steps per key of the linearizability checker.
    #[arg(long, default_value_t = Budget::default().max_steps_per_key)]
    checker_max_steps: u64,
}

impl CheckArgs {
    fn budget(&self) -> Budget {
        Budget {
            max_steps_per_key: self.checker_max_steps,
            time_limit: Duration::from_secs(self.checker_time_limit),
            ..Budget::default()
        }
    }
}

/// Where the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// `netns` when running as root with `ip netns` and iptables, else `loopback`.
    Auto,
    /// Each node in its own network namespace; network faults available. Fails without root.
    Netns,
    /// Every node on 127.0.0.1; process faults only.
    Loopback,
}

// Parsed once per process: the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Cmd {
    /// Runs a test and writes a result folder.
    Test {
        /// Workload: `register`, `set`, `lock`, `lock-set`, `lock-fenced-set`, `lock-kv-set`,
        /// `lease`, `watch`, `queue` (Picket only) or `election`.
        #[arg(long, default_value = "register")]
        workload: String,
        /// Faults, comma-separated: `kill`, `pause`, `partition` (network-namespace mode only),
        /// `member` (remove and re-add a node), `admin` (compaction, snapshots, defragment,
        /// leader transfer), `clock` (a node under libfaketime, wall clock skewed), `clock-rate`
        /// (a node whose monotonic clock runs fast or slow: breaks lease timing), `snapshot-lag`
        /// (one member, often the leader, paused or cut off until it must catch up by
        /// snapshot), or `none`.
        #[arg(long, value_delimiter = ',', default_value = "kill,pause")]
        nemesis: Vec<String>,
        /// Seconds of workload (recovery, final reads and checking come on top).
        #[arg(long, default_value_t = 30)]
        time_limit: u64,
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, value_enum, default_value_t = Target::Picket)]
        target: Target,
        /// The result folder (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Seed of the operation generator and the fault schedule (random if absent).
        #[arg(long)]
        seed: Option<u64>,
        /// Target operations per second over all workers.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// Number of workers (default: 3 per node).
        #[arg(long)]
        concurrency: Option<usize>,
        /// Bound on each operation, in milliseconds. Past it a write is recorded `info` (it may
        /// still take effect) and a read `fail`, so the bound only trades ambiguity for worker
        /// progress; it never makes the history claim something that did not happen.
        #[arg(long, default_value_t = 4000)]
        op_timeout_ms: u64,
        /// Operations per key before a group of workers moves to a fresh key.
        #[arg(long, default_value_t = 200)]
        ops_per_key: u64,
        /// TTL in seconds of the leases the lock and lease workloads grant. Short, so that the
        /// pause nemesis (2.5-6 s) and client stalls outlast it.
        #[arg(long, default_value_t = 2)]
        lease_ttl: i64,
        /// The picketd binary (default: next to this executable).
        #[arg(long)]
        picketd: Option<PathBuf>,
        /// The etcd binary, for `--target etcd` (default: `etcd` on PATH, Debian `etcd-server`).
        #[arg(long)]
        etcd: Option<PathBuf>,
        /// Serve gets as serializable (node-local) reads: a deliberately unsafe client, to
        /// show the checkers catch stale reads.
        #[arg(long)]
        unsafe_serializable_reads: bool,
        /// Keep the nodes' data directories in the result folder.
        #[arg(long)]
        keep_data: bool,
        /// `--log-level` passed to every node.
        #[arg(long)]
        node_log_level: Option<String>,
        /// Where the nodes run.
        #[arg(long, value_enum, default_value_t = Mode::Auto)]
        mode: Mode,
        #[command(flatten)]
        check: CheckArgs,
    },
    /// Re-checks a result folder's history and rewrites its results.json.
    Check {
        dir: PathBuf,
        #[command(flatten)]
        check: CheckArgs,
    },
}

/// `picketd` next to this executable, or one directory up (a test executable lives in
/// `target/<profile>/deps/`, the binaries in `target/<profile>/`).
fn default_picketd() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let dir = exe.parent().context("executable without a directory")?;
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let p = d.join("picketd");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "picketd not found next to {}; build it (`cargo build --workspace`) or pass --picketd",
        exe.display()
    )
}

/// Chooses the mode and, for network-namespace mode, builds the namespaces and moves this
/// (still single-threaded) process's main thread into the control namespace, so the tokio
/// runtime built afterwards runs every client there. Returns the network and a note saying why
/// this mode was chosen.
fn prepare_network(mode: Mode, nodes: usize) -> anyhow::Result<(Option<Arc<Network>>, String)> {
    let reason = match mode {
        Mode::Loopback => {
            return Ok((None, "loopback mode (--mode loopback): process faults only".into()))
        }
        Mode::Auto | Mode::Netns => netns::unavailable_reason(),
    };
    if let Some(reason) = reason {
        if mode == Mode::Netns {
            bail!("--mode netns: {reason}");
        }
        return Ok((None, format!("loopback mode, process faults only: {reason}")));
    }
    let net = Network::create(nodes).context("building the network namespaces")?;
    net.enter_control().context("entering the control namespace")?;
    let note = format!(
        "netns mode: each node in its own network namespace ({}..), clients in {}",
        net.node_namespace(0),
        net.control_namespace()
    );
    Ok((Some(Arc::new(net)), note))
}

async fn run(cli: Cli, network: Option<Arc<Network>>, mode_note: String) -> anyhow::Result<u8> {
    match cli.cmd {
        Cmd::Test {
            workload,
            nemesis,
            time_limit,
            nodes,
            target,
            out,
            seed,
            rate,
            concurrency,
            op_timeout_ms,
            ops_per_key,
            lease_ttl,
            picketd,
            etcd,
            unsafe_serializable_reads,
            keep_data,
            node_log_level,
            mode: _,
            check,
        } => {
            let bin = match target {
                Target::Picket => match picketd {
                    Some(p) => p,
                    None => default_picketd()?,
                },
                Target::Etcd => match etcd {
                    Some(p) => p,
                    None => picket_procs::tools::etcd()?,
                },
            };
            let seed = seed.unwrap_or_else(|| rand::rng().random());
            let opts = TestOptions {
                workload,
                nemeses: nemesis.into_iter().filter(|n| !n.is_empty()).collect(),
                time_limit: Duration::from_secs(time_limit),
                nodes,
                target,
                bin,
                out: out.clone(),
                seed,
                rate,
                concurrency: concurrency.unwrap_or(3 * nodes),
                op_timeout: Duration::from_millis(op_timeout_ms),
                ops_per_key,
                lease_ttl,
                unsafe_serializable_reads,
                keep_data,
                node_log_level,
                budget: check.budget(),
                network,
                mode_note: mode_note.clone(),
            };
            println!("mode: {mode_note}");
            println!("seed: {seed}");
            println!("re-run: {}", opts.command());
            let results = runner::run_test(opts).await?;
            runner::print_results(&out, &results);
            Ok(results.valid.exit_code() as u8)
        }
        Cmd::Check { dir, check } => {
            let results = runner::check_dir(&dir, &check.budget())?;
            runner::print_results(&dir, &results);
            Ok(results.valid.exit_code() as u8)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    // Namespaces are set up before the runtime exists: setns(2) moves only the calling thread,
    // and only threads created after it inherit the namespace.
    let (network, mode_note) = match &cli.cmd {
        Cmd::Test { mode, nodes, .. } => match prepare_network(*mode, *nodes) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("picket-jepsen: harness failure: {e:#}");
                return ExitCode::from(HARNESS_FAILED);
            }
        },
        Cmd::Check { .. } => (None, String::new()),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("picket-jepsen: cannot start the tokio runtime: {e}");
            return ExitCode::from(HARNESS_FAILED);
        }
    };
    let code = runtime.block_on(run_until_signal(cli, network.clone(), mode_note));
    // The runtime goes first (the cluster, and with it every node, is gone by now), then the
    // last reference to the network, whose `Drop` deletes the namespaces.
    drop(runtime);
    drop(network);
    ExitCode::from(code)
}

async fn run_until_signal(cli: Cli, network: Option<Arc<Network>>, mode_note: String) -> u8 {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("picket-jepsen: cannot listen for SIGTERM: {e}");
            return HARNESS_FAILED;
        }
    };
    // Dropping the run future on a signal drops the cluster (which SIGKILLs every node it
    // started) and the worker set (which aborts the workers).
    tokio::select! {
        r = run(cli, network, mode_note) => match r {
            Ok(code) => code,
            Err(e) => {
                eprintln!("picket-jepsen: harness failure: {e:#}");
                HARNESS_FAILED
            }
        },
        _ = tokio::signal::ctrl_c() => {
            eprintln!("picket-jepsen: interrupted (SIGINT); nodes killed");
            HARNESS_FAILED
        }
        _ = term.recv() => {
            eprintln!("picket-jepsen: terminated (SIGTERM); nodes killed");
            HARNESS_FAILED
        }
    }
}
