//! `picket lock` and `picket elect` as processes against a real cluster, including a lock
//! revoked while its command runs.

mod common;

use anyhow::{ensure, Context, Result};
use common::{picket, run, Running};
use picket_tests::{Cluster, ClusterOptions};
use tracing::info;

/// A child that reports SIGTERM and then exits 0, and otherwise runs until stopped.
const TRAPPING_CHILD: &str = r#"echo "running $PICKET_LOCK_KEY $PICKET_FENCING_TOKEN"; trap "echo got-term; exit 0" TERM; while true; do sleep 0.1; done"#;

#[tokio::test]
async fn lock_runs_a_command_and_passes_its_exit_code() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();

    info!("the command sees the key and token; its exit code comes back");
    let out = run(
        &eps,
        &[
            "lock",
            "jobs",
            "-w",
            "json",
            "--",
            "sh",
            "-c",
            "echo $PICKET_LOCK_KEY $PICKET_FENCING_TOKEN; exit 3",
        ],
    )
    .await?
    .expect_code(3)?;
    let mut lines = out.stdout.lines();
    let grant: serde_json::Value = serde_json::from_str(lines.next().context("grant line")?)?;
    let key = grant["key"].as_str().context("key")?;
    ensure!(key.starts_with("jobs/"), "{grant}");
    ensure!(lines.next() == Some(format!("{key} {}", grant["token"]).as_str()), "{out:?}");
    run(&eps, &["get", "jobs/", "--prefix", "--count-only", "-w", "simple"])
        .await?
        .ok()
        .map(|o| assert_eq!(o.stdout.trim(), "0", "released when the command exited"))?;

    info!("a holder without a command; --try and --timeout give up with exit 4");
    let mut holder = Running::spawn(picket(&eps, &["lock", "jobs", "-w", "simple"]))?;
    let held_key = holder.line().await?;
    let token: i64 = holder.line().await?.parse()?;
    holder.stderr_until("holding the lock").await?;
    let out = run(&eps, &["lock", "jobs", "--try", "--", "true"]).await?.expect_code(4)?;
    ensure!(out.stderr.contains(&format!("held by {held_key} (fencing token {token})")), "{out:?}");
    let mut waiter = Running::spawn(picket(&eps, &["lock", "jobs", "--timeout", "2s"]))?;
    let seen = waiter.stderr_until("waiting for lock jobs: held by").await?;
    ensure!(seen.last().is_some_and(|l| l.contains(&held_key)), "{seen:?}");
    ensure!(waiter.exit_code().await? == 4, "--timeout ran out");

    info!("a waiter gets the lock with a larger token once the holder is interrupted");
    let mut next =
        Running::spawn(picket(&eps, &["lock", "jobs", "-w", "json", "--", "echo", "second"]))?;
    next.stderr_until("waiting for lock jobs").await?;
    holder.interrupt()?;
    ensure!(holder.exit_code().await? == 0, "Ctrl-C releases and exits 0");
    let grant: serde_json::Value = serde_json::from_str(&next.line().await?)?;
    ensure!(grant["token"].as_i64().context("token")? > token, "tokens grow: {grant}");
    ensure!(next.line().await? == "second", "the command ran");
    ensure!(next.exit_code().await? == 0, "exit code of echo");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn lock_lost_mid_run_terminates_the_command() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();

    info!("a command that traps SIGTERM runs under the lock");
    let mut locked = Running::spawn(picket(
        &eps,
        &["lock", "guarded", "-w", "json", "--kill-grace", "30s", "--", "sh", "-c", TRAPPING_CHILD],
    ))?;
    let grant: serde_json::Value = serde_json::from_str(&locked.line().await?)?;
    let lease = grant["lease"].as_str().context("lease")?.to_string();
    let running = locked.line().await?;
    ensure!(
        running == format!("running {} {}", grant["key"].as_str().unwrap_or(""), grant["token"]),
        "{running}"
    );

    info!("revoking the lease from outside loses the lock");
    run(&eps, &["lease", "revoke", &lease]).await?.ok()?;
    ensure!(locked.line().await? == "got-term", "the child got SIGTERM");
    let code = locked.exit_code().await?;
    ensure!(code == 7, "lock lost exits 7, got {code}");
    let notes = locked.stderr_until("lost while the command ran").await?;
    ensure!(notes.iter().any(|l| l.contains("sending SIGTERM")), "{notes:?}");

    info!("a child that ignores SIGTERM is killed after the grace period");
    let mut stubborn = Running::spawn(picket(
        &eps,
        &[
            "lock",
            "guarded",
            "-w",
            "json",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            r#"trap "echo ignoring-term" TERM; echo up; while true; do sleep 0.1; done"#,
        ],
    ))?;
    let grant: serde_json::Value = serde_json::from_str(&stubborn.line().await?)?;
    ensure!(stubborn.line().await? == "up", "child started");
    run(&eps, &["lease", "revoke", grant["lease"].as_str().context("lease")?]).await?.ok()?;
    ensure!(stubborn.line().await? == "ignoring-term", "SIGTERM first");
    ensure!(stubborn.exit_code().await? == 7, "lock lost");
    stubborn.stderr_until("sending SIGKILL").await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn elect_and_listen() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();

    let mut listener = Running::spawn(picket(&eps, &["elect", "--listen", "svc", "-w", "json"]))?;
    listener.stderr_until("observing election svc").await?;
    let mut first = Running::spawn(picket(&eps, &["elect", "svc", "alpha", "-w", "simple"]))?;
    let key = first.line().await?;
    ensure!(key.starts_with("svc/") && first.line().await? == "alpha", "elected");
    let mut second = Running::spawn(picket(&eps, &["elect", "svc", "beta", "-w", "simple"]))?;
    second.stderr_until("current leader").await?;
    let seen: serde_json::Value = serde_json::from_str(&listener.line().await?)?;
    ensure!(seen["value"] == "alpha", "{seen}");

    info!("the leader resigns on Ctrl-C; the next candidate takes over");
    first.interrupt()?;
    ensure!(first.exit_code().await? == 0, "resigned cleanly");
    ensure!(
        second.line().await?.starts_with("svc/") && second.line().await? == "beta",
        "second elected"
    );
    let seen: serde_json::Value = serde_json::from_str(&listener.line().await?)?;
    ensure!(seen["value"] == "beta", "{seen}");
    second.interrupt()?;
    ensure!(second.exit_code().await? == 0, "resigned cleanly");
    listener.interrupt()?;
    ensure!(listener.exit_code().await? == 0, "listener stops on Ctrl-C");
    run(&eps, &["elect", "svc"]).await?.expect_code(2)?;
    cluster.finish();
    Ok(())
}
