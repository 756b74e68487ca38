//! The newest Raft log entries, kept in memory for the reads that follow an append.
//!
//! openraft reads every entry back soon after it is appended: the leader once per follower to
//! replicate it, every member once to apply it. From RocksDB each read is an iterator, a seek
//! and a decode (issue 20: ~5 % of the members' CPU under 64-client puts). The tail answers them
//! with clones, which share the command (`raft::types::Command`).
//!
//! Invariant: the tail holds consecutive entries ending with the log's last entry, or nothing.
//! Every change of the stored log that could break it updates the tail after the stored log
//! changed (append: pushed; truncation: cut; purge: dropped), so what the tail answers is what
//! RocksDB holds. A read it cannot answer whole (it starts before the tail or after its end,
//! or the tail is empty, as after a start) goes to RocksDB.

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::raft::types::Entry;

/// How many stored bytes of entries the tail keeps at most. An entry is read back within
/// milliseconds by a member keeping up; a follower further behind than this reads from RocksDB
/// as before. The entries in memory take about twice their stored size (the command decoded
/// and its encoding), so this bounds the tail's memory at ~8 MiB.
pub const TAIL_BYTES: usize = 4 << 20;

#[derive(Default)]
pub struct LogTail {
    inner: Mutex<Tail>,
}

#[derive(Default)]
struct Tail {
    /// Consecutive entries with their stored (postcard) sizes.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Tail {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.log_id.index)
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }

    fn pop_back(&mut self) {
        if let Some((_, size)) = self.entries.pop_back() {
            self.bytes -= size;
        }
    }
}

impl LogTail {
    /// Records entries just written to the log, with their stored sizes, in index order.
    pub fn appended(&self, entries: Vec<(Entry, usize)>) {
        let mut tail = self.inner.lock();
        for (entry, size) in entries {
            // openraft truncates before it overwrites and appends after a snapshot's last
            // entry after purging: an entry that does not follow the tail's last starts anew,
            // so the tail stays consecutive whatever the order of calls.
            if tail.last_index().is_some_and(|last| last.checked_add(1) != Some(entry.log_id.index))
            {
                tail.clear();
            }
            tail.bytes += size;
            tail.entries.push_back((entry, size));
        }
        while tail.bytes > TAIL_BYTES && tail.entries.len() > 1 {
            tail.pop_front();
        }
    }

    /// The log kept only the entries before `first_gone`.
    pub fn truncated(&self, first_gone: u64) {
        let mut tail = self.inner.lock();
        while tail.last_index().is_some_and(|last| last >= first_gone) {
            tail.pop_back();
        }
    }

    /// The log dropped every entry up to and including `last_purged`.
    pub fn purged(&self, last_purged: u64) {
        let mut tail = self.inner.lock();
        while tail.first_index().is_some_and(|first| first <= last_purged) {
            tail.pop_front();
        }
    }

    /// The entries of `[start, end)` as the log holds them, stopping after the entry that
    /// brings the stored bytes read to `max_bytes`; `None` unless the tail holds `start`.
    /// Entries after the tail's last do not exist, so a range past it is answered whole.
    pub fn read(&self, start: u64, end: Option<u64>, max_bytes: usize) -> Option<Vec<Entry>> {
        let tail = self.inner.lock();
        let first = tail.first_index()?;
        if start < first || start > tail.last_index()? {
            return None;
        }
        let skip = usize::try_from(start - first).ok()?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for (entry, size) in tail.entries.iter().skip(skip) {
            if bytes >= max_bytes || end.is_some_and(|end| entry.log_id.index >= end) {
                break;
            }
            bytes = bytes.saturating_add(*size);
            out.push(entry.clone());
        }
        Some(out)
    }

    /// Stored bytes and entries held now.
    #[cfg(test)]
    pub fn held(&self) -> (usize, usize) {
        let tail = self.inner.lock();
        (tail.bytes, tail.entries.len())
    }
}

#[cfg(test)]
#[path = "log_tail_tests.rs"]
mod tests;
