//! Writing and reading `history.jsonl`.
//!
//! [`HistoryWriter`] is shared by every worker and the nemesis. It stamps each event with its
//! index and its time **under one lock**, so the file's line order, the `index` field and the
//! `time` field all agree, and an event written after another really happened after it: an
//! invocation is recorded just before the request is sent and a completion just after the
//! response arrives, so "A's completion line comes before B's invocation line" implies "A
//! finished before B started". The checkers rely on that.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use super::{Event, EventDraft, HistoryError};

/// Appends events to a `history.jsonl` file. Cheap to share behind an `Arc`.
pub struct HistoryWriter {
    path: PathBuf,
    start: Instant,
    inner: Mutex<Inner>,
}

struct Inner {
    out: BufWriter<File>,
    next_index: u64,
    /// The first write error, kept so every later `record` reports it too.
    failed: Option<String>,
}

impl HistoryWriter {
    /// Creates (truncates) `path`. Times are measured from this call.
    pub fn create(path: &Path) -> Result<HistoryWriter, HistoryError> {
        let file = File::create(path).map_err(|e| HistoryError::io(path, e))?;
        Ok(HistoryWriter {
            path: path.to_path_buf(),
            start: Instant::now(),
            inner: Mutex::new(Inner { out: BufWriter::new(file), next_index: 0, failed: None }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Nanoseconds since the writer was created (the history's clock).
    pub fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Stamps `draft` with the next index and the current time, appends it and returns it.
    pub fn record(&self, draft: EventDraft) -> Result<Event, HistoryError> {
        // A poisoned lock only means another thread panicked while holding it; the writer's
        // state (a buffered file and a counter) is still consistent line by line.
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(msg) = &inner.failed {
            return Err(HistoryError::Write { path: self.path.clone(), message: msg.clone() });
        }
        let event = draft.stamp(inner.next_index, self.now());
        let written = serde_json::to_writer(&mut inner.out, &event)
            .map_err(|e| e.to_string())
            .and_then(|()| inner.out.write_all(b"\n").map_err(|e| e.to_string()));
        if let Err(msg) = written {
            inner.failed = Some(msg.clone());
            return Err(HistoryError::Write { path: self.path.clone(), message: msg });
        }
        inner.next_index += 1;
        Ok(event)
    }

    /// Number of events recorded so far.
    pub fn len(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).next_index
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flushes buffered lines to the file. The history is evidence, not state: losing its tail
    /// to a machine crash loses a run, not correctness, so there is no fsync.
    pub fn flush(&self) -> Result<(), HistoryError> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.out.flush().map_err(|e| HistoryError::io(&self.path, e))
    }
}

impl Drop for HistoryWriter {
    fn drop(&mut self) {
        // Best effort: an explicit `flush` reports errors; a drop can only try.
        let _ = self.flush();
    }
}

/// Reads a whole `history.jsonl`, checking that indexes are dense from 0 and times never go
/// backwards (both are what the writer guarantees and what the checkers assume).
pub fn read_history(path: &Path) -> Result<Vec<Event>, HistoryError> {
    let file = File::open(path).map_err(|e| HistoryError::io(path, e))?;
    let mut events = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| HistoryError::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line).map_err(|e| HistoryError::Parse {
            path: path.to_path_buf(),
            line: n + 1,
            message: e.to_string(),
        })?;
        events.push(event);
    }
    validate_order(&events)?;
    Ok(events)
}

/// Checks the writer's guarantees on an in-memory history: `index` is dense from 0 and `time`
/// is non-decreasing.
pub fn validate_order(events: &[Event]) -> Result<(), HistoryError> {
    let mut last_time = 0;
    for (i, e) in events.iter().enumerate() {
        if e.index != i as u64 {
            return Err(HistoryError::Malformed {
                index: e.index,
                reason: format!("expected index {i}: indexes must be dense from 0"),
            });
        }
        if e.time < last_time {
            return Err(HistoryError::Malformed {
                index: e.index,
                reason: format!("time {} is before the previous event's {last_time}", e.time),
            });
        }
        last_time = e.time;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{EventType, Process};
    use serde_json::json;

    #[test]
    fn writes_then_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let w = HistoryWriter::create(&path).unwrap();
        let a = w
            .record(
                EventDraft::new(EventType::Invoke, Process::Client(0), "put")
                    .key("k")
                    .value(json!({"value": "p0-0"})),
            )
            .unwrap();
        let b = w.record(EventDraft::new(EventType::Invoke, Process::Nemesis, "kill")).unwrap();
        w.flush().unwrap();
        assert_eq!((a.index, b.index), (0, 1));
        assert!(b.time >= a.time);
        let back = read_history(&path).unwrap();
        assert_eq!(back, vec![a, b]);
    }

    #[test]
    fn rejects_gaps_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        std::fs::write(
            &path,
            "{\"index\":0,\"time\":0,\"type\":\"invoke\",\"process\":0,\"f\":\"get\",\"value\":null}\n\
             {\"index\":2,\"time\":1,\"type\":\"ok\",\"process\":0,\"f\":\"get\",\"value\":null}\n",
        )
        .unwrap();
        assert!(matches!(read_history(&path), Err(HistoryError::Malformed { index: 2, .. })));
        std::fs::write(&path, "{not json\n").unwrap();
        assert!(matches!(read_history(&path), Err(HistoryError::Parse { line: 1, .. })));
    }
}
