//! One line of `history.jsonl`: the [`Event`] type and its small parts.
//!
//! The field names and shapes are fixed by `shared/specs/harness.md` ("History format"), so
//! scripts and later sessions can rely on them. Operation-specific arguments and results live in
//! the free-form `value` object; checkers parse the shapes they understand (see
//! [`crate::checker::register`]).

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// `invoke`, `ok`, `fail` (definitely did not happen) or `info` (outcome unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

impl EventType {
    /// Whether this event completes an operation (anything but `invoke`).
    pub fn is_completion(self) -> bool {
        self != EventType::Invoke
    }
}

/// Who issued an operation: a numbered client process, or the nemesis.
///
/// Serialized as a JSON integer for clients and as the string `"nemesis"` for the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    Client(u64),
    Nemesis,
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Process::Client(p) => write!(f, "{p}"),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(p) => s.serialize_u64(*p),
            Process::Nemesis => s.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Process;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer or \"nemesis\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Process, E> {
                Ok(Process::Client(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Process, E> {
                u64::try_from(v)
                    .map(Process::Client)
                    .map_err(|_| E::custom(format!("negative process id {v}")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Process, E> {
                if v == "nemesis" {
                    Ok(Process::Nemesis)
                } else {
                    Err(E::custom(format!("unknown process {v:?}")))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// The etcd `ResponseHeader` fields a checker can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub revision: i64,
    pub raft_term: u64,
    pub member_id: u64,
}

/// `[kind, message]` on `fail` and `info` events. `kind` is a short stable label (for example
/// `timeout`, `unavailable`, `connect`); `message` is the client's or server's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo(pub String, pub String);

impl ErrorInfo {
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ErrorInfo(kind.into(), message.into())
    }

    pub fn kind(&self) -> &str {
        &self.0
    }

    pub fn message(&self) -> &str {
        &self.1
    }
}

/// One line of `history.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Dense, from 0, in the order the writer saw the events. The writer takes `time` under the
    /// same lock that assigns `index`, so index order is also real-time order.
    pub index: u64,
    /// Monotonic nanoseconds since the test started.
    pub time: u64,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub process: Process,
    /// Operation name: `get`, `put`, `cas`, `delete`, `lock_acquire`, ..., or a nemesis fault.
    pub f: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Arguments on `invoke`; arguments plus results on completion. `null` when there are none.
    #[serde(default)]
    pub value: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The node the client talked to (its name, e.g. `n2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<Header>,
}

/// An event before the writer stamps it with `index` and `time`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventDraft {
    pub kind: EventType,
    pub process: Process,
    pub f: String,
    pub key: Option<String>,
    pub value: Value,
    pub error: Option<ErrorInfo>,
    pub node: Option<String>,
    pub header: Option<Header>,
}

impl EventDraft {
    /// A draft with only the required fields set.
    pub fn new(kind: EventType, process: Process, f: impl Into<String>) -> Self {
        EventDraft {
            kind,
            process,
            f: f.into(),
            key: None,
            value: Value::Null,
            error: None,
            node: None,
            header: None,
        }
    }

    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn value(mut self, value: Value) -> Self {
        self.value = value;
        self
    }

    pub fn error(mut self, error: ErrorInfo) -> Self {
        self.error = Some(error);
        self
    }

    pub fn node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }

    pub fn header(mut self, header: Option<Header>) -> Self {
        self.header = header;
        self
    }

    /// Stamps the draft into an event.
    pub fn stamp(self, index: u64, time: u64) -> Event {
        Event {
            index,
            time,
            kind: self.kind,
            process: self.process,
            f: self.f,
            key: self.key,
            value: self.value,
            error: self.error,
            node: self.node,
            header: self.header,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trips_in_the_spec_format() {
        let e = EventDraft::new(EventType::Ok, Process::Client(3), "put")
            .key("r/0/0")
            .value(json!({"value": "p3-17", "mod_rev": 12}))
            .node("n2")
            .header(Some(Header { revision: 12, raft_term: 2, member_id: 7 }))
            .stamp(5, 1000);
        let line = serde_json::to_string(&e).unwrap();
        // serde_json sorts the keys of `value` objects; the top-level order is the struct's.
        assert_eq!(
            line,
            r#"{"index":5,"time":1000,"type":"ok","process":3,"f":"put","key":"r/0/0","value":{"mod_rev":12,"value":"p3-17"},"node":"n2","header":{"revision":12,"raft_term":2,"member_id":7}}"#
        );
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);

        let n = EventDraft::new(EventType::Info, Process::Nemesis, "kill")
            .error(ErrorInfo::new("timeout", "x"))
            .stamp(0, 0);
        let line = serde_json::to_string(&n).unwrap();
        assert!(line.contains(r#""process":"nemesis""#), "{line}");
        assert!(line.contains(r#""error":["timeout","x"]"#), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), n);
    }

    #[test]
    fn rejects_unknown_processes() {
        let line = r#"{"index":0,"time":0,"type":"ok","process":"bob","f":"get","value":null}"#;
        assert!(serde_json::from_str::<Event>(line).is_err());
    }
}
