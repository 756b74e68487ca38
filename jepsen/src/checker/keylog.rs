//! The key-event log a workload records after healing (a `watch` operation with `log: true`,
//! see [`crate::workload::watch::final_log`]), and the key lifetimes derived from it.
//!
//! The log lists every put and delete under a prefix from its `start` revision up to a sentinel
//! put at `until`, in revision order. A key's lifetime runs from its creation (`create_rev`) to
//! its deletion (the delete event's revision), or to the end of the log.

use std::collections::BTreeMap;

use serde_json::Value;

use super::CheckError;
use crate::history::{Op, Outcome};

/// One event of a watch or a log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEvent {
    pub rev: i64,
    pub key: String,
    pub delete: bool,
    pub value: Option<String>,
    pub create_rev: i64,
    pub lease: i64,
}

/// Parses an event item (`{rev, key, type, value, create_rev, lease}`); `None` for progress
/// notifications and anything else.
pub fn parse_item(v: &Value) -> Option<LogEvent> {
    let rev = v.get("rev")?.as_i64()?;
    let key = v.get("key")?.as_str()?.to_string();
    Some(LogEvent {
        rev,
        key,
        delete: v.get("type").and_then(Value::as_str) == Some("delete"),
        value: v.get("value").and_then(Value::as_str).map(str::to_string),
        create_rev: v.get("create_rev").and_then(Value::as_i64).unwrap_or(0),
        lease: v.get("lease").and_then(Value::as_i64).unwrap_or(0),
    })
}

/// A key's existence from `created` to `deleted` (exclusive; `None`: still live at the log's end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub created: i64,
    pub deleted: Option<i64>,
    pub lease: i64,
}

impl Lifetime {
    pub fn live_at(&self, rev: i64) -> bool {
        self.created <= rev && self.deleted.is_none_or(|d| rev < d)
    }
}

/// The complete log of one prefix.
#[derive(Debug, Clone, Default)]
pub struct KeyLog {
    /// First revision covered (events from here on are all present).
    pub start: i64,
    /// Last revision covered (the sentinel's).
    pub until: i64,
    pub events: Vec<LogEvent>,
    /// Lifetimes per key, in creation order.
    pub lifetimes: BTreeMap<String, Vec<Lifetime>>,
    /// History indexes of the log operation.
    pub indexes: Vec<u64>,
}

impl KeyLog {
    /// The last complete log among `ops` (an `ok` `watch` with `log: true` that reached its
    /// `until`), if any.
    pub fn find(ops: &[Op]) -> Result<Option<KeyLog>, CheckError> {
        let mut found = None;
        for op in ops {
            if op.f() != "watch" || op.outcome() != Outcome::Ok {
                continue;
            }
            let v = op.value();
            if v.get("log").and_then(Value::as_bool) != Some(true) || v["canceled"] == true {
                continue;
            }
            let (Some(start), Some(until)) =
                (v.get("start").and_then(Value::as_i64), v.get("until").and_then(Value::as_i64))
            else {
                return Err(CheckError::Malformed {
                    index: op.invoke.index,
                    reason: "key log without start/until".into(),
                });
            };
            let events: Vec<LogEvent> = v
                .get("items")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(parse_item).collect())
                .unwrap_or_default();
            found = Some(KeyLog::build(start, until, events, op.indexes()));
        }
        Ok(found)
    }

    pub fn build(start: i64, until: i64, events: Vec<LogEvent>, indexes: Vec<u64>) -> KeyLog {
        let mut lifetimes: BTreeMap<String, Vec<Lifetime>> = BTreeMap::new();
        for e in &events {
            let l = lifetimes.entry(e.key.clone()).or_default();
            let open = l.last_mut().filter(|x| x.deleted.is_none());
            match (e.delete, open) {
                (true, Some(x)) => x.deleted = Some(e.rev),
                // A delete of a key created before the log starts.
                (true, None) => l.push(Lifetime { created: 0, deleted: Some(e.rev), lease: 0 }),
                (false, Some(_)) => {}
                (false, None) => l.push(Lifetime {
                    created: if e.create_rev > 0 { e.create_rev } else { e.rev },
                    deleted: None,
                    lease: e.lease,
                }),
            }
        }
        KeyLog { start, until, events, lifetimes, indexes }
    }

    /// Whether the log covers revision `rev` (every event at or before it is known, as far back
    /// as the key's creation, when the log starts at 1).
    pub fn covers(&self, rev: i64) -> bool {
        self.start <= 1 && rev <= self.until
    }

    /// The lifetime of `key` that began at `created`.
    pub fn lifetime(&self, key: &str, created: i64) -> Option<Lifetime> {
        self.lifetimes.get(key)?.iter().find(|l| l.created == created).copied()
    }

    /// The lifetime of `key` live at `rev`, if any.
    pub fn live_at(&self, key: &str, rev: i64) -> Option<Lifetime> {
        self.lifetimes.get(key)?.iter().find(|l| l.live_at(rev)).copied()
    }

    /// Keys under `prefix` live at `rev`, with their lifetimes.
    pub fn live_under(&self, prefix: &str, rev: i64) -> Vec<(&str, Lifetime)> {
        self.lifetimes
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .flat_map(|(k, ls)| ls.iter().filter(|l| l.live_at(rev)).map(move |l| (k.as_str(), *l)))
            .collect()
    }
}
