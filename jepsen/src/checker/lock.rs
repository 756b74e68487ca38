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
//!    acquisition may be both invoked and completed strictly inside that interval (one invoked
//!    earlier may have been granted before the interval began and answered late). A release with an unknown outcome
//!    (`info`), a failed or missing release, or `held: false` gives no definite end (the lease may
//!    have expired first), so such intervals are not used: the checker never guesses how long an
//!    ambiguous holder held.
//!
//!    Two *definite* holders are also checked against each other whatever their invocation
//!    order: if both releases proved holding (`held: true`, or a plain `ok`), each held without
//!    interruption from its grant to its release (its key, once oldest, stays oldest until it is
//!    deleted, and the release proved it still existed), so the intervals `[grant ok, release
//!    invoked]` of two such holders must not overlap (`overlapping-holders`). This closes the
//!    blind spot of the rule above: a contender invoked *before* A's grant completed and
//!    answered while A still held is exempt from it, but not from this one once its own release
//!    proves it held.
//!
//!    3b. **grant revision after a release it preceded**: a definite release (`ok`, not
//!    `held: false`) has a response header revision, the revision of its delete. A grant answered
//!    before that release was invoked saw the store at its `grant_rev` before the delete was even
//!    sent, so `grant_rev` must be below the release's revision; a larger one means the lock
//!    service answered a grant from a future it had not reached, or stamped a grant made while the
//!    previous holder still held with a later revision (`grant-revision-after-release`).
//!
//! A plain `Unlock` (no `held` field) is taken as proof of holding until the release; a
//! workload that pauses clients past the lease TTL must record `held` to avoid blaming the lock
//! service for an expired lease.
//!
//! 4. **FIFO**: grants ordered by token are ordered by grant revision (`grant_rev`, the revision
//!    of the response header, at which the lock service proved the grantee's key oldest): a
//!    younger key granted at an earlier revision than an older one means one of them was granted
//!    out of turn.
//!
//! With the key-event log of the lock prefix ([`super::keylog`], recorded after healing), also:
//!
//! 5. **oldest live key at the grant**: at `grant_rev` the grantee's key (created at the token)
//!    is live (`grant-on-dead-key` otherwise: the lock went to an expired lease) and no older
//!    key under `name/` is live (`not-oldest`, or `fifo-violation` when that older key was a
//!    waiter granted later).
//!
//! A grant whose token could not be read (its key vanished first) takes its token from the log
//! when the log has it; otherwise only the checks that need no token apply to it.

use std::collections::HashMap;

use serde_json::Value;

use super::keylog::KeyLog;
use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome};

#[derive(Debug)]
struct Acquire<'a> {
    op: &'a Op,
    name: String,
    key: String,
    token: Option<i64>,
    /// Revision at which the lock service proved the grant (the response header's).
    grant_rev: Option<i64>,
    /// History index of the completion (the grant is known by then).
    granted: u64,
    /// End of the definite holding interval: the invocation of its release.
    held_until: Option<u64>,
    /// The header revision of that definite release (the revision of its delete).
    release_rev: Option<i64>,
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
                let grant_rev = v
                    .get("grant_rev")
                    .and_then(Value::as_i64)
                    .or_else(|| op.complete.as_ref()?.header.map(|h| h.revision));
                let token = match v.get("token") {
                    Some(Value::Null) | None => None,
                    Some(t) => Some(t.as_i64().ok_or_else(|| {
                        malformed(op, "ok lock_acquire with a token that is not an integer")
                    })?),
                };
                let granted =
                    op.complete_index().ok_or_else(|| malformed(op, "ok without completion"))?;
                open.insert((name.clone(), key.to_string()), acquires.len());
                acquires.push(Acquire {
                    op,
                    name,
                    key: key.to_string(),
                    token,
                    grant_rev,
                    granted,
                    held_until: None,
                    release_rev: None,
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
                    acquires[a].release_rev =
                        op.complete.as_ref().and_then(|c| c.header).map(|h| h.revision);
                }
            }
            _ => {}
        }
    }

    let log = KeyLog::find(ops)?;
    let mut derived = 0usize;
    if let Some(log) = &log {
        for a in acquires.iter_mut().filter(|a| a.token.is_none()) {
            if let Some(l) = a.grant_rev.and_then(|r| log.live_at(&a.key, r)) {
                a.token = Some(l.created);
                derived += 1;
            }
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
            let Some(token) = a.token else { continue };
            if let Some(b) = by_token.insert(token, a) {
                let mut events = b.op.indexes();
                events.extend(a.op.indexes());
                anomalies.push(Anomaly::new(
                    "duplicate-token",
                    Some(name),
                    format!(
                        "lock {name}: two grants share token {token}: {} and {}",
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
        for (i, a) in list.iter().enumerate().filter(|(_, a)| a.token.is_some()) {
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
                                "lock {name}: {} was granted token {:?} after {} had been granted \
                                 the larger-or-equal token {:?}",
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
                // Either b was *invoked* after a's grant completed, so b's grant (somewhere
                // between its invoke and its completion) certainly fell inside a's hold; or b is
                // a definite holder too and the two definite intervals overlap (see 3 in the
                // module docs). A grant invoked earlier and not proven held by its release may
                // have happened before a's key existed and merely been answered late (its client
                // or member paused), which is no overlap. Each pair of definite holders is
                // reported once, from the one granted first.
                let inside = a.granted < b.op.invoke.index && b.granted < until;
                // (b's own interval starts at b.granted and ends after it, so with a granted
                // first the two overlap exactly when b was granted before a's release began.)
                let both_definite =
                    b.held_until.is_some() && a.granted < b.granted && b.granted < until;
                if inside || both_definite {
                    let mut events = a.op.indexes();
                    events.extend(b.op.indexes());
                    events.push(until);
                    anomalies.push(Anomaly::new(
                        "overlapping-holders",
                        Some(name),
                        format!(
                            "lock {name}: {} (token {:?}) was granted while {} (token {:?}) held \
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
        // 3b. A grant answered before a definite release was invoked has a lower revision.
        for a in list {
            let (Some(until), Some(rel_rev)) = (a.held_until, a.release_rev) else { continue };
            for b in list {
                if std::ptr::eq(*a, *b) {
                    continue;
                }
                let Some(grant_rev) = b.grant_rev else { continue };
                if b.granted < until && grant_rev > rel_rev {
                    let mut events = a.op.indexes();
                    events.extend(b.op.indexes());
                    events.push(until);
                    anomalies.push(Anomaly::new(
                        "grant-revision-after-release",
                        Some(name),
                        format!(
                            "lock {name}: {} (token {:?}) was answered at event #{} with grant \
                             revision {grant_rev}, before the release of {} (token {:?}) was \
                             even invoked at #{until}, yet that release's revision is only \
                             {rel_rev}: the grant claims a revision after a delete that had not \
                             been sent",
                            b.op.describe(),
                            b.token,
                            b.granted,
                            a.op.describe(),
                            a.token,
                        ),
                        events,
                    ));
                }
            }
        }
        // 4. FIFO: token order and grant-revision order agree.
        let mut ordered: Vec<(i64, i64, &Acquire<'_>)> =
            list.iter().filter_map(|a| Some((a.token?, a.grant_rev?, *a))).collect();
        ordered.sort_by_key(|(t, _, _)| *t);
        let mut max_rev: Option<(i64, &Acquire<'_>)> = None;
        for &(token, rev, a) in &ordered {
            if let Some((mrev, b)) = max_rev {
                if rev < mrev {
                    let mut events = b.op.indexes();
                    events.extend(a.op.indexes());
                    anomalies.push(Anomaly::new(
                        "fifo-violation",
                        Some(name),
                        format!(
                            "lock {name}: {} (token {token}) was granted at revision {rev}, \
                             before {} with the older key (token {:?}) was granted at {mrev}",
                            a.op.describe(),
                            b.op.describe(),
                            b.token
                        ),
                        events,
                    ));
                }
            }
            if max_rev.is_none_or(|(m, _)| rev > m) {
                max_rev = Some((rev, a));
            }
        }
        // 5. With the key log: the grantee's key is the oldest live key at the grant revision.
        if let Some(log) = &log {
            check_oldest(name, list, log, &mut anomalies);
        }
    }
    let mut r = CheckResult::from_anomalies(anomalies)
        .stat("acquires_invoked", invoked)
        .stat("acquires_ok", acquires.len())
        .stat("acquires_unknown", unknown_acquires)
        .stat("releases", releases)
        .stat("definite_holds", acquires.iter().filter(|a| a.held_until.is_some()).count())
        .stat("tokens_from_log", derived)
        .stat("key_log", log.is_some());
    if log.is_none() {
        r.notes.push("no key-event log: the oldest-live-key check did not run".to_string());
    }
    if acquires.is_empty() {
        r = r.at_most_unknown("no acknowledged lock acquisitions to check");
    }
    Ok(r)
}

/// Check 5: at each grant's revision, its key is live and the oldest live key under `name/`.
fn check_oldest(name: &str, list: &[&Acquire<'_>], log: &KeyLog, anomalies: &mut Vec<Anomaly>) {
    let prefix = format!("{name}/");
    for a in list {
        let Some(rev) = a.grant_rev.filter(|r| log.covers(*r)) else { continue };
        let mut events = a.op.indexes();
        events.extend(&log.indexes);
        let Some(token) = a.token else {
            // No token: the key was gone when read after the grant, and (had it been live at
            // the grant revision) the token would have been taken from the log.
            anomalies.push(Anomaly::new(
                "grant-on-dead-key",
                Some(name),
                format!(
                    "lock {name}: {} was granted at revision {rev}, but its key {} was not live \
                     then (lifetimes: {:?}): the lock went to an expired or deleted contender",
                    a.op.describe(),
                    a.key,
                    log.lifetimes.get(&a.key)
                ),
                events,
            ));
            continue;
        };
        if !log.lifetime(&a.key, token).is_some_and(|l| l.live_at(rev)) {
            anomalies.push(Anomaly::new(
                "grant-on-dead-key",
                Some(name),
                format!(
                    "lock {name}: {} was granted at revision {rev}, but its key {} (created at \
                     {token}) was not live then (lifetimes: {:?}): the lock went to an expired \
                     or deleted contender",
                    a.op.describe(),
                    a.key,
                    log.lifetimes.get(&a.key)
                ),
                events.clone(),
            ));
        }
        for (k, l) in log.live_under(&prefix, rev) {
            if l.created >= token || k == a.key {
                continue;
            }
            // Was the older key a waiter that this grant overtook?
            let overtaken = list.iter().find(|b| b.key == k && b.token == Some(l.created));
            let kind = if overtaken.is_some_and(|b| b.granted > a.granted) {
                "fifo-violation"
            } else {
                "not-oldest"
            };
            let mut ev = events.clone();
            if let Some(b) = overtaken {
                ev.extend(b.op.indexes());
            }
            anomalies.push(Anomaly::new(
                kind,
                Some(name),
                format!(
                    "lock {name}: {} (token {token}) was granted at revision {rev} while the \
                     older key {k} (created at {}) was live",
                    a.op.describe(),
                    l.created
                ),
                ev,
            ));
        }
    }
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;
