//! The lease checker (the `lease` workload).
//!
//! Shapes: `lease_grant {ttl}` -> ok `{id, ttl}`; `lease_keepalive {id}` -> ok `{id, ttl}`
//! (`ttl <= 0`: the lease was gone); `lease_revoke {id}`; `put {value, lease}` -> ok adds
//! `mod_rev`; `get` -> ok `{value|null, ...}`; the key-event log of the prefix (a `watch` with
//! `log: true`, see [`super::keylog`]).
//!
//! Properties:
//! 1. **no early expiry**: a lease lives at least until `invoke time + ttl` of every `ok` grant
//!    and every `ok` keep-alive that returned `ttl > 0` (the server renewed it at some point after
//!    the invocation, for `ttl` seconds, and a lease never comes back). So a get that *completed*
//!    before that bound, began after a put attaching the key completed, and overlapped no revoke
//!    of the lease (nor followed one), must find the key; `early-expiry` otherwise.
//! 2. **expiry deletes all attached keys in one revision** (from the log): every key of a lease
//!    that was deleted was deleted at the same revision, and no key of that lease outlived it
//!    (`partial-expiry`, `key-survived-lease`).
//! 3. **no put succeeds on a dead lease**: an `ok` put whose lease was definitely gone before the
//!    put began (a revoke completed `ok`, a keep-alive answered `ttl <= 0`), or whose revision is
//!    past the revision at which the log shows the lease's keys deleted (`put-on-dead-lease`).
//! 4. **unique lease ids**: two `ok` grants never return the same id (`duplicate-lease-id`).
//!
//! `info` operations are never taken as failed: an `info` revoke only removes the early-expiry
//! guarantee from its invocation on; `info` puts attach nothing for the checks.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::keylog::KeyLog;
use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome};

const NS_PER_S: u64 = 1_000_000_000;

#[derive(Debug, Default)]
struct LeaseFacts<'a> {
    /// Guaranteed alive up to this history time (ns).
    alive_until: u64,
    /// Earliest invocation of a revoke that was not `fail`.
    revoke_invoked: Option<u64>,
    /// Earliest completion (history index, time) of proof the lease was gone.
    dead_proof: Option<(u64, &'a Op)>,
    grants: Vec<&'a Op>,
}

fn id_of(op: &Op) -> Option<i64> {
    op.value().get("id").and_then(Value::as_i64).or_else(|| op.invoke.value.get("id")?.as_i64())
}

pub fn check(ops: &[Op]) -> Result<CheckResult, CheckError> {
    let mut leases: HashMap<i64, LeaseFacts<'_>> = HashMap::new();
    // key -> (lease, put op) for ok puts.
    let mut attached: BTreeMap<&str, (i64, &Op)> = BTreeMap::new();
    let mut puts: Vec<(i64, &Op)> = Vec::new();
    let mut gets: Vec<&Op> = Vec::new();
    for op in ops {
        let t = op.invoke.time;
        match (op.f(), op.outcome()) {
            ("lease_grant", Outcome::Ok) => {
                let (Some(id), Some(ttl)) =
                    (id_of(op), op.value().get("ttl").and_then(Value::as_i64))
                else {
                    return Err(CheckError::Malformed {
                        index: op.invoke.index,
                        reason: "ok lease_grant without id and ttl".into(),
                    });
                };
                let f = leases.entry(id).or_default();
                f.alive_until = f.alive_until.max(t + ttl.max(0) as u64 * NS_PER_S);
                f.grants.push(op);
            }
            ("lease_keepalive", Outcome::Ok) => {
                let (Some(id), Some(ttl)) =
                    (id_of(op), op.value().get("ttl").and_then(Value::as_i64))
                else {
                    continue;
                };
                let f = leases.entry(id).or_default();
                if ttl > 0 {
                    f.alive_until = f.alive_until.max(t + ttl as u64 * NS_PER_S);
                } else if let Some(c) = op.complete_index() {
                    if f.dead_proof.is_none_or(|(d, _)| c < d) {
                        f.dead_proof = Some((c, op));
                    }
                }
            }
            ("lease_revoke", outcome) if outcome != Outcome::Fail => {
                let Some(id) = id_of(op) else { continue };
                let f = leases.entry(id).or_default();
                f.revoke_invoked = Some(f.revoke_invoked.map_or(t, |r| r.min(t)));
                if outcome == Outcome::Ok {
                    if let Some(c) = op.complete_index() {
                        if f.dead_proof.is_none_or(|(d, _)| c < d) {
                            f.dead_proof = Some((c, op));
                        }
                    }
                }
            }
            ("put", Outcome::Ok) => {
                let Some(lease) = op.invoke.value.get("lease").and_then(Value::as_i64) else {
                    continue;
                };
                if let Some(k) = op.key() {
                    attached.insert(k, (lease, op));
                }
                puts.push((lease, op));
            }
            ("get", Outcome::Ok) => gets.push(op),
            _ => {}
        }
    }

    let mut anomalies = Vec::new();
    // 4. Unique ids.
    let mut ids: Vec<&i64> = leases.keys().collect();
    ids.sort_unstable();
    for id in ids {
        let g = &leases[id].grants;
        if g.len() > 1 {
            anomalies.push(Anomaly::new(
                "duplicate-lease-id",
                None,
                format!(
                    "lease id {id:#x} was granted {} times: {}",
                    g.len(),
                    g.iter().map(|o| o.describe()).collect::<Vec<_>>().join("; ")
                ),
                g.iter().flat_map(|o| o.indexes()).collect(),
            ));
        }
    }
    // 1. No early expiry.
    let mut early_checked = 0usize;
    for g in &gets {
        let Some(key) = g.key() else { continue };
        if !g.value().get("value").is_some_and(Value::is_null) {
            continue;
        }
        let Some(&(lease, put)) = attached.get(key) else { continue };
        let (Some(put_done), Some(done)) = (put.complete_index(), g.complete.as_ref()) else {
            continue;
        };
        if put_done > g.invoke.index {
            continue;
        }
        let Some(f) = leases.get(&lease) else { continue };
        if f.revoke_invoked.is_some_and(|r| r <= done.time) {
            continue;
        }
        early_checked += 1;
        if done.time < f.alive_until {
            let margin_ms = (f.alive_until - done.time) / 1_000_000;
            anomalies.push(Anomaly::new(
                "early-expiry",
                Some(key),
                format!(
                    "{} found no value, but lease {lease:#x} (attached by {}) was guaranteed \
                     alive for another {margin_ms} ms by its grant or keep-alives",
                    g.describe(),
                    put.describe()
                ),
                [g.indexes(), put.indexes()].concat(),
            ));
        }
    }
    // 3a. No put on a lease definitely dead before the put began.
    for &(lease, put) in &puts {
        let Some(f) = leases.get(&lease) else { continue };
        if let Some((d, proof)) = f.dead_proof {
            if d < put.invoke.index {
                anomalies.push(Anomaly::new(
                    "put-on-dead-lease",
                    put.key(),
                    format!(
                        "{} succeeded although {} had shown lease {lease:#x} gone",
                        put.describe(),
                        proof.describe()
                    ),
                    [put.indexes(), proof.indexes()].concat(),
                ));
            }
        }
    }
    // 2 and 3b, from the key log.
    let log = KeyLog::find(ops)?;
    if let Some(log) = &log {
        check_log(log, &attached, &puts, &mut anomalies);
    }
    let mut r = CheckResult::from_anomalies(anomalies)
        .stat("leases", leases.len())
        .stat("ok_puts", puts.len())
        .stat("ok_gets", gets.len())
        .stat("expiry_reads_checked", early_checked)
        .stat("key_log", log.is_some());
    if log.is_none() {
        r = r.at_most_unknown("no key-event log: the one-revision expiry check did not run");
    }
    if leases.is_empty() {
        r = r.at_most_unknown("no lease was granted");
    }
    Ok(r)
}

/// Checks 2 and 3b over the key log.
fn check_log(
    log: &KeyLog,
    attached: &BTreeMap<&str, (i64, &Op)>,
    puts: &[(i64, &Op)],
    anomalies: &mut Vec<Anomaly>,
) {
    // Lease -> its keys (from the log's puts and the history's ok puts).
    let mut keys: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for (k, ls) in &log.lifetimes {
        for l in ls.iter().filter(|l| l.lease != 0) {
            keys.entry(l.lease).or_default().push(k.clone());
        }
    }
    for (k, (lease, _)) in attached {
        let v = keys.entry(*lease).or_default();
        if !v.iter().any(|x| x == k) {
            v.push(k.to_string());
        }
    }
    let mut death: HashMap<i64, i64> = HashMap::new();
    for (lease, ks) in &keys {
        let mut deleted: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
        let mut survived = Vec::new();
        for k in ks {
            for l in log.lifetimes.get(k).into_iter().flatten().filter(|l| l.lease == *lease) {
                match l.deleted {
                    Some(d) => deleted.entry(d).or_default().push(k),
                    None => survived.push(k.as_str()),
                }
            }
        }
        let Some((&first, _)) = deleted.iter().next() else { continue };
        death.insert(*lease, first);
        if deleted.len() > 1 {
            anomalies.push(Anomaly::new(
                "partial-expiry",
                None,
                format!(
                    "the keys of lease {lease:#x} were deleted at {} different revisions: {:?}",
                    deleted.len(),
                    deleted
                ),
                log.indexes.clone(),
            ));
        }
        if !survived.is_empty() {
            anomalies.push(Anomaly::new(
                "key-survived-lease",
                None,
                format!(
                    "lease {lease:#x} ended at revision {first} (its other keys were deleted), \
                     but {survived:?} still exist at the end of the log"
                ),
                log.indexes.clone(),
            ));
        }
    }
    for &(lease, put) in puts {
        let (Some(&d), Some(rev)) =
            (death.get(&lease), put.value().get("mod_rev").and_then(Value::as_i64))
        else {
            continue;
        };
        if rev > d {
            anomalies.push(Anomaly::new(
                "put-on-dead-lease",
                put.key(),
                format!(
                    "{} was applied at revision {rev}, after lease {lease:#x}'s keys were \
                     deleted at {d}",
                    put.describe()
                ),
                [put.indexes(), log.indexes.clone()].concat(),
            ));
        }
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
