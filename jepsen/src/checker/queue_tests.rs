//! Hand-made queue histories that the queue checker must reject or accept.

use serde_json::json;

use crate::checker::{check_history, Budget, CheckResult, Validity};
use crate::history::HistoryBuilder;

fn check(h: &HistoryBuilder) -> CheckResult {
    check_history("queue", &h.events(), &Budget::default()).unwrap().checkers["queue"].clone()
}

fn enqueue(h: &mut HistoryBuilder, p: u64, payload: u64, id: &str) {
    h.invoke(p, "enqueue", "jepsen", json!({"payload": payload}));
    h.ok(p, json!({"payload": payload, "id": id, "revision": 1}));
}

fn claim(h: &mut HistoryBuilder, p: u64, id: &str, payload: u64, token: i64) {
    h.invoke(p, "claim", "jepsen", json!({"lease": 1}));
    h.ok(p, json!({"id": id, "payload": payload, "token": token, "attempt": 1}));
}

fn ack(h: &mut HistoryBuilder, p: u64, id: &str, payload: u64, token: i64, rev: i64) {
    h.invoke(p, "ack", "jepsen", json!({"id": id, "token": token, "payload": payload}));
    h.ok(p, json!({"id": id, "token": token, "payload": payload, "revision": rev}));
}

fn drained(h: &mut HistoryBuilder, dead: &[u64]) {
    h.invoke(9, "dead_letters", "jepsen", json!(null));
    h.ok(9, json!({"payloads": dead, "final": true}));
}

#[track_caller]
fn assert_anomaly(r: &CheckResult, kind: &str) {
    assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
    assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected {kind}: {r:#?}");
}

#[test]
fn a_clean_history_is_valid() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    enqueue(&mut h, 0, 2, "b");
    enqueue(&mut h, 0, 3, "c");
    claim(&mut h, 1, "a", 1, 10);
    ack(&mut h, 1, "a", 1, 10, 11);
    // b: the first claimant's lease died (no ack); a later claim acks it.
    claim(&mut h, 2, "b", 2, 12);
    claim(&mut h, 1, "b", 2, 14);
    ack(&mut h, 1, "b", 2, 14, 15);
    // The first claimant's late ack is refused: a definite fail.
    h.invoke(2, "ack", "jepsen", json!({"id": "b", "token": 12, "payload": 2}));
    h.fail(2, "failed-precondition");
    // c: dead-lettered.
    drained(&mut h, &[3]);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn an_acknowledged_enqueue_never_done_is_lost() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    enqueue(&mut h, 0, 2, "b");
    claim(&mut h, 1, "a", 1, 10);
    ack(&mut h, 1, "a", 1, 10, 11);
    drained(&mut h, &[]);
    assert_anomaly(&check(&h), "lost");
}

#[test]
fn unknown_enqueues_and_unknown_acks_are_not_lost() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "enqueue", "jepsen", json!({"payload": 1}));
    h.info(0, "timeout");
    enqueue(&mut h, 3, 2, "b");
    claim(&mut h, 1, "b", 2, 10);
    h.invoke(1, "ack", "jepsen", json!({"id": "b", "token": 10, "payload": 2}));
    h.info(1, "timeout");
    drained(&mut h, &[]);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn without_the_final_drain_the_verdict_is_unknown() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    let r = check(&h);
    assert_eq!(r.valid, Validity::Unknown, "{r:#?}");
}

#[test]
fn two_claims_acking_one_job_are_rejected() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    claim(&mut h, 1, "a", 1, 10);
    claim(&mut h, 2, "a", 1, 12);
    ack(&mut h, 1, "a", 1, 10, 13);
    ack(&mut h, 2, "a", 1, 12, 14);
    drained(&mut h, &[]);
    let r = check(&h);
    assert_anomaly(&r, "double-ack");
    assert_anomaly(&r, "overlapping-claims");
}

#[test]
fn a_claim_created_inside_another_live_claim_is_rejected() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    claim(&mut h, 1, "a", 1, 10);
    claim(&mut h, 2, "a", 1, 11); // created at 11, while token 10 lives until 12
    ack(&mut h, 1, "a", 1, 10, 12);
    drained(&mut h, &[]);
    assert_anomaly(&check(&h), "overlapping-claims");
}

#[test]
fn a_claim_after_the_previous_one_ended_is_fine() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    claim(&mut h, 1, "a", 1, 10);
    h.invoke(1, "nack", "jepsen", json!({"id": "a", "token": 10, "payload": 1}));
    h.ok(1, json!({"id": "a", "token": 10, "payload": 1, "revision": 11, "dead": false}));
    claim(&mut h, 2, "a", 1, 12);
    ack(&mut h, 2, "a", 1, 12, 13);
    drained(&mut h, &[]);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn shared_tokens_and_phantom_payloads_are_rejected() {
    let mut h = HistoryBuilder::new();
    enqueue(&mut h, 0, 1, "a");
    claim(&mut h, 1, "a", 1, 10);
    claim(&mut h, 2, "a", 1, 10);
    claim(&mut h, 3, "z", 99, 20);
    drained(&mut h, &[1]);
    let r = check(&h);
    assert_anomaly(&r, "shared-claim");
    assert_anomaly(&r, "phantom");
}
