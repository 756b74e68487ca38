//! Short loopback-mode runs of the real `picket-jepsen` binary against real `picketd`
//! processes: the register workload under kill and pause faults must be valid, and the same
//! workload with deliberately unsafe (serializable, node-local) reads must be caught.
//!
//! They need `picketd` built next to the harness (`cargo build --workspace --bins`, as
//! `scripts/test.sh` does) or named by `$PICKETD_BIN`. Each takes about 30 s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Overrides the `picketd` the harness starts (same variable as the e2e tests).
const PICKETD_BIN_ENV: &str = "PICKETD_BIN";

/// Upper bound on one harness run: 20 s of workload, up to 60 s for start-up and 60 s for
/// recovery, 30 s of agreement polling and the check. The harness bounds each of those phases
/// itself; this only stops a wedged harness from hanging CI.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

/// Runs `picket-jepsen` with `args`, returning its exit code and the parsed `results.json`.
fn harness(args: &[&str], out: &Path) -> (i32, Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_picket-jepsen"));
    cmd.args(args).arg("--out").arg(out);
    if let Some(p) = std::env::var_os(PICKETD_BIN_ENV) {
        cmd.arg("--picketd").arg(PathBuf::from(p));
    }
    let mut child = cmd.spawn().expect("spawning picket-jepsen");
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("polling picket-jepsen") {
            break s;
        }
        if Instant::now() >= deadline {
            // SIGKILLing the harness leaves its nodes running (no parent-death signal without
            // `unsafe`), but a harness that hangs this long is already a failure to report.
            let _ = child.kill();
            let _ = child.wait();
            panic!("picket-jepsen did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let code = status.code().expect("picket-jepsen killed by a signal");
    let text = std::fs::read_to_string(out.join("results.json"))
        .unwrap_or_else(|e| panic!("no results.json (exit {code}): {e}"));
    (code, serde_json::from_str(&text).expect("results.json is JSON"))
}

fn verdict<'a>(r: &'a Value, checker: &str) -> &'a str {
    r["checkers"][checker]["valid"].as_str().unwrap_or("<missing>")
}

#[test]
fn register_under_kill_and_pause_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "test",
        "--workload",
        "register",
        "--nemesis",
        "kill,pause",
        "--time-limit",
        "20",
        "--nodes",
        "3",
        "--target",
        "picket",
        "--seed",
        "42",
        "--rate",
        "100",
    ];
    let (code, r) = harness(&args, &out);
    assert_eq!(code, 0, "expected a valid run; results: {r:#}");
    for c in ["linearizable", "revision", "cluster"] {
        assert_eq!(verdict(&r, c), "valid", "{c}: {r:#}");
    }
    let ok_ops = r["checkers"]["linearizable"]["stats"]["ok_ops"].as_u64().unwrap();
    assert!(ok_ops > 200, "too few operations to mean anything: {ok_ops}");
    let faults: u64 =
        r["summary"]["faults"].as_object().unwrap().values().filter_map(Value::as_u64).sum();
    assert!(faults >= 1, "no fault was injected: {r:#}");

    // The saved folder re-checks to the same verdict without re-running anything.
    let status = Command::new(env!("CARGO_BIN_EXE_picket-jepsen"))
        .arg("check")
        .arg(&out)
        .status()
        .expect("running picket-jepsen check");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn unsafe_serializable_reads_are_caught() {
    // Serializable gets are served from each node's local state. Followers apply a few
    // milliseconds behind the leader even without faults, and a restarted or resumed node lags
    // for longer, so a 15 s run reliably contains stale reads (3 of 3 seeds tried while
    // writing this test found several, in both checkers).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = [
        "test",
        "--workload",
        "register",
        "--nemesis",
        "kill,pause",
        "--time-limit",
        "15",
        "--nodes",
        "3",
        "--target",
        "picket",
        "--seed",
        "7",
        "--unsafe-serializable-reads",
    ];
    let (code, r) = harness(&args, &out);
    assert_eq!(code, 1, "expected the stale reads to be found; results: {r:#}");
    assert_eq!(verdict(&r, "cluster"), "valid", "{r:#}");
    let stale = ["linearizable", "revision"].iter().any(|c| {
        r["checkers"][c]["anomalies"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["kind"] == "stale-read"))
    });
    assert!(stale, "expected a stale-read anomaly: {r:#}");
}
