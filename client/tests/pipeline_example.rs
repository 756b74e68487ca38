//! Runs `client/examples/pipeline.rs` (producers -> queue -> workers with locks and fenced
//! writes -> ledger -> durable subscription) against a real three-member cluster and checks
//! that it reports conserved totals and a complete, duplicate-free ledger replay.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use picket_tests::{Cluster, ClusterOptions};
use tokio::process::Command;

/// `target/<profile>/examples/pipeline`, built by `cargo build --workspace --all-targets`.
fn example(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().and_then(|d| d.parent()).context("test executable location")?;
    let bin = dir.join("examples").join(name);
    ensure!(
        bin.is_file(),
        "{} not built: run `cargo build --workspace --all-targets`",
        bin.display()
    );
    Ok(bin)
}

#[tokio::test]
async fn pipeline_conserves_money_and_replays_the_whole_ledger() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let bin = example("pipeline")?;
    let eps = cluster.endpoints().join(",");
    let args = [
        "--endpoints",
        eps.as_str(),
        "--accounts",
        "5",
        "--transfers",
        "24",
        "--producers",
        "2",
        "--workers",
        "3",
        "--timeout-secs",
        "90",
    ];
    // The example bounds itself at 90 s; this outer bound only catches a hung process, which
    // kill_on_drop then ends.
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(&bin).args(args).kill_on_drop(true).output(),
    )
    .await
    .context("pipeline example did not finish")??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(out.status.success(), "pipeline failed: {}\n{stdout}\n{stderr}", out.status);
    println!("{stdout}");
    ensure!(stdout.contains("jobs 24: applied "), "{stdout}");
    ensure!(stdout.contains("ledger replayed: 24 entries"), "{stdout}");
    ensure!(stdout.contains("total 500 conserved; replayed balances match"), "{stdout}");

    // The run cleaned up its group, so it holds no compaction back.
    let client = picket_client::Client::connect(cluster.endpoints()).await?;
    ensure!(client.list_groups().await?.is_empty(), "the example left its group behind");
    cluster.finish();
    Ok(())
}
