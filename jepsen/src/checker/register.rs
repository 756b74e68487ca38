//! Parses the register workload's operations (`get`, `put`, `cas`, `delete` on string values)
//! from a paired history into [`RegOp`]s.
//!
//! Value shapes (`shared/specs/harness.md`, plus the fields marked "ours"):
//! - `get` -> ok `{"value": v|null, "mod_rev"?, "create_rev"?, "version"?}`
//! - `put {"value": v}` -> ok `{"value": v, "mod_rev": r}`
//! - `cas {"expect": v|null, "new": w}` -> ok adds `{"succeeded": bool}`; when it succeeded,
//!   `"mod_rev": r` (ours: the revision of the write); when it did not and the harness read the
//!   key in the failure branch, `"current": v|null` and `"current_mod_rev"` (ours)
//! - `delete` -> ok `{"deleted": 0|1}`, plus `"mod_rev": r` when it deleted (ours)
//!
//! Every written value is unique in a run, which makes "the register holds v" the same as "the
//! write of v is the latest write".

use serde_json::Value;

use super::CheckError;
use crate::history::{Op, Outcome};

/// Which register operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegF {
    Get,
    Put,
    Cas,
    Delete,
}

/// One parsed register operation. Fields that only exist on `ok` completions are `None` otherwise.
#[derive(Debug, Clone, PartialEq)]
pub struct RegOp {
    pub key: String,
    pub f: RegF,
    pub outcome: Outcome,
    /// History index of the invocation.
    pub invoke: u64,
    /// History index of the completion (`None`: never completed).
    pub complete: Option<u64>,
    /// The value a put writes, or the value a cas writes if it succeeds.
    pub write: Option<String>,
    /// A cas's expected value (`None` inside: the key must be absent).
    pub expect: Option<Option<String>>,
    /// The value observed: a get's result, or a failed cas's `current` when recorded.
    pub read: Option<Option<String>>,
    /// Revision of the observed value (a get's `mod_rev`, a failed cas's `current_mod_rev`).
    pub read_mod_rev: Option<i64>,
    pub succeeded: Option<bool>,
    pub deleted: Option<u64>,
    /// The revision this operation's write created (ok put, succeeded cas, delete that deleted).
    pub write_rev: Option<i64>,
    /// `header.revision` of the response.
    pub header_rev: Option<i64>,
    /// `header.member_id` of the response: the member the client asked (a follower answers
    /// the writes it forwarded itself).
    pub member: Option<u64>,
    /// A one-line description for anomaly reports.
    pub describe: String,
}

impl RegOp {
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// Whether this operation changes the register when it takes effect (for `cas`, only if its
    /// comparison holds; for `delete`, only if the key exists).
    pub fn may_write(&self) -> bool {
        match self.f {
            RegF::Get => false,
            RegF::Put | RegF::Delete => true,
            RegF::Cas => self.succeeded != Some(false),
        }
    }

    /// History indexes of its events.
    pub fn events(&self) -> Vec<u64> {
        let mut v = vec![self.invoke];
        v.extend(self.complete);
        v
    }
}

fn malformed(op: &Op, reason: impl Into<String>) -> CheckError {
    CheckError::Malformed { index: op.invoke.index, reason: reason.into() }
}

/// A JSON string or null.
fn opt_str(op: &Op, v: &Value, field: &str) -> Result<Option<String>, CheckError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(malformed(op, format!("{field} must be a string or null, not {other}"))),
    }
}

fn req_str(op: &Op, v: &Value, field: &str) -> Result<String, CheckError> {
    opt_str(op, v, field)?.ok_or_else(|| malformed(op, format!("missing string {field}")))
}

fn opt_i64(op: &Op, v: &Value, field: &str) -> Result<Option<i64>, CheckError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_i64()
            .map(Some)
            .ok_or_else(|| malformed(op, format!("{field} must be an integer, not {x}"))),
    }
}

/// Parses every register operation (`get`, `put`, `cas`, `delete` with a key). Other operations
/// (nemesis events, other workloads, the serializable `sget`) are skipped.
pub fn parse(ops: &[Op]) -> Result<Vec<RegOp>, CheckError> {
    let mut out = Vec::new();
    for op in ops {
        let f = match op.f() {
            "get" => RegF::Get,
            "put" => RegF::Put,
            "cas" => RegF::Cas,
            "delete" => RegF::Delete,
            _ => continue,
        };
        out.push(parse_one(op, f)?);
    }
    Ok(out)
}

/// Parses the workload's serializable reads (`sget`, value shapes as `get`) as `get`s. They are
/// not linearizable (a member serves them from its own state), so only the per-member checker
/// ([`super::member_reads`]) reads them.
pub fn parse_serializable_reads(ops: &[Op]) -> Result<Vec<RegOp>, CheckError> {
    ops.iter().filter(|op| op.f() == "sget").map(|op| parse_one(op, RegF::Get)).collect()
}

fn parse_one(op: &Op, f: RegF) -> Result<RegOp, CheckError> {
    let Some(key) = op.key() else {
        return Err(malformed(op, "register operation without a key"));
    };
    let outcome = op.outcome();
    let args = &op.invoke.value;
    let ok = outcome == Outcome::Ok;
    // Results come from the completion; an ok completion must carry them.
    let res = op.complete.as_ref().map(|c| &c.value).unwrap_or(&Value::Null);
    let mut r = RegOp {
        key: key.to_string(),
        f,
        outcome,
        invoke: op.invoke.index,
        complete: op.complete_index(),
        write: None,
        expect: None,
        read: None,
        read_mod_rev: None,
        succeeded: None,
        deleted: None,
        write_rev: None,
        header_rev: op.complete.as_ref().and_then(|c| c.header).map(|h| h.revision),
        member: op.complete.as_ref().and_then(|c| c.header).map(|h| h.member_id),
        describe: op.describe(),
    };
    match f {
        RegF::Get => {
            if ok {
                if res.get("value").is_none() {
                    return Err(malformed(op, "ok get without a value field"));
                }
                r.read = Some(opt_str(op, res, "value")?);
                r.read_mod_rev = opt_i64(op, res, "mod_rev")?;
            }
        }
        RegF::Put => {
            r.write = Some(req_str(op, args, "value")?);
            if ok {
                r.write_rev = opt_i64(op, res, "mod_rev")?;
            }
        }
        RegF::Cas => {
            if args.get("expect").is_none() {
                return Err(malformed(op, "cas without an expect field"));
            }
            r.expect = Some(opt_str(op, args, "expect")?);
            r.write = Some(req_str(op, args, "new")?);
            if ok {
                let s = res
                    .get("succeeded")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| malformed(op, "ok cas without a boolean succeeded"))?;
                r.succeeded = Some(s);
                if s {
                    r.write_rev = opt_i64(op, res, "mod_rev")?;
                } else if res.get("current").is_some() {
                    r.read = Some(opt_str(op, res, "current")?);
                    r.read_mod_rev = opt_i64(op, res, "current_mod_rev")?;
                }
            }
        }
        RegF::Delete => {
            if ok {
                let d = res
                    .get("deleted")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| malformed(op, "ok delete without an integer deleted"))?;
                if d > 1 {
                    return Err(malformed(op, "a single-key delete deleted more than 1"));
                }
                r.deleted = Some(d);
                if d == 1 {
                    r.write_rev = opt_i64(op, res, "mod_rev")?;
                }
            }
        }
    }
    Ok(r)
}
