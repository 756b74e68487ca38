//! Signals: waiting for Ctrl-C or SIGTERM, and stopping a child process with SIGTERM then,
//! after a bounded grace period, SIGKILL.

use std::time::Duration;

use anyhow::{Context, Result};
use rustix::process::{kill_process, Pid, Signal};
use tokio::process::Child;
use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM; returns the signal's number.
pub async fn interrupted() -> Result<i32> {
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    Ok(tokio::select! {
        _ = int.recv() => 2,
        _ = term.recv() => 15,
    })
}

/// Sends `sig` to the process `pid`. A process that already exited is not an error.
pub fn send(pid: u32, sig: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        // ESRCH (already gone) is the only expected failure, and then there is nothing to stop.
        let _ = kill_process(pid, sig);
    }
}

/// Stops `child`: SIGTERM, then SIGKILL if it has not exited after `grace`. Returns its exit
/// status. Bounded: SIGKILL cannot be caught, so the final wait ends as soon as the kernel
/// reaps the process.
pub async fn terminate(child: &mut Child, grace: Duration) -> Result<std::process::ExitStatus> {
    if let Some(pid) = child.id() {
        send(pid, Signal::TERM);
    }
    // Bounded by `grace`; past it the child gets SIGKILL.
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => Ok(status?),
        Err(_) => {
            crate::output::note(format!(
                "child did not exit {grace:?} after SIGTERM; sending SIGKILL"
            ));
            child.start_kill().context("sending SIGKILL")?;
            Ok(child.wait().await?)
        }
    }
}

/// The shell convention for an exit status: the code, or 128 + the signal that ended it.
pub fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(crate::exit::ERROR),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(crate::exit::ERROR),
        (None, None) => crate::exit::ERROR,
    }
}
