//! The availability verdicts on broken inputs: each must report what it exists to catch.

use serde_json::json;

use super::*;
use crate::history::{pair, EventType, HistoryBuilder};

const S: u64 = 1_000_000_000;

fn kinds(a: &[Anomaly]) -> Vec<String> {
    a.iter().map(|a| a.kind.clone()).collect()
}

#[test]
fn members_that_accepted_the_probe_are_fine() {
    let probes = vec![
        ("n1".to_string(), Ok(ProbeOk { elapsed_ms: 12, attempts: 1 })),
        ("n2".to_string(), Ok(ProbeOk { elapsed_ms: 900, attempts: 4 })),
    ];
    assert!(judge_probes(&probes).is_empty());
}

#[test]
fn a_member_that_stopped_accepting_writes_is_a_failure() {
    let probes = vec![
        ("n1".to_string(), Ok(ProbeOk { elapsed_ms: 12, attempts: 1 })),
        ("n2".to_string(), Err("last error: put: no response within 9.8s".to_string())),
    ];
    let a = judge_probes(&probes);
    assert_eq!(kinds(&a), ["member-unavailable"]);
    assert!(a[0].message.contains("member n2"), "{}", a[0].message);
    assert!(a[0].message.contains("put"), "{}", a[0].message);
    let view = probes_view(&probes);
    assert_eq!(view["n1"]["attempts"], 1);
    assert!(view["n2"]["error"].as_str().unwrap().contains("put"));
}

/// Client `p` (bound to node `n<p % 3 + 1>`) runs a `put` that ends as `outcome`.
fn put(h: &mut HistoryBuilder, p: u64, outcome: &str) {
    h.invoke(p, "put", "k", json!({"value": format!("v{p}")}));
    match outcome {
        "ok" => h.ok(p, json!({"value": format!("v{p}")})),
        "info" => h.info(p, "timeout"),
        kind => h.fail(p, kind),
    };
}

/// A history: a fault healed at 10 s, then `f(h)` from 20 s on, ending at 30 s.
fn window_of(f: impl FnOnce(&mut HistoryBuilder)) -> Window {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "ok");
    h.advance(5 * S);
    h.nemesis(EventType::Invoke, "kill", json!({}));
    h.nemesis(EventType::Info, "kill", json!({"nodes": ["n2"]}));
    h.advance(5 * S);
    h.nemesis(EventType::Invoke, "heal", json!({"nemesis": "kill"}));
    h.nemesis(EventType::Info, "heal", json!({"nemesis": "kill"}));
    // Inside the recovery grace: not judged, however badly it went.
    for p in 100..110 {
        put(&mut h, p, "info");
    }
    h.advance(10 * S);
    f(&mut h);
    let mut events = h.events();
    for e in &mut events {
        if let Process::Client(p) = e.process {
            e.node = Some(format!("n{}", p % 3 + 1));
        }
    }
    window_stats(&pair(&events).unwrap(), 30 * S)
}

#[test]
fn a_healthy_window_is_fine() {
    let w = window_of(|h| {
        for p in 0..30 {
            put(h, p, "ok");
        }
        // A timeout or two is a blip, and a failed comparison is an answer.
        put(h, 30, "info");
        put(h, 31, "failed-precondition");
        // Blocking operations wait by design.
        for p in 40..50 {
            h.invoke(p, "lock_acquire", "L", json!({"name": "L"}));
            h.info(p, "timeout");
        }
    });
    assert_eq!(w.all, Counts { served: 31, unserved: 1 }, "{w:#?}");
    assert!(w.start_ns > 10 * S, "the grace is skipped: {w:#?}");
    let (a, notes) = judge_window(&w);
    assert!(a.is_empty() && notes.is_empty(), "{:?} {notes:?}", kinds(&a));
}

#[test]
fn a_cluster_that_stays_unavailable_after_the_heal_is_a_failure() {
    let w = window_of(|h| {
        for p in 0..30 {
            put(h, p, if p % 3 == 0 { "ok" } else { "info" });
        }
    });
    let (a, _) = judge_window(&w);
    assert!(kinds(&a).contains(&"unavailable-after-heal".to_string()), "{:?}", kinds(&a));
    let u = a.iter().find(|a| a.kind == "unavailable-after-heal").unwrap();
    assert!(!u.events.is_empty(), "{u:?}");
}

#[test]
fn one_wedged_member_is_named() {
    // n2's clients (p % 3 == 1) time out, or fail to connect; the others are served.
    let w = window_of(|h| {
        for p in 0..30 {
            let outcome = match p % 3 {
                1 if p % 2 == 0 => "info",
                1 => "connect",
                _ => "ok",
            };
            put(h, p, outcome);
        }
    });
    let (a, _) = judge_window(&w);
    let k = kinds(&a);
    assert!(k.contains(&"member-unavailable".to_string()), "{k:?}");
    assert!(k.contains(&"unavailable-after-heal".to_string()), "two thirds is not most: {k:?}");
    let m = a.iter().find(|a| a.kind == "member-unavailable").unwrap();
    assert!(m.message.contains("member n2"), "{}", m.message);
}

#[test]
fn a_wedged_member_whose_clients_are_stuck_in_timeouts_is_named() {
    // Found in a real run: n2's three workers each waited out a 4 s timeout, so n2 had three
    // operations in the window against dozens on the healthy nodes, and the overall fraction
    // stayed above 80 %.
    let w = window_of(|h| {
        for p in (0..60).filter(|p| p % 3 != 1) {
            put(h, p, "ok");
        }
        for p in [61, 64, 67] {
            put(h, p, "info");
        }
    });
    assert!(w.all.fraction() >= MIN_SERVED, "{w:#?}");
    let (a, _) = judge_window(&w);
    assert_eq!(kinds(&a), ["member-unavailable"]);
    assert!(a[0].message.contains("member n2"), "{}", a[0].message);
}

#[test]
fn a_window_with_nothing_in_it_is_noted_not_judged() {
    let w = window_of(|_| {});
    let (a, notes) = judge_window(&w);
    assert!(a.is_empty());
    assert_eq!(notes.len(), 1, "{notes:?}");
    // A fault healed after the end of the workload leaves no window at all.
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "ok");
    h.advance(29 * S);
    h.nemesis(EventType::Invoke, "heal", json!({}));
    let w = window_stats(&pair(&h.events()).unwrap(), 30 * S);
    let (a, notes) = judge_window(&w);
    assert!(a.is_empty());
    assert!(notes[0].contains("no healed window"), "{notes:?}");
}

#[test]
fn final_quiet_fits_short_and_long_runs() {
    assert_eq!(final_quiet(Duration::from_secs(20)), Duration::from_secs(5));
    assert_eq!(final_quiet(Duration::from_secs(120)), Duration::from_secs(6));
}
