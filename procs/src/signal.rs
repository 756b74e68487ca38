//! Signals to child processes by PID, through kill(2).
//!
//! The harness and the tests only ever signal processes they started and still hold a `Child`
//! for, so a PID here is always their own child (a zombie until reaped, so the PID cannot be
//! reused by an unrelated process while the `Child` is held and not yet waited for).

pub use rustix::process::Signal;
use rustix::process::{kill_process, Pid};

/// Why a signal could not be sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignalError {
    #[error("{pid} is not a valid process id")]
    BadPid { pid: u32 },
    #[error("kill({pid}, {signal:?}): {source}")]
    Kill { pid: u32, signal: Signal, source: std::io::Error },
}

/// Sends `signal` to process `pid`.
pub fn send(pid: u32, signal: Signal) -> Result<(), SignalError> {
    let raw = i32::try_from(pid).ok().and_then(Pid::from_raw).ok_or(SignalError::BadPid { pid })?;
    kill_process(raw, signal).map_err(|e| SignalError::Kill { pid, signal, source: e.into() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn stops_and_kills_a_child_by_pid() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        send(child.id(), Signal::STOP).expect("SIGSTOP");
        send(child.id(), Signal::CONT).expect("SIGCONT");
        send(child.id(), Signal::KILL).expect("SIGKILL");
        let status = child.wait().expect("reap");
        assert!(!status.success(), "a killed child does not exit 0: {status}");
    }

    #[test]
    fn pid_zero_is_refused() {
        // kill(0, ...) would signal our own process group: never let a bad PID through.
        assert!(matches!(send(0, Signal::TERM), Err(SignalError::BadPid { .. })));
    }
}
