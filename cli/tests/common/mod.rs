//! Running the `picket` binary under test: bounded runs, and spawned processes whose output is
//! read line by line with a bounded wait.

#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

/// Bound on one `picket` invocation that should finish by itself. Each request inside it is
/// bounded by `--command-timeout` (10 s here); 60 s covers a loaded 2-core machine and an
/// election after a kill, while a hung command still fails the test.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Bound on waiting for one expected line from a long-running `picket` (a watch event, a lock
/// grant, a child's output). Same reasoning as [`RUN_TIMEOUT`].
pub const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// The `picket` binary Cargo built for these tests (always up to date, unlike a path guess).
pub fn picket_bin() -> &'static str {
    env!("CARGO_BIN_EXE_picket")
}

/// A `picket` command against `endpoints`, with generous timeouts for a loaded machine.
pub fn picket(endpoints: &[String], args: &[&str]) -> Command {
    let mut c = Command::new(picket_bin());
    c.arg("--endpoints")
        .arg(endpoints.join(","))
        .args(["--command-timeout", "10s", "--dial-timeout", "2s"])
        .args(args)
        .env_remove("PICKET_ENDPOINTS")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// What a finished `picket` run printed, and its exit code.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// Fails unless the exit code is `code`, showing everything printed.
    pub fn expect_code(self, code: i32) -> Result<Self> {
        if self.code != code {
            bail!(
                "expected exit code {code}, got {}:\nstdout:\n{}\nstderr:\n{}",
                self.code,
                self.stdout,
                self.stderr
            );
        }
        Ok(self)
    }

    pub fn ok(self) -> Result<Self> {
        self.expect_code(0)
    }

    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.stdout)
            .with_context(|| format!("stdout is not JSON:\n{}", self.stdout))
    }
}

/// Runs `cmd` to completion, feeding `stdin` if given; bounded by [`RUN_TIMEOUT`].
pub async fn run_cmd(mut cmd: Command, stdin: Option<&str>) -> Result<Out> {
    use tokio::io::AsyncWriteExt;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().context("spawning picket")?;
    if let Some(input) = stdin {
        let mut w = child.stdin.take().context("stdin")?;
        w.write_all(input.as_bytes()).await?;
        drop(w);
    }
    let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .context("picket did not finish within RUN_TIMEOUT")??;
    Ok(Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `picket ARGS` against `endpoints` to completion.
pub async fn run(endpoints: &[String], args: &[&str]) -> Result<Out> {
    run_cmd(picket(endpoints, args), None).await
}

/// A long-running `picket`, its output read line by line.
pub struct Running {
    pub child: Child,
    pub stdout: Lines<BufReader<ChildStdout>>,
    pub stderr: Lines<BufReader<ChildStderr>>,
}

impl Running {
    pub fn spawn(mut cmd: Command) -> Result<Self> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().context("spawning picket")?;
        let stdout = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let stderr = BufReader::new(child.stderr.take().context("stderr")?).lines();
        Ok(Self { child, stdout, stderr })
    }

    /// The next stdout line, waiting at most [`LINE_TIMEOUT`].
    pub async fn line(&mut self) -> Result<String> {
        match tokio::time::timeout(LINE_TIMEOUT, self.stdout.next_line()).await {
            Ok(Ok(Some(l))) => Ok(l),
            Ok(Ok(None)) => bail!("picket closed stdout (exited?)"),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => bail!("no stdout line within {LINE_TIMEOUT:?}"),
        }
    }

    /// Stderr lines until one contains `needle`, waiting at most [`LINE_TIMEOUT`] in all.
    pub async fn stderr_until(&mut self, needle: &str) -> Result<Vec<String>> {
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + LINE_TIMEOUT;
        loop {
            let l = match tokio::time::timeout_at(deadline, self.stderr.next_line()).await {
                Ok(Ok(Some(l))) => l,
                Ok(Ok(None)) => bail!("stderr closed before {needle:?}; saw {seen:#?}"),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    bail!("no stderr line with {needle:?} within {LINE_TIMEOUT:?}; saw {seen:#?}")
                }
            };
            let hit = l.contains(needle);
            seen.push(l);
            if hit {
                return Ok(seen);
            }
        }
    }

    /// Waits at most [`RUN_TIMEOUT`] for the process to exit; returns its exit code.
    pub async fn exit_code(&mut self) -> Result<i32> {
        let status = tokio::time::timeout(RUN_TIMEOUT, self.child.wait())
            .await
            .context("picket did not exit within RUN_TIMEOUT")??;
        Ok(status.code().unwrap_or(-1))
    }

    /// Sends SIGINT (what Ctrl-C does) with the `kill` binary, as the cluster harness does.
    pub fn interrupt(&self) -> Result<()> {
        let pid = self.child.id().context("already exited")?;
        let st = std::process::Command::new("kill").args(["-INT", &pid.to_string()]).status()?;
        if !st.success() {
            bail!("kill -INT {pid} failed");
        }
        Ok(())
    }
}
