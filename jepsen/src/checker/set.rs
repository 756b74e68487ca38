//! The set checker: no acknowledged element is lost.
//!
//! Operations: `add` / `resource_add` with `{"element": e}` (an integer or a string), and
//! `read` / `resource_read` -> ok `{"elements": [...]}`. The `set` workload keeps the set in a
//! key; the `lock-set` family keeps it in harness memory behind a lock (`resource_*`).
//!
//! For every `ok` read R:
//! - every element whose add was acknowledged (`ok`) before R began must be in R (**lost**);
//! - every element in R must have been added by some operation that was not `fail`ed and that
//!   began before R completed (**unexpected**).
//!
//! `info` adds may or may not appear. Without any `ok` read there is nothing to check, and the
//! verdict is `unknown`.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome};

/// How many elements an anomaly message lists before eliding the rest.
const SHOW: usize = 20;

fn is_add(f: &str) -> bool {
    matches!(f, "add" | "resource_add")
}

fn is_read(f: &str) -> bool {
    matches!(f, "read" | "resource_read")
}

/// Elements are compared by their JSON text, so `1` and `"1"` are different elements.
fn element_key(v: &Value) -> String {
    v.to_string()
}

fn shown(set: &BTreeSet<String>) -> String {
    let mut s: Vec<&str> = set.iter().take(SHOW).map(String::as_str).collect();
    if set.len() > SHOW {
        s.push("...");
    }
    s.join(", ")
}

pub fn check(ops: &[Op]) -> Result<CheckResult, CheckError> {
    // Element -> (invocation index, completion index if ok, outcome).
    let mut adds: HashMap<String, (u64, Option<u64>, Outcome)> = HashMap::new();
    let mut reads: Vec<&Op> = Vec::new();
    for op in ops {
        if is_add(op.f()) {
            let e = op.invoke.value.get("element").ok_or_else(|| CheckError::Malformed {
                index: op.invoke.index,
                reason: "add without an element".to_string(),
            })?;
            let done = (op.outcome() == Outcome::Ok).then(|| op.complete_index()).flatten();
            adds.insert(element_key(e), (op.invoke.index, done, op.outcome()));
        } else if is_read(op.f()) && op.outcome() == Outcome::Ok {
            reads.push(op);
        }
    }

    let mut anomalies = Vec::new();
    let mut lost_total = BTreeSet::new();
    for r in &reads {
        let Some(Value::Array(items)) = r.value().get("elements") else {
            return Err(CheckError::Malformed {
                index: r.invoke.index,
                reason: "ok read without an elements array".to_string(),
            });
        };
        let seen: BTreeSet<String> = items.iter().map(element_key).collect();
        let begin = r.invoke.index;
        let end = r.complete_index().unwrap_or(u64::MAX);
        let lost: BTreeSet<String> = adds
            .iter()
            .filter(|(_, (_, done, _))| done.is_some_and(|d| d < begin))
            .map(|(e, _)| e.clone())
            .filter(|e| !seen.contains(e))
            .collect();
        let unexpected: BTreeSet<String> = seen
            .iter()
            .filter(|e| match adds.get(*e) {
                None => true,
                Some((inv, _, outcome)) => *outcome == Outcome::Fail || *inv > end,
            })
            .cloned()
            .collect();
        if !lost.is_empty() {
            anomalies.push(Anomaly::new(
                "lost",
                r.key(),
                format!(
                    "{} acknowledged elements missing from the read #{begin}: {}",
                    lost.len(),
                    shown(&lost)
                ),
                r.indexes(),
            ));
            lost_total.extend(lost);
        }
        if !unexpected.is_empty() {
            anomalies.push(Anomaly::new(
                "unexpected",
                r.key(),
                format!(
                    "read #{begin} returned {} elements never (successfully) added: {}",
                    unexpected.len(),
                    shown(&unexpected)
                ),
                r.indexes(),
            ));
        }
    }
    let ok_adds = adds.values().filter(|a| a.2 == Outcome::Ok).count();
    let unknown_adds = adds.values().filter(|a| a.2.is_unknown()).count();
    let mut res = CheckResult::from_anomalies(anomalies)
        .stat("adds", adds.len())
        .stat("ok_adds", ok_adds)
        .stat("unknown_adds", unknown_adds)
        .stat("ok_reads", reads.len())
        .stat("lost", lost_total.len());
    if reads.is_empty() {
        res = res.at_most_unknown("no ok read of the set");
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::checker::{check_history, Budget, CheckResult, Validity};
    use crate::history::HistoryBuilder;

    fn check(h: &HistoryBuilder) -> CheckResult {
        check_history("set", &h.events(), &Budget::default()).unwrap().checkers["set"].clone()
    }

    fn add(h: &mut HistoryBuilder, p: u64, e: i64) {
        h.invoke(p, "add", "s", json!({"element": e}));
        h.ok(p, json!({"element": e}));
    }

    fn read(h: &mut HistoryBuilder, p: u64, els: &[i64]) {
        h.invoke(p, "read", "s", json!(null));
        h.ok(p, json!({"elements": els}));
    }

    #[test]
    fn all_acknowledged_elements_present_is_valid() {
        let mut h = HistoryBuilder::new();
        add(&mut h, 0, 1);
        h.invoke(1, "add", "s", json!({"element": 2}));
        h.info(1, "timeout"); // may or may not be there
        h.invoke(2, "add", "s", json!({"element": 3}));
        read(&mut h, 0, &[1, 3]); // 3 is concurrent with the read
        h.ok(2, json!(null));
        read(&mut h, 0, &[1, 2, 3]);
        assert_eq!(check(&h).valid, Validity::Valid, "{:#?}", check(&h));
    }

    #[test]
    fn lost_element_is_rejected() {
        let mut h = HistoryBuilder::new();
        add(&mut h, 0, 1);
        add(&mut h, 1, 2);
        read(&mut h, 0, &[2]);
        let r = check(&h);
        assert_eq!(r.valid, Validity::Invalid);
        assert_eq!(r.anomalies[0].kind, "lost");
        assert_eq!(r.stats["lost"], json!(1));
    }

    #[test]
    fn failed_or_unknown_element_is_unexpected() {
        let mut h = HistoryBuilder::new();
        h.invoke(0, "add", "s", json!({"element": 1}));
        h.fail(0, "invalid-argument");
        read(&mut h, 1, &[1, 7]);
        let r = check(&h);
        assert_eq!(r.valid, Validity::Invalid);
        assert_eq!(r.anomalies[0].kind, "unexpected");
    }

    #[test]
    fn no_read_is_unknown() {
        let mut h = HistoryBuilder::new();
        add(&mut h, 0, 1);
        assert_eq!(check(&h).valid, Validity::Unknown);
    }
}
