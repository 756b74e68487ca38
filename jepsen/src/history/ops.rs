//! Pairs invocations with their completions into [`Op`]s.
//!
//! A process has at most one operation in flight, so an invocation's completion is the next
//! event of the same process. An invocation with no completion (the harness stopped while it was
//! in flight) is an operation whose outcome is unknown, exactly like an `info` completion.

use std::collections::HashMap;

use serde_json::Value;

use super::{Event, EventType, HistoryError, Process};

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Definitely did not happen.
    Fail,
    /// May or may not have happened, at any time after its invocation.
    Info,
    /// Never completed in the history; treated like `Info`.
    Pending,
}

impl Outcome {
    /// `info` or never completed: the operation may have taken effect, or not.
    pub fn is_unknown(self) -> bool {
        matches!(self, Outcome::Info | Outcome::Pending)
    }
}

/// An invocation and its completion, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub invoke: Event,
    pub complete: Option<Event>,
}

impl Op {
    pub fn process(&self) -> Process {
        self.invoke.process
    }

    pub fn f(&self) -> &str {
        &self.invoke.f
    }

    pub fn key(&self) -> Option<&str> {
        self.invoke.key.as_deref()
    }

    pub fn outcome(&self) -> Outcome {
        match self.complete.as_ref().map(|c| c.kind) {
            Some(EventType::Ok) => Outcome::Ok,
            Some(EventType::Fail) => Outcome::Fail,
            Some(EventType::Info) => Outcome::Info,
            Some(EventType::Invoke) | None => Outcome::Pending,
        }
    }

    /// The completion's value when there is one, else the invocation's.
    pub fn value(&self) -> &Value {
        match &self.complete {
            Some(c) if !c.value.is_null() => &c.value,
            _ => &self.invoke.value,
        }
    }

    /// History index of the invocation.
    pub fn invoke_index(&self) -> u64 {
        self.invoke.index
    }

    /// History index of the completion, if the operation completed.
    pub fn complete_index(&self) -> Option<u64> {
        self.complete.as_ref().map(|c| c.index)
    }

    /// Indexes of both events, for anomaly reports.
    pub fn indexes(&self) -> Vec<u64> {
        let mut v = vec![self.invoke.index];
        v.extend(self.complete_index());
        v
    }

    /// `f(key) value -> result` in one line, for anomaly messages.
    pub fn describe(&self) -> String {
        let key = self.key().map(|k| format!(" {k}")).unwrap_or_default();
        let done = match &self.complete {
            Some(c) => format!(
                "{:?} {}{}",
                c.kind,
                c.value,
                c.error.as_ref().map(|e| format!(" error={}:{}", e.0, e.1)).unwrap_or_default()
            ),
            None => "pending".to_string(),
        };
        format!(
            "#{} p{} {}{} {} -> {}",
            self.invoke.index,
            self.process(),
            self.f(),
            key,
            self.invoke.value,
            done
        )
    }
}

/// Pairs every invocation with its completion, in invocation order. Fails on a completion
/// without an invocation, on a second invocation by a process with one in flight, and on a
/// completion whose `f` differs from its invocation's.
pub fn pair(events: &[Event]) -> Result<Vec<Op>, HistoryError> {
    let mut ops: Vec<Op> = Vec::new();
    let mut open: HashMap<Process, usize> = HashMap::new();
    for e in events {
        if e.kind == EventType::Invoke {
            if let Some(&i) = open.get(&e.process) {
                return Err(HistoryError::Malformed {
                    index: e.index,
                    reason: format!(
                        "process {} invokes while its operation #{} is in flight",
                        e.process, ops[i].invoke.index
                    ),
                });
            }
            open.insert(e.process, ops.len());
            ops.push(Op { invoke: e.clone(), complete: None });
        } else {
            let Some(i) = open.remove(&e.process) else {
                return Err(HistoryError::Malformed {
                    index: e.index,
                    reason: format!("completion for process {} without an invocation", e.process),
                });
            };
            if ops[i].invoke.f != e.f {
                return Err(HistoryError::Malformed {
                    index: e.index,
                    reason: format!(
                        "completion f {:?} does not match invocation #{}'s {:?}",
                        e.f, ops[i].invoke.index, ops[i].invoke.f
                    ),
                });
            }
            ops[i].complete = Some(e.clone());
        }
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::HistoryBuilder;
    use serde_json::json;

    #[test]
    fn pairs_by_process() {
        let mut h = HistoryBuilder::new();
        h.invoke(0, "put", "k", json!({"value": "a"}));
        h.invoke(1, "get", "k", json!(null));
        h.ok(1, json!({"value": null}));
        h.info(0, "timeout");
        h.invoke(2, "get", "k", json!(null));
        let ops = pair(&h.events()).unwrap();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0].outcome(), Outcome::Info);
        assert_eq!(ops[1].outcome(), Outcome::Ok);
        assert_eq!(ops[2].outcome(), Outcome::Pending);
        assert_eq!(ops[0].complete_index(), Some(3));
    }

    #[test]
    fn rejects_double_invocations() {
        let mut h = HistoryBuilder::new();
        h.invoke(0, "put", "k", json!({"value": "a"}));
        h.invoke(0, "put", "k", json!({"value": "b"}));
        assert!(pair(&h.events()).is_err());
    }
}
