//! Patroni's etcd3 DCS against a three-member Picket cluster, through the HTTP/JSON gateway:
//! `tests/patroni/patroni_etcd3.py` drives `patroni.dcs.etcd3.Etcd3` as two Patroni nodes would
//! (leader key taken, seen by another node, expired after its holder's process is killed, taken
//! over). Patroni is installed with pip into a virtualenv under the target directory, keyed by
//! its version, so later runs reuse it; PyPI must be reachable for the first run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use picket_tests::{Cluster, ClusterOptions};
use tokio::process::Command;
use tracing::info;

/// The Patroni release the script is written against. `psycopg2-binary`: Patroni imports a
/// PostgreSQL driver even to load its DCS modules; the binary wheel needs no libpq.
const PATRONI: &str = "patroni[etcd3,psycopg2-binary]==4.0.4";
const PATRONI_VERSION: &str = "4.0.4";

/// Bound on creating the virtualenv and installing Patroni (downloads included).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Bound on the script: two TTLs of 10 s and a few bounded waits of 15 s.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

async fn run(what: &str, cmd: &mut Command, timeout: Duration) -> Result<String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .with_context(|| format!("{what}: not done in {timeout:?}"))?
        .with_context(|| format!("{what}: could not start"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// A virtualenv with Patroni, made once per version under the target directory.
async fn patroni_python() -> Result<PathBuf> {
    let python3 = picket_procs::tools::command("python3", "python3")?;
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("patroni-{PATRONI_VERSION}"));
    let python = venv.join("bin/python");
    let check = ["-c", "import patroni.dcs.etcd3"];
    if run("import patroni", Command::new(&python).args(check), INSTALL_TIMEOUT).await.is_ok() {
        return Ok(python);
    }
    info!(venv = %venv.display(), "installing {PATRONI} into a virtualenv");
    // Built beside its final name and renamed, so an interrupted install is never reused.
    let partial = venv.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    let _ = std::fs::remove_dir_all(&venv);
    run(
        "python3 -m venv (Debian: package python3-venv; scripts/setup-deps.sh installs it)",
        Command::new(&python3).arg("-m").arg("venv").arg(&partial),
        INSTALL_TIMEOUT,
    )
    .await?;
    run(
        &format!("pip install {PATRONI}"),
        Command::new(partial.join("bin/pip")).args(["install", "-q", PATRONI]),
        INSTALL_TIMEOUT,
    )
    .await?;
    // The venv's own scripts (pip) keep the partial path in their `#!` line, but only
    // `bin/python` is used from here on, and it finds its packages relative to itself.
    std::fs::rename(&partial, &venv).context("moving the virtualenv into place")?;
    run("import patroni", Command::new(&python).args(check), INSTALL_TIMEOUT).await?;
    Ok(python)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patroni_etcd3_dcs_fails_over_on_picket() -> Result<()> {
    let python = patroni_python().await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("patroni/patroni_etcd3.py");
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let endpoints: Vec<String> = (0..3).map(|i| cluster.endpoint(i)).collect();
    info!(?endpoints, "running Patroni's Etcd3 DCS against the cluster");
    let res = run(
        "patroni_etcd3.py",
        Command::new(&python).arg(&script).arg(endpoints.join(",")),
        SCRIPT_TIMEOUT,
    )
    .await;
    match &res {
        Ok(out) => info!("patroni_etcd3.py:\n{out}"),
        Err(_) => cluster.print_logs(),
    }
    cluster.finish();
    let out = res?;
    if out.lines().last() != Some("OK") {
        bail!("patroni_etcd3.py did not finish with OK:\n{out}");
    }
    Ok(())
}
