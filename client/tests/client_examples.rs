//! Runs the examples under `client/examples/` against a real cluster, the bank example with a
//! worker paused (SIGSTOP) past its lease while it holds locks.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use picket_tests::{Cluster, ClusterOptions};
use tokio::process::Command;

/// `target/<profile>/examples/<name>`, built by `cargo build --workspace --all-targets`.
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

/// Runs an example to completion, bounded by `limit`; returns its stdout.
async fn run(bin: &PathBuf, args: &[&str], limit: Duration) -> Result<String> {
    let out = tokio::time::timeout(limit, Command::new(bin).args(args).kill_on_drop(true).output())
        .await
        .with_context(|| format!("{} {args:?} did not finish within {limit:?}", bin.display()))??;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{} {args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
        bin.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let ok =
        std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status()?;
    ensure!(ok.success(), "kill -{sig} {pid}");
    Ok(())
}

#[tokio::test]
async fn bank_total_survives_a_worker_paused_past_its_lease() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let bank = example("bank")?;
    let eps = cluster.endpoints().join(",");
    let common = ["--endpoints", eps.as_str(), "--accounts", "6", "--balance", "100"];
    run(&bank, &[&["init"], &common[..]].concat(), Duration::from_secs(30)).await?;

    let mut workers = Vec::new();
    for id in 0..3 {
        let id = id.to_string();
        let args = [
            &["worker"],
            &common[..],
            &["--id", &id, "--transfers", "25", "--think-ms", "100", "--ttl", "2"],
        ]
        .concat();
        workers.push(
            Command::new(&bank)
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()?,
        );
    }
    // Let worker 0 get going, then freeze it for longer than its 2 s lease: its locks expire
    // and pass to the others while it still believes it holds them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pid = workers[0].id().context("worker 0 pid")?;
    signal(pid, "STOP")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    signal(pid, "CONT")?;

    let mut report = Vec::new();
    for w in workers {
        // Bounded: 25 transfers of ~100 ms each, plus lock waits, take well under two minutes.
        let out = tokio::time::timeout(Duration::from_secs(180), w.wait_with_output())
            .await
            .context("worker did not finish")??;
        ensure!(out.status.success(), "worker failed: {}", String::from_utf8_lossy(&out.stderr));
        report.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    eprintln!("{}", report.join("\n"));
    let check = run(&bank, &[&["check"], &common[..]].concat(), Duration::from_secs(30)).await?;
    ensure!(check.contains("total 600 (expected 600)"), "{check}");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn election_and_registry_examples_run() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let eps = cluster.endpoint(0);
    let election = example("election")?;
    let args_a = ["--endpoints", &eps, "--name", "a", "--rounds", "1"];
    let args_b = ["--endpoints", &eps, "--name", "b", "--rounds", "1"];
    let a = run(&election, &args_a, Duration::from_secs(60));
    let b = run(&election, &args_b, Duration::from_secs(60));
    let (a, b) = tokio::join!(a, b);
    let (a, b) = (a?, b?);
    ensure!(a.contains("a: elected") && b.contains("b: elected"), "{a}\n{b}");

    let registry = example("registry")?;
    let watch_args = ["--endpoints", &eps, "watch", "--service", "api", "--seconds", "4"];
    let watcher = run(&registry, &watch_args, Duration::from_secs(30));
    let register = async {
        // Registers after the watcher has read the initial (empty) set.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        run(
            &registry,
            &[
                "--endpoints",
                &eps,
                "register",
                "--service",
                "api",
                "--addr",
                "10.0.0.5:80",
                "--seconds",
                "1",
            ],
            Duration::from_secs(30),
        )
        .await
    };
    let (w, r) = tokio::join!(watcher, register);
    let (w, r) = (w?, r?);
    ensure!(r.contains("deregistered"), "{r}");
    ensure!(w.contains("10.0.0.5:80"), "watcher saw the instance: {w}");
    ensure!(w.trim_end().ends_with("{}"), "watcher saw it leave: {w}");
    cluster.finish();
    Ok(())
}
