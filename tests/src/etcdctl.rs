//! Running Debian's `etcdctl` (v3.4) against a cluster, with a bounded wait.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Outer bound on one `etcdctl` run. etcdctl bounds itself with `--dial-timeout` (2 s) and
/// `--command-timeout` (5 s); 30 s only catches a hung process, which is then killed.
pub const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(30);

/// `etcdctl` on `PATH` (Debian's `etcd-client`), or an error naming the package. Every test
/// that runs etcdctl fails with it when etcdctl is missing; none passes by skipping.
pub fn path() -> Result<PathBuf> {
    Ok(picket_procs::tools::etcdctl()?)
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

    /// The command for `args`; fails (naming the package) when etcdctl is not installed.
    fn command(&self, args: &[&str]) -> Result<tokio::process::Command> {
        let mut cmd = tokio::process::Command::new(path()?);
        // Clear any ETCDCTL_* settings of the developer's shell so only our flags apply.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("ETCDCTL_API", "3").arg("--endpoints").arg(&self.endpoints).args(args);
        Ok(cmd)
    }

    /// Starts a long-running `etcdctl` (`watch`, `lock`, `elect`, `lease keep-alive`) whose
    /// stdout is read line by line; see [`CtlChild`]. The process is killed when the handle is
    /// dropped.
    pub fn spawn(&self, args: &[&str]) -> Result<CtlChild> {
        let mut child = self
            .command(args)?
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning etcdctl {args:?}"))?;
        let stdout = child.stdout.take().context("etcdctl stdout")?;
        let mut stderr_pipe = child.stderr.take().context("etcdctl stderr")?;
        let (line_tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if line_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Ok(CtlChild { args: args.iter().map(|a| a.to_string()).collect(), child, lines, stderr })
    }

    /// Runs `ETCDCTL_API=3 etcdctl --endpoints <eps> <args>` with `stdin` fed in and closed.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<CtlOutput> {
        let mut cmd = self.command(args)?;
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("spawning etcdctl")?;
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

/// A running `etcdctl` whose stdout lines are collected as they are printed.
pub struct CtlChild {
    args: Vec<String>,
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    stderr: Arc<Mutex<String>>,
}

impl CtlChild {
    /// The next line of stdout, waiting at most `timeout`.
    pub async fn next_line(&mut self, timeout: Duration) -> Result<String> {
        match tokio::time::timeout(timeout, self.lines.recv()).await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => {
                bail!("etcdctl {:?} closed stdout (exited?); stderr: {}", self.args, self.stderr())
            }
            Err(_) => bail!(
                "etcdctl {:?} printed no line within {timeout:?}; stderr: {}",
                self.args,
                self.stderr()
            ),
        }
    }

    /// The next `n` lines of stdout, each within `timeout`.
    pub async fn next_lines(&mut self, n: usize, timeout: Duration) -> Result<Vec<String>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            match self.next_line(timeout).await {
                Ok(l) => out.push(l),
                Err(e) => bail!("{e:#}; lines so far: {out:?}"),
            }
        }
        Ok(out)
    }

    /// Lines printed so far and not yet read, without waiting.
    pub fn pending_lines(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(l) = self.lines.try_recv() {
            out.push(l);
        }
        out
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The process id (for signals), if it is still running.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGINT, as Ctrl-C would: etcdctl then unlocks, resigns or stops watching cleanly.
    pub async fn interrupt(&self) -> Result<()> {
        let pid = self.id().context("etcdctl already exited")?;
        let status = tokio::process::Command::new("kill")
            .arg("-INT")
            .arg(pid.to_string())
            .status()
            .await
            .context("running kill -INT")?;
        if !status.success() {
            bail!("kill -INT {pid} failed: {status}");
        }
        Ok(())
    }

    /// Waits at most `timeout` for the process to exit.
    pub async fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .with_context(|| format!("etcdctl {:?} did not exit within {timeout:?}", self.args))?
            .context("waiting for etcdctl")
    }

    /// Whether the process has exited, without waiting.
    pub fn has_exited(&mut self) -> Result<bool> {
        Ok(self.child.try_wait().context("checking etcdctl")?.is_some())
    }

    /// SIGKILLs the process and reaps it.
    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await.context("killing etcdctl")
    }
}
