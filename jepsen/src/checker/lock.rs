//! The lock checker, over `lock_acquire` / `lock_release` operations.
//!
//! Shapes: `lock_acquire {name, lease}` -> ok `{key, token}` (the token is the lock key's
//! `create_revision`); `lock_release {name, key}` -> ok, optionally `{"held": bool}` when the
//! release was a Txn guarded on the lock key still existing with its token (so `held: true`
//! proves the holder still held the lock at that point). The lock name is the event's `key`
//! field (or `value.name`).
//!
//! Properties, per lock name:
//! 1. **unique tokens**: no two acknowledged acquisitions share a token;
//! 2. **tokens increase in real-time order of grants**: if acquisition A completed before
//!    acquisition B began, `token(A) < token(B)`;
//! 3. **no overlapping holders**: A *definitely* held the lock from its acquisition's `ok` until
//!    its release began, when that release is `ok` and did not report `held: false`. No other
//!    acquisition may complete strictly inside that interval. A release with an unknown outcome
//!    (`info`), a failed or missing release, or `held: false` gives no definite end (the lease may
//!    have expired first), so such intervals are not used: the checker never guesses how long an
//!    ambiguous holder held.
//!
//! A plain `Unlock` (no `held` field) is taken as proof of holding until the release; a
//! workload that pauses clients past the lease TTL must record `held` to avoid blaming the lock
//! service for an expired lease.

use std::collections::HashMap;

use serde_json::Value;

use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome};

#[derive(Debug)]
struct Acquire<'a> {
    op: &'a Op,
    name: String,
    key: String,
    token: i64,
    /// History index of the completion (the grant is known by then).
    granted: u64,
    /// End of the definite holding interval: the invocation of its release.
    held_until: Option<u64>,
}

fn name_of(op: &Op) -> Option<String> {
    op.key()
        .map(str::to_string)
        .or_else(|| op.invoke.value.get("name").and_then(Value::as_str).map(str::to_string))
}

fn malformed(op: &Op, reason: &str) -> CheckError {
    CheckError::Malformed { index: op.invoke.index, reason: reason.to_string() }
}

pub fn check(ops: &[Op]) -> Result<CheckResult, CheckError> {
    let mut acquires: Vec<Acquire<'_>> = Vec::new();
    // Index into `acquires` by (name, lock key) of the latest acquisition not yet released.
    let mut open: HashMap<(String, String), usize> = HashMap::new();
    let (mut invoked, mut unknown_acquires, mut releases) = (0usize, 0usize, 0usize);
    for op in ops {
        match op.f() {
            "lock_acquire" => {
                invoked += 1;
                let name =
                    name_of(op).ok_or_else(|| malformed(op, "lock_acquire without a name"))?;
                match op.outcome() {
                    Outcome::Ok => {}
                    Outcome::Fail => continue,
                    Outcome::Info | Outcome::Pending => {
                        unknown_acquires += 1;
                        continue;
                    }
                }
                let v = op.value();
                let key = v
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed(op, "ok lock_acquire without a string key"))?;
                let token = v
                    .get("token")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| malformed(op, "ok lock_acquire without an integer token"))?;
                let granted =
                    op.complete_index().ok_or_else(|| malformed(op, "ok without completion"))?;
                open.insert((name.clone(), key.to_string()), acquires.len());
                acquires.push(Acquire {
                    op,
                    name,
                    key: key.to_string(),
                    token,
                    granted,
                    held_until: None,
                });
            }
            "lock_release" => {
                releases += 1;
                let name =
                    name_of(op).ok_or_else(|| malformed(op, "lock_release without a name"))?;
                let Some(key) = op.invoke.value.get("key").and_then(Value::as_str) else {
                    return Err(malformed(op, "lock_release without a string key"));
                };
                // Whatever its outcome, a release ends the acquisition it refers to.
                let Some(a) = open.remove(&(name, key.to_string())) else { continue };
                let held = op.value().get("held").and_then(Value::as_bool);
                if op.outcome() == Outcome::Ok && held != Some(false) {
                    acquires[a].held_until = Some(op.invoke.index);
                }
            }
            _ => {}
        }
    }

    let mut anomalies = Vec::new();
    let mut by_name: HashMap<&str, Vec<&Acquire<'_>>> = HashMap::new();
    for a in &acquires {
        by_name.entry(a.name.as_str()).or_default().push(a);
    }
    let mut names: Vec<&str> = by_name.keys().copied().collect();
    names.sort_unstable();
    for name in names {
        let list = &by_name[name];
        // 1. Unique tokens.
        let mut by_token: HashMap<i64, &Acquire<'_>> = HashMap::new();
        for a in list {
            if let Some(b) = by_token.insert(a.token, a) {
                let mut events = b.op.indexes();
                events.extend(a.op.indexes());
                anomalies.push(Anomaly::new(
                    "duplicate-token",
                    Some(name),
                    format!(
                        "lock {name}: two grants share token {}: {} and {}",
                        a.token,
                        b.op.describe(),
                        a.op.describe()
                    ),
                    events,
                ));
            }
        }
        // 2. Tokens increase in real-time order: compare each grant with the highest token of
        // the grants completed before it was invoked.
        let mut points: Vec<(u64, bool, usize)> = Vec::new();
        for (i, a) in list.iter().enumerate() {
            points.push((a.op.invoke.index, true, i));
            points.push((a.granted, false, i));
        }
        points.sort_unstable();
        let mut best: Option<usize> = None;
        for (_, is_invoke, i) in points {
            if is_invoke {
                if let Some(b) = best {
                    if list[i].token <= list[b].token {
                        let mut events = list[b].op.indexes();
                        events.extend(list[i].op.indexes());
                        anomalies.push(Anomaly::new(
                            "token-not-increasing",
                            Some(name),
                            format!(
                                "lock {name}: {} was granted token {} after {} had been granted \
                                 the larger-or-equal token {}",
                                list[i].op.describe(),
                                list[i].token,
                                list[b].op.describe(),
                                list[b].token
                            ),
                            events,
                        ));
                    }
                }
            } else if best.is_none_or(|b| list[i].token > list[b].token) {
                best = Some(i);
            }
        }
        // 3. No grant completes while another holder definitely holds the lock.
        for a in list {
            let Some(until) = a.held_until else { continue };
            for b in list {
                if std::ptr::eq(*a, *b) || b.key == a.key && b.token == a.token {
                    continue;
                }
                if a.granted < b.granted && b.granted < until {
                    let mut events = a.op.indexes();
                    events.extend(b.op.indexes());
                    events.push(until);
                    anomalies.push(Anomaly::new(
                        "overlapping-holders",
                        Some(name),
                        format!(
                            "lock {name}: {} (token {}) was granted while {} (token {}) held \
                             the lock from event #{} until its release began at #{until}",
                            b.op.describe(),
                            b.token,
                            a.op.describe(),
                            a.token,
                            a.granted
                        ),
                        events,
                    ));
                }
            }
        }
    }
    let mut r = CheckResult::from_anomalies(anomalies)
        .stat("acquires_invoked", invoked)
        .stat("acquires_ok", acquires.len())
        .stat("acquires_unknown", unknown_acquires)
        .stat("releases", releases)
        .stat("definite_holds", acquires.iter().filter(|a| a.held_until.is_some()).count());
    if acquires.is_empty() {
        r = r.at_most_unknown("no acknowledged lock acquisitions to check");
    }
    Ok(r)
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;
