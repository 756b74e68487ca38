//! Hand-made register histories that the linearizability checker must reject or accept.

use std::time::Duration;

use serde_json::json;

use crate::checker::{check_history, Budget, CheckResult, Validity};
use crate::history::HistoryBuilder;

fn lin(h: &HistoryBuilder) -> CheckResult {
    lin_with(h, &Budget::default())
}

fn lin_with(h: &HistoryBuilder, budget: &Budget) -> CheckResult {
    let report = check_history("register", &h.events(), budget).expect("well-formed history");
    report.checkers["linearizable"].clone()
}

#[track_caller]
fn assert_valid(r: &CheckResult) {
    assert_eq!(r.valid, Validity::Valid, "expected valid: {r:#?}");
}

#[track_caller]
fn assert_anomaly(r: &CheckResult, kind: &str) {
    assert_eq!(r.valid, Validity::Invalid, "expected invalid: {r:#?}");
    assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected a {kind} anomaly: {r:#?}");
}

fn put(h: &mut HistoryBuilder, p: u64, k: &str, v: &str) {
    h.invoke(p, "put", k, json!({"value": v}));
    h.ok(p, json!({"value": v}));
}

fn get(h: &mut HistoryBuilder, p: u64, k: &str, v: Option<&str>) {
    h.invoke(p, "get", k, json!(null));
    h.ok(p, json!({"value": v}));
}

#[test]
fn sequential_history_is_valid() {
    let mut h = HistoryBuilder::new();
    get(&mut h, 0, "k", None);
    put(&mut h, 0, "k", "a");
    get(&mut h, 1, "k", Some("a"));
    h.invoke(1, "cas", "k", json!({"expect": "a", "new": "b"}));
    h.ok(1, json!({"expect": "a", "new": "b", "succeeded": true}));
    h.invoke(0, "cas", "k", json!({"expect": "a", "new": "c"}));
    h.ok(0, json!({"expect": "a", "new": "c", "succeeded": false, "current": "b"}));
    get(&mut h, 0, "k", Some("b"));
    h.invoke(1, "delete", "k", json!(null));
    h.ok(1, json!({"deleted": 1}));
    h.invoke(1, "delete", "k", json!(null));
    h.ok(1, json!({"deleted": 0}));
    h.invoke(0, "cas", "k", json!({"expect": null, "new": "d"}));
    h.ok(0, json!({"expect": null, "new": "d", "succeeded": true}));
    get(&mut h, 1, "k", Some("d"));
    assert_valid(&lin(&h));
}

#[test]
fn concurrent_operations_may_take_effect_in_either_order() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "put", "k", json!({"value": "a"}));
    get(&mut h, 1, "k", None); // concurrent with the put: before it
    get(&mut h, 2, "k", Some("a")); // concurrent with the put: after it
    h.ok(0, json!({"value": "a"}));
    assert_valid(&lin(&h));
}

#[test]
fn stale_read_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    put(&mut h, 0, "k", "b");
    get(&mut h, 1, "k", Some("a"));
    let r = lin(&h);
    assert_anomaly(&r, "stale-read");
    assert_eq!(r.anomalies[0].key.as_deref(), Some("k"));
    // The report names the offending read's events (indexes 4 and 5).
    assert!(r.anomalies[0].events.contains(&4), "{r:#?}");
}

#[test]
fn lost_write_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    get(&mut h, 1, "k", None);
    assert_anomaly(&lin(&h), "lost-write");
}

#[test]
fn stale_read_of_an_absent_key_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    get(&mut h, 1, "k", None); // stale: the write is seen again below, so it was not lost
    get(&mut h, 2, "k", Some("a"));
    assert_anomaly(&lin(&h), "stale-read");
}

#[test]
fn read_of_a_value_never_written_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    get(&mut h, 1, "k", Some("zzz"));
    assert_anomaly(&lin(&h), "read-of-unwritten-value");
}

#[test]
fn impossible_cas_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    h.invoke(1, "cas", "k", json!({"expect": "b", "new": "c"}));
    h.ok(1, json!({"expect": "b", "new": "c", "succeeded": true}));
    assert_anomaly(&lin(&h), "impossible-cas");
}

#[test]
fn failed_cas_that_should_have_succeeded_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    h.invoke(1, "cas", "k", json!({"expect": "a", "new": "c"}));
    h.ok(1, json!({"expect": "a", "new": "c", "succeeded": false}));
    assert_anomaly(&lin(&h), "impossible-failed-cas");
}

#[test]
fn failed_cas_reading_the_wrong_value_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    put(&mut h, 0, "k", "b");
    h.invoke(1, "cas", "k", json!({"expect": "x", "new": "c"}));
    h.ok(1, json!({"expect": "x", "new": "c", "succeeded": false, "current": "a"}));
    assert_anomaly(&lin(&h), "impossible-failed-cas");
}

#[test]
fn delete_of_an_existing_key_that_found_nothing_is_rejected() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    h.invoke(1, "delete", "k", json!(null));
    h.ok(1, json!({"deleted": 0}));
    assert_anomaly(&lin(&h), "impossible-delete");
}

#[test]
fn info_write_may_take_effect_late() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "put", "k", json!({"value": "a"}));
    h.info(0, "timeout");
    get(&mut h, 1, "k", None);
    put(&mut h, 1, "k", "b");
    get(&mut h, 1, "k", Some("a")); // the timed-out put landed after b
    assert_valid(&lin(&h));
}

#[test]
fn info_write_may_never_take_effect() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "put", "k", json!({"value": "a"}));
    h.info(0, "timeout");
    h.invoke(3, "cas", "k", json!({"expect": null, "new": "c"}));
    h.info(3, "unavailable");
    h.invoke(4, "delete", "k", json!(null));
    h.info(4, "unavailable");
    get(&mut h, 1, "k", None);
    put(&mut h, 1, "k", "b");
    get(&mut h, 2, "k", Some("b"));
    assert_valid(&lin(&h));
}

#[test]
fn pending_write_is_treated_like_info() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "put", "k", json!({"value": "a"}));
    get(&mut h, 1, "k", Some("a"));
    assert_valid(&lin(&h));
}

#[test]
fn info_write_cannot_take_effect_before_its_invocation() {
    let mut h = HistoryBuilder::new();
    get(&mut h, 1, "k", Some("a"));
    h.invoke(0, "put", "k", json!({"value": "a"}));
    h.info(0, "timeout");
    assert_eq!(lin(&h).valid, Validity::Invalid);
}

#[test]
fn info_cas_takes_effect_only_if_its_comparison_holds() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    h.invoke(1, "cas", "k", json!({"expect": "zz", "new": "b"}));
    h.info(1, "timeout");
    get(&mut h, 2, "k", Some("b"));
    assert_eq!(lin(&h).valid, Validity::Invalid);

    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k", "a");
    h.invoke(1, "cas", "k", json!({"expect": "a", "new": "b"}));
    h.info(1, "timeout");
    get(&mut h, 2, "k", Some("b"));
    assert_valid(&lin(&h));
}

#[test]
fn failed_write_must_not_be_visible() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "put", "k", json!({"value": "a"}));
    h.fail(0, "invalid-argument");
    get(&mut h, 1, "k", Some("a"));
    assert_eq!(lin(&h).valid, Validity::Invalid);
}

#[test]
fn keys_are_independent() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "k1", "a");
    get(&mut h, 1, "k2", None);
    get(&mut h, 1, "k1", Some("a"));
    assert_valid(&lin(&h));
    put(&mut h, 0, "k2", "b");
    get(&mut h, 1, "k1", Some("b"));
    let r = lin(&h);
    assert_eq!(r.valid, Validity::Invalid);
    assert_eq!(r.anomalies.len(), 1);
    assert_eq!(r.anomalies[0].key.as_deref(), Some("k1"));
}

#[test]
fn many_timed_out_writes_stay_cheap() {
    // 120 timed-out writes and deletes: without the symmetry reduction the search could try
    // every subset of them (2^120). With it, each class is linearized in call order, so the
    // memoized configurations are at most (61 x 61 prefixes) x (x7 placed or not) x states, and
    // the search stays far below the default budget of 20 M steps.
    let mut h = HistoryBuilder::new();
    for i in 0..60u64 {
        h.invoke(100 + i, "put", "k", json!({"value": format!("x{i}")}));
        h.info(100 + i, "timeout");
        h.invoke(200 + i, "delete", "k", json!(null));
        h.info(200 + i, "timeout");
    }
    put(&mut h, 0, "k", "a");
    get(&mut h, 1, "k", Some("a"));
    h.invoke(2, "cas", "k", json!({"expect": "a", "new": "b"}));
    h.ok(2, json!({"expect": "a", "new": "b", "succeeded": false, "current": "x7"}));
    get(&mut h, 1, "k", None);
    let r = lin(&h);
    assert_valid(&r);
    let steps = r.stats["search_steps"].as_u64().unwrap();
    assert!(steps < 3_000_000, "search took {steps} steps");
}

/// `n` concurrent acknowledged puts and then a read of a value nobody wrote: a violation, but
/// one the search can only establish after trying every subset of the puts.
fn hard_history(n: u64) -> HistoryBuilder {
    let mut h = HistoryBuilder::new();
    for i in 0..n {
        h.invoke(i, "put", "k", json!({"value": format!("v{i}")}));
    }
    for i in 0..n {
        h.ok(i, json!({"value": format!("v{i}")}));
    }
    get(&mut h, 1000, "k", Some("nobody-wrote-this"));
    h
}

#[test]
fn tiny_budget_gives_unknown_not_valid() {
    let h = hard_history(24);
    let tiny = Budget {
        max_steps_per_key: 10_000,
        max_cache_entries_per_key: 1_000_000,
        time_limit: Duration::from_secs(60),
    };
    let r = lin_with(&h, &tiny);
    assert_eq!(r.valid, Validity::Unknown, "{r:#?}");
    assert!(r.notes.iter().any(|n| n.contains("steps")), "{r:#?}");

    let small_cache = Budget { max_cache_entries_per_key: 1000, ..Budget::default() };
    assert_eq!(lin_with(&h, &small_cache).valid, Validity::Unknown);

    let no_time = Budget { time_limit: Duration::ZERO, ..Budget::default() };
    assert_eq!(lin_with(&h, &no_time).valid, Validity::Unknown);
}

#[test]
fn hard_history_within_budget_is_decided() {
    let r = lin(&hard_history(10));
    assert_anomaly(&r, "read-of-unwritten-value");
}
