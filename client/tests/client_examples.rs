//! Runs the examples under `client/examples/` against a real cluster, the bank example with a
//! worker paused (SIGSTOP) past its lease while it holds locks.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use picket_client::{Compare, CompareOp, LockOptions, Txn, TxnOp};
use picket_procs::signal::Signal;
use picket_tests::{Cluster, ClusterOptions};
use tokio::io::{AsyncBufReadExt, BufReader};
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

/// Runs an example to completion, bounded by `limit`; returns (success, stdout).
async fn run_status(bin: &PathBuf, args: &[&str], limit: Duration) -> Result<(bool, String)> {
    let out = tokio::time::timeout(limit, Command::new(bin).args(args).kill_on_drop(true).output())
        .await
        .with_context(|| format!("{} {args:?} did not finish within {limit:?}", bin.display()))??;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned()))
}

const ACCOUNTS: u64 = 6;

/// The bank example's key for account `i` and its lock name (client/examples/bank.rs).
fn account(i: u64) -> String {
    format!("bank/accounts/{i:03}")
}
fn lock_name(i: u64) -> String {
    format!("bank-locks/{i:03}")
}

/// What one bank run under a pause ended with.
struct BankRun {
    /// `bank check`'s verdict and its line.
    total_kept: bool,
    check: String,
    /// Worker 0's report: `worker 0: done <n> fenced <n> failed <n>`.
    paused_report: String,
}

/// Worker 0 (`--unfenced` when `fenced` is false) is frozen with SIGSTOP at the moment it holds
/// the locks of accounts `a` and `b` and has read their balances (its `--verbose` line says so).
/// While it is frozen, the test itself moves 7 from a third account `c` to `a` under the same
/// locks, which it can only acquire once worker 0's 2 s lease has expired: so the pause outlasts
/// the lease by construction, and `a` changes under the frozen worker, every run. Then worker 0
/// continues and writes the balances it read before the pause. `others` more workers run
/// normal transfers throughout.
async fn bank_under_pause(fenced: bool, others: u64) -> Result<BankRun> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let bank = example("bank")?;
    let eps = cluster.endpoints().join(",");
    let accounts = ACCOUNTS.to_string();
    let common = ["--endpoints", eps.as_str(), "--accounts", &accounts, "--balance", "100"];
    run(&bank, &[&["init"], &common[..]].concat(), Duration::from_secs(30)).await?;

    let mut args0: Vec<&str> = [&["worker"], &common[..]].concat();
    // A long think (1 s) leaves ample time to deliver SIGSTOP after the "holding" line.
    args0.extend([
        "--id",
        "0",
        "--transfers",
        "3",
        "--think-ms",
        "1000",
        "--ttl",
        "2",
        "--verbose",
    ]);
    if !fenced {
        args0.push("--unfenced");
    }
    let mut paused = Command::new(&bank)
        .args(&args0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut workers = Vec::new();
    for id in 1..=others {
        let id = id.to_string();
        let args = [
            &["worker"],
            &common[..],
            &["--id", &id, "--transfers", "25", "--think-ms", "100", "--ttl", "2"],
        ]
        .concat();
        workers.push(
            Command::new(&bank).args(&args).stdout(Stdio::piped()).kill_on_drop(true).spawn()?,
        );
    }

    let mut lines = BufReader::new(paused.stderr.take().context("worker 0 stderr")?).lines();
    // Bounded: the first transfer takes its locks within seconds of the start.
    let holding = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("worker 0: holding ") {
                return Ok(rest.to_string());
            }
        }
        anyhow::bail!("worker 0 ended without holding its locks")
    })
    .await
    .context("worker 0 never held its locks")??;
    let pid = paused.id().context("worker 0 pid")?;
    picket_procs::signal::send(pid, Signal::STOP)?;
    // Drain the rest of its stderr so the worker never blocks on a full pipe.
    let rest = tokio::spawn(async move {
        let mut text = String::new();
        while let Ok(Some(l)) = lines.next_line().await {
            text.push_str(&l);
            text.push('\n');
        }
        text
    });
    let ab: Vec<u64> = holding.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
    let (a, b) = (ab[0], ab[1]);
    let c = (0..ACCOUNTS).find(|i| *i != a && *i != b).context("a third account")?;
    info_line(&format!("worker 0 frozen holding {a} and {b}; moving 7 from {c} to {a}"));

    let client = picket_client::Client::connect(cluster.endpoints()).await?;
    let (first, second) = (a.min(c), a.max(c));
    // Bounded by the lock wait: worker 0's lease (2 s) expires and the leader revokes it.
    let wait = LockOptions::new().ttl(10).timeout(Duration::from_secs(60));
    let g1 = client.lock_with(lock_name(first), wait.clone()).await?;
    let g2 = client.lock_with(lock_name(second), wait).await?;
    let bal = |kv: Option<picket_client::proto::KeyValue>| -> Result<i64> {
        Ok(String::from_utf8_lossy(&kv.context("account")?.value).parse()?)
    };
    let (ba, bc) = (bal(client.get(account(a)).await?)?, bal(client.get(account(c)).await?)?);
    let txn = Txn::new()
        .when([
            Compare::create_revision(g1.key().to_vec(), CompareOp::Equal, g1.token()),
            Compare::create_revision(g2.key().to_vec(), CompareOp::Equal, g2.token()),
        ])
        .and_then([
            TxnOp::put(account(a), (ba + 7).to_string()),
            TxnOp::put(account(c), (bc - 7).to_string()),
        ]);
    ensure!(client.txn(txn).await?.succeeded, "the test's own fenced transfer was refused");
    g2.unlock().await?;
    g1.unlock().await?;
    picket_procs::signal::send(pid, Signal::CONT)?;

    let out = tokio::time::timeout(Duration::from_secs(180), paused.wait_with_output())
        .await
        .context("worker 0 did not finish")??;
    let paused_report = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!("{paused_report}\n{}", rest.await?);
    for w in workers {
        // Bounded: 25 transfers of ~100 ms each, plus lock waits, take well under two minutes.
        let out = tokio::time::timeout(Duration::from_secs(180), w.wait_with_output())
            .await
            .context("worker did not finish")??;
        ensure!(out.status.success(), "worker failed");
        eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
    }
    let (total_kept, check) =
        run_status(&bank, &[&["check"], &common[..]].concat(), Duration::from_secs(30)).await?;
    cluster.finish();
    Ok(BankRun { total_kept, check, paused_report })
}

fn info_line(s: &str) {
    eprintln!("client_examples: {s}");
}

/// `fenced <n>` from a worker's report line.
fn fenced_count(report: &str) -> Result<u64> {
    let words: Vec<&str> = report.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "fenced").with_context(|| report.to_string())?;
    Ok(words.get(i + 1).context("count")?.parse()?)
}

#[tokio::test]
async fn bank_total_survives_a_worker_paused_past_its_lease() -> Result<()> {
    let r = bank_under_pause(true, 2).await?;
    ensure!(r.total_kept && r.check.contains("total 600 (expected 600)"), "{}", r.check);
    // The frozen worker's stale write was refused by its fencing tokens, not merely absent.
    ensure!(fenced_count(&r.paused_report)? >= 1, "{}", r.paused_report);
    Ok(())
}

/// The control: the same pause without fencing loses money (the frozen worker overwrites the
/// test's transfer with the balances it read before the pause), so the test above can fail.
#[tokio::test]
async fn bank_without_fencing_loses_money_under_the_same_pause() -> Result<()> {
    let r = bank_under_pause(false, 0).await?;
    ensure!(!r.total_kept, "the unfenced worker kept the total: {}", r.check);
    ensure!(r.check.contains("total 593 (expected 600)"), "{}", r.check);
    ensure!(fenced_count(&r.paused_report)? == 0, "{}", r.paused_report);
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
