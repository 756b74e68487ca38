//! The per-member checker on hand-made histories: valid ones it must pass, and each broken
//! kind it must report (a checker that cannot fail proves nothing).

use serde_json::{json, Value};

use crate::checker::{check_history, Budget, CheckResult, Validity};
use crate::history::HistoryBuilder;

const A: u64 = 0xa;
const B: u64 = 0xb;

fn check(h: &HistoryBuilder) -> CheckResult {
    check_history("register", &h.events(), &Budget::default()).unwrap().checkers["member-reads"]
        .clone()
}

fn put(h: &mut HistoryBuilder, p: u64, k: &str, v: &str, rev: i64, member: u64) {
    h.invoke(p, "put", k, json!({"value": v}));
    h.ok_from(p, json!({"value": v, "mod_rev": rev}), rev, member);
}

fn read_value(v: Option<(&str, i64)>) -> Value {
    match v {
        Some((v, m)) => json!({"value": v, "mod_rev": m}),
        None => json!({"value": null}),
    }
}

fn sget(h: &mut HistoryBuilder, p: u64, k: &str, v: Option<(&str, i64)>, rev: i64, member: u64) {
    h.invoke(p, "sget", k, json!(null));
    h.ok_from(p, read_value(v), rev, member);
}

#[track_caller]
fn assert_anomaly(r: &CheckResult, kind: &str) {
    assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
    assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected {kind}: {r:#?}");
}

#[test]
fn reads_that_keep_up_with_their_member_are_valid() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "a", "x", 2, A);
    sget(&mut h, 0, "a", Some(("x", 2)), 2, A);
    // Another member may lag behind A's write: serializable reads promise nothing across members.
    sget(&mut h, 1, "a", None, 1, B);
    put(&mut h, 1, "a", "y", 3, B);
    sget(&mut h, 1, "a", Some(("y", 3)), 3, B);
    // A read concurrent with a write may miss it.
    h.invoke(2, "put", "a", json!({"value": "z"}));
    h.invoke(3, "sget", "a", json!(null));
    h.ok_from(3, read_value(Some(("y", 3))), 3, A);
    h.ok_from(2, json!({"value": "z", "mod_rev": 4}), 4, A);
    // Unknown outcomes and failed reads carry no floor.
    h.invoke(4, "put", "a", json!({"value": "w"}));
    h.info(4, "timeout");
    sget(&mut h, 0, "a", Some(("z", 4)), 4, A);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert_eq!(r.stats["serializable_reads_checked"], json!(5));
}

#[test]
fn a_read_missing_the_members_own_acknowledged_write_is_reported() {
    // The bug of issue 21: the follower acknowledged the put (the leader applied it) before it
    // applied the entry itself, so its next serializable read showed the old version.
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "a", "x", 2, A);
    put(&mut h, 0, "a", "y", 3, A);
    sget(&mut h, 1, "a", Some(("x", 2)), 3, A);
    assert_anomaly(&check(&h), "member-missed-own-write");
}

#[test]
fn a_member_whose_reads_go_back_is_reported() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "a", "x", 5, A);
    sget(&mut h, 1, "b", None, 4, A);
    assert_anomaly(&check(&h), "member-read-went-back");

    // Between two serializable reads, and through a linearizable get.
    let mut h = HistoryBuilder::new();
    sget(&mut h, 0, "a", None, 7, A);
    sget(&mut h, 1, "a", None, 6, A);
    assert_anomaly(&check(&h), "member-read-went-back");
    let mut h = HistoryBuilder::new();
    h.invoke(0, "get", "a", json!(null));
    h.ok_from(0, read_value(None), 9, A);
    sget(&mut h, 1, "a", None, 8, A);
    assert_anomaly(&check(&h), "member-read-went-back");
}

#[test]
fn a_member_added_again_under_a_new_id_starts_over() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "a", "x", 5, A);
    // Member B is A's node after a remove, wipe and add: empty state, new id.
    sget(&mut h, 1, "a", None, 1, B);
    assert_eq!(check(&h).valid, Validity::Valid);
}

#[test]
fn serializable_reads_stay_out_of_the_linearizability_check() {
    // Stale across members, so not linearizable, yet allowed for a serializable read.
    let mut h = HistoryBuilder::new();
    put(&mut h, 0, "a", "x", 2, A);
    sget(&mut h, 1, "a", None, 1, B);
    let report = check_history("register", &h.events(), &Budget::default()).unwrap();
    assert_eq!(report.valid, Validity::Valid, "{report:#?}");
}
