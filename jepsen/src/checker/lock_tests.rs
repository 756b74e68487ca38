//! Hand-made lock histories that the lock checker must reject or accept.

use serde_json::json;

use crate::checker::{check_history, Budget, CheckResult, Validity};
use crate::history::HistoryBuilder;

fn check(h: &HistoryBuilder) -> CheckResult {
    check_history("lock", &h.events(), &Budget::default()).unwrap().checkers["lock"].clone()
}

fn acquire(h: &mut HistoryBuilder, p: u64, lease: i64, token: i64) -> String {
    let key = format!("L/{lease:x}");
    h.invoke(p, "lock_acquire", "L", json!({"name": "L", "lease": lease}));
    h.ok(p, json!({"key": key, "token": token}));
    key
}

fn release(h: &mut HistoryBuilder, p: u64, key: &str, held: Option<bool>) {
    h.invoke(p, "lock_release", "L", json!({"name": "L", "key": key}));
    match held {
        Some(b) => h.ok(p, json!({"held": b})),
        None => h.ok(p, json!(null)),
    };
}

#[track_caller]
fn assert_anomaly(r: &CheckResult, kind: &str) {
    assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
    assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected {kind}: {r:#?}");
}

#[test]
fn orderly_handover_is_valid() {
    let mut h = HistoryBuilder::new();
    let k1 = acquire(&mut h, 0, 1, 10);
    // Process 1 waits while 0 holds the lock.
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 2}));
    release(&mut h, 0, &k1, Some(true));
    h.ok(1, json!({"key": "L/2", "token": 11}));
    release(&mut h, 1, "L/2", None);
    acquire(&mut h, 0, 3, 12);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn overlapping_holders_are_rejected() {
    let mut h = HistoryBuilder::new();
    let k1 = acquire(&mut h, 0, 1, 10);
    acquire(&mut h, 1, 2, 11); // granted while 0 still holds
    release(&mut h, 0, &k1, Some(true));
    assert_anomaly(&check(&h), "overlapping-holders");
}

#[test]
fn holder_with_unknown_release_gives_no_definite_interval() {
    // 0's release timed out: 0 may have lost the lock (lease expiry) before 1's grant, so the
    // checker must not claim an overlap.
    let mut h = HistoryBuilder::new();
    let k1 = acquire(&mut h, 0, 1, 10);
    acquire(&mut h, 1, 2, 11);
    h.invoke(0, "lock_release", "L", json!({"name": "L", "key": k1}));
    h.info(0, "timeout");
    assert_eq!(check(&h).valid, Validity::Valid);

    // Same with a release that reports the lock already lost.
    let mut h = HistoryBuilder::new();
    let k1 = acquire(&mut h, 0, 1, 10);
    acquire(&mut h, 1, 2, 11);
    release(&mut h, 0, &k1, Some(false));
    assert_eq!(check(&h).valid, Validity::Valid);
}

#[test]
fn info_acquire_is_not_a_holder() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    h.info(0, "timeout");
    let k = acquire(&mut h, 1, 2, 11);
    release(&mut h, 1, &k, Some(true));
    assert_eq!(check(&h).valid, Validity::Valid);
}

#[test]
fn duplicate_token_is_rejected() {
    let mut h = HistoryBuilder::new();
    let k1 = acquire(&mut h, 0, 1, 10);
    release(&mut h, 0, &k1, Some(true));
    acquire(&mut h, 1, 2, 10);
    assert_anomaly(&check(&h), "duplicate-token");
}

#[test]
fn token_going_backwards_is_rejected() {
    let mut h = HistoryBuilder::new();
    let k1 = acquire(&mut h, 0, 1, 10);
    release(&mut h, 0, &k1, Some(true));
    acquire(&mut h, 1, 2, 9);
    assert_anomaly(&check(&h), "token-not-increasing");
}

#[test]
fn concurrent_acquisitions_may_get_tokens_in_either_order() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 2}));
    // 1's key was created first, so 1 is granted first although 0 asked first.
    h.ok(1, json!({"key": "L/2", "token": 9}));
    release(&mut h, 1, "L/2", Some(true));
    h.ok(0, json!({"key": "L/1", "token": 10}));
    assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
}

#[test]
fn no_grants_is_unknown() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    h.fail(0, "unavailable");
    assert_eq!(check(&h).valid, Validity::Unknown);
}
