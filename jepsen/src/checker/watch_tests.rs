//! Hand-made watch histories that the watch checker must reject or accept.

use serde_json::{json, Value};

use crate::checker::{check_history, Budget, CheckResult, Validity};
use crate::history::{EventType, HistoryBuilder};

fn check(h: &HistoryBuilder) -> CheckResult {
    check_history("watch", &h.events(), &Budget::default()).unwrap().checkers["watch"].clone()
}

#[track_caller]
fn assert_anomaly(r: &CheckResult, kind: &str) {
    assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
    assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected {kind}: {r:#?}");
}

/// Puts `w/k` = `v<rev>` at revisions `revs`.
fn puts(h: &mut HistoryBuilder, revs: &[i64]) {
    for &r in revs {
        h.invoke(0, "put", "w/k", json!({"value": format!("v{r}")}));
        h.ok(0, json!({"value": format!("v{r}"), "mod_rev": r}));
    }
}

fn ev(rev: i64) -> Value {
    json!({"rev": rev, "key": "w/k", "type": "put", "value": format!("v{rev}"),
           "create_rev": 2, "lease": 0})
}

fn progress(rev: i64) -> Value {
    json!({ "progress": rev })
}

fn watch(h: &mut HistoryBuilder, p: u64, start: i64, items: Vec<Value>) {
    watch_ext(h, p, start, None, items, false, 0);
}

fn watch_ext(
    h: &mut HistoryBuilder,
    p: u64,
    start: i64,
    resume_of: Option<i64>,
    items: Vec<Value>,
    canceled: bool,
    compact_revision: i64,
) {
    watch_created(h, p, start, resume_of, items, canceled, compact_revision, 1);
}

/// A watch whose member was at revision `created_rev` when it created the watch.
#[allow(clippy::too_many_arguments)]
fn watch_created(
    h: &mut HistoryBuilder,
    p: u64,
    start: i64,
    resume_of: Option<i64>,
    items: Vec<Value>,
    canceled: bool,
    compact_revision: i64,
    created_rev: i64,
) {
    h.invoke(p, "watch", "w/", json!({"prefix": "w/", "start": start, "resume_of": resume_of}));
    h.ok(
        p,
        json!({"prefix": "w/", "start": start, "resume_of": resume_of, "items": items,
               "created_rev": created_rev, "canceled": canceled,
               "compact_revision": compact_revision}),
    );
}

#[test]
fn complete_ordered_delivery_is_valid() {
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    watch(&mut h, 1, 2, vec![ev(2), ev(3), ev(4), progress(4)]);
    // A resumed session continuing at last + 1.
    watch_ext(&mut h, 2, 4, Some(3), vec![ev(4)], false, 0);
    // A watch "from now" (created at 1, so from 2).
    watch(&mut h, 3, 0, vec![ev(2), ev(3)]);
    let r = check(&h);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn gap_is_rejected() {
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    watch(&mut h, 1, 2, vec![ev(2), ev(4)]);
    assert_anomaly(&check(&h), "gap");
    // A gap at the start.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    watch(&mut h, 1, 2, vec![ev(3), ev(4)]);
    assert_anomaly(&check(&h), "gap");
}

#[test]
fn duplicate_and_reordered_events_are_rejected() {
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3]);
    watch(&mut h, 1, 2, vec![ev(2), ev(3), ev(3)]);
    assert_anomaly(&check(&h), "duplicate-event");
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3]);
    watch(&mut h, 1, 2, vec![ev(3), ev(2)]);
    assert_anomaly(&check(&h), "out-of-order");
}

#[test]
fn progress_before_an_event_it_covers_is_rejected() {
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3]);
    watch(&mut h, 1, 2, vec![ev(2), progress(3)]);
    assert_anomaly(&check(&h), "progress-ahead");
    // An event at or below a progress revision arriving after it.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    watch(&mut h, 1, 2, vec![ev(2), ev(3), progress(4), ev(4)]);
    assert_anomaly(&check(&h), "progress-ahead");
}

#[test]
fn resumed_watch_must_continue_at_last_plus_one() {
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    watch_ext(&mut h, 1, 5, Some(3), vec![], false, 0);
    assert_anomaly(&check(&h), "resume-start");
}

#[test]
fn compacted_start_must_be_refused_with_its_revision() {
    // The compaction's response reports store revision 4.
    let compact = |h: &mut HistoryBuilder| {
        h.invoke(5, "compact", "", json!({"revision": 3}));
        h.ok_rev(5, json!({"revision": 3}), 4);
    };
    // Refused with the compaction revision: valid.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    compact(&mut h);
    watch_ext(&mut h, 1, 2, None, vec![], true, 3);
    watch(&mut h, 2, 3, vec![ev(3), ev(4)]);
    assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
    // Accepted although compacted, by a member past the compaction (created at 5 > 4).
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4, 5]);
    compact(&mut h);
    watch_created(&mut h, 1, 2, None, vec![ev(2), ev(3), ev(4), ev(5)], false, 0, 5);
    assert_anomaly(&check(&h), "compacted-start-accepted");
    // Accepted by a member that had not applied the compaction yet (found in a watch run under
    // kill: a just-restarted member at revision 492 served a watch from 493 below a compaction
    // at 557): it serves its own, older history; no anomaly.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4, 5]);
    compact(&mut h);
    watch_created(&mut h, 1, 2, None, vec![ev(2), ev(3), ev(4), ev(5)], false, 0, 4);
    assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
    // Refused without saying where the compaction is.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    compact(&mut h);
    watch_ext(&mut h, 1, 2, None, vec![], true, 0);
    assert_anomaly(&check(&h), "compacted-without-revision");
    // Refused as compacted beyond any compaction requested.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    watch_ext(&mut h, 1, 2, None, vec![], true, 4);
    assert_anomaly(&check(&h), "spurious-compaction");
}

#[test]
fn phantom_and_inconsistent_events_are_rejected() {
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2]);
    let mut bad = ev(2);
    bad["value"] = json!("never-written");
    watch(&mut h, 1, 2, vec![bad]);
    let r = check(&h);
    assert_anomaly(&r, "phantom-event");
    assert_anomaly(&r, "inconsistent-event");
}

#[test]
fn admin_nemesis_compactions_count() {
    let admin = |h: &mut HistoryBuilder, outcome: &str| {
        h.nemesis(EventType::Invoke, "admin", json!({"leader": "n1"}));
        h.nemesis(
            EventType::Info,
            "admin",
            json!({"action": "compact", "revision": 3, "outcome": outcome, "nodes": ["n1"]}),
        );
    };
    // The nemesis does not record the store revision its compaction was applied at, so a watch
    // below it that was served is not blamed (its member may have lagged); its events are
    // still checked like any other's.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    admin(&mut h, "ok");
    watch(&mut h, 1, 2, vec![ev(2), ev(3), ev(4)]);
    assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
    // Refused with its revision: valid.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    admin(&mut h, "ok");
    watch_ext(&mut h, 1, 2, None, vec![], true, 3);
    assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
    // A compaction with an unknown outcome may explain a refusal but does not require one.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    admin(&mut h, "info");
    watch_ext(&mut h, 1, 2, None, vec![], true, 3);
    watch(&mut h, 2, 2, vec![ev(2), ev(3), ev(4)]);
    assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
    // A failed one explains nothing.
    let mut h = HistoryBuilder::new();
    puts(&mut h, &[2, 3, 4]);
    admin(&mut h, "fail");
    watch_ext(&mut h, 1, 2, None, vec![], true, 3);
    assert_anomaly(&check(&h), "spurious-compaction");
}
