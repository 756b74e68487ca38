//! `picketd`: parses flags, starts tracing, runs a member until SIGINT/SIGTERM.

use std::io::IsTerminal;

use anyhow::Context;
use clap::Parser;
use picket_server::config::Config;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&cfg.log_level).context("--log-level")?)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let mut node = picket_server::node::start(cfg).await.context("starting picketd")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        res = node.wait() => {
            if let Some(Err(e)) = res {
                tracing::error!(error = %e, "a server stopped");
            }
        }
    }
    node.shutdown().await;
    Ok(())
}
