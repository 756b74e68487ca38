//! The cluster-level nemeses against Picket, in network-namespace mode, one workload each:
//!
//! - `register` under `member`: nodes are removed (MemberRemove, stop, wipe) and added again
//!   (MemberAdd, start as a joining member with a new member id); the register must stay
//!   linearizable and the three nodes must agree at the end;
//! - `watch` under `admin`: compactions, leader transfers, defragmentation and snapshots; the
//!   nemesis's compactions must be refused to watches that start below them, as the watch
//!   checker demands;
//! - `lease` under `clock`: a node restarted under libfaketime with a bumped (and possibly
//!   rate-skewed) wall clock; lease safety must not depend on it.
//!
//! Every test needs root, `ip netns` and iptables (and `clock` Debian's libfaketime); without
//! them it fails, naming what is missing. Each run takes about 40 s.

mod common;

use std::path::Path;

use common::{faults, harness, require_netns, verdict, Run};
use picket_jepsen::nemesis::clock;
use serde_json::Value;

fn run(workload: &str, nemesis: &str, seed: &str, out: &Path) -> Run {
    let args = [
        "test",
        "--workload",
        workload,
        "--nemesis",
        nemesis,
        "--time-limit",
        "30",
        "--nodes",
        "3",
        "--target",
        "picket",
        "--seed",
        seed,
        "--mode",
        "netns",
    ];
    harness(&args, out)
}

#[track_caller]
fn assert_valid(run: &Run, checkers: &[&str]) {
    let r = &run.results;
    assert_eq!(run.code, 0, "expected a valid run; results: {r:#}");
    assert_eq!(r["summary"]["mode"], "netns", "{r:#}");
    for c in checkers.iter().chain(&["cluster"]) {
        assert_eq!(verdict(r, c), "valid", "{c}: {r:#}");
    }
}

fn history(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("history.jsonl"))
        .expect("history.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a history line is JSON"))
        .collect()
}

/// The `value` of every nemesis `info` event of kind `f`, and of every heal action of kind `f`.
fn nemesis_values(h: &[Value], f: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for e in h.iter().filter(|e| e["process"] == "nemesis" && e["type"] == "info") {
        if e["f"] == f {
            out.push(e["value"].clone());
        }
        for a in e["value"]["actions"].as_array().into_iter().flatten() {
            if a["f"] == f {
                out.push(a["value"].clone());
            }
        }
    }
    out
}

#[test]
fn register_under_member_changes_is_valid() {
    require_netns();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = run("register", "member", "1", &out);
    assert_valid(&run, &["linearizable", "revision"]);
    let r = &run.results;
    assert!(faults(r, "member") >= 1, "no member was removed: {r:#}");
    let h = history(&out);
    let removed: Vec<Value> =
        nemesis_values(&h, "member").into_iter().filter(|v| v["outcome"] == "ok").collect();
    let rejoined = nemesis_values(&h, "rejoin");
    assert!(
        !removed.is_empty() && !rejoined.is_empty(),
        "removed {removed:?} rejoined {rejoined:?}"
    );
    // Every node that was removed came back with a new member id, and served clients under it.
    let id = |v: &Value| u64::from_str_radix(v["member_id"].as_str().unwrap(), 16).unwrap();
    let new_ids: Vec<u64> = rejoined.iter().map(id).collect();
    // Removals and re-adds alternate (one node out at a time).
    for (out, back) in removed.iter().zip(&rejoined) {
        assert_eq!(out["nodes"], back["nodes"], "{removed:?} {rejoined:?}");
        assert_ne!(id(out), id(back), "{} came back under its old id", back["nodes"]);
    }
    let served_by_new = h.iter().any(|e| {
        e["type"] == "ok" && e["header"]["member_id"].as_u64().is_some_and(|m| new_ids.contains(&m))
    });
    assert!(served_by_new, "no operation was served by a re-added member {new_ids:x?}");
    // All three nodes took part in the final agreement (and agreed: the cluster check is valid).
    let states = &r["checkers"]["cluster"]["stats"]["node_states"];
    assert_eq!(states.as_object().map(|o| o.len()), Some(3), "{states:#}");
}

#[test]
fn watch_under_admin_is_valid() {
    require_netns();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = run("watch", "admin", "3", &out);
    assert_valid(&run, &["watch"]);
    let r = &run.results;
    assert!(faults(r, "admin") >= 2, "{r:#}");
    let h = history(&out);
    let admin = nemesis_values(&h, "admin");
    let compactions: Vec<i64> = admin
        .iter()
        .filter(|v| v["action"] == "compact" && v["outcome"] == "ok")
        .filter_map(|v| v["revision"].as_i64())
        .collect();
    assert!(!compactions.is_empty(), "the nemesis compacted nothing: {admin:#?}");
    // The checker counted the nemesis's compactions besides the workload's own.
    // (Every workload compaction that did not definitely fail: invocations minus `fail`s.)
    let count = |t: &str| h.iter().filter(|e| e["f"] == "compact" && e["type"] == t).count();
    let workload_compactions = (count("invoke") - count("fail")) as u64;
    let counted = r["checkers"]["watch"]["stats"]["compactions"].as_u64().unwrap();
    assert!(counted >= workload_compactions + compactions.len() as u64, "{r:#}");
    // Watches were refused as compacted, with a revision, and the checker accepted that.
    let refused = h
        .iter()
        .filter(|e| e["f"] == "watch" && e["type"] == "ok" && e["value"]["canceled"] == true)
        .filter(|e| e["value"]["compact_revision"].as_i64().is_some_and(|c| c > 0))
        .count();
    assert!(refused >= 1, "no watch was refused as compacted");
}

/// Seconds since the epoch of a log line starting with an RFC 3339 UTC timestamp
/// (`2026-11-29T22:30:49.016615Z ...`), from the civil date (Howard Hinnant's algorithm).
fn timestamp(line: &str) -> Option<f64> {
    let t = line.get(..27)?;
    if !t.ends_with('Z') || t.as_bytes()[10] != b'T' {
        return None;
    }
    let num = |a: usize, b: usize| t.get(a..b)?.parse::<i64>().ok();
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let secs: f64 = t.get(17..26)?.parse().ok()?;
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + num(11, 13)? * 3600 + num(14, 16)? * 60) as f64 + secs)
}

#[test]
fn lease_under_clock_skew_is_valid() {
    require_netns();
    if let Some(why) = clock::unavailable_reason() {
        panic!("the clock nemesis cannot run here: {why}");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = run("lease", "clock", "4", &out);
    assert_valid(&run, &["lease"]);
    assert!(faults(&run.results, "clock") >= 1, "{:#}", run.results);
    // The skew took effect: in a skewed node's log, the first line after a libfaketime start is
    // stamped `offset` away from the true time of the start, which the harness's marker line
    // records (the node logs within a second or two of starting, even on a loaded machine, and
    // a rate skew changes little in that time; 20 s is a wide margin).
    let mut checked = 0;
    for entry in std::fs::read_dir(out.join("nodes")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (k, l) in lines.iter().enumerate() {
            let Some(spec) = l.split("FAKETIME=\"").nth(1) else { continue };
            let offset: f64 = spec.split('s').next().unwrap().parse().unwrap();
            let started: f64 =
                l.split(" at unix ").nth(1).unwrap().split(':').next().unwrap().parse().unwrap();
            if let Some(a) = lines[k + 1..].iter().find_map(|l| timestamp(l)) {
                let jump = a - started;
                assert!((jump - offset).abs() < 20.0, "clock off by {jump} s, not {offset} s: {l}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 1, "no skewed start found in the node logs");
}
