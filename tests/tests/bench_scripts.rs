//! The side-by-side benchmark scripts refuse to measure a cluster they did not start, and each
//! runs every row on both sides back to back, in an order that flips every round: Picket and
//! etcd, the two builds of `bench-vs-etcd.sh`'s A/B mode, Picket and RabbitMQ
//! (`bench-queue.sh`).
//!
//! `scripts/bench-vs-etcd.sh` starts its clusters on fixed ports and waits until something on
//! those ports answers. A second run started while the first was still going (session 46,
//! docs/benchmarks.md) had its members fail to bind, while the first run's members answered
//! its health checks and then its load: a whole round measured another run's clusters and
//! went into the medians. The scripts now check their ports before they start anything.

use std::ffi::OsStr;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use picket_procs::signal::{self, Signal};
use picket_tests::binary::picketd_bin;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

/// The client port of the second Picket member `bench-vs-etcd.sh` starts (its base port 21000,
/// member n2 at base + 20).
const TAKEN_PORT: u16 = 21020;

/// Bound on the script: with the check it stops before starting a member (seconds); without it,
/// it started both clusters and waited up to 30 s for a write and 10 s per member to answer.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Bound on the two-round runs below: two rounds of two clusters (debug members, or etcd), each
/// brought up (up to 30 s for a write and 10 s per member) and two 1 s rows run on both; 25-35 s
/// on an idle 2-core machine, so the bound leaves room for a loaded CI machine without hiding a
/// hang.
const AB_TIMEOUT: Duration = Duration::from_secs(400);

/// Where the A/B test's clusters live: away from the default ports (21000, 22000) that the
/// port test above holds one of and a developer's own run may be using, from bench-mixed's
/// (23000) and bench-queue's (25000, 26000), and below the test port range (24000-32000).
const AB_BASE_PORT: &str = "19000";

/// The same for the run against etcd (its clusters at 19500 and 20500).
const VS_ETCD_BASE_PORT: &str = "19500";

/// Where the queue test's clusters live: Picket at 19200, RabbitMQ at 20200 (its epmd at 20202,
/// its CLI's distribution ports 20250-20260), away from the ports above and out of the test port
/// range.
const QUEUE_BASE_PORT: &str = "19200";

/// Bound on the queue run: a three-node RabbitMQ cluster booted and joined (a dozen CLI calls,
/// each an Erlang VM of a second or more), four debug Picket clusters and eight 1 s rows; 36-39 s
/// on this 2-core machine, so the bound leaves room for a loaded CI machine without hiding a
/// hang.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the per-member CPU test's cluster lives (19310-19331), away from the ports above.
const PER_MEMBER_BASE_PORT: &str = "19300";

/// The script most tests here run.
const VS_ETCD: &str = "scripts/bench-vs-etcd.sh";

/// How long a script given SIGTERM has to kill its members (each exits within 10 s of SIGKILL,
/// `bench-lib.sh`'s `kill_members`) before the test returns and drops it.
const TERM_GRACE: Duration = Duration::from_secs(15);

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// Reads a child's pipe to its end in a task of its own (the pipe closes when the script and
/// everything it started have exited).
fn read_all<R: AsyncRead + Unpin + Send + 'static>(
    pipe: Option<R>,
) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf).await;
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Runs `script` (a bench script's path from the project root) with the given arguments and
/// environment (on top of `BENCH_NO_BUILD=1` and the debug build's picketd and picket-bench),
/// bounded by `bound`; returns whether it succeeded, its stdout and its stderr.
async fn run_bench_script(
    script: &str,
    args: &[&str],
    env: &[(&str, &OsStr)],
    bound: Duration,
) -> Result<(bool, String, String)> {
    let picketd = picketd_bin()?;
    let bench = picketd.with_file_name("picket-bench");
    anyhow::ensure!(
        bench.is_file(),
        "picket-bench not found at {}: run `cargo build --workspace --bins` first",
        bench.display()
    );
    let mut cmd = Command::new(script);
    cmd.args(args)
        .current_dir(project_root())
        .env("BENCH_NO_BUILD", "1")
        .env("PICKETD_BIN", &picketd)
        .env("BENCH_BIN", &bench)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().with_context(|| format!("could not run {script}"))?;
    let pid = child.id().context("the script has no PID")?;
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    let status = match tokio::time::timeout(bound, child.wait()).await {
        Ok(status) => status.with_context(|| format!("waiting for {script}"))?,
        Err(_) => {
            // SIGTERM first: the script's trap then kills, by PID, the members it started,
            // which the SIGKILL of `kill_on_drop` would leave running on the bench's ports.
            let _ = signal::send(pid, Signal::TERM);
            let _ = tokio::time::timeout(TERM_GRACE, child.wait()).await;
            anyhow::bail!("{script} did not stop within {bound:?}");
        }
    };
    // Bounded: the pipes close once the script has exited, unless something it started
    // outlived it holding them, which is itself a failure.
    let left_open = "the script's output stayed open after it exited";
    let stdout = tokio::time::timeout(TERM_GRACE, stdout).await.context(left_open)??;
    let stderr = tokio::time::timeout(TERM_GRACE, stderr).await.context(left_open)??;
    Ok((status.success(), stdout, stderr))
}

#[tokio::test]
async fn bench_vs_etcd_refuses_ports_already_in_use() -> Result<()> {
    // Held for the whole test. If something else holds the port already, the script must
    // refuse it all the same, so that is no reason to stop here.
    let _held = TcpListener::bind(("127.0.0.1", TAKEN_PORT)).ok();
    let (success, stdout, stderr) =
        run_bench_script(VS_ETCD, &["1", "1"], &[], SCRIPT_TIMEOUT).await?;
    anyhow::ensure!(!success, "the script ran with port {TAKEN_PORT} taken:\n{stdout}\n{stderr}");
    anyhow::ensure!(
        stderr.contains(&TAKEN_PORT.to_string()) && stderr.contains("already in use"),
        "the script failed without naming the taken port {TAKEN_PORT}:\n{stdout}\n{stderr}"
    );
    anyhow::ensure!(
        !stdout.contains("# round 1 fresh clusters"),
        "the script started a round's clusters before it refused:\n{stdout}\n{stderr}"
    );
    Ok(())
}

/// The kinds of the rows' lines (`picket`, and `etcd`, `rabbitmq` or in an A/B run `picket-b`)
/// in the order each round printed them, round by round.
fn kinds_by_round(stdout: &str) -> Vec<Vec<&str>> {
    let mut rounds: Vec<Vec<&str>> = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("# round ") && line.contains("(load average") {
            rounds.push(Vec::new());
        } else if let (Some(kind), Some(round)) =
            (line.split_whitespace().next(), rounds.last_mut())
        {
            if line.contains("workload=")
                && ["picket", "picket-b", "etcd", "rabbitmq"].contains(&kind)
            {
                round.push(kind);
            }
        }
    }
    rounds
}

#[tokio::test]
async fn bench_ab_runs_both_builds_back_to_back_in_alternating_order() -> Result<()> {
    // B is a wrapper that notes each member it starts and then runs the same picketd: the run
    // must start B's members from the binary it was given, not A's (or etcd).
    let dir = tempfile::tempdir()?;
    let marker = dir.path().join("b-started");
    let wrapper = dir.path().join("picketd-b");
    let picketd = picketd_bin()?;
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            marker.display(),
            picketd.display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let env = [
        ("BENCH_B_PICKETD", wrapper.as_os_str()),
        ("BENCH_BASE_PORT", OsStr::new(AB_BASE_PORT)),
        ("BENCH_ONLY", OsStr::new("put-1 lease-hold")),
    ];
    let (success, stdout, stderr) =
        run_bench_script(VS_ETCD, &["1", "2"], &env, AB_TIMEOUT).await?;
    anyhow::ensure!(success, "the A/B run failed:\n{stdout}\n{stderr}");
    anyhow::ensure!(!stdout.contains("failed (exit"), "a row failed:\n{stdout}\n{stderr}");

    // Three B members per round, each started through the wrapper, on the moved ports.
    let started = std::fs::read_to_string(&marker).context("B's binary never ran")?;
    anyhow::ensure!(
        started.lines().count() == 6 && started.lines().all(|l| l.contains("127.0.0.1:2001")),
        "B's members were not started from BENCH_B_PICKETD on base port 20000:\n{started}"
    );
    check_paired_rounds(&stdout, "picket", "picket-b", "B")
}

/// Checks that a two-round run of two rows ran each row on both sides back to back, `first`
/// first in round 1 and `second` first in round 2.
fn check_turns(stdout: &str, first: &str, second: &str) -> Result<()> {
    let round1 = [first, second, first, second];
    let round2 = [second, first, second, first];
    let rounds = kinds_by_round(stdout);
    anyhow::ensure!(
        rounds == [round1.to_vec(), round2.to_vec()],
        "rows not run {first} then {second} in round 1 and the other way in round 2 \
         ({rounds:?}):\n{stdout}"
    );
    Ok(())
}

/// Checks a two-round run of the rows put-1 and lease-hold: each row ran on both sides back to
/// back, `first` first in round 1 and `second` first in round 2, and both summary tables have
/// their row, headed by `main_label` (the side the ratios put on top).
fn check_paired_rounds(stdout: &str, first: &str, second: &str, main_label: &str) -> Result<()> {
    check_turns(stdout, first, second)?;
    anyhow::ensure!(
        stdout.contains(&format!("| workload | rounds | {main_label} ops/s"))
            && stdout.contains("\n| put-1 | 2 |"),
        "no summary row for put-1:\n{stdout}"
    );
    anyhow::ensure!(
        stdout.contains(&format!("| latency row | rounds | {main_label} p50 ms"))
            && stdout.contains("\n| lease-hold | 2 |"),
        "no summary row for lease-hold:\n{stdout}"
    );
    Ok(())
}

#[tokio::test]
async fn bench_vs_etcd_alternates_which_server_runs_first() -> Result<()> {
    let env = [
        ("BENCH_BASE_PORT", OsStr::new(VS_ETCD_BASE_PORT)),
        ("BENCH_ONLY", OsStr::new("put-1 lease-hold")),
    ];
    let (success, stdout, stderr) =
        run_bench_script(VS_ETCD, &["1", "2"], &env, AB_TIMEOUT).await?;
    anyhow::ensure!(success, "the run failed:\n{stdout}\n{stderr}");
    anyhow::ensure!(!stdout.contains("failed (exit"), "a row failed:\n{stdout}\n{stderr}");
    check_paired_rounds(&stdout, "picket", "etcd", "Picket")
}

#[tokio::test]
async fn bench_vs_etcd_refuses_a_base_port_that_is_not_a_port() -> Result<()> {
    for bad in ["abc", "80", "70000"] {
        let env = [("BENCH_BASE_PORT", OsStr::new(bad))];
        let (success, stdout, stderr) =
            run_bench_script(VS_ETCD, &["1", "1"], &env, SCRIPT_TIMEOUT).await?;
        anyhow::ensure!(!success, "the script ran with BENCH_BASE_PORT={bad}:\n{stdout}\n{stderr}");
        anyhow::ensure!(
            stderr.contains(&format!("BENCH_BASE_PORT={bad} is not a port number")),
            "the script failed without naming BENCH_BASE_PORT={bad}:\n{stdout}\n{stderr}"
        );
        anyhow::ensure!(
            !stdout.contains("# round 1"),
            "the script started a round before it refused:\n{stdout}\n{stderr}"
        );
    }
    Ok(())
}

/// `bench-queue.sh` ran Picket first in every round, so RabbitMQ always ran right after Picket's
/// load (session 48's closing note). Each row now runs on both back to back, in an order that
/// flips every round, on ports BENCH_BASE_PORT moves out of the test port range.
#[tokio::test]
async fn bench_queue_alternates_which_server_runs_first() -> Result<()> {
    let env = [("BENCH_BASE_PORT", OsStr::new(QUEUE_BASE_PORT))];
    let (success, stdout, stderr) =
        run_bench_script("scripts/bench-queue.sh", &["1", "2"], &env, QUEUE_TIMEOUT).await?;
    anyhow::ensure!(success, "the run failed:\n{stdout}\n{stderr}");
    anyhow::ensure!(!stdout.contains("failed (exit"), "a row failed:\n{stdout}\n{stderr}");
    check_turns(&stdout, "picket", "rabbitmq")?;
    for row in ["cycle-1", "cycle-16"] {
        anyhow::ensure!(
            stdout.contains(&format!("\n| {row} | 2 |")),
            "no summary row for {row}:\n{stdout}"
        );
    }
    Ok(())
}

/// `per-member-cpu.sh` ran its members with tokio's default runtime (a worker per core) while
/// every bench runs them with one (`--runtime-threads 1`), summed threads that share a name
/// without saying how many, and could not pass the queue bench's flags, so session 49's first
/// queue figures came through a copy of it and described another layout. It now runs members as
/// the benches do, shows each name's thread count, and passes BENCH_ARGS to the bench. On the
/// old script this failed: its members had `tokio-rt-worker` threads.
#[tokio::test]
async fn per_member_cpu_runs_members_as_the_benches_do_and_passes_bench_args() -> Result<()> {
    let picketd = picketd_bin()?;
    let picketd = picketd.to_str().context("picketd's path is not UTF-8")?;
    let args = [picketd, "queue-overlap", "2", "2", "1"];
    let script = "scripts/per-member-cpu.sh";
    let run = |bench_args: &'static str| {
        let env = [
            ("BENCH_BASE_PORT", OsStr::new(PER_MEMBER_BASE_PORT)),
            ("BENCH_ARGS", OsStr::new(bench_args)),
        ];
        async move { run_bench_script(script, &args, &env, SCRIPT_TIMEOUT).await }
    };
    let (success, stdout, stderr) = run("--prefill 2 --value-size 64 --queue per-member").await?;
    anyhow::ensure!(success, "the run failed:\n{stdout}\n{stderr}");
    anyhow::ensure!(
        stdout.contains("workload=QueueOverlap") && stdout.contains(" errors=0 "),
        "no clean queue-overlap run:\n{stdout}\n{stderr}"
    );
    let members = stdout.lines().filter(|l| l.contains(" us CPU/op, ")).count();
    anyhow::ensure!(members == 3, "{members} members reported, not 3:\n{stdout}");
    // One runtime worker is tokio's current-thread scheduler: no worker pool at all.
    anyhow::ensure!(
        !stdout.contains("tokio-rt-worker"),
        "members ran a tokio worker pool, not the benches' one runtime worker:\n{stdout}"
    );
    let flushers = stdout.lines().filter(|l| l.contains("raft-log-flush") && l.contains(" x1 "));
    anyhow::ensure!(flushers.count() == 3, "no thread count per name:\n{stdout}");

    // A flag picket-bench does not know fails the run: BENCH_ARGS reaches the bench.
    let (success, stdout, stderr) = run("--no-such-flag").await?;
    anyhow::ensure!(!success, "BENCH_ARGS did not reach the bench:\n{stdout}\n{stderr}");
    Ok(())
}
