//! Loopback ports for test clusters that cannot collide.
//!
//! Ports come from [`RANGE`], below Linux's ephemeral range (32768-60999), so no outgoing
//! connection of any process is ever given one of them in the gap between our check and the
//! member's bind. Each port is reserved across processes with an exclusive `flock` on a file named
//! after it in a shared directory, held until the reserving process exits (the kernel drops the
//! lock even on SIGKILL, so a crashed test never leaks a reservation). Two test processes running
//! side by side therefore never hand out the same port, and no test ever uses etcd's defaults
//! (2379/2380), `picket local-cluster`'s ports or the benchmark scripts' (see [`AVOID`]): those
//! belong to whatever the developer runs.

use std::fs::{File, OpenOptions};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

use rustix::fs::{flock, FlockOperation};

/// The ports handed out: below the ephemeral range, above most well-known services.
pub const RANGE: std::ops::Range<u16> = 24_000..32_000;

/// Ports inside [`RANGE`] that belong to other tools of this repository and are never handed
/// out: `picket local-cluster` and `scripts/local-cluster.sh` (22379/22380 fall outside the range
/// anyway), and the benchmark scripts (`scripts/bench-vs-etcd.sh`, `scripts/per-member-cpu.sh`
/// use 23010-23031, also outside; kept here so moving [`RANGE`] cannot silently take them).
pub const AVOID: &[std::ops::RangeInclusive<u16>] = &[22_379..=22_380, 23_000..=23_099];

/// Reservations held by this process, kept open (and so locked) until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Why no ports could be reserved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    #[error("creating the port reservation directory {dir}: {source}")]
    Dir { dir: PathBuf, source: std::io::Error },
    #[error("only {found} of {wanted} free loopback ports in {RANGE:?}")]
    Exhausted { wanted: usize, found: usize },
}

/// The directory of reservation files, shared by every process of this user on this machine.
fn dir() -> PathBuf {
    std::env::temp_dir().join("picket-test-ports")
}

/// Where the scan starts: spread by PID so that processes started together rarely probe the
/// same files first (correctness does not depend on it; the locks do).
fn start() -> u16 {
    let span = u32::from(RANGE.end - RANGE.start);
    RANGE.start + ((std::process::id().wrapping_mul(2_654_435_761) % span) as u16)
}

/// Takes port `port`: locks its reservation file and checks that nothing listens on it. `None`
/// when another process holds it or it is in use (the lock, if taken, is released on drop).
fn try_take(dir: &std::path::Path, port: u16) -> Option<File> {
    if AVOID.iter().any(|r| r.contains(&port)) || !RANGE.contains(&port) {
        return None;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    // Held by another process: not ours to hand out.
    flock(&file, FlockOperation::NonBlockingLockExclusive).ok()?;
    // Free of reservations, but is something else (not a test of ours) listening there?
    TcpListener::bind(("127.0.0.1", port)).ok()?;
    Some(file)
}

/// Reserves runs of `len` consecutive ports, `n` of them, returning each run's first port.
fn reserve_runs(n: usize, len: u16) -> Result<Vec<u16>, PortError> {
    let dir = dir();
    std::fs::create_dir_all(&dir).map_err(|source| PortError::Dir { dir: dir.clone(), source })?;
    // Poisoning only means another thread panicked while pushing; the files it holds are fine.
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let mut firsts = Vec::with_capacity(n);
    let span = RANGE.end - RANGE.start;
    let first = start();
    // Bounded: one pass over the range at most.
    for step in 0..span {
        if firsts.len() == n {
            break;
        }
        let port = RANGE.start + (first - RANGE.start + step) % span;
        let run: Option<Vec<File>> =
            (0..len).map(|k| port.checked_add(k).and_then(|p| try_take(&dir, p))).collect();
        if let Some(files) = run {
            held.extend(files);
            firsts.push(port);
        }
    }
    if firsts.len() < n {
        return Err(PortError::Exhausted { wanted: n, found: firsts.len() });
    }
    Ok(firsts)
}

/// Reserves `n` loopback ports for the life of this process. Each is free to bind on
/// 127.0.0.1 now and will not be handed out by this function again, in this or any other process,
/// until this process exits.
pub fn reserve(n: usize) -> Result<Vec<u16>, PortError> {
    reserve_runs(n, 1)
}

/// Reserves `n` ports `p` each with `p + 1` reserved too, for programs that derive one port from
/// another (`picket local-cluster --ports` puts a member's peer port at its client port + 1).
pub fn reserve_pairs(n: usize) -> Result<Vec<u16>, PortError> {
    reserve_runs(n, 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn ports_are_distinct_in_range_and_bindable() {
        let a = reserve(8).expect("reserve");
        let b = reserve(8).expect("reserve again");
        let all: BTreeSet<u16> = a.iter().chain(&b).copied().collect();
        assert_eq!(all.len(), 16, "{a:?} {b:?}");
        for p in &all {
            assert!(RANGE.contains(p) && !AVOID.iter().any(|r| r.contains(p)), "{p}");
            TcpListener::bind(("127.0.0.1", *p)).expect("a reserved port is free");
        }
    }

    #[test]
    fn pairs_are_reserved_whole() {
        let pairs = reserve_pairs(3).expect("reserve pairs");
        let singles = reserve(32).expect("reserve");
        for p in &pairs {
            assert!(!singles.contains(p) && !singles.contains(&(p + 1)), "{p} {singles:?}");
        }
    }

    #[test]
    fn a_port_reserved_by_another_process_is_not_handed_out() {
        // `flock` locks belong to the open file description, so a second open of the same file
        // in this process stands for another process here.
        let ours = reserve(1).expect("reserve")[0];
        let again = OpenOptions::new().write(true).open(dir().join(ours.to_string())).unwrap();
        assert!(flock(&again, FlockOperation::NonBlockingLockExclusive).is_err());
    }

    #[test]
    fn a_port_someone_listens_on_is_skipped() {
        let taken = reserve(1).expect("reserve")[0];
        let listener = TcpListener::bind(("127.0.0.1", taken)).unwrap();
        // Release our lock on it by hand, as if another program (not a test) held the port.
        HELD.lock().unwrap().retain(|_| false);
        let next = reserve(64).expect("reserve");
        assert!(!next.contains(&taken), "{taken} is in use by a listener");
        drop(listener);
    }
}
