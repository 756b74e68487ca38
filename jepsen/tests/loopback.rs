//! Short loopback-mode runs of the real `picket-jepsen` binary against real `picketd`
//! processes: the register workload under kill and pause faults must be valid, and the same
//! workload with deliberately unsafe (serializable, node-local) reads must be caught.
//!
//! They pin `--mode loopback`, so they test loopback mode also when run as root (where the default
//! would be network-namespace mode, tested in `netns.rs`). They need `picketd` built next to the
//! harness (`cargo build --workspace`, as `scripts/test.sh` does) or named by `$PICKETD_BIN`.
//! Each takes about 30 s.

mod common;

use std::path::Path;
use std::process::Command;

use common::{harness, has_anomaly, verdict};
use serde_json::Value;

/// The register workload under kill and pause in loopback mode, 3 nodes, for `secs` seconds.
fn register_run(seed: &str, secs: &str, extra: &[&str], out: &Path) -> common::Run {
    let mut args = vec![
        "test",
        "--workload",
        "register",
        "--nemesis",
        "kill,pause",
        "--time-limit",
        secs,
        "--nodes",
        "3",
        "--target",
        "picket",
        "--seed",
        seed,
        "--mode",
        "loopback",
    ];
    args.extend_from_slice(extra);
    harness(&args, out)
}

#[test]
fn register_under_kill_and_pause_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = register_run("42", "20", &["--rate", "100"], &out);
    let (code, r) = (run.code, run.results);
    assert_eq!(code, 0, "expected a valid run; results: {r:#}");
    for c in ["linearizable", "revision", "member-reads", "cluster"] {
        assert_eq!(verdict(&r, c), "valid", "{c}: {r:#}");
    }
    let ok_ops = r["checkers"]["linearizable"]["stats"]["ok_ops"].as_u64().unwrap();
    assert!(ok_ops > 200, "too few operations to mean anything: {ok_ops}");
    let sreads =
        r["checkers"]["member-reads"]["stats"]["serializable_reads_checked"].as_u64().unwrap();
    assert!(sreads > 20, "too few serializable reads checked to mean anything: {sreads}");
    let faults: u64 =
        r["summary"]["faults"].as_object().unwrap().values().filter_map(Value::as_u64).sum();
    assert!(faults >= 1, "no fault was injected: {r:#}");
    assert_eq!(r["summary"]["mode"], "loopback", "{r:#}");

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
    // for longer, so a 15 s run usually contains stale reads (3 of 3 seeds tried while writing
    // this test found several, in both checkers). Usually, not always: on openraft 0.10 a
    // fresh-machine run under a full build's load got one fault in 15 s and no stale read
    // (seed 7, 2026-12-02). So up to three seeds are tried, in order, and the first run that
    // finds anomalies must have found stale reads; three clean runs fail the test.
    let dir = tempfile::tempdir().unwrap();
    let mut tried = Vec::new();
    for seed in ["7", "8", "9"] {
        let out = dir.path().join(format!("run-{seed}"));
        let run = register_run(seed, "15", &["--unsafe-serializable-reads"], &out);
        let (code, r) = (run.code, run.results);
        if code == 0 {
            tried.push(format!("seed {seed}: valid"));
            continue;
        }
        assert_eq!(code, 1, "seed {seed}: the harness failed: {r:#}");
        assert_eq!(verdict(&r, "cluster"), "valid", "{r:#}");
        let stale = has_anomaly(&r, &["linearizable", "revision"], "stale-read");
        assert!(stale, "expected a stale-read anomaly: {r:#}");
        return;
    }
    panic!("no stale read found in three runs: {tried:?}");
}

/// Runs a lock-set-family workload under `pause` in loopback mode.
fn lock_run(workload: &str, seed: &str, out: &std::path::Path) -> common::Run {
    let args = [
        "test",
        "--workload",
        workload,
        "--nemesis",
        "pause",
        "--time-limit",
        "20",
        "--nodes",
        "3",
        "--target",
        "picket",
        "--seed",
        seed,
        "--mode",
        "loopback",
    ];
    harness(&args, out)
}

#[test]
fn lock_set_under_pause_is_unsafe() {
    // The control: holders stalled past their 2 s lease (SIGSTOPped nodes, and client stalls of
    // TTL + 1-2 s in 15 % of critical sections) write back stale sets after the next holder was
    // granted the lock, so acknowledged elements vanish.
    let dir = tempfile::tempdir().unwrap();
    let run = lock_run("lock-set", "11", &dir.path().join("run"));
    let r = &run.results;
    assert_eq!(run.code, 1, "expected lost updates; results: {r:#}");
    assert!(has_anomaly(r, &["set"], "lost"), "{r:#}");
    assert_eq!(verdict(r, "cluster"), "valid", "{r:#}");
}

#[test]
fn lock_kv_set_under_pause_is_valid() {
    // The same stalls, but every write is a Txn guarded on the lock key's create revision: a
    // stale holder's write is refused, so nothing is lost.
    let dir = tempfile::tempdir().unwrap();
    let run = lock_run("lock-kv-set", "11", &dir.path().join("run"));
    let r = &run.results;
    assert_eq!(run.code, 0, "expected a valid run; results: {r:#}");
    for c in ["set", "lock", "cluster"] {
        assert_eq!(verdict(r, c), "valid", "{c}: {r:#}");
    }
    let adds = r["checkers"]["set"]["stats"]["ok_adds"].as_u64().unwrap();
    assert!(adds >= 10, "too few acknowledged adds to mean anything: {adds}");
    // Report written alongside.
    assert!(dir.path().join("run/report.html").is_file());
}
