//! `picketd`: parses flags, starts tracing, runs a member until SIGINT/SIGTERM.

use std::io::IsTerminal;

use anyhow::Context;
use picket_server::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc for the Rust side (RocksDB's C++ keeps its own). A put
/// allocates dozens of small buffers across tonic, prost and the apply path; under 64 writers
/// glibc's malloc, free and chunk consolidation took about a tenth of the servers' CPU
/// (docs/benchmarks.md, "Write path").
///
/// Built with mimalloc's `no_thp` (workspace Cargo.toml): at start mimalloc turns transparent
/// huge pages off for the process (`PR_SET_THP_DISABLE`). With THP on ("always", Debian's
/// default), the kernel backed mimalloc's eagerly committed arena with 2 MiB pages, so an idle
/// member held 56 MiB of anonymous huge pages, and three members after three rounds of 64-client
/// puts held ~530 MiB against etcd's ~400 (issue 20's RSS row). Without it: 30 MiB idle, and
/// the three members' RSS at etcd's (docs/benchmarks.md, "Issue 20, session 12").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // `--config-file`: flags from a YAML file, overridden by the command line. Parsed before the
    // runtime exists, because `--runtime-threads` decides its size.
    let cfg: Config = match picket_server::config_file::parse() {
        Ok(cfg) => cfg,
        Err(picket_server::config_file::ConfigFileError::Args(e)) => e.exit(),
        Err(e) => anyhow::bail!("{e}"),
    };
    let filter = EnvFilter::try_new(cfg.log_filter()).context("--log-level")?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cfg.log_format {
        // One JSON object per line; the event's fields (`message`, `node_id`, ...) stay nested
        // under `fields`, because flattening them would let a field named `target` or `level`
        // collide with the line's own keys.
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    // One thread: tokio's current-thread scheduler, not a one-worker multi-thread one. Both
    // run every task on one thread, but the multi-thread scheduler runs a task woken by the
    // running one next (its LIFO slot): each handler that finishes wakes its connection's
    // task, which then writes that one response before the next handler runs, one `writev`
    // per response. The current-thread scheduler queues it behind the handlers already woken,
    // so the responses a Raft entry completes leave together (a third of the `writev` calls
    // per put at 64 clients): 20 % less server CPU per linearizable get and 25 % more gets,
    // 9-10 % on the queue, 3-17 % less CPU on the write rows; locks and a lone writer
    // unchanged within the rounds' spread (docs/benchmarks.md, "Session 33").
    let mut runtime = if cfg.runtime_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut multi = tokio::runtime::Builder::new_multi_thread();
        // 0 leaves tokio's default: one worker per core, or `TOKIO_WORKER_THREADS`.
        if cfg.runtime_threads > 0 {
            multi.worker_threads(usize::from(cfg.runtime_threads));
        }
        multi
    };
    runtime.enable_all();
    let runtime = runtime.build().context("starting the runtime")?;
    runtime.block_on(run(cfg))
}

/// Runs the member until a signal or a server's end, then shuts it down.
async fn run(cfg: Config) -> anyhow::Result<()> {
    let mut node = picket_server::node::start(cfg).await.context("starting picketd")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let graceful = tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("SIGINT: shutting down");
            true
        }
        _ = term.recv() => {
            tracing::info!("SIGTERM: shutting down");
            true
        }
        res = node.wait() => {
            if let Some(Err(e)) = res {
                tracing::error!(error = %e, "a server stopped");
            }
            false
        }
    };
    if graceful {
        // A leader hands over leadership first (bounded by --shutdown-transfer-timeout).
        node.graceful_shutdown().await;
    } else {
        // A server already stopped (an error, or this member was removed): nothing to hand on.
        node.shutdown().await;
    }
    Ok(())
}
