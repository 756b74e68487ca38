//! `picketd --config-file` with a real process (issue 10): a member configured only by a YAML
//! file with etcd's keys serves, a flag on the command line overrides the file, and a file with
//! a key that is not a flag fails at once with a message naming the key.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use picket_tests::binary::picketd_bin;
use picket_tests::cluster::connect;
use picket_tests::eventually;
use tracing::info;

/// How long a single member may take to elect itself and serve on a loaded machine.
const READY: Duration = Duration::from_secs(30);
/// How long a misconfigured picketd may take to exit (it fails before touching the disk).
const EXIT: Duration = Duration::from_secs(30);

/// Kills the process when the test ends, however it ends.
struct Member(Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_configured_by_file_serves_and_flags_override_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let file = dir.path().join("picket.yaml");
    write(
        &file,
        &format!(
            "# etcd-style configuration\n\
             name: from-file\n\
             data-dir: {data}\n\
             listen-client-urls: {client_url}\n\
             advertise-client-urls: [{client_url}]\n\
             listen-peer-urls: {peer_url}\n\
             initial-advertise-peer-urls: {peer_url}\n\
             initial-cluster: from-file={peer_url}\n\
             initial-cluster-state: new\n\
             snapshot-count: 1000\n\
             quota-backend-bytes: 1048576\n\
             max-txn-ops:\n",
            data = dir.path().join("data").display()
        ),
    )?;
    let stderr = std::fs::File::create(dir.path().join("stderr.log"))?;
    info!("phase: start picketd with --config-file and one overriding flag");
    let _member = Member(
        Command::new(picketd_bin()?)
            .arg("--config-file")
            .arg(&file)
            .args(["--quota-backend-bytes", "2097152"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("spawning picketd")?,
    );
    let mut client = eventually("the member serves", READY, || async {
        let mut c = connect(&client_url, Duration::from_secs(5)).await?;
        c.put("cfg/k", "v", None).await?;
        Ok(c)
    })
    .await
    .with_context(|| std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default())?;
    let got = client.get("cfg/k", None).await?;
    ensure!(got.kvs().first().map(|kv| kv.value()) == Some(&b"v"[..]), "read back {got:?}");
    let status = client.status().await?;
    ensure!(
        status.db_size_quota() == 2_097_152,
        "the command line should override the file's quota, Status says {}",
        status.db_size_quota()
    );
    ensure!(dir.path().join("data").is_dir(), "the file's data-dir was not used");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_with_an_unknown_key_fails_naming_the_key() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("bad.yaml");
    write(&file, "name: x\nenable-v2: true\n")?;
    let mut child = Command::new(picketd_bin()?)
        .arg("--config-file")
        .arg(&file)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning picketd")?;
    let status = eventually("picketd exits", EXIT, || {
        let r = child.try_wait();
        async move { r?.context("still running") }
    })
    .await;
    if status.is_err() {
        let _ = child.kill();
    }
    let status = status?;
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!status.success(), "picketd accepted an unknown key; stderr: {stderr}");
    ensure!(
        stderr.contains("unknown key \"enable-v2\"") && stderr.contains("bad.yaml"),
        "the error should name the key and the file: {stderr}"
    );
    ensure!(!dir.path().join("x.picket").exists(), "a data dir was created before the error");
    Ok(())
}
