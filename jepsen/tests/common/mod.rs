//! Running the real `picket-jepsen` binary from the integration tests.
//!
//! The binaries need `picketd` built next to the harness (`cargo build --workspace`, as
//! `scripts/test.sh` does) or named by `$PICKETD_BIN`.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Overrides the `picketd` the harness starts (same variable as the e2e tests).
const PICKETD_BIN_ENV: &str = "PICKETD_BIN";

/// Upper bound on one harness run: 20-25 s of workload, up to 60 s for start-up and 60 s for
/// recovery, 30 s of agreement polling and the check. The harness bounds each of those phases
/// itself; this only stops a wedged harness from hanging CI.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

/// A finished harness run.
pub struct Run {
    pub code: i32,
    /// The harness's PID, which names its namespaces (`pkj-<pid>-...`).
    pub pid: u32,
    pub results: Value,
}

/// Runs `picket-jepsen` with `args` plus `--out <out>`, returning its exit code and the parsed
/// `results.json`.
pub fn harness(args: &[&str], out: &Path) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_picket-jepsen"));
    cmd.args(args).arg("--out").arg(out);
    if let Some(p) = std::env::var_os(PICKETD_BIN_ENV) {
        cmd.arg("--picketd").arg(PathBuf::from(p));
    }
    let mut child = cmd.spawn().expect("spawning picket-jepsen");
    let pid = child.id();
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("polling picket-jepsen") {
            break s;
        }
        if Instant::now() >= deadline {
            // The nodes have a parent-death signal (setpriv), so they die with the harness; its
            // namespaces are swept by the next run.
            let _ = child.kill();
            let _ = child.wait();
            panic!("picket-jepsen did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let code = status.code().expect("picket-jepsen killed by a signal");
    let text = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("no results.json (exit {code}): {e}"));
    Run { code, pid, results: serde_json::from_str(&text).expect("results.json is JSON") }
}

pub fn verdict<'a>(r: &'a Value, checker: &str) -> &'a str {
    r["checkers"][checker]["valid"].as_str().unwrap_or("<missing>")
}

/// How many faults of kind `f` the run injected.
pub fn faults(r: &Value, f: &str) -> u64 {
    r["summary"]["faults"][f].as_u64().unwrap_or(0)
}

/// Whether any of `checkers` reported an anomaly of `kind`.
pub fn has_anomaly(r: &Value, checkers: &[&str], kind: &str) -> bool {
    checkers.iter().any(|c| {
        r["checkers"][c]["anomalies"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["kind"] == kind))
    })
}

/// Fails the test, naming what is missing, unless network-namespace mode can run here (root,
/// `ip netns`, iptables). A test that cannot run fails; it never passes by skipping.
#[allow(dead_code)] // not every test file uses every helper
pub fn require_netns() {
    if let Some(reason) = picket_jepsen::netns::unavailable_reason() {
        panic!("network-namespace mode cannot run here: {reason}");
    }
}

/// Fails the test unless Debian's etcd 3.4 is on `PATH` (the comparison runs need it).
#[allow(dead_code)]
pub fn require_etcd() {
    if let Err(missing) = picket_procs::tools::etcd() {
        panic!("{missing}");
    }
}
