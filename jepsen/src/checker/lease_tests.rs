//! Hand-made lease histories that the lease checker must reject or accept.

use serde_json::json;

use crate::checker::{check_history, Budget, CheckResult, Validity};
use crate::history::HistoryBuilder;

const S: u64 = 1_000_000_000;

fn check(h: &HistoryBuilder) -> CheckResult {
    check_history("lease", &h.events(), &Budget::default()).unwrap().checkers["lease"].clone()
}

#[track_caller]
fn assert_anomaly(r: &CheckResult, kind: &str) {
    assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
    assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected {kind}: {r:#?}");
}

fn grant(h: &mut HistoryBuilder, p: u64, id: i64, ttl: i64) {
    h.invoke(p, "lease_grant", "", json!({"ttl": ttl}));
    h.ok(p, json!({"id": id, "ttl": ttl}));
}

fn put(h: &mut HistoryBuilder, p: u64, key: &str, lease: i64, rev: i64) {
    h.invoke(p, "put", key, json!({"value": key, "lease": lease}));
    h.ok(p, json!({"value": key, "lease": lease, "mod_rev": rev}));
}

fn get_absent(h: &mut HistoryBuilder, p: u64, key: &str) {
    h.invoke(p, "get", key, json!(null));
    h.ok(p, json!({"value": null}));
}

fn keepalive(h: &mut HistoryBuilder, p: u64, id: i64, ttl: i64) {
    h.invoke(p, "lease_keepalive", "", json!({"id": id}));
    h.ok(p, json!({"id": id, "ttl": ttl}));
}

/// The key log of the prefix: `(rev, key, lease or None for a delete)`.
fn log(h: &mut HistoryBuilder, until: i64, events: &[(i64, &str, Option<i64>)]) {
    let items: Vec<_> = events
        .iter()
        .map(|(rev, key, lease)| match lease {
            Some(l) => json!({"rev": rev, "key": key, "type": "put", "value": key,
                              "create_rev": rev, "lease": l}),
            None => json!({"rev": rev, "key": key, "type": "delete", "create_rev": 0, "lease": 0}),
        })
        .collect();
    h.invoke(99, "watch", "k/", json!({"prefix": "k/", "start": 1, "log": true, "until": until}));
    h.ok(99, json!({"prefix": "k/", "start": 1, "log": true, "until": until, "items": items}));
}

#[test]
fn expiry_after_the_ttl_is_valid() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    put(&mut h, 0, "k/b", 1, 3);
    h.advance(S);
    keepalive(&mut h, 0, 1, 2); // alive until ~3 s
    h.advance(3 * S);
    get_absent(&mut h, 1, "k/a"); // at ~4 s: expired, fine
    log(&mut h, 9, &[(2, "k/a", Some(1)), (3, "k/b", Some(1)), (5, "k/a", None), (5, "k/b", None)]);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert_eq!(r.stats["expiry_reads_checked"], json!(1));
}

#[test]
fn early_expiry_is_rejected() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    h.advance(S);
    get_absent(&mut h, 1, "k/a"); // 1 s into a 2 s lease
    assert_anomaly(&check(&h), "early-expiry");
}

#[test]
fn keepalive_extends_the_guarantee() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    h.advance(3 * S / 2);
    keepalive(&mut h, 0, 1, 2); // alive until 3.5 s
    h.advance(S);
    get_absent(&mut h, 1, "k/a"); // at 2.5 s: past the grant's bound, not the keep-alive's
    assert_anomaly(&check(&h), "early-expiry");
}

#[test]
fn revoked_lease_may_vanish_at_once() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    h.invoke(0, "lease_revoke", "", json!({"id": 1}));
    h.info(0, "timeout"); // unknown outcome: it may have happened
    get_absent(&mut h, 1, "k/a");
    assert_eq!(check(&h).valid, Validity::Unknown, "no log, so at most unknown");
    assert!(check(&h).anomalies.is_empty());
}

#[test]
fn expiry_over_two_revisions_is_rejected() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    put(&mut h, 0, "k/b", 1, 3);
    log(&mut h, 9, &[(2, "k/a", Some(1)), (3, "k/b", Some(1)), (5, "k/a", None), (6, "k/b", None)]);
    assert_anomaly(&check(&h), "partial-expiry");
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    put(&mut h, 0, "k/b", 1, 3);
    log(&mut h, 9, &[(2, "k/a", Some(1)), (3, "k/b", Some(1)), (5, "k/a", None)]);
    assert_anomaly(&check(&h), "key-survived-lease");
}

#[test]
fn put_on_a_dead_lease_is_rejected() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    h.invoke(0, "lease_revoke", "", json!({"id": 1}));
    h.ok(0, json!({"id": 1}));
    put(&mut h, 1, "k/a", 1, 3);
    assert_anomaly(&check(&h), "put-on-dead-lease");
    // Shown by the log: the lease's keys died at 4, a put on it was applied at 6.
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 1, 2);
    put(&mut h, 0, "k/a", 1, 2);
    h.advance(3 * S);
    put(&mut h, 0, "k/b", 1, 6);
    log(&mut h, 9, &[(2, "k/a", Some(1)), (4, "k/a", None), (6, "k/b", Some(1))]);
    assert_anomaly(&check(&h), "put-on-dead-lease");
}

#[test]
fn duplicate_lease_ids_are_rejected() {
    let mut h = HistoryBuilder::new();
    grant(&mut h, 0, 7, 2);
    grant(&mut h, 1, 7, 2);
    assert_anomaly(&check(&h), "duplicate-lease-id");
}
