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
fn grant_answered_late_is_not_an_overlap() {
    // Found in a lock-kv-set run under pause: process 1 was granted the lock (token 10) before
    // process 0's key even existed, but its answer arrived only while 0 held the lock (1's
    // client or member was paused, its lease expired meanwhile and the lock passed to 0). Its
    // completion inside 0's hold proves nothing about when it held the lock.
    let mut h = HistoryBuilder::new();
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    let k0 = acquire(&mut h, 0, 2, 11);
    h.ok(1, json!({"key": "L/1", "token": 10}));
    release(&mut h, 0, &k0, Some(true));
    release(&mut h, 1, "L/1", Some(false));
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
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

/// A grant with its grant revision (the response header's).
fn acquire_at(h: &mut HistoryBuilder, p: u64, key: &str, token: i64, grant_rev: i64) {
    h.invoke(p, "lock_acquire", "L", json!({"name": "L", "lease": p}));
    h.ok(p, json!({"key": key, "token": token, "grant_rev": grant_rev}));
}

/// The key-event log of `L/`: `(rev, key, delete)`.
fn key_log(h: &mut HistoryBuilder, p: u64, until: i64, events: &[(i64, &str, bool)]) {
    let items: Vec<_> = events
        .iter()
        .map(|(rev, key, del)| {
            if *del {
                json!({"rev": rev, "key": key, "type": "delete", "create_rev": 0, "lease": 0})
            } else {
                json!({"rev": rev, "key": key, "type": "put", "value": "", "create_rev": rev,
                       "lease": 1})
            }
        })
        .collect();
    h.invoke(p, "watch", "L/", json!({"prefix": "L/", "start": 1, "log": true, "until": until}));
    h.ok(p, json!({"prefix": "L/", "start": 1, "log": true, "until": until, "items": items}));
}

#[test]
fn handover_matching_the_key_log_is_valid() {
    let mut h = HistoryBuilder::new();
    acquire_at(&mut h, 0, "L/a", 3, 3);
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 2}));
    release(&mut h, 0, "L/a", Some(true));
    // B's key was created at 4 and proven oldest at 5, when A's key had just been deleted.
    h.ok(1, json!({"key": "L/b", "token": 4, "grant_rev": 5}));
    key_log(
        &mut h,
        9,
        10,
        &[(3, "L/a", false), (4, "L/b", false), (5, "L/a", true), (6, "L/b", true)],
    );
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert_eq!(r.stats["key_log"], json!(true));
}

#[test]
fn grant_on_an_expired_key_is_rejected() {
    // The contender's key was deleted (its lease expired) at 4, yet it was granted at 5.
    let mut h = HistoryBuilder::new();
    acquire_at(&mut h, 0, "L/a", 3, 5);
    key_log(&mut h, 9, 10, &[(3, "L/a", false), (4, "L/a", true)]);
    assert_anomaly(&check(&h), "grant-on-dead-key");
    // The same when the token could not even be read after the grant.
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    h.ok(0, json!({"key": "L/a", "token": null, "grant_rev": 5}));
    key_log(&mut h, 9, 10, &[(3, "L/a", false), (4, "L/a", true)]);
    assert_anomaly(&check(&h), "grant-on-dead-key");
}

#[test]
fn grant_while_an_older_key_lives_is_rejected() {
    // A holds (key created at 3) while B (key at 4) is granted at 5: two holders.
    let mut h = HistoryBuilder::new();
    acquire_at(&mut h, 0, "L/a", 3, 3);
    acquire_at(&mut h, 1, "L/b", 4, 5);
    key_log(&mut h, 9, 10, &[(3, "L/a", false), (4, "L/b", false), (7, "L/a", true)]);
    assert_anomaly(&check(&h), "not-oldest");
}

#[test]
fn overtaking_an_older_waiter_is_a_fifo_violation() {
    // A waits with the older key (3); B (key 4) is granted at 5 and only later A, at 7.
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    acquire_at(&mut h, 1, "L/b", 4, 5);
    release(&mut h, 1, "L/b", Some(true));
    h.ok(0, json!({"key": "L/a", "token": 3, "grant_rev": 7}));
    key_log(
        &mut h,
        9,
        10,
        &[(3, "L/a", false), (4, "L/b", false), (6, "L/b", true), (8, "L/a", true)],
    );
    assert_anomaly(&check(&h), "fifo-violation");
    // Without the log, the token / grant-revision order alone shows it.
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    acquire_at(&mut h, 1, "L/b", 4, 5);
    release(&mut h, 1, "L/b", Some(true));
    h.ok(0, json!({"key": "L/a", "token": 3, "grant_rev": 7}));
    assert_anomaly(&check(&h), "fifo-violation");
}

#[test]
fn missing_token_is_taken_from_the_log() {
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    h.ok(0, json!({"key": "L/a", "token": null, "grant_rev": 3}));
    key_log(&mut h, 9, 10, &[(3, "L/a", false), (4, "L/a", true)]);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert_eq!(r.stats["tokens_from_log"], json!(1));
}

fn check_lock_set(h: &HistoryBuilder) -> crate::checker::Report {
    check_history("lock-set", &h.events(), &Budget::default()).unwrap()
}

#[test]
fn lock_set_lost_update_reveals_overlapping_holders() {
    // A holds token 10 and reads the set; its lease expires; B is granted token 11, adds 2; A
    // writes back its stale snapshot plus 1. The lock checker cannot blame the lock service (A's
    // release reports the lock lost), but the set checker sees element 2 vanish.
    let mut h = HistoryBuilder::new();
    acquire(&mut h, 0, 1, 10);
    h.invoke(0, "resource_add", "memory/set", json!({"element": 1, "token": 10}));
    acquire(&mut h, 1, 2, 11);
    h.invoke(1, "resource_add", "memory/set", json!({"element": 2, "token": 11}));
    h.ok(1, json!({"element": 2, "token": 11}));
    h.ok(0, json!({"element": 1, "token": 10}));
    release(&mut h, 0, "L/1", Some(false));
    release(&mut h, 1, "L/2", Some(true));
    h.invoke(2, "resource_read", "memory/set", json!(null));
    h.ok(2, json!({"elements": [1]}));
    let r = check_lock_set(&h);
    assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
    assert!(r.checkers["set"].anomalies.iter().any(|a| a.kind == "lost"), "{r:#?}");
    assert_eq!(r.checkers["lock"].valid, Validity::Valid, "{r:#?}");
}

#[test]
fn fenced_rejection_keeps_the_set_whole() {
    let mut h = HistoryBuilder::new();
    acquire(&mut h, 0, 1, 10);
    h.invoke(0, "resource_add", "memory/set", json!({"element": 1, "token": 10}));
    acquire(&mut h, 1, 2, 11);
    h.invoke(1, "resource_add", "memory/set", json!({"element": 2, "token": 11}));
    h.ok(1, json!({"element": 2, "token": 11}));
    h.fail(0, "fenced"); // the stale holder's write is refused: 1 is definitely not in the set
    release(&mut h, 0, "L/1", Some(false));
    release(&mut h, 1, "L/2", Some(true));
    h.invoke(2, "resource_read", "memory/set", json!(null));
    h.ok(2, json!({"elements": [2]}));
    let r = check_lock_set(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

fn release_at(h: &mut HistoryBuilder, p: u64, key: &str, held: bool, revision: i64) {
    h.invoke(p, "lock_release", "L", json!({"name": "L", "key": key}));
    h.ok_rev(p, json!({"held": held}), revision);
}

#[test]
fn double_grant_to_a_contender_invoked_before_the_grant_is_rejected() {
    // Planted in a real history: B asked before A's grant completed (so the "invoked inside the
    // hold" rule exempts it), was answered with a higher token while A still held, and both
    // releases say they held. Each held without interruption from its answer to its release,
    // and those intervals overlap: two holders at once.
    let mut h = HistoryBuilder::new();
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 2}));
    let ka = acquire(&mut h, 0, 1, 10);
    h.ok(1, json!({"key": "L/2", "token": 11}));
    release(&mut h, 0, &ka, Some(true));
    release(&mut h, 1, "L/2", Some(true));
    let r = check(&h);
    assert_anomaly(&r, "overlapping-holders");
    assert_eq!(r.anomalies.len(), 1, "one pair, reported once: {r:#?}");

    // The mirror image: A's acquisition was the one invoked first and answered last.
    let mut h = HistoryBuilder::new();
    h.invoke(0, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    let kb = acquire(&mut h, 1, 2, 11);
    h.ok(0, json!({"key": "L/1", "token": 10}));
    release(&mut h, 1, &kb, Some(true));
    release(&mut h, 0, "L/1", Some(true));
    assert_anomaly(&check(&h), "overlapping-holders");
}

#[test]
fn late_answer_to_a_holder_who_then_lost_the_lock_stays_valid() {
    // The same interleaving, but B's release finds its key gone: B may have been granted before
    // A's key existed and lost the lock (lease expiry) before A was granted. No proof of overlap.
    let mut h = HistoryBuilder::new();
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 2}));
    let ka = acquire(&mut h, 0, 1, 10);
    h.ok(1, json!({"key": "L/2", "token": 11}));
    release(&mut h, 0, &ka, Some(true));
    release(&mut h, 1, "L/2", Some(false));
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");

    // And sequential definite holders, one invoked while the other held, are a handover.
    let mut h = HistoryBuilder::new();
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 2}));
    let ka = acquire(&mut h, 0, 1, 10);
    release(&mut h, 0, &ka, Some(true));
    h.ok(1, json!({"key": "L/2", "token": 11}));
    release(&mut h, 1, "L/2", Some(true));
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn grant_revision_after_a_release_it_preceded_is_rejected() {
    // B asks first; A is granted (token 3, at revision 3). B is answered at grant revision 6
    // before A's release is even sent, yet A's release deleted its key at revision 5. B was
    // invoked before A's grant completed and its release is unknown, so neither overlap rule
    // applies: only the revisions show the double grant.
    let mut h = HistoryBuilder::new();
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    acquire_at(&mut h, 0, "L/a", 3, 3);
    h.ok(1, json!({"key": "L/b", "token": 4, "grant_rev": 6}));
    release_at(&mut h, 0, "L/a", true, 5);
    h.invoke(1, "lock_release", "L", json!({"name": "L", "key": "L/b"}));
    h.info(1, "timeout");
    let r = check(&h);
    assert_anomaly(&r, "grant-revision-after-release");
    assert_eq!(r.anomalies.len(), 1, "{r:#?}");
}

#[test]
fn grant_answered_after_the_release_began_may_have_a_later_revision() {
    // The orderly version: B's answer arrives after A's release was sent (the release deleted
    // A's key at 5, B was granted at 6 and answered before A heard back).
    let mut h = HistoryBuilder::new();
    acquire_at(&mut h, 0, "L/a", 3, 3);
    h.invoke(1, "lock_acquire", "L", json!({"name": "L", "lease": 1}));
    h.invoke(0, "lock_release", "L", json!({"name": "L", "key": "L/a"}));
    h.ok(1, json!({"key": "L/b", "token": 4, "grant_rev": 6}));
    h.ok_rev(0, json!({"held": true}), 5);
    release_at(&mut h, 1, "L/b", true, 7);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}
