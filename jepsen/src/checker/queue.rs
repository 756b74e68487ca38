//! The queue checker (workload [`crate::workload::queue`]).
//!
//! - **lost**: every acknowledged (`ok`) enqueue's payload is eventually acked (an `ok` ack, or
//!   an `info` ack that may have applied) or found in the final dead-letter read (or nacked into
//!   it). Needs the final drain; without its `dead_letters` read the verdict is at most
//!   `unknown`.
//! - **double-ack**: no job is acked `ok` by two different claims (tokens), and no payload is
//!   acked `ok` under two different jobs.
//! - **overlapping-claims**: a claim is live from its token (the revision that created it) until
//!   the revision of the `ok` ack or nack that ended it. No other claim of the same job may have
//!   been created inside that window; two claims answered with the same token must be the same
//!   claim (**shared-claim**).
//! - **phantom**: a claimed or acked payload that no enqueue (other than a `fail`ed one)
//!   produced.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome};

/// Payloads are compared by their JSON text.
fn key(v: &Value) -> String {
    v.to_string()
}

fn field<'a>(op: &'a Op, v: &'a Value, name: &str) -> Result<&'a Value, CheckError> {
    v.get(name).ok_or_else(|| CheckError::Malformed {
        index: op.invoke.index,
        reason: format!("{} without {name}", op.f()),
    })
}

fn int(op: &Op, v: &Value, name: &str) -> Result<i64, CheckError> {
    field(op, v, name)?.as_i64().ok_or_else(|| CheckError::Malformed {
        index: op.invoke.index,
        reason: format!("{}: {name} is not an integer", op.f()),
    })
}

fn text(op: &Op, v: &Value, name: &str) -> Result<String, CheckError> {
    Ok(field(op, v, name)?.as_str().map(str::to_string).unwrap_or_else(|| v[name].to_string()))
}

struct Claim {
    token: i64,
    indexes: Vec<u64>,
}

pub fn check(ops: &[Op]) -> Result<CheckResult, CheckError> {
    // Payload -> (outcome of its enqueue, event indexes).
    let mut enqueued: HashMap<String, (Outcome, Vec<u64>)> = HashMap::new();
    // Job id -> claims answered ok.
    let mut claims: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
    // Job id -> token -> revision of the ok ack or nack that ended the claim.
    let mut ended: HashMap<(String, i64), (i64, Vec<u64>)> = HashMap::new();
    // Job id -> ok acks (token, indexes); payload -> job ids acked ok.
    let mut acks: BTreeMap<String, Vec<(i64, Vec<u64>)>> = BTreeMap::new();
    let mut acked_payloads: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut maybe_done: BTreeSet<String> = BTreeSet::new();
    let mut dead_read: Option<BTreeSet<String>> = None;
    let mut phantoms = Vec::new();
    let mut claimed_payloads: Vec<(String, Vec<u64>)> = Vec::new();

    for op in ops {
        let inv = &op.invoke.value;
        match op.f() {
            "enqueue" => {
                let p = key(field(op, inv, "payload")?);
                enqueued.insert(p, (op.outcome(), op.indexes()));
            }
            "claim" if op.outcome() == Outcome::Ok => {
                let v = op.value();
                if v.get("empty").and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                let id = text(op, v, "id")?;
                let token = int(op, v, "token")?;
                claimed_payloads.push((key(field(op, v, "payload")?), op.indexes()));
                claims.entry(id).or_default().push(Claim { token, indexes: op.indexes() });
            }
            "ack" | "nack" => {
                let id = text(op, inv, "id")?;
                let token = int(op, inv, "token")?;
                let payload = key(field(op, inv, "payload")?);
                match op.outcome() {
                    Outcome::Ok => {
                        let v = op.value();
                        let rev = int(op, v, "revision")?;
                        ended.insert((id.clone(), token), (rev, op.indexes()));
                        let dead = v.get("dead").and_then(Value::as_bool) == Some(true);
                        if op.f() == "ack" {
                            acks.entry(id.clone()).or_default().push((token, op.indexes()));
                            acked_payloads.entry(payload.clone()).or_default().insert(id);
                            maybe_done.insert(payload);
                        } else if dead {
                            maybe_done.insert(payload);
                        }
                    }
                    o if o.is_unknown() => {
                        // May have applied: the job may be gone without an ok ack.
                        maybe_done.insert(payload);
                    }
                    _ => {}
                }
            }
            "dead_letters" if op.outcome() == Outcome::Ok => {
                let Some(Value::Array(items)) = op.value().get("payloads") else {
                    return Err(CheckError::Malformed {
                        index: op.invoke.index,
                        reason: "ok dead_letters without a payloads array".into(),
                    });
                };
                dead_read = Some(items.iter().map(key).collect());
            }
            _ => {}
        }
    }

    let mut anomalies = Vec::new();
    for (p, idx) in &claimed_payloads {
        match enqueued.get(p) {
            Some((o, _)) if *o != Outcome::Fail => {}
            _ => phantoms.push((p.clone(), idx.clone())),
        }
    }
    for (p, idx) in phantoms.iter().take(20) {
        anomalies.push(Anomaly::new(
            "phantom",
            None,
            format!("payload {p} was claimed but never (successfully) enqueued"),
            idx.clone(),
        ));
    }

    for (id, list) in &acks {
        let tokens: BTreeSet<i64> = list.iter().map(|(t, _)| *t).collect();
        if tokens.len() > 1 {
            anomalies.push(Anomaly::new(
                "double-ack",
                None,
                format!(
                    "job {id} was acked by {} different claims: tokens {tokens:?}",
                    tokens.len()
                ),
                list.iter().flat_map(|(_, i)| i.clone()).collect(),
            ));
        }
    }
    for (p, ids) in &acked_payloads {
        if ids.len() > 1 {
            anomalies.push(Anomaly::new(
                "double-ack",
                None,
                format!("payload {p} was acked under {} different jobs: {ids:?}", ids.len()),
                Vec::new(),
            ));
        }
    }

    for (id, list) in &claims {
        let mut by_token: HashMap<i64, &Claim> = HashMap::new();
        for c in list {
            if let Some(other) = by_token.insert(c.token, c) {
                anomalies.push(Anomaly::new(
                    "shared-claim",
                    None,
                    format!("job {id}: two claims were answered with the same token {}", c.token),
                    other.indexes.iter().chain(&c.indexes).copied().collect(),
                ));
            }
        }
        for c in list {
            let Some((end, end_idx)) = ended.get(&(id.clone(), c.token)) else { continue };
            for other in list {
                if other.token > c.token && other.token < *end {
                    anomalies.push(Anomaly::new(
                        "overlapping-claims",
                        None,
                        format!(
                            "job {id}: claim with token {} was created while the claim with \
                             token {} was live (it ended at revision {end})",
                            other.token, c.token
                        ),
                        c.indexes.iter().chain(end_idx).chain(&other.indexes).copied().collect(),
                    ));
                }
            }
        }
    }

    let acknowledged: Vec<(&String, &Vec<u64>)> =
        enqueued.iter().filter(|(_, (o, _))| *o == Outcome::Ok).map(|(p, (_, i))| (p, i)).collect();
    let mut notes = Vec::new();
    let mut lost = 0;
    match &dead_read {
        Some(dead) => {
            let mut missing: Vec<(&String, &Vec<u64>)> = acknowledged
                .iter()
                .filter(|(p, _)| !maybe_done.contains(*p) && !dead.contains(*p))
                .copied()
                .collect();
            missing.sort();
            lost = missing.len();
            for (p, idx) in missing.iter().take(20) {
                anomalies.push(Anomaly::new(
                    "lost",
                    None,
                    format!(
                        "the enqueue of payload {p} was acknowledged but the job was never \
                         acked nor dead-lettered, even after the final drain"
                    ),
                    (*idx).clone(),
                ));
            }
            if lost > 20 {
                notes.push(format!("{lost} lost payloads in all; 20 shown"));
            }
        }
        None => notes.push(
            "no final dead-letter read (the drain did not complete): lost jobs cannot be ruled out"
                .into(),
        ),
    }

    let claim_count: usize = claims.values().map(Vec::len).sum();
    let mut res = CheckResult::from_anomalies(anomalies)
        .stat("enqueued_ok", acknowledged.len())
        .stat("claims", claim_count)
        .stat("acked_jobs", acks.len())
        .stat("dead_letters", dead_read.as_ref().map(BTreeSet::len).unwrap_or(0))
        .stat("lost", lost);
    if dead_read.is_none() {
        res = res.at_most_unknown(notes.remove(0));
    }
    res.notes.extend(notes);
    if acknowledged.is_empty() {
        res = res.at_most_unknown("no acknowledged enqueue: nothing to check");
    }
    Ok(res)
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
