//! Running Debian's `etcdctl` (v3.4) against a cluster, with a bounded wait.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::AsyncWriteExt;

/// Where Debian's `etcd-client` package installs `etcdctl`.
pub const ETCDCTL: &str = "/usr/bin/etcdctl";

/// Outer bound on one `etcdctl` run. etcdctl bounds itself with `--dial-timeout` (2 s) and
/// `--command-timeout` (5 s); 30 s only catches a hung process, which is then killed.
pub const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(30);

pub fn available() -> bool {
    Path::new(ETCDCTL).is_file()
}

/// The result of one `etcdctl` run.
#[derive(Debug)]
pub struct CtlOutput {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CtlOutput {
    /// Fails with the command's stderr unless it exited 0.
    pub fn ok(self) -> Result<CtlOutput> {
        if !self.success {
            bail!(
                "etcdctl failed ({:?}): stderr: {} stdout: {}",
                self.code,
                self.stderr,
                self.stdout
            );
        }
        Ok(self)
    }
}

/// An `etcdctl` invocation template for a fixed set of endpoints.
#[derive(Debug, Clone)]
pub struct Etcdctl {
    endpoints: String,
}

impl Etcdctl {
    pub fn new(endpoints: &[String]) -> Etcdctl {
        Etcdctl { endpoints: endpoints.join(",") }
    }

    /// Runs `ETCDCTL_API=3 etcdctl --endpoints <eps> <args>` with `stdin` fed in and closed.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<CtlOutput> {
        let mut cmd = tokio::process::Command::new(ETCDCTL);
        // Clear any ETCDCTL_* settings of the developer's shell so only our flags apply.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&self.endpoints)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("spawning {ETCDCTL}"))?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().context("etcdctl stdin")?;
            pipe.write_all(input.as_bytes()).await.context("writing etcdctl stdin")?;
            // Dropping the pipe closes it, which ends etcdctl's input.
            drop(pipe);
        }
        let out = tokio::time::timeout(ETCDCTL_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| format!("etcdctl {args:?} did not finish within {ETCDCTL_TIMEOUT:?}"))?
            .context("waiting for etcdctl")?;
        Ok(CtlOutput {
            success: out.status.success(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
