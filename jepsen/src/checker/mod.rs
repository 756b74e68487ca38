//! Offline checkers over a recorded history.
//!
//! Every checker returns a [`CheckResult`]: `valid`, `invalid` with the [`Anomaly`]s found, or
//! `unknown` when it could not decide (a search over budget, or nothing to check). A checker never
//! says `valid` when it ran out of budget, never treats `info` as `fail`, and never drops an
//! anomaly it found.
//!
//! - [`register`]: parses get/put/cas/delete operations (shared by the next three).
//! - [`linearizable`]: per-key linearizability of the register workload ([`wgl`] search).
//! - [`revision`]: etcd revision invariants of the register workload.
//! - [`member_reads`]: per-member guarantees of the register workload's serializable reads
//!   (a member's reads never go back and show the writes it acknowledged).
//! - [`lock`]: fencing tokens and mutual exclusion of `lock_acquire`/`lock_release`.
//! - [`set`]: no acknowledged element lost (`set`, `lock-set` and their fenced variants).
//! - [`lease`]: no early expiry, expiry in one revision, no put on a dead lease, unique ids.
//! - [`queue`]: no acknowledged job lost, none acked by two claims, no overlapping claims.
//! - [`watch`]: ordered, unique, gap-free watch delivery; compaction and progress semantics.
//! - [`election`]: one leader at a time, proclaims only by the leader, observers in order.
//! - [`keylog`]: the key-event log recorded after healing, used by the lock and lease checkers.
//!
//! [`check_history`] runs the checkers that apply to a workload.

pub mod election;
pub mod keylog;
pub mod lease;
pub mod linearizable;
pub mod lock;
pub mod member_reads;
pub mod queue;
pub mod register;
pub mod revision;
pub mod set;
pub mod watch;
pub mod wgl;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::history::{pair, Event, HistoryError};

/// A checker's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Validity {
    Valid,
    /// The checker could not decide; never a pass.
    Unknown,
    Invalid,
}

impl Validity {
    /// Combines verdicts: any `invalid` wins, then any `unknown`, else `valid`.
    pub fn combine(self, other: Validity) -> Validity {
        self.max(other)
    }

    /// The harness's exit status for this verdict (0 valid, 1 anomaly, 2 unknown).
    pub fn exit_code(self) -> i32 {
        match self {
            Validity::Valid => 0,
            Validity::Invalid => 1,
            Validity::Unknown => 2,
        }
    }
}

/// One violation found by a checker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Anomaly {
    /// A stable label, e.g. `stale-read`, `impossible-cas`, `duplicate-token`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What went wrong, in one or two sentences that name the operations.
    pub message: String,
    /// History indexes of the events involved (invocations and completions).
    pub events: Vec<u64>,
    /// Anything else worth showing (the operations involved, the search's deepest state).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub detail: Value,
}

impl Anomaly {
    pub fn new(kind: &str, key: Option<&str>, message: String, events: Vec<u64>) -> Self {
        Anomaly {
            kind: kind.to_string(),
            key: key.map(str::to_string),
            message,
            events,
            detail: Value::Null,
        }
    }

    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }
}

/// What one checker concluded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub valid: Validity,
    pub anomalies: Vec<Anomaly>,
    /// Why the verdict is `unknown`, and other facts a reader needs (not anomalies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Counts: operations checked, keys, search steps, ...
    #[serde(default)]
    pub stats: BTreeMap<String, Value>,
}

impl CheckResult {
    /// A result whose verdict follows from `anomalies` (`invalid` if any, else `valid`).
    pub fn from_anomalies(anomalies: Vec<Anomaly>) -> Self {
        let valid = if anomalies.is_empty() { Validity::Valid } else { Validity::Invalid };
        CheckResult { valid, anomalies, notes: Vec::new(), stats: BTreeMap::new() }
    }

    pub fn unknown(note: impl Into<String>) -> Self {
        CheckResult {
            valid: Validity::Unknown,
            anomalies: Vec::new(),
            notes: vec![note.into()],
            stats: BTreeMap::new(),
        }
    }

    pub fn stat(mut self, name: &str, v: impl Into<Value>) -> Self {
        self.stats.insert(name.to_string(), v.into());
        self
    }

    /// Lowers a `valid` verdict to `unknown` with `note` (e.g. when there was nothing to check).
    pub fn at_most_unknown(mut self, note: impl Into<String>) -> Self {
        self.valid = self.valid.combine(Validity::Unknown);
        self.notes.push(note.into());
        self
    }
}

/// Limits on a search, so a hard history ends with `unknown` instead of exhausting the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Search steps per key (one step tries one operation at one point of the search).
    pub max_steps_per_key: u64,
    /// Memoized configurations per key; each costs roughly `ops/8 + 64` bytes.
    pub max_cache_entries_per_key: usize,
    /// Wall-clock time for the whole check.
    pub time_limit: Duration,
}

impl Default for Budget {
    /// 20 M steps and 4 M configurations per key (a few hundred MB at most for a 200-op key),
    /// and 5 minutes overall: far more than a register history with ~200 operations per key
    /// needs (typically under 10 k steps), small enough to finish on a CI machine.
    fn default() -> Self {
        Budget {
            max_steps_per_key: 20_000_000,
            max_cache_entries_per_key: 4_000_000,
            time_limit: Duration::from_secs(300),
        }
    }
}

/// A history that cannot be checked: a harness bug, reported as such (exit status 3).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckError {
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("event #{index}: {reason}")]
    Malformed { index: u64, reason: String },
    #[error("unknown workload {0:?}")]
    UnknownWorkload(String),
}

/// The verdict of every checker that applies to a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub valid: Validity,
    pub checkers: BTreeMap<String, CheckResult>,
}

impl Report {
    pub fn new(checkers: BTreeMap<String, CheckResult>) -> Self {
        let valid = checkers.values().fold(Validity::Valid, |v, r| v.combine(r.valid));
        Report { valid, checkers }
    }
}

/// The workloads the checkers know, and which checkers apply to each.
pub const WORKLOADS: &[&str] = &[
    "register",
    "set",
    "lock",
    "lock-set",
    "lock-fenced-set",
    "lock-kv-set",
    "lease",
    "watch",
    "queue",
    "election",
];

/// Runs every checker that applies to `workload` over `events`.
pub fn check_history(
    workload: &str,
    events: &[Event],
    budget: &Budget,
) -> Result<Report, CheckError> {
    let ops = pair(events)?;
    let mut checkers = BTreeMap::new();
    match workload {
        "register" => {
            let reg = register::parse(&ops)?;
            checkers.insert("linearizable".to_string(), linearizable::check(&reg, budget));
            checkers.insert("revision".to_string(), revision::check(&reg));
            let serializable = register::parse_serializable_reads(&ops)?;
            checkers.insert("member-reads".to_string(), member_reads::check(&reg, &serializable));
        }
        "lock" => {
            checkers.insert("lock".to_string(), lock::check(&ops)?);
        }
        "set" => {
            checkers.insert("set".to_string(), set::check(&ops)?);
        }
        // The lock-set family: the set checker finds lost updates (overlapping holders made
        // visible), the lock checker the lock service's own guarantees.
        "lock-set" | "lock-fenced-set" | "lock-kv-set" => {
            checkers.insert("lock".to_string(), lock::check(&ops)?);
            checkers.insert("set".to_string(), set::check(&ops)?);
        }
        "lease" => {
            checkers.insert("lease".to_string(), lease::check(&ops)?);
        }
        "queue" => {
            checkers.insert("queue".to_string(), queue::check(&ops)?);
        }
        "watch" => {
            checkers.insert("watch".to_string(), watch::check(&ops)?);
        }
        "election" => {
            checkers.insert("election".to_string(), election::check(&ops)?);
        }
        other => return Err(CheckError::UnknownWorkload(other.to_string())),
    }
    Ok(Report::new(checkers))
}
