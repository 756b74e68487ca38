//! Children that cannot outlive the process that started them.
//!
//! Dropping a cluster handle kills its members, but nothing runs when the test process itself is
//! SIGKILLed (a runner's timeout, an OOM kill, Ctrl-C on some runners): its members would keep
//! running, holding ports and CPU long after the suite ended. [`command`] starts the program
//! through util-linux's `setpriv --pdeathsig KILL`, which sets the kernel's parent-death signal
//! and then execs the program in place (same PID, so signalling by PID is unchanged). The setting
//! survives that exec and is cleared in the program's own children, so nothing else is affected.
//!
//! prctl(2) documents the signal as sent when the *thread* that forked the child exits, so start
//! members from threads that live as long as their handle: a test's main thread or a tokio
//! worker thread (they live until the runtime shuts down), never from `spawn_blocking` or a
//! short-lived thread (a member killed early shows as a crash, it cannot pass silently). setpriv
//! sets the signal after the fork, so a parent that dies within microseconds of a spawn, before
//! setpriv ran, leaves that child running; no test process dies that fast.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use crate::tools::{command as find, Missing};

/// `setpriv`, from util-linux (essential on Debian, so on every machine of this kind).
pub fn setpriv() -> Result<PathBuf, Missing> {
    find("setpriv", "util-linux")
}

/// A [`Command`] that runs `program` with SIGKILL as its parent-death signal. Add arguments,
/// environment and stdio to it as to any command.
pub fn command(program: impl AsRef<OsStr>) -> Result<Command, Missing> {
    let mut cmd = Command::new(setpriv()?);
    cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_child_has_a_parent_death_signal_and_keeps_its_pid() {
        let mut child = command("sleep").unwrap().arg("30").spawn().expect("spawn");
        // Bounded wait for the exec to happen (it is immediate; 10 s covers a loaded machine).
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            let s = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
            if s.lines().any(|l| l == "Name:\tsleep") || Instant::now() > deadline {
                break s;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.lines().any(|l| l == "Name:\tsleep"), "{status}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_child_dies_when_the_process_that_started_it_is_killed() {
        // A shell stands for a test process: it starts the guarded command (same argv as
        // `command` builds) in the background, prints its PID, then is SIGKILLed, so no cleanup
        // of its own can run.
        let guarded = command("sleep").unwrap();
        let argv: Vec<String> = std::iter::once(guarded.get_program())
            .chain(guarded.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let script = format!("{} 30 & echo $!; exec sleep 30", argv.join(" "));
        let mut parent = std::process::Command::new("sh")
            .args(["-c", &script])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(parent.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let pid: u32 = line.trim().parse().expect("pid");
        // The parent-death signal is set by setpriv after the fork: wait (bounded, 10 s) until
        // the child runs `sleep`, i.e. setpriv has set it and exec'd. (A parent that dies inside
        // that window, microseconds after a spawn, leaves the child running; a test process
        // lives far longer than that.)
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .any(|l| l == "Name:\tsleep")
        {
            assert!(Instant::now() < deadline, "child {pid} never ran sleep");
            std::thread::sleep(Duration::from_millis(5));
        }
        parent.kill().unwrap();
        parent.wait().unwrap();
        // Bounded wait for the kernel's parent-death signal (immediate; 10 s covers any load).
        let deadline = Instant::now() + Duration::from_secs(10);
        let gone = loop {
            // Dead (a zombie until init reaps it) or gone: either way not running.
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let running =
                state.rsplit(')').next().is_some_and(|r| !r.trim_start().starts_with('Z'));
            if !running || state.is_empty() {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let last = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if !gone {
            let _ = crate::signal::send(pid, crate::signal::Signal::KILL);
        }
        assert!(gone, "child {pid} outlived the process that started it: {last}");
    }
}
