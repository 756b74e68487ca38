//! Per-member guarantees of serializable reads (issue 21): what a client pinned to one member
//! may rely on without paying for a linearizable read. etcd gives both, because a member answers
//! a request only after it applied it:
//!
//! 1. **the member's reads never go back**: a serializable read's header revision is at least
//!    the header revision of every `ok` operation answered by the same member (reads and writes,
//!    any client) that completed before the read began;
//! 2. **read-your-writes through a member**: a serializable read of a key does not return a
//!    version older than a write to that key that the same member acknowledged before the read
//!    began (its `mod_rev` is at least that write's revision).
//!
//! "The same member" is the response header's `member_id`, so a member the `member` nemesis
//! removed, wiped and added again (a new id, empty state) is a new member, as it is for etcd.
//! Serializable reads are otherwise unconstrained: they may miss writes acknowledged by other
//! members; the linearizability checker never sees them.

use std::collections::HashMap;

use super::register::{RegF, RegOp};
use super::{Anomaly, CheckResult};

/// The highest revision a member has shown so far, with the operation that showed it.
#[derive(Debug, Clone, Copy, Default)]
struct Floor {
    rev: i64,
    op: Option<usize>,
}

impl Floor {
    fn bump(&mut self, rev: i64, op: usize) {
        if self.op.is_none() || rev > self.rev {
            *self = Floor { rev, op: Some(op) };
        }
    }
}

/// Which operation a sweep point belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    /// An operation of the linearizable register workload (`get`, `put`, `cas`, `delete`).
    Op(usize),
    /// A serializable read.
    Read(usize),
}

/// Whether `op` created the revision it reports (the write a later read must not miss).
fn wrote(op: &RegOp) -> bool {
    match op.f {
        RegF::Put => true,
        RegF::Cas => op.succeeded == Some(true),
        RegF::Delete => op.deleted == Some(1),
        RegF::Get => false,
    }
}

/// Checks `reads` (the serializable reads) against every operation in `ops` and each other.
pub fn check(ops: &[RegOp], reads: &[RegOp]) -> CheckResult {
    let op_of = |w: Who| match w {
        Who::Op(i) => &ops[i],
        Who::Read(i) => &reads[i],
    };
    // A sweep in history order over the ok operations with a known member: at a read's
    // invocation, remember the member's floors; at any completion, raise them.
    let mut points: Vec<(u64, bool, Who)> = Vec::new();
    let known = |op: &RegOp| op.is_ok() && op.member.is_some() && op.header_rev.is_some();
    let whos = (0..ops.len()).map(Who::Op).chain((0..reads.len()).map(Who::Read));
    for w in whos {
        let op = op_of(w);
        if !known(op) {
            continue;
        }
        if let Who::Read(_) = w {
            points.push((op.invoke, true, w));
        }
        if let Some(c) = op.complete {
            points.push((c, false, w));
        }
    }
    points.sort_unstable();

    let mut member_floor: HashMap<u64, Floor> = HashMap::new();
    let mut key_floor: HashMap<(u64, &str), Floor> = HashMap::new();
    let mut before: HashMap<usize, (Floor, Floor)> = HashMap::new();
    for &(_, is_invoke, w) in &points {
        let op = op_of(w);
        let (Some(member), Some(header)) = (op.member, op.header_rev) else { continue };
        let idx = match w {
            Who::Op(i) => i,
            // Reads are numbered after the operations, so one index space names both.
            Who::Read(i) => ops.len() + i,
        };
        if is_invoke {
            let m = member_floor.get(&member).copied().unwrap_or_default();
            let k = key_floor.get(&(member, op.key.as_str())).copied().unwrap_or_default();
            before.insert(idx, (m, k));
            continue;
        }
        member_floor.entry(member).or_default().bump(header, idx);
        if let (Who::Op(_), true, Some(r)) = (w, wrote(op), op.write_rev) {
            key_floor.entry((member, op.key.as_str())).or_default().bump(r, idx);
        }
    }

    let describe = |idx: usize| {
        if idx < ops.len() {
            &ops[idx]
        } else {
            &reads[idx - ops.len()]
        }
    };
    let mut anomalies = Vec::new();
    let mut checked = 0u64;
    for (i, read) in reads.iter().enumerate() {
        let Some(&(member_before, key_before)) = before.get(&(ops.len() + i)) else { continue };
        let (Some(member), Some(header)) = (read.member, read.header_rev) else { continue };
        checked += 1;
        let events = |j: usize| {
            let mut e = describe(j).events();
            e.extend(read.events());
            e
        };
        if let Some(j) = member_before.op {
            if header < member_before.rev {
                anomalies.push(Anomaly::new(
                    "member-read-went-back",
                    Some(&read.key),
                    format!(
                        "member {member:x} answered {} at revision {header}, after it had \
                         answered {} at revision {}",
                        read.describe,
                        describe(j).describe,
                        member_before.rev
                    ),
                    events(j),
                ));
                continue;
            }
        }
        if let (Some(j), Some(Some(_)), Some(m)) = (key_before.op, &read.read, read.read_mod_rev) {
            if m < key_before.rev {
                anomalies.push(Anomaly::new(
                    "member-missed-own-write",
                    Some(&read.key),
                    format!(
                        "member {member:x} acknowledged {} (revision {}), then answered {} with \
                         the version of revision {m}",
                        describe(j).describe,
                        key_before.rev,
                        read.describe
                    ),
                    events(j),
                ));
            }
        }
    }
    let mut result = CheckResult::from_anomalies(anomalies);
    result.stats.insert("serializable_reads_checked".into(), checked.into());
    result.stats.insert("serializable_reads".into(), reads.len().into());
    result
}

#[cfg(test)]
#[path = "member_reads_tests.rs"]
mod tests;
