//! The watch checker (the `watch` workload).
//!
//! Every `ok` `watch` operation lists what its session delivered, in order (`items`: events and
//! `{progress: revision}` notifications; see [`crate::workload::watch`]). The "final history"
//! is every event known to exist: each `ok` put at its `mod_rev`, and every event any watch
//! (including the key-event log recorded after healing) delivered. Per watch session, with `s`
//! its effective start (`start`, or `created_rev + 1` for a watch "from now"):
//!
//! - **ordered, unique**: revisions never go backwards, no (revision, key) twice
//!   (`out-of-order`, `duplicate-event`), nothing before `s` (`event-before-start`);
//! - **consistent**: every delivery of a (revision, key) agrees with the others and with the put
//!   that wrote it (`inconsistent-event`), and no event carries a value no put could have
//!   written (`phantom-event`);
//! - **no gaps**: every known event with revision in `[s, last delivered]` was delivered
//!   (`gap`); a resumed session (`resume_of: L`) starts at `L + 1` (`resume-start`), so the
//!   resumed chain has no gap either;
//! - **compaction**: a start below a compaction that completed before the watch began, on a
//!   member that had applied it (its creation revision is above the revision the compaction's
//!   response reported; a lagging member rightly serves older history), is refused with
//!   `canceled` and a `compact_revision` (`compacted-start-accepted`,
//!   `compacted-without-revision`), and a refusal names a revision above the start and not above
//!   any compaction requested so far (`spurious-compaction`). Compactions are the workload's
//!   `compact` operations and the `admin` nemesis's (`admin` events with `action: compact`,
//!   completed when their `outcome` is `ok`, requested unless it is `fail`);
//! - **progress**: a progress notification at `P` comes after every known event in `[s, P]`,
//!   and no later event is at or below `P` (`progress-ahead`).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde_json::Value;

use super::keylog::{parse_item, LogEvent};
use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome, Process};

/// How many missing revisions an anomaly lists.
const SHOW: usize = 10;

/// One delivered item.
enum Item {
    Event(LogEvent),
    Progress(i64),
}

fn items(op: &Op) -> Vec<Item> {
    op.value()
        .get("items")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| match v.get("progress").and_then(Value::as_i64) {
                    Some(p) => Some(Item::Progress(p)),
                    None => parse_item(v).map(Item::Event),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn prefix_of(op: &Op) -> String {
    op.value().get("prefix").and_then(Value::as_str).or(op.key()).unwrap_or_default().to_string()
}

type Known = BTreeMap<(i64, String), (Option<String>, u64)>;

/// A compaction that may have happened.
struct Compaction {
    revision: i64,
    /// History index of its invocation.
    invoked: u64,
    /// History index of its completion, when it is known to have been applied.
    completed: Option<u64>,
    /// The store revision its response header reported: every member whose state is past this
    /// revision has applied the compaction. `None` when unknown (the `admin` nemesis).
    applied_rev: Option<i64>,
}

/// The compaction an operation requested, unless it definitely did not happen: the workload's
/// `compact` and the `admin` nemesis's `compact` action.
fn compaction(op: &Op) -> Option<Compaction> {
    let ok_index = || (op.outcome() == Outcome::Ok).then(|| op.complete_index()).flatten();
    match op.f() {
        "compact" if op.outcome() != Outcome::Fail => Some(Compaction {
            revision: op.invoke.value.get("revision").and_then(Value::as_i64)?,
            invoked: op.invoke.index,
            completed: ok_index(),
            applied_rev: op
                .complete
                .as_ref()
                .filter(|_| op.outcome() == Outcome::Ok)
                .and_then(|c| c.header.as_ref())
                .map(|h| h.revision),
        }),
        "admin" if op.process() == Process::Nemesis => {
            let v = op.value();
            if v.get("action").and_then(Value::as_str) != Some("compact") {
                return None;
            }
            let outcome = v.get("outcome").and_then(Value::as_str).unwrap_or("info");
            if outcome == "fail" {
                return None;
            }
            Some(Compaction {
                revision: v.get("revision").and_then(Value::as_i64)?,
                invoked: op.invoke.index,
                completed: if outcome == "ok" { op.complete_index() } else { None },
                applied_rev: None,
            })
        }
        _ => None,
    }
}

/// Adds an observation of (revision, key) to the final history, reporting a disagreement.
fn observe(
    known: &mut Known,
    rev: i64,
    key: &str,
    value: Option<String>,
    at: u64,
    anomalies: &mut Vec<Anomaly>,
) {
    match known.get(&(rev, key.to_string())) {
        Some((v, first)) if *v != value => anomalies.push(Anomaly::new(
            "inconsistent-event",
            Some(key),
            format!(
                "revision {rev} of {key} was reported as {v:?} (event #{first}) and as {value:?} \
                 (event #{at})"
            ),
            vec![*first, at],
        )),
        Some(_) => {}
        None => {
            known.insert((rev, key.to_string()), (value, at));
        }
    }
}

pub fn check(ops: &[Op]) -> Result<CheckResult, CheckError> {
    let watches: Vec<&Op> =
        ops.iter().filter(|o| o.f() == "watch" && o.outcome() == Outcome::Ok).collect();
    let mut anomalies = Vec::new();

    // Values each put could have written (not `fail`), and the final history.
    let mut writable: HashSet<&str> = HashSet::new();
    let mut known: Known = BTreeMap::new();
    let compacts: Vec<Compaction> = ops.iter().filter_map(compaction).collect();
    for op in ops {
        match (op.f(), op.outcome()) {
            ("put", o) if o != Outcome::Fail => {
                if let Some(v) = op.invoke.value.get("value").and_then(Value::as_str) {
                    writable.insert(v);
                }
                if o == Outcome::Ok {
                    let rev = op.value().get("mod_rev").and_then(Value::as_i64);
                    let val = op.value().get("value").and_then(Value::as_str).map(str::to_string);
                    if let (Some(rev), Some(k), Some(at)) = (rev, op.key(), op.complete_index()) {
                        observe(&mut known, rev, k, val, at, &mut anomalies);
                    }
                }
            }
            _ => {}
        }
    }
    let mut delivered = 0usize;
    for w in &watches {
        let at = w.complete_index().unwrap_or(w.invoke.index);
        for it in items(w) {
            if let Item::Event(e) = it {
                delivered += 1;
                let v = if e.delete { None } else { e.value.clone() };
                observe(&mut known, e.rev, &e.key, v, at, &mut anomalies);
                if !e.delete && e.value.as_deref().is_some_and(|v| !writable.contains(v)) {
                    anomalies.push(Anomaly::new(
                        "phantom-event",
                        Some(&e.key),
                        format!(
                            "{} delivered {}={:?} at revision {}, a value no put could have \
                             written",
                            w.describe_short(),
                            e.key,
                            e.value,
                            e.rev
                        ),
                        w.indexes(),
                    ));
                }
            }
        }
    }

    let mut gaps = 0usize;
    for w in &watches {
        check_one(w, &known, &compacts, &mut anomalies, &mut gaps);
    }
    let mut r = CheckResult::from_anomalies(anomalies)
        .stat("watches", watches.len())
        .stat("events_delivered", delivered)
        .stat("known_events", known.len())
        .stat("compactions", compacts.len())
        .stat("missing_events", gaps);
    if watches.is_empty() {
        r = r.at_most_unknown("no watch delivered anything to check");
    }
    Ok(r)
}

trait Short {
    fn describe_short(&self) -> String;
}

impl Short for Op {
    /// `#index pN watch from S` (a watch's full description lists every item).
    fn describe_short(&self) -> String {
        format!(
            "#{} p{} watch {} from {}",
            self.invoke.index,
            self.process(),
            prefix_of(self),
            self.invoke.value.get("start").and_then(Value::as_i64).unwrap_or(0)
        )
    }
}

fn check_one(
    w: &Op,
    known: &Known,
    compacts: &[Compaction],
    anomalies: &mut Vec<Anomaly>,
    gaps: &mut usize,
) {
    let v = w.value();
    let prefix = prefix_of(w);
    let start = v.get("start").and_then(Value::as_i64).unwrap_or(0);
    let created = v.get("created_rev").and_then(Value::as_i64);
    let canceled = v.get("canceled").and_then(Value::as_bool).unwrap_or(false);
    let compact_rev = v.get("compact_revision").and_then(Value::as_i64).unwrap_or(0);
    let name = w.describe_short();
    let mut push = |kind: &str, msg: String| {
        anomalies.push(Anomaly::new(kind, Some(&prefix), format!("{name}: {msg}"), w.indexes()));
    };
    let its = items(w);
    let events: Vec<&LogEvent> = its
        .iter()
        .filter_map(|i| match i {
            Item::Event(e) => Some(e),
            Item::Progress(_) => None,
        })
        .collect();

    // Resumption.
    if let Some(l) = w.invoke.value.get("resume_of").and_then(Value::as_i64) {
        if start != l + 1 {
            push("resume-start", format!("resumed after revision {l} but started at {start}"));
        }
    }
    // Compaction.
    let compacted_before = compacts
        .iter()
        .filter(|c| c.completed.is_some_and(|i| i < w.invoke.index))
        .map(|c| c.revision)
        .max()
        .unwrap_or(0);
    let requested_by_end = compacts
        .iter()
        .filter(|c| Some(c.invoked) < w.complete_index())
        .map(|c| c.revision)
        .max()
        .unwrap_or(0);
    // Watches are served from the contacted member's own state, which may lag: a member that
    // has not applied a compaction yet rightly serves history below it. Acceptance is an
    // anomaly only when the member was demonstrably past the compaction when it created the
    // watch: its creation revision is above the revision the compaction's own response
    // reported (the compaction was applied before the write that made that revision newer).
    let compacted_on_member = compacts
        .iter()
        .filter(|c| c.completed.is_some_and(|i| i < w.invoke.index))
        .filter(|c| matches!((c.applied_rev, created), (Some(a), Some(cr)) if cr > a))
        .map(|c| c.revision)
        .max()
        .unwrap_or(0);
    let progressed = its.iter().any(|i| matches!(i, Item::Progress(_)));
    if start > 0 && start < compacted_on_member && !canceled && (!events.is_empty() || progressed) {
        push(
            "compacted-start-accepted",
            format!(
                "started at {start}, below the compaction at {compacted_on_member} that the \
                 member (created at {}) had applied, yet was not refused",
                created.unwrap_or(0)
            ),
        );
    }
    if start > 0 && start < compacted_before && canceled && compact_rev == 0 {
        push(
            "compacted-without-revision",
            format!("refused a start below {compacted_before} without a compact_revision"),
        );
    }
    if canceled && compact_rev > 0 && (compact_rev <= start || compact_rev > requested_by_end) {
        push(
            "spurious-compaction",
            format!(
                "refused start {start} as compacted at {compact_rev}, but the highest \
                 compaction requested by then was {requested_by_end}"
            ),
        );
    }
    if canceled && compact_rev > 0 {
        return;
    }

    // Order and uniqueness.
    let mut seen: HashSet<(i64, &str)> = HashSet::new();
    let mut prev: Option<i64> = None;
    for e in &events {
        if prev.is_some_and(|p| e.rev < p) {
            push("out-of-order", format!("event at {} after one at {}", e.rev, prev.unwrap_or(0)));
        }
        if !seen.insert((e.rev, e.key.as_str())) {
            push("duplicate-event", format!("{} at revision {} delivered twice", e.key, e.rev));
        }
        prev = Some(prev.map_or(e.rev, |p| p.max(e.rev)));
    }
    let s = if start > 0 { Some(start) } else { created.map(|c| c + 1) };
    let Some(s) = s.or(events.first().map(|e| e.rev)) else { return };
    if let Some(e) = events.iter().find(|e| e.rev < s) {
        push(
            "event-before-start",
            format!("delivered {} at revision {}, before its start {s}", e.key, e.rev),
        );
    }
    let in_range = |lo: i64, hi: i64| {
        known
            .range((lo, String::new())..)
            .take_while(move |((r, _), _)| *r <= hi)
            .filter(|((_, k), _)| k.starts_with(prefix.as_str()))
            .map(|((r, k), _)| (*r, k.as_str()))
    };
    // No gaps up to the last delivered event.
    if let Some(last) = events.iter().map(|e| e.rev).max() {
        let missing: Vec<(i64, &str)> =
            in_range(s, last).filter(|(r, k)| !seen.contains(&(*r, *k))).collect();
        if !missing.is_empty() {
            *gaps += missing.len();
            let shown: Vec<_> = missing.iter().take(SHOW).collect();
            push(
                "gap",
                format!(
                    "{} known events in [{s}, {last}] were not delivered: {shown:?}{}",
                    missing.len(),
                    if missing.len() > SHOW { " ..." } else { "" }
                ),
            );
        }
    }
    // Progress notifications.
    let mut before: BTreeSet<(i64, &str)> = BTreeSet::new();
    let mut last_progress: Option<i64> = None;
    for it in &its {
        match it {
            Item::Event(e) => {
                if let Some(p) = last_progress.filter(|p| e.rev <= *p) {
                    push(
                        "progress-ahead",
                        format!("event at {} arrived after a progress notification at {p}", e.rev),
                    );
                }
                before.insert((e.rev, e.key.as_str()));
            }
            Item::Progress(p) => {
                let missing: Vec<(i64, &str)> =
                    in_range(s, *p).filter(|x| !before.contains(x)).collect();
                if !missing.is_empty() {
                    let shown: Vec<_> = missing.iter().take(SHOW).collect();
                    push(
                        "progress-ahead",
                        format!(
                            "progress notification at {p} before {} known events at or below it \
                             were delivered: {shown:?}",
                            missing.len()
                        ),
                    );
                }
                last_progress = Some(last_progress.map_or(*p, |q: i64| q.max(*p)));
            }
        }
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
