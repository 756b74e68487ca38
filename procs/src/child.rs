//! [`Managed`]: one server process (a `picketd` or `etcd` member) that the end-to-end tests, the
//! fault harness and `picket local-cluster` start, signal and stop the same way:
//!
//! - started through [`crate::guard`] (`setpriv --pdeathsig KILL`), so it dies with the process
//!   that started it even when that process is SIGKILLed;
//! - addressed only by its own PID (never by name), and only while it is ours and not reaped, so
//!   a signal can never reach a process that reused the PID;
//! - stopped with SIGTERM and a bounded wait, then SIGKILL ([`Managed::terminate`]);
//! - SIGKILLed and reaped when the handle is dropped (a failed test, a panic, Ctrl-C).
//!
//! What differs between the three users (flags, log layout, readiness probes with their own
//! clients) stays with them; [`wait_ready`] is the bounded probe loop they share.

use std::future::Future;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::signal::{self, Signal, SignalError};
use crate::tools::Missing;

/// How often [`Managed::terminate`] and [`Managed::wait_exit`] look at the process. A member's
/// graceful shutdown takes tens of milliseconds, so 50 ms adds little to it.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// What the starter believes about its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    /// SIGSTOPped by [`Managed::pause`].
    Paused,
    /// Never started, killed, stopped or exited.
    Down,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcError {
    #[error("{0} is not running")]
    NotRunning(String),
    #[error("{0} is already running")]
    AlreadyRunning(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("signalling {name}: {source}")]
    Signal { name: String, source: SignalError },
    #[error(transparent)]
    Missing(#[from] Missing),
    #[error("{name} did not exit within {timeout:?} of SIGTERM; SIGKILLed it")]
    StopTimeout { name: String, timeout: Duration },
    #[error("{name} still running after {timeout:?}")]
    StillRunning { name: String, timeout: Duration },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ProcError {
    let what = what.into();
    move |source| ProcError::Io { what, source }
}

/// Opens `path` for appending (creating it) and writes `header` as one line, so each start of a
/// member is marked in its log. Returns the file for the child's stdout or stderr.
pub fn open_log(path: &Path, header: &str) -> Result<std::fs::File, ProcError> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(format!("opening {}", path.display())))?;
    writeln!(f, "{header}").map_err(io(format!("writing {}", path.display())))?;
    Ok(f)
}

/// One managed server process. See the module docs.
pub struct Managed {
    name: String,
    child: Option<Child>,
    paused: bool,
    starts: u32,
}

impl Managed {
    /// A handle for a process called `name` in messages; nothing runs until [`Self::start`].
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), child: None, paused: false, starts: 0 }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many times [`Self::start`] started it.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The [`Command`] for `program` with the parent-death guard, stdin closed and stdout and
    /// stderr to `stdout` and `stderr`. Add the arguments and environment, then [`Self::start`].
    pub fn command(
        program: impl AsRef<std::ffi::OsStr>,
        stdout: std::fs::File,
        stderr: std::fs::File,
    ) -> Result<Command, ProcError> {
        let mut cmd = crate::guard::command(program)?;
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        Ok(cmd)
    }

    /// Spawns `cmd` (built with [`Self::command`]) as this process; returns its PID.
    pub fn start(&mut self, mut cmd: Command) -> Result<u32, ProcError> {
        if self.child.is_some() {
            return Err(ProcError::AlreadyRunning(self.name.clone()));
        }
        let child = cmd.spawn().map_err(io(format!("spawning {}", self.name)))?;
        let pid = child.id();
        self.child = Some(child);
        self.paused = false;
        self.starts += 1;
        Ok(pid)
    }

    pub fn state(&self) -> State {
        match (&self.child, self.paused) {
            (None, _) => State::Down,
            (Some(_), true) => State::Paused,
            (Some(_), false) => State::Running,
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The PID while the process is ours and not reaped.
    pub fn pid(&self) -> Result<u32, ProcError> {
        self.child.as_ref().map(Child::id).ok_or_else(|| ProcError::NotRunning(self.name.clone()))
    }

    /// The exit status if the process has exited (it is reaped and the handle goes down), or
    /// `None` while it runs. A handle that is already down is an error.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ProcError> {
        let child = self.child.as_mut().ok_or_else(|| ProcError::NotRunning(self.name.clone()))?;
        let status = child.try_wait().map_err(io(format!("polling {}", self.name)))?;
        if status.is_some() {
            self.child = None;
            self.paused = false;
        }
        Ok(status)
    }

    /// SIGKILLs the process and reaps it. A SIGKILLed process cannot delay its exit (even when
    /// stopped), so the wait returns as soon as the kernel has torn it down.
    pub fn kill(&mut self) -> Result<(), ProcError> {
        let mut child =
            self.child.take().ok_or_else(|| ProcError::NotRunning(self.name.clone()))?;
        self.paused = false;
        child.kill().map_err(io(format!("SIGKILL to {}", self.name)))?;
        child.wait().map_err(io(format!("reaping {}", self.name)))?;
        Ok(())
    }

    fn send(&self, s: Signal) -> Result<(), ProcError> {
        signal::send(self.pid()?, s)
            .map_err(|source| ProcError::Signal { name: self.name.clone(), source })
    }

    /// SIGSTOPs the process: it keeps its sockets but does nothing, like a long GC pause.
    pub fn pause(&mut self) -> Result<(), ProcError> {
        self.send(Signal::STOP)?;
        self.paused = true;
        Ok(())
    }

    /// SIGCONTs a paused process.
    pub fn resume(&mut self) -> Result<(), ProcError> {
        self.send(Signal::CONT)?;
        self.paused = false;
        Ok(())
    }

    /// Sends SIGTERM without waiting (to stop several members at once; then
    /// [`Self::wait_exit`] each).
    pub fn term(&mut self) -> Result<(), ProcError> {
        if self.paused {
            // A stopped process cannot act on SIGTERM until it runs again.
            self.resume()?;
        }
        self.send(Signal::TERM)
    }

    /// Waits (at most `timeout`) for the process to exit on its own.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, ProcError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(ProcError::StillRunning { name: self.name.clone(), timeout });
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }

    /// SIGTERM, then a wait of at most `timeout` for a clean exit. A process that does not exit
    /// in time is SIGKILLed and reported as an error: a member that ignores SIGTERM is a bug.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus, ProcError> {
        self.term()?;
        match self.wait_exit(timeout).await {
            Err(ProcError::StillRunning { .. }) => {
                self.kill()?;
                Err(ProcError::StopTimeout { name: self.name.clone(), timeout })
            }
            other => other,
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Errors are ignored: the process may have exited on its own already. The wait is
            // prompt because a SIGKILLed process cannot delay its exit.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Why [`wait_ready`] gave up.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    #[error("{name} exited before it served ({status})")]
    Exited { name: String, status: ExitStatus },
    #[error("{name} not serving after {timeout:?}: {last}")]
    Timeout { name: String, timeout: Duration, last: String },
    #[error(transparent)]
    Proc(#[from] ProcError),
}

/// Runs `probe` until it succeeds, every `interval`, for at most `timeout` (and at most
/// `timeout / interval + 1` attempts), failing early if `proc` exits. The probe is the caller's
/// (a read through its own client) and must bound its own time; it is only ever a read, so
/// repeating it is safe.
pub async fn wait_ready<T, E, F, Fut>(
    proc: &mut Managed,
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<T, ReadyError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    let max_attempts = timeout.as_millis() / interval.as_millis().max(1) + 1;
    let mut last = "no attempt made".to_string();
    for _ in 0..max_attempts {
        if let Some(status) = proc.try_wait()? {
            return Err(ReadyError::Exited { name: proc.name.clone(), status });
        }
        match probe().await {
            Ok(v) => return Ok(v),
            Err(e) => last = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(interval).await;
    }
    Err(ReadyError::Timeout { name: proc.name.clone(), timeout, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &Path) -> (Managed, Command) {
        let out = open_log(&dir.join("out.log"), "=== start ===").unwrap();
        let err = out.try_clone().unwrap();
        let mut cmd = Managed::command("sleep", out, err).unwrap();
        cmd.arg("30");
        (Managed::new("sleeper"), cmd)
    }

    #[tokio::test]
    async fn start_pause_resume_terminate_by_pid() {
        let dir = tempfile::tempdir().unwrap();
        let (mut p, cmd) = sleeper(dir.path());
        assert_eq!(p.state(), State::Down);
        assert!(matches!(p.pid(), Err(ProcError::NotRunning(_))));
        p.start(cmd).unwrap();
        assert_eq!((p.state(), p.starts()), (State::Running, 1));
        p.pause().unwrap();
        assert_eq!(p.state(), State::Paused);
        // Terminating a paused process resumes it first, so SIGTERM takes effect at once.
        let status = p.terminate(Duration::from_secs(5)).await.unwrap();
        assert!(!status.success(), "sleep ends by SIGTERM: {status}");
        assert_eq!(p.state(), State::Down);
        assert!(matches!(p.kill(), Err(ProcError::NotRunning(_))));
    }

    #[tokio::test]
    async fn wait_ready_fails_early_when_the_process_exits_and_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (mut p, cmd) = sleeper(dir.path());
        p.start(cmd).unwrap();
        let started = Instant::now();
        let r: Result<(), _> =
            wait_ready(&mut p, Duration::from_millis(300), Duration::from_millis(50), || async {
                Err::<(), _>("not yet")
            })
            .await;
        assert!(matches!(r, Err(ReadyError::Timeout { ref last, .. }) if last == "not yet"));
        assert!(started.elapsed() < Duration::from_secs(5));
        p.kill().unwrap();
        let (mut q, cmd) = sleeper(dir.path());
        q.start(cmd).unwrap();
        q.send(Signal::TERM).unwrap();
        let r: Result<(), _> =
            wait_ready(&mut q, Duration::from_secs(10), Duration::from_millis(50), || async {
                Err::<(), _>("never")
            })
            .await;
        assert!(matches!(r, Err(ReadyError::Exited { .. })), "{r:?}");
    }
}
