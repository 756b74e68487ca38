//! The election checker, over `campaign`, `proclaim`, `resign`, `lease_revoke`, `leader` and
//! `observe` operations ([`crate::workload::election`] has the shapes).
//!
//! A leadership is an `ok` campaign, identified per election name by `rev`, its key's create
//! revision. Its key, once the oldest under the name, stays the oldest until deleted, and a
//! proclaim succeeds only while the key exists with that create revision; so an `ok` proclaim
//! proves the leadership lasted without interruption from the campaign's answer to the
//! proclaim's invocation. That is the lock checker's reasoning with proclaims in place of
//! `held: true` releases: a leadership's **definite interval** runs from its campaign's `ok` to
//! the invocation of its last `ok` proclaim. A leadership is **over** once its `resign` or the
//! revoke of its lease completed `ok`.
//!
//! Per election name:
//! 1. `duplicate-leader-rev`: two `ok` campaigns with the same `rev`.
//! 2. `leader-rev-not-increasing`: a campaign invoked after another completed has a larger
//!    `rev` (it created its key later, and leadership passes only to younger keys).
//! 3. `overlapping-leaders`: no campaign is both invoked and answered inside another's definite
//!    interval, and no two definite intervals overlap, whenever their campaigns were invoked.
//!    `leader-revision-order`: a campaign answered before a leader's `ok` proclaim or resign
//!    was invoked has a `campaign_rev` no larger than that write's revision.
//! 4. `stale-proclaim`: only the current leader's proclaims succeed: an `ok` proclaim was not
//!    invoked after its leadership was over, nor after another campaign completed that was
//!    invoked after this leadership began (that campaign's win proves this key was gone).
//! 5. Observers: `observed-out-of-order`: in a session, leaders appear in increasing `rev`
//!    and, within a leader, proclaims in increasing `mod_rev` (and header revisions never go
//!    back); `stale-observation`: no observed leader is older than a campaign that completed
//!    before the session began; `phantom-leader`: every observed leader is a campaign of this
//!    name (matched by lease, with the same `rev` when the campaign's answer is known), and
//!    `phantom-value`: every observed value is its campaign value or one of its proclaims that
//!    did not fail.
//! 6. Leader queries: the same phantom checks; `stale-leader`: no answer older than a campaign
//!    completed before the query began, or naming a leadership over before it began;
//!    `wrong-leader`: a query that began and ended inside a leadership's definite interval names
//!    that leader.
//!
//! The Observe API does not promise to report every leader: a leader elected and deposed
//! between two of the server's reads is skipped (etcd's own `observe` re-reads the first key
//! after a deletion). So "observers see every leader in order" is checked as: whatever they
//! see is a real leader with a real value, in order, and never older than what was known when
//! the session began. Unit tests with broken histories: `election_tests.rs`.

use std::collections::HashMap;

use serde_json::Value;

use super::{Anomaly, CheckError, CheckResult};
use crate::history::{Op, Outcome};

#[derive(Debug)]
struct Leadership<'a> {
    op: &'a Op,
    rev: i64,
    lease: i64,
    campaign_rev: Option<i64>,
    /// History index of the campaign's `ok`.
    granted: u64,
    /// Invocation of the last `ok` proclaim: the end of the definite interval.
    held_until: Option<u64>,
    /// Completion of an `ok` resign or lease revoke: the leadership is over by then.
    over: Option<u64>,
    /// `(invocation index, header revision)` of every `ok` proclaim and resign.
    writes: Vec<(u64, i64)>,
}

/// What may be observed of one campaign (by lease): its values, and its `rev` if known.
#[derive(Debug, Default)]
struct Contender {
    rev: Option<i64>,
    values: Vec<String>,
}

fn name_of(op: &Op) -> Option<String> {
    op.key()
        .map(str::to_string)
        .or_else(|| op.invoke.value.get("name").and_then(Value::as_str).map(str::to_string))
}

fn malformed(op: &Op, reason: &str) -> CheckError {
    CheckError::Malformed { index: op.invoke.index, reason: reason.to_string() }
}

fn int(v: &Value, field: &str) -> Option<i64> {
    v.get(field).and_then(Value::as_i64)
}

fn header_rev(op: &Op) -> Option<i64> {
    op.complete.as_ref()?.header.map(|h| h.revision)
}

/// One observed or queried leader.
#[derive(Debug)]
struct Seen {
    rev: i64,
    mod_rev: i64,
    lease: i64,
    value: String,
    header_rev: Option<i64>,
}

fn seen(v: &Value) -> Option<Seen> {
    Some(Seen {
        rev: int(v, "rev")?,
        mod_rev: int(v, "mod_rev").unwrap_or(0),
        lease: int(v, "lease")?,
        value: v.get("value").and_then(Value::as_str).unwrap_or_default().to_string(),
        header_rev: int(v, "header_rev"),
    })
}

#[derive(Default)]
struct PerName<'a> {
    leaders: Vec<Leadership<'a>>,
    contenders: HashMap<i64, Contender>,
    proclaims: Vec<&'a Op>,
    queries: Vec<&'a Op>,
    sessions: Vec<&'a Op>,
}

pub fn check(ops: &[Op]) -> Result<CheckResult, CheckError> {
    let mut names: HashMap<String, PerName<'_>> = HashMap::new();
    let mut revoked: HashMap<i64, u64> = HashMap::new();
    let (mut campaigns, mut unknown_campaigns, mut observed) = (0usize, 0usize, 0usize);
    for op in ops {
        let f = op.f();
        if f == "lease_revoke" {
            if let (Outcome::Ok, Some(id), Some(done)) =
                (op.outcome(), int(&op.invoke.value, "id"), op.complete_index())
            {
                revoked.entry(id).or_insert(done);
            }
            continue;
        }
        if !matches!(f, "campaign" | "proclaim" | "resign" | "leader" | "observe") {
            continue;
        }
        let name = name_of(op).ok_or_else(|| malformed(op, "election operation without a name"))?;
        let per = names.entry(name).or_default();
        match f {
            "campaign" => {
                campaigns += 1;
                let lease = int(&op.invoke.value, "lease")
                    .ok_or_else(|| malformed(op, "campaign without a lease"))?;
                let c = per.contenders.entry(lease).or_default();
                if let Some(v) = op.invoke.value.get("value").and_then(Value::as_str) {
                    c.values.push(v.to_string());
                }
                // A failed campaign is never a leadership, but it may have created its key: a
                // campaign fails while waiting when its key is deleted (its lease expired, say
                // while its member was cut off), and until then that key can be the oldest under
                // the prefix, which Leader and Observe report, as etcd's do. So its lease and
                // value stay known to the phantom checks. (Seen in a real run: a leader query
                // named the key of a campaign that failed 8 s later with "deleted while
                // waiting"; the checker called it a phantom.)
                if op.outcome() == Outcome::Fail {
                    continue;
                }
                if op.outcome().is_unknown() {
                    unknown_campaigns += 1;
                    continue;
                }
                let v = op.value();
                let rev = int(v, "rev").ok_or_else(|| malformed(op, "ok campaign without rev"))?;
                c.rev = Some(rev);
                per.leaders.push(Leadership {
                    op,
                    rev,
                    lease,
                    campaign_rev: int(v, "campaign_rev").or_else(|| header_rev(op)),
                    granted: op.complete_index().ok_or_else(|| malformed(op, "ok without end"))?,
                    held_until: None,
                    over: None,
                    writes: Vec::new(),
                });
            }
            "proclaim" => per.proclaims.push(op),
            "resign" => {
                let rev = int(&op.invoke.value, "rev")
                    .ok_or_else(|| malformed(op, "resign without rev"))?;
                if op.outcome() != Outcome::Ok {
                    continue;
                }
                if let Some(l) = per.leaders.iter_mut().rev().find(|l| l.rev == rev) {
                    let done = op.complete_index().unwrap_or(u64::MAX);
                    l.over = Some(l.over.map_or(done, |o| o.min(done)));
                    if let Some(r) = header_rev(op) {
                        l.writes.push((op.invoke.index, r));
                    }
                }
            }
            "leader" => per.queries.push(op),
            _ => {
                observed += 1;
                per.sessions.push(op);
            }
        }
    }
    // Proclaims: values (any that did not fail may be observed), definite ends, and writes.
    for per in names.values_mut() {
        for op in per.proclaims.clone() {
            let v = &op.invoke.value;
            let (Some(rev), Some(lease)) = (int(v, "rev"), int(v, "lease")) else {
                return Err(malformed(op, "proclaim without rev and lease"));
            };
            if op.outcome() != Outcome::Fail {
                if let Some(val) = v.get("value").and_then(Value::as_str) {
                    per.contenders.entry(lease).or_default().values.push(val.to_string());
                }
            }
            if op.outcome() != Outcome::Ok {
                continue;
            }
            if let Some(l) = per.leaders.iter_mut().rev().find(|l| l.rev == rev) {
                if l.held_until.is_none_or(|h| h < op.invoke.index) {
                    l.held_until = Some(op.invoke.index);
                }
                if let Some(r) = header_rev(op) {
                    l.writes.push((op.invoke.index, r));
                }
            }
        }
        for l in &mut per.leaders {
            if let Some(&done) = revoked.get(&l.lease) {
                l.over = Some(l.over.map_or(done, |o| o.min(done)));
            }
        }
    }

    let mut anomalies = Vec::new();
    let mut sorted: Vec<&String> = names.keys().collect();
    sorted.sort();
    for name in sorted {
        let per = &names[name];
        check_leaders(name, &per.leaders, &mut anomalies);
        check_proclaims(name, per, &mut anomalies);
        check_sessions(name, per, &mut anomalies);
        check_queries(name, per, &mut anomalies);
    }
    let leaders: Vec<&Leadership<'_>> = names.values().flat_map(|p| &p.leaders).collect();
    let mut r = CheckResult::from_anomalies(anomalies)
        .stat("campaigns_invoked", campaigns)
        .stat("campaigns_ok", leaders.len())
        .stat("campaigns_unknown", unknown_campaigns)
        .stat("definite_leaderships", leaders.iter().filter(|l| l.held_until.is_some()).count())
        .stat("observe_sessions", observed)
        .stat(
            "observed_leaders",
            names
                .values()
                .flat_map(|p| &p.sessions)
                .map(|s| s.value().get("items").and_then(Value::as_array).map_or(0, Vec::len))
                .sum::<usize>(),
        );
    if leaders.is_empty() {
        r = r.at_most_unknown("no acknowledged campaigns to check");
    }
    Ok(r)
}

fn push(
    out: &mut Vec<Anomaly>,
    kind: &str,
    name: &str,
    events: Vec<u64>,
    message: impl Into<String>,
) {
    out.push(Anomaly::new(kind, Some(name), message.into(), events));
}

/// Rules 1-3: unique and increasing revs, one leader at a time.
fn check_leaders(name: &str, list: &[Leadership<'_>], out: &mut Vec<Anomaly>) {
    let mut by_rev: HashMap<i64, &Leadership<'_>> = HashMap::new();
    for l in list {
        if let Some(o) = by_rev.insert(l.rev, l) {
            let mut ev = o.op.indexes();
            ev.extend(l.op.indexes());
            let msg = format!(
                "election {name}: two campaigns won with the same rev {}: {} and {}",
                l.rev,
                o.op.describe(),
                l.op.describe()
            );
            push(out, "duplicate-leader-rev", name, ev, msg);
        }
    }
    for a in list {
        for b in list {
            if std::ptr::eq(a, b) {
                continue;
            }
            // 2. b invoked after a was answered: b's key is younger.
            if a.granted < b.op.invoke.index && b.rev <= a.rev {
                let mut ev = a.op.indexes();
                ev.extend(b.op.indexes());
                let msg = format!(
                    "election {name}: {} won with rev {} after {} had won with rev {}",
                    b.op.describe(),
                    b.rev,
                    a.op.describe(),
                    a.rev
                );
                push(out, "leader-rev-not-increasing", name, ev, msg);
            }
            // 3. One leader at a time (see the lock checker's rule 3).
            if let Some(until) = a.held_until {
                let inside = a.granted < b.op.invoke.index && b.granted < until;
                let both = b.held_until.is_some() && a.granted < b.granted && b.granted < until;
                if inside || both {
                    let mut ev = a.op.indexes();
                    ev.extend(b.op.indexes());
                    ev.push(until);
                    let msg = format!(
                        "election {name}: {} (rev {}) won while {} (rev {}) led from event #{} \
                         until at least its proclaim at #{until}",
                        b.op.describe(),
                        b.rev,
                        a.op.describe(),
                        a.rev,
                        a.granted
                    );
                    push(out, "overlapping-leaders", name, ev, msg);
                }
            }
            // 3b. A campaign answered before a's write was sent has a revision no larger.
            let Some(crev) = b.campaign_rev else { continue };
            for &(invoked, wrev) in &a.writes {
                if b.granted < invoked && crev > wrev {
                    let mut ev = a.op.indexes();
                    ev.extend(b.op.indexes());
                    ev.push(invoked);
                    let msg = format!(
                        "election {name}: {} was answered at campaign revision {crev} before \
                         the write at #{invoked} by the leadership {} was sent, yet that write \
                         has the lower revision {wrev}",
                        b.op.describe(),
                        a.op.describe()
                    );
                    push(out, "leader-revision-order", name, ev, msg);
                }
            }
        }
    }
}

/// Rule 4: only the current leader's proclaims succeed.
fn check_proclaims(name: &str, per: &PerName<'_>, out: &mut Vec<Anomaly>) {
    for p in per.proclaims.iter().filter(|p| p.outcome() == Outcome::Ok) {
        let Some(rev) = int(&p.invoke.value, "rev") else { continue };
        let Some(a) = per.leaders.iter().rev().find(|l| l.rev == rev) else { continue };
        let at = p.invoke.index;
        if let Some(over) = a.over.filter(|&o| o < at) {
            let mut ev = p.indexes();
            ev.extend(a.op.indexes());
            ev.push(over);
            let msg = format!(
                "election {name}: {} succeeded although the leadership {} was over (resigned or \
                 its lease revoked) at #{over}, before the proclaim began",
                p.describe(),
                a.op.describe()
            );
            push(out, "stale-proclaim", name, ev, msg);
            continue;
        }
        let newer = per
            .leaders
            .iter()
            .find(|b| b.rev != a.rev && a.granted < b.op.invoke.index && b.granted < at);
        if let Some(b) = newer {
            let mut ev = p.indexes();
            ev.extend(a.op.indexes());
            ev.extend(b.op.indexes());
            let msg = format!(
                "election {name}: {} succeeded after {} (invoked once {} led) had won: the \
                 proclaiming leader had been replaced",
                p.describe(),
                b.op.describe(),
                a.op.describe()
            );
            push(out, "stale-proclaim", name, ev, msg);
        }
    }
}

/// The newest rev among campaigns answered before event `index`.
fn known_before<'p, 'a>(per: &'p PerName<'a>, index: u64) -> Option<&'p Leadership<'a>> {
    per.leaders.iter().filter(|l| l.granted < index).max_by_key(|l| l.rev)
}

/// Phantom checks for one observed or queried leader.
fn check_real(name: &str, per: &PerName<'_>, op: &Op, s: &Seen, out: &mut Vec<Anomaly>) {
    match per.contenders.get(&s.lease) {
        None => push(
            out,
            "phantom-leader",
            name,
            op.indexes(),
            format!(
                "election {name}: {} reports a leader with lease {:x} (rev {}), which no \
                 campaign of this name used",
                op.describe(),
                s.lease,
                s.rev
            ),
        ),
        Some(c) if c.rev.is_some_and(|r| r != s.rev) => push(
            out,
            "phantom-leader",
            name,
            op.indexes(),
            format!(
                "election {name}: {} reports lease {:x}'s leader key at rev {}, but its \
                 campaign won with rev {:?}",
                op.describe(),
                s.lease,
                s.rev,
                c.rev
            ),
        ),
        Some(c) if !c.values.contains(&s.value) => push(
            out,
            "phantom-value",
            name,
            op.indexes(),
            format!(
                "election {name}: {} reports the value {:?} for lease {:x}, which is neither its \
                 campaign value nor a proclaim that did not fail ({:?})",
                op.describe(),
                s.value,
                s.lease,
                c.values
            ),
        ),
        Some(_) => {}
    }
}

/// Rule 5: observe sessions.
fn check_sessions(name: &str, per: &PerName<'_>, out: &mut Vec<Anomaly>) {
    for op in per.sessions.iter().filter(|o| o.outcome() == Outcome::Ok) {
        let items = op.value().get("items").and_then(Value::as_array).cloned().unwrap_or_default();
        let floor = known_before(per, op.invoke.index);
        let mut prev: Option<Seen> = None;
        for (i, item) in items.iter().enumerate() {
            let Some(s) = seen(item) else { continue };
            check_real(name, per, op, &s, out);
            if let Some(f) = floor.filter(|f| s.rev < f.rev) {
                let mut ev = op.indexes();
                ev.extend(f.op.indexes());
                let msg = format!(
                    "election {name}: {} observed (item {i}) the leader with rev {} although {} \
                     had won with rev {} before the session began",
                    op.describe(),
                    s.rev,
                    f.op.describe(),
                    f.rev
                );
                push(out, "stale-observation", name, ev, msg);
            }
            if let Some(p) = &prev {
                let back = (s.rev, s.mod_rev) < (p.rev, p.mod_rev)
                    || s.header_rev.zip(p.header_rev).is_some_and(|(a, b)| a < b);
                if back {
                    let msg = format!(
                        "election {name}: {} observed (item {i}) rev {} / mod_rev {} / header \
                         {:?} after rev {} / mod_rev {} / header {:?}",
                        op.describe(),
                        s.rev,
                        s.mod_rev,
                        s.header_rev,
                        p.rev,
                        p.mod_rev,
                        p.header_rev
                    );
                    push(out, "observed-out-of-order", name, op.indexes(), msg);
                }
            }
            prev = Some(s);
        }
    }
}

/// Rule 6: leader queries.
fn check_queries(name: &str, per: &PerName<'_>, out: &mut Vec<Anomaly>) {
    for op in per.queries.iter().filter(|o| o.outcome() == Outcome::Ok) {
        let v = op.value();
        let s = if v.get("none").and_then(Value::as_bool) == Some(true) { None } else { seen(v) };
        let Some(done) = op.complete_index() else { continue };
        let start = op.invoke.index;
        if let Some(s) = &s {
            check_real(name, per, op, s, out);
            if let Some(f) = known_before(per, start).filter(|f| s.rev < f.rev) {
                let mut ev = op.indexes();
                ev.extend(f.op.indexes());
                let msg = format!(
                    "election {name}: {} named the leader with rev {} although {} had won with \
                     rev {} before the query began",
                    op.describe(),
                    s.rev,
                    f.op.describe(),
                    f.rev
                );
                push(out, "stale-leader", name, ev, msg);
            }
            let ended =
                per.leaders.iter().find(|l| l.rev == s.rev && l.over.is_some_and(|o| o < start));
            if let Some(l) = ended {
                let mut ev = op.indexes();
                ev.extend(l.op.indexes());
                let msg = format!(
                    "election {name}: {} named {} as leader, whose leadership was over (resigned \
                     or lease revoked) at #{:?}, before the query began",
                    op.describe(),
                    l.op.describe(),
                    l.over
                );
                push(out, "stale-leader", name, ev, msg);
            }
        }
        let holder = per
            .leaders
            .iter()
            .find(|l| l.held_until.is_some_and(|until| l.granted < start && done < until));
        if let Some(l) = holder.filter(|l| s.as_ref().is_none_or(|s| s.rev != l.rev)) {
            let mut ev = op.indexes();
            ev.extend(l.op.indexes());
            let msg = format!(
                "election {name}: {} ran entirely while {} (rev {}) definitely led, but named \
                 {}",
                op.describe(),
                l.op.describe(),
                l.rev,
                s.as_ref().map_or("no leader".to_string(), |s| format!("rev {}", s.rev))
            );
            push(out, "wrong-leader", name, ev, msg);
        }
    }
}

#[cfg(test)]
#[path = "election_tests.rs"]
mod tests;
