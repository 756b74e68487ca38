//! The side-by-side benchmark scripts refuse to measure a cluster they did not start.
//!
//! `scripts/bench-vs-etcd.sh` starts its clusters on fixed ports and waits until something on
//! those ports answers. A second run started while the first was still going (session 46,
//! docs/benchmarks.md) had its members fail to bind, while the first run's members answered
//! its health checks and then its load: a whole round measured another run's clusters and
//! went into the medians. The scripts now check their ports before they start anything.

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

#[tokio::test]
async fn bench_vs_etcd_refuses_ports_already_in_use() -> Result<()> {
    // Held for the whole test. If something else holds the port already, the script must
    // refuse it all the same, so that is no reason to stop here.
    let _held = TcpListener::bind(("127.0.0.1", TAKEN_PORT)).ok();
    let picketd = picketd_bin()?;
    let bench = picketd.with_file_name("picket-bench");
    anyhow::ensure!(
        bench.is_file(),
        "picket-bench not found at {}: run `cargo build --workspace --bins` first",
        bench.display()
    );
    let mut cmd = Command::new("scripts/bench-vs-etcd.sh");
    cmd.args(["1", "1"])
        .current_dir(project_root())
        .env("BENCH_NO_BUILD", "1")
        .env("PICKETD_BIN", &picketd)
        .env("BENCH_BIN", &bench)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("could not run scripts/bench-vs-etcd.sh")?;
    let pid = child.id().context("the script has no PID")?;
    let stdout = read_all(child.stdout.take());
    let stderr = read_all(child.stderr.take());
    let status = match tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await {
        Ok(status) => status.context("waiting for scripts/bench-vs-etcd.sh")?,
        Err(_) => {
            // SIGTERM first: the script's trap then kills, by PID, the members it started,
            // which the SIGKILL of `kill_on_drop` would leave running on the bench's ports.
            let _ = signal::send(pid, Signal::TERM);
            let _ = tokio::time::timeout(TERM_GRACE, child.wait()).await;
            anyhow::bail!("bench-vs-etcd.sh did not stop within {SCRIPT_TIMEOUT:?}");
        }
    };
    // Bounded: the pipes close once the script has exited, unless something it started
    // outlived it holding them, which is itself a failure.
    let left_open = "the script's output stayed open after it exited";
    let stdout = tokio::time::timeout(TERM_GRACE, stdout).await.context(left_open)??;
    let stderr = tokio::time::timeout(TERM_GRACE, stderr).await.context(left_open)??;
    anyhow::ensure!(
        !status.success(),
        "the script ran with port {TAKEN_PORT} taken:\n{stdout}\n{stderr}"
    );
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
