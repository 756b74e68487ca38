//! etcd revision invariants over the register workload (all keys together, since revisions are
//! one counter for the whole store):
//!
//! 1. **unique write revisions**: no two acknowledged writes (put, succeeded cas, delete that
//!    deleted) report the same revision;
//! 2. **write revisions increase in real-time order**: a write that began after another
//!    operation completed gets a revision greater than every revision that operation saw in its
//!    response header;
//! 3. **no read older than a write that completed before it began**: a read's header revision is
//!    at least every header revision of operations completed before the read began, and the
//!    `mod_rev` it returns for a key is at least the revision of every write to that key that
//!    completed before the read began;
//! 4. a read's `mod_rev` is the revision the write of that value reported, and is not above
//!    the read's own header revision.
//!
//! Only `ok` operations are checked: an `info` write's revision is unknown. "Completed before
//! began" uses history order, which the writer keeps consistent with real time.

use std::collections::HashMap;

use super::register::{RegF, RegOp};
use super::{Anomaly, CheckResult};

/// The highest revision seen by operations completed so far, with the operation that saw it.
#[derive(Debug, Clone, Copy, Default)]
struct Max {
    rev: i64,
    op: Option<usize>,
}

impl Max {
    fn bump(&mut self, rev: i64, op: usize) {
        if rev > self.rev || self.op.is_none() {
            *self = Max { rev, op: Some(op) };
        }
    }
}

/// Whether the operation is a write that created a revision.
fn wrote(op: &RegOp) -> bool {
    op.is_ok()
        && match op.f {
            RegF::Put => true,
            RegF::Cas => op.succeeded == Some(true),
            RegF::Delete => op.deleted == Some(1),
            RegF::Get => false,
        }
}

pub fn check(ops: &[RegOp]) -> CheckResult {
    let mut anomalies = Vec::new();
    let ok: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].is_ok()).collect();
    let mut unchecked = 0usize;

    // 1. Unique write revisions.
    let mut by_rev: HashMap<i64, usize> = HashMap::new();
    for &i in &ok {
        let op = &ops[i];
        if !wrote(op) {
            continue;
        }
        let Some(rev) = op.write_rev else {
            unchecked += 1;
            continue;
        };
        if let Some(&j) = by_rev.get(&rev) {
            let other = &ops[j];
            let mut events = other.events();
            events.extend(op.events());
            anomalies.push(Anomaly::new(
                "duplicate-write-revision",
                Some(&op.key),
                format!(
                    "two acknowledged writes report revision {rev}: {} and {}",
                    other.describe, op.describe
                ),
                events,
            ));
        } else {
            by_rev.insert(rev, i);
        }
    }

    // 2-3. A sweep in history order: at each invocation, remember the maxima over operations
    // completed before it; check each operation against them.
    let mut points: Vec<(u64, bool, usize)> = Vec::with_capacity(ok.len() * 2);
    for &i in &ok {
        points.push((ops[i].invoke, true, i));
        if let Some(c) = ops[i].complete {
            points.push((c, false, i));
        }
    }
    points.sort_unstable();
    let mut seen = Max::default();
    let mut key_written: HashMap<&str, Max> = HashMap::new();
    let mut before: HashMap<usize, (Max, Max)> = HashMap::new();
    for &(_, is_invoke, i) in &points {
        let op = &ops[i];
        if is_invoke {
            let k = key_written.get(op.key.as_str()).copied().unwrap_or_default();
            before.insert(i, (seen, k));
        } else {
            if let Some(h) = op.header_rev {
                seen.bump(h, i);
            }
            if wrote(op) {
                if let Some(r) = op.write_rev {
                    key_written.entry(op.key.as_str()).or_default().bump(r, i);
                }
            }
        }
    }

    // Revision reported by the ok write of each value, for check 4.
    let mut value_rev: HashMap<(&str, &str), i64> = HashMap::new();
    for &i in &ok {
        let op = &ops[i];
        if wrote(op) && op.f != RegF::Delete {
            if let (Some(v), Some(r)) = (&op.write, op.write_rev) {
                value_rev.insert((op.key.as_str(), v.as_str()), r);
            }
        }
    }

    for &i in &ok {
        let op = &ops[i];
        let Some(&(seen_before, key_before)) = before.get(&i) else { continue };
        let pair_events = |j: Option<usize>| {
            let mut e = j.map(|j| ops[j].events()).unwrap_or_default();
            e.extend(op.events());
            e
        };
        let prior = |j: Option<usize>| j.map(|j| ops[j].describe.clone()).unwrap_or_default();
        if wrote(op) {
            if let Some(r) = op.write_rev {
                if seen_before.op.is_some() && r <= seen_before.rev {
                    anomalies.push(Anomaly::new(
                        "revision-went-backwards",
                        Some(&op.key),
                        format!(
                            "{} wrote revision {r}, but {} had completed before it began and \
                             saw revision {}",
                            op.describe,
                            prior(seen_before.op),
                            seen_before.rev
                        ),
                        pair_events(seen_before.op),
                    ));
                }
            }
            continue;
        }
        // A read: a get, a failed cas or a delete that found nothing.
        if let Some(h) = op.header_rev {
            if seen_before.op.is_some() && h < seen_before.rev {
                anomalies.push(Anomaly::new(
                    "stale-read",
                    Some(&op.key),
                    format!(
                        "{} was served at revision {h}, older than revision {} which {} had \
                         seen before the read began",
                        op.describe,
                        seen_before.rev,
                        prior(seen_before.op)
                    ),
                    pair_events(seen_before.op),
                ));
            }
        }
        let Some(m) = op.read_mod_rev else { continue };
        if key_before.op.is_some() && m < key_before.rev {
            anomalies.push(Anomaly::new(
                "stale-read",
                Some(&op.key),
                format!(
                    "{} returned a value of revision {m}, older than {} (revision {}), which \
                     completed before the read began",
                    op.describe,
                    prior(key_before.op),
                    key_before.rev
                ),
                pair_events(key_before.op),
            ));
        }
        if let Some(h) = op.header_rev {
            if m > h {
                anomalies.push(Anomaly::new(
                    "revision-from-the-future",
                    Some(&op.key),
                    format!("{} returned mod_rev {m} above its header revision {h}", op.describe),
                    op.events(),
                ));
            }
        }
        if let Some(Some(v)) = &op.read {
            if let Some(&r) = value_rev.get(&(op.key.as_str(), v.as_str())) {
                if r != m {
                    anomalies.push(Anomaly::new(
                        "revision-mismatch",
                        Some(&op.key),
                        format!(
                            "{} returned value {v:?} with mod_rev {m}, but its write reported \
                             revision {r}",
                            op.describe
                        ),
                        op.events(),
                    ));
                }
            }
        }
    }

    let writes = ok.iter().filter(|&&i| wrote(&ops[i])).count();
    let mut r = CheckResult::from_anomalies(anomalies)
        .stat("ok_ops", ok.len())
        .stat("ok_writes", writes)
        .stat("writes_without_revision", unchecked);
    if unchecked > 0 {
        r.notes.push(format!("{unchecked} acknowledged writes carried no revision"));
    }
    if ok.is_empty() {
        r = r.at_most_unknown("no acknowledged register operations to check");
    }
    r
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::checker::{check_history, Budget, CheckResult, Validity};
    use crate::history::HistoryBuilder;

    fn rev(h: &HistoryBuilder) -> CheckResult {
        check_history("register", &h.events(), &Budget::default()).unwrap().checkers["revision"]
            .clone()
    }

    fn put(h: &mut HistoryBuilder, p: u64, k: &str, v: &str, r: i64) {
        h.invoke(p, "put", k, json!({"value": v}));
        h.ok_rev(p, json!({"value": v, "mod_rev": r}), r);
    }

    fn get(h: &mut HistoryBuilder, p: u64, k: &str, v: Option<(&str, i64)>, header: i64) {
        h.invoke(p, "get", k, json!(null));
        let value = match v {
            Some((v, m)) => json!({"value": v, "mod_rev": m}),
            None => json!({"value": null}),
        };
        h.ok_rev(p, value, header);
    }

    #[track_caller]
    fn assert_anomaly(r: &CheckResult, kind: &str) {
        assert_eq!(r.valid, Validity::Invalid, "{r:#?}");
        assert!(r.anomalies.iter().any(|a| a.kind == kind), "expected {kind}: {r:#?}");
    }

    #[test]
    fn increasing_revisions_are_valid() {
        let mut h = HistoryBuilder::new();
        put(&mut h, 0, "a", "x", 2);
        put(&mut h, 1, "b", "y", 3);
        get(&mut h, 0, "a", Some(("x", 2)), 3);
        h.invoke(1, "cas", "a", json!({"expect": "x", "new": "z"}));
        h.ok_rev(1, json!({"expect": "x", "new": "z", "succeeded": true, "mod_rev": 4}), 4);
        h.invoke(0, "delete", "b", json!(null));
        h.ok_rev(0, json!({"deleted": 1, "mod_rev": 5}), 5);
        get(&mut h, 1, "b", None, 5);
        // An info write has no known revision and is not checked.
        h.invoke(2, "put", "a", json!({"value": "w"}));
        h.info(2, "timeout");
        get(&mut h, 0, "a", Some(("z", 4)), 6);
        assert_eq!(rev(&h).valid, Validity::Valid, "{:#?}", rev(&h));
    }

    #[test]
    fn concurrent_writes_may_commit_in_either_order() {
        let mut h = HistoryBuilder::new();
        h.invoke(0, "put", "a", json!({"value": "x"}));
        h.invoke(1, "put", "b", json!({"value": "y"}));
        h.ok_rev(1, json!({"value": "y", "mod_rev": 2}), 2);
        h.ok_rev(0, json!({"value": "x", "mod_rev": 3}), 3);
        assert_eq!(rev(&h).valid, Validity::Valid);
    }

    #[test]
    fn duplicate_write_revision_is_rejected() {
        let mut h = HistoryBuilder::new();
        h.invoke(0, "put", "a", json!({"value": "x"}));
        h.invoke(1, "put", "b", json!({"value": "y"}));
        h.ok_rev(0, json!({"value": "x", "mod_rev": 2}), 2);
        h.ok_rev(1, json!({"value": "y", "mod_rev": 2}), 2);
        assert_anomaly(&rev(&h), "duplicate-write-revision");
    }

    #[test]
    fn revision_going_backwards_is_rejected() {
        let mut h = HistoryBuilder::new();
        put(&mut h, 0, "a", "x", 5);
        put(&mut h, 1, "b", "y", 4);
        assert_anomaly(&rev(&h), "revision-went-backwards");
    }

    #[test]
    fn read_older_than_a_completed_write_is_rejected() {
        let mut h = HistoryBuilder::new();
        put(&mut h, 0, "a", "x", 2);
        put(&mut h, 0, "b", "y", 3);
        get(&mut h, 1, "c", None, 2); // header revision 2 < 3
        assert_anomaly(&rev(&h), "stale-read");

        let mut h = HistoryBuilder::new();
        put(&mut h, 0, "a", "x", 2);
        put(&mut h, 0, "a", "y", 3);
        get(&mut h, 1, "a", Some(("x", 2)), 3); // value older than the completed write
        assert_anomaly(&rev(&h), "stale-read");
    }

    #[test]
    fn read_with_the_wrong_mod_rev_is_rejected() {
        let mut h = HistoryBuilder::new();
        put(&mut h, 0, "a", "x", 2);
        get(&mut h, 1, "a", Some(("x", 3)), 3);
        assert_anomaly(&rev(&h), "revision-mismatch");
        let mut h = HistoryBuilder::new();
        put(&mut h, 0, "a", "x", 2);
        get(&mut h, 1, "a", Some(("x", 2)), 1);
        assert_anomaly(&rev(&h), "revision-from-the-future");
    }
}
