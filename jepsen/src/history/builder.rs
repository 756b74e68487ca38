//! [`HistoryBuilder`]: hand-made histories for checker tests.
//!
//! Events get dense indexes and times equal to their index, so "written earlier" means
//! "happened earlier", as in a real history.

use std::collections::HashMap;

use serde_json::Value;

use super::{ErrorInfo, Event, EventDraft, EventType, Header, Process};

/// Builds a history one event at a time. Completions reuse the `f` and `key` of the process's
/// open invocation, so tests only state what matters.
#[derive(Debug, Default, Clone)]
pub struct HistoryBuilder {
    events: Vec<Event>,
    open: HashMap<u64, (String, Option<String>)>,
    /// Added to every later event's time (see [`HistoryBuilder::advance`]).
    offset: u64,
}

impl HistoryBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    fn push(&mut self, draft: EventDraft) -> u64 {
        let i = self.events.len() as u64;
        self.events.push(draft.stamp(i, i + self.offset));
        i
    }

    /// Moves the clock: later events happen `ns` nanoseconds later (for checkers that compare
    /// times with durations, such as lease TTLs).
    pub fn advance(&mut self, ns: u64) {
        self.offset += ns;
    }

    /// Invokes `f` on `key` by client `process`; returns the event's index.
    pub fn invoke(&mut self, process: u64, f: &str, key: &str, value: Value) -> u64 {
        self.open.insert(process, (f.to_string(), Some(key.to_string())));
        self.push(
            EventDraft::new(EventType::Invoke, Process::Client(process), f).key(key).value(value),
        )
    }

    fn complete(&mut self, process: u64, kind: EventType) -> EventDraft {
        // Test-only helper: a completion without an invocation is a bug in the test itself.
        let (f, key) = self
            .open
            .remove(&process)
            .unwrap_or_else(|| panic!("process {process} has no open invocation"));
        let mut d = EventDraft::new(kind, Process::Client(process), f);
        d.key = key;
        d
    }

    /// Completes `process`'s operation with `ok` and `value`.
    pub fn ok(&mut self, process: u64, value: Value) -> u64 {
        let d = self.complete(process, EventType::Ok).value(value);
        self.push(d)
    }

    /// Completes with `ok`, `value` and a response header carrying `revision`.
    pub fn ok_rev(&mut self, process: u64, value: Value, revision: i64) -> u64 {
        let d = self.complete(process, EventType::Ok).value(value).header(Some(Header {
            revision,
            raft_term: 1,
            member_id: 1,
        }));
        self.push(d)
    }

    /// Completes with `ok`, `value` and a header from member `member_id` at `revision`.
    pub fn ok_from(&mut self, process: u64, value: Value, revision: i64, member_id: u64) -> u64 {
        let d = self.complete(process, EventType::Ok).value(value).header(Some(Header {
            revision,
            raft_term: 1,
            member_id,
        }));
        self.push(d)
    }

    /// Completes with `fail`.
    pub fn fail(&mut self, process: u64, kind: &str) -> u64 {
        let d = self.complete(process, EventType::Fail).error(ErrorInfo::new(kind, "test"));
        self.push(d)
    }

    /// Completes with `info` (outcome unknown).
    pub fn info(&mut self, process: u64, kind: &str) -> u64 {
        let d = self.complete(process, EventType::Info).error(ErrorInfo::new(kind, "test"));
        self.push(d)
    }

    /// A nemesis event (not an operation on a key).
    pub fn nemesis(&mut self, kind: EventType, f: &str, value: Value) -> u64 {
        self.push(EventDraft::new(kind, Process::Nemesis, f).value(value))
    }

    /// The events so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.clone()
    }
}
