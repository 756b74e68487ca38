//! Linearizability of the register workload, checked per key (P-compositionality: a history is
//! linearizable iff each key's sub-history is, because keys are independent registers).
//!
//! Each key's operations become a [`wgl`] search over [`RegisterModel`]:
//! - `ok` operations must take effect between their invocation and completion;
//! - `info` (and never-completed) writes may take effect at any time after their invocation, or
//!   never; `info` and `fail` reads, and `fail` writes, are dropped (they constrain nothing).
//!
//! Values are interned: 0 is "absent", 1 stands for every value that is written but never
//! referenced by a read or a comparison (they are indistinguishable to every check), and the rest
//! are referenced values. Timed-out operations with the same effect share a class, which the
//! search uses to avoid trying them in every order (see [`wgl`]).

use std::collections::HashMap;
use std::time::Instant;

use serde_json::json;

use super::register::{RegF, RegOp};
use super::wgl::{self, Limits, Model, SearchOp};
use super::{Anomaly, Budget, CheckResult, Validity};
use crate::history::Outcome;

/// Interned value id: absent.
const ABSENT: u32 = 0;
/// Interned value id: any value that no operation reads or compares against.
const UNSEEN: u32 = 1;

/// A register operation as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A read (or a failed cas that also read) that observed this value.
    Read(u32),
    Write(u32),
    /// A cas known to have succeeded.
    Cas {
        expect: u32,
        new: u32,
    },
    /// A cas known to have failed; `current` is the value it saw, if recorded.
    CasFailed {
        expect: u32,
        current: Option<u32>,
    },
    /// A cas with an unknown outcome: writes `new` if the register holds `expect`.
    CasMaybe {
        expect: u32,
        new: u32,
    },
    /// A delete known to have deleted the key (`true`) or found it absent (`false`).
    Delete(bool),
    /// A delete with an unknown outcome.
    DeleteMaybe,
}

/// A register holding an interned value (or [`ABSENT`]).
pub struct RegisterModel;

impl Model for RegisterModel {
    type State = u32;
    type Op = Step;

    fn init(&self) -> u32 {
        ABSENT
    }

    fn step(&self, s: &u32, op: &Step) -> Option<u32> {
        let s = *s;
        match *op {
            Step::Read(v) => (s == v).then_some(s),
            Step::Write(v) => Some(v),
            Step::Cas { expect, new } => (s == expect).then_some(new),
            Step::CasFailed { expect, current } => {
                (s != expect && current.is_none_or(|c| c == s)).then_some(s)
            }
            Step::CasMaybe { expect, new } => Some(if s == expect { new } else { s }),
            Step::Delete(true) => (s != ABSENT).then_some(ABSENT),
            Step::Delete(false) => (s == ABSENT).then_some(ABSENT),
            Step::DeleteMaybe => Some(ABSENT),
        }
    }
}

/// One key's search problem, with the tables needed to explain a failure.
struct KeyProblem<'a> {
    ops: Vec<SearchOp<Step>>,
    /// The register operation behind each search op.
    src: Vec<&'a RegOp>,
    /// Interned id -> value, for reports.
    names: Vec<String>,
}

fn intern_key<'a>(ops: &[&'a RegOp]) -> KeyProblem<'a> {
    // Values that some check refers to get their own id; all others collapse into UNSEEN.
    let mut ids: HashMap<&str, u32> = HashMap::new();
    let mut names = vec!["<absent>".to_string(), "<unread value>".to_string()];
    let mut referenced: Vec<&'a str> = Vec::new();
    for op in ops {
        if op.outcome == Outcome::Fail {
            continue;
        }
        if op.outcome == Outcome::Ok {
            if let Some(Some(v)) = &op.read {
                referenced.push(v);
            }
        }
        if let Some(Some(e)) = &op.expect {
            referenced.push(e);
        }
    }
    for v in referenced {
        if !ids.contains_key(v) {
            ids.insert(v, names.len() as u32);
            names.push(v.to_string());
        }
    }
    let id = |v: &Option<String>| -> u32 {
        match v {
            None => ABSENT,
            Some(s) => ids.get(s.as_str()).copied().unwrap_or(UNSEEN),
        }
    };

    let mut classes: HashMap<(u8, u32, u32), u32> = HashMap::new();
    let mut class_of = |tag: u8, a: u32, b: u32| -> Option<u32> {
        let n = classes.len() as u32;
        Some(*classes.entry((tag, a, b)).or_insert(n))
    };
    let mut out = KeyProblem { ops: Vec::new(), src: Vec::new(), names };
    for op in ops {
        let unknown = op.outcome.is_unknown();
        let step = match (op.f, op.outcome) {
            (_, Outcome::Fail) => continue,
            (RegF::Get, Outcome::Ok) => match &op.read {
                Some(v) => Step::Read(id(v)),
                None => continue,
            },
            (RegF::Get, _) => continue,
            (RegF::Put, _) => Step::Write(id(&op.write)),
            (RegF::Cas, Outcome::Ok) => {
                let expect = id(op.expect.as_ref().unwrap_or(&None));
                if op.succeeded == Some(true) {
                    Step::Cas { expect, new: id(&op.write) }
                } else {
                    Step::CasFailed { expect, current: op.read.as_ref().map(&id) }
                }
            }
            (RegF::Cas, _) => Step::CasMaybe {
                expect: id(op.expect.as_ref().unwrap_or(&None)),
                new: id(&op.write),
            },
            (RegF::Delete, Outcome::Ok) => Step::Delete(op.deleted == Some(1)),
            (RegF::Delete, _) => Step::DeleteMaybe,
        };
        // Unknown-outcome operations with identical effects are interchangeable. A write of a
        // referenced value is unique (values are unique), so it gets no class.
        let class = match step {
            _ if !unknown => None,
            Step::Write(UNSEEN) => class_of(0, UNSEEN, 0),
            Step::CasMaybe { expect, new: UNSEEN } => class_of(1, expect, UNSEEN),
            Step::DeleteMaybe => class_of(2, 0, 0),
            _ => None,
        };
        let ret = if unknown { None } else { op.complete };
        out.ops.push(SearchOp { op: step, call: op.invoke, ret, class });
        out.src.push(op);
    }
    out
}

/// Names the kind of a violation from the operation the search could not place.
fn classify(blocked: &RegOp, key_ops: &[&RegOp]) -> &'static str {
    match blocked.f {
        RegF::Cas if blocked.succeeded == Some(true) => "impossible-cas",
        RegF::Cas => "impossible-failed-cas",
        RegF::Delete => "impossible-delete",
        RegF::Put => "nonlinearizable-write",
        RegF::Get => {
            let Some(v) = &blocked.read else { return "nonlinearizable-read" };
            let Some(v) = v else {
                // Absent although a write acknowledged before the read began put a value there.
                // If a later operation still saw one of those values, the write was not lost:
                // this read saw an older state (stale). Otherwise the write looks lost.
                let acked_before: Vec<&str> = key_ops
                    .iter()
                    .filter(|o| {
                        o.is_ok()
                            && o.f != RegF::Delete
                            && o.may_write()
                            && o.complete.is_some_and(|c| c < blocked.invoke)
                    })
                    .filter_map(|o| o.write.as_deref())
                    .collect();
                if acked_before.is_empty() {
                    return "nonlinearizable-read";
                }
                let after = blocked.complete.unwrap_or(u64::MAX);
                let seen_later = key_ops.iter().any(|o| {
                    let read =
                        matches!(&o.read, Some(Some(r)) if acked_before.contains(&r.as_str()));
                    let cas = o.succeeded == Some(true)
                        && matches!(&o.expect, Some(Some(e)) if acked_before.contains(&e.as_str()));
                    o.is_ok() && o.invoke > after && (read || cas)
                });
                return if seen_later { "stale-read" } else { "lost-write" };
            };
            let written = key_ops.iter().any(|o| o.write.as_deref() == Some(v.as_str()));
            if !written {
                return "read-of-unwritten-value";
            }
            // Stale: a write of another value completed before the read began, after the write
            // of the value read had completed (so the value read was already overwritten).
            let writer_done = key_ops
                .iter()
                .filter(|o| o.write.as_deref() == Some(v.as_str()) && o.is_ok())
                .filter_map(|o| o.complete)
                .min();
            let overwritten = key_ops.iter().any(|o| {
                o.is_ok()
                    && o.may_write()
                    && o.write.as_deref() != Some(v.as_str())
                    && o.complete.is_some_and(|c| c < blocked.invoke)
                    && writer_done.is_some_and(|w| w < o.invoke)
            });
            if overwritten {
                "stale-read"
            } else {
                "nonlinearizable-read"
            }
        }
    }
}

/// How many operations of the deepest linearizable prefix a report shows.
const REPORT_PREFIX: usize = 8;
/// How many undecided keys get their own note (the count covers the rest).
const MAX_UNKNOWN_NOTES: usize = 20;
/// How many operations concurrent with the blocked one a report shows.
const REPORT_CONCURRENT: usize = 12;

fn explain(key: &str, p: &KeyProblem<'_>, f: &wgl::Failure<u32>, key_ops: &[&RegOp]) -> Anomaly {
    let state = &p.names[f.state as usize];
    let prefix: Vec<String> = f.linearized[f.linearized.len().saturating_sub(REPORT_PREFIX)..]
        .iter()
        .map(|&i| p.src[i].describe.clone())
        .collect();
    let Some(b) = f.blocked else {
        return Anomaly::new(
            "nonlinearizable",
            Some(key),
            format!("key {key}: no linearization exists"),
            Vec::new(),
        );
    };
    let blocked = p.src[b];
    let end = blocked.complete.unwrap_or(u64::MAX);
    let concurrent: Vec<String> = p
        .src
        .iter()
        .filter(|o| o.invoke < end && o.complete.is_none_or(|c| c > blocked.invoke))
        .filter(|o| o.invoke != blocked.invoke)
        .take(REPORT_CONCURRENT)
        .map(|o| o.describe.clone())
        .collect();
    let kind = classify(blocked, key_ops);
    let mut events = blocked.events();
    for &i in f.linearized.iter().rev().take(REPORT_PREFIX) {
        events.extend(p.src[i].events());
    }
    events.sort_unstable();
    events.dedup();
    Anomaly::new(
        kind,
        Some(key),
        format!(
            "key {key}: {} cannot take effect: after the longest linearizable prefix ({} ops) \
             the register holds {state}",
            blocked.describe,
            f.linearized.len()
        ),
        events,
    )
    .with_detail(json!({
        "blocked": blocked.describe,
        "state_after_prefix": state,
        "prefix_len": f.linearized.len(),
        "prefix_tail": prefix,
        "concurrent": concurrent,
    }))
}

/// Checks every key's sub-history. Keys are searched one after another under one time limit.
pub fn check(ops: &[RegOp], budget: &Budget) -> CheckResult {
    let deadline = Instant::now() + budget.time_limit;
    let mut by_key: HashMap<&str, Vec<&RegOp>> = HashMap::new();
    for op in ops {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    let mut keys: Vec<&str> = by_key.keys().copied().collect();
    keys.sort_unstable();

    let mut anomalies = Vec::new();
    let mut notes = Vec::new();
    let mut verdict = Validity::Valid;
    let (mut steps, mut max_steps, mut max_cache, mut searched_ops) = (0u64, 0u64, 0usize, 0usize);
    let mut unknown_keys = 0usize;
    for key in &keys {
        let key_ops = &by_key[key];
        let problem = intern_key(key_ops);
        searched_ops += problem.ops.len();
        let limits = Limits {
            max_steps: budget.max_steps_per_key,
            max_cache_entries: budget.max_cache_entries_per_key,
            deadline: Some(deadline),
        };
        let (outcome, stats) = wgl::search(&RegisterModel, &problem.ops, &limits);
        steps += stats.steps;
        max_steps = max_steps.max(stats.steps);
        max_cache = max_cache.max(stats.cache_entries);
        match outcome {
            wgl::Outcome::Linearizable => {}
            wgl::Outcome::NotLinearizable(f) => {
                verdict = verdict.combine(Validity::Invalid);
                anomalies.push(explain(key, &problem, &f, key_ops));
            }
            wgl::Outcome::Unknown(why) => {
                verdict = verdict.combine(Validity::Unknown);
                unknown_keys += 1;
                if unknown_keys <= MAX_UNKNOWN_NOTES {
                    notes.push(format!("key {key}: {why} ({} ops)", problem.ops.len()));
                }
            }
        }
    }
    if unknown_keys > MAX_UNKNOWN_NOTES {
        notes.push(format!("... {} more keys unknown", unknown_keys - MAX_UNKNOWN_NOTES));
    }
    if keys.is_empty() {
        verdict = Validity::Unknown;
        notes.push("no register operations to check".to_string());
    }
    let mut r = CheckResult { valid: verdict, anomalies, notes, stats: Default::default() };
    let ok = ops.iter().filter(|o| o.is_ok()).count();
    let unknown = ops.iter().filter(|o| o.outcome.is_unknown()).count();
    r = r
        .stat("keys", keys.len())
        .stat("ops", ops.len())
        .stat("ok_ops", ok)
        .stat("unknown_ops", unknown)
        .stat("searched_ops", searched_ops)
        .stat("unknown_keys", unknown_keys)
        .stat("search_steps", steps)
        .stat("max_steps_per_key", max_steps)
        .stat("max_cache_entries_per_key", max_cache);
    r
}

#[cfg(test)]
#[path = "linearizable_tests.rs"]
mod tests;
