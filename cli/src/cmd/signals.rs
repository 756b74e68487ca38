//! Signals: waiting for Ctrl-C or SIGTERM, and stopping a child process with SIGTERM then,
//! after a bounded grace period, SIGKILL.

use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use rustix::process::{kill_process, Pid, Signal};
use tokio::process::Child;
use tokio::signal::unix::{signal, Signal as SignalStream, SignalKind};

/// The SIGINT and SIGTERM streams, made once by [`install`].
static STREAMS: OnceLock<tokio::sync::Mutex<(SignalStream, SignalStream)>> = OnceLock::new();

/// Registers the SIGINT and SIGTERM handlers now. Long-running commands call this before they
/// print anything a caller may react to: a signal sent right after that output must be seen
/// (and must not kill the process with the default action), and a stream made later would not
/// see a signal delivered before it existed. Short commands do not call it, so Ctrl-C still
/// ends them at once.
pub fn install() -> Result<()> {
    if STREAMS.get().is_none() {
        let int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        // Commands run on one task; if two ever raced here, the loser's streams are dropped
        // and the winner's (registered as early) serve both.
        let _ = STREAMS.set(tokio::sync::Mutex::new((int, term)));
    }
    Ok(())
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM since [`install`] (called here if it was
/// not yet); returns the signal's number.
pub async fn interrupted() -> Result<i32> {
    install()?;
    let Some(streams) = STREAMS.get() else {
        anyhow::bail!("signal handlers not installed");
    };
    let mut guard = streams.lock().await;
    let (int, term) = &mut *guard;
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
