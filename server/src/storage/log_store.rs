//! The Raft log on RocksDB (openraft's `RaftLogStorage`).
//!
//! Layout: column family `raft_log` maps the big-endian log index to the postcard-encoded
//! [`Entry`]; `raft_meta` holds the vote, the committed log id and the last purged log id.
//! The state machine lives in other column families of the same RocksDB instance, which
//! shares one write-ahead log: see the durability notes on each write below. Appends are
//! written without a sync; `log_flusher` syncs them in groups, off openraft's core task.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions, DB};

use super::log_flusher::LogFlusher;
use super::log_tail::LogTail;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::raft::types::{Entry, LogId, StorageError, TypeConfig, Vote};

const CF_LOG: &str = "raft_log";
const CF_META: &str = "raft_meta";
const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// How often at most the committed log id is written (`save_committed`).
const SAVE_COMMITTED_EVERY: Duration = Duration::from_millis(500);

/// The Raft log. Cheap to clone: clones share the database and the flusher, and serve as log
/// readers.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    /// Syncs appends and completes their callbacks (`log_flusher`).
    flusher: Arc<LogFlusher>,
    /// The newest entries, which answer most reads (`log_tail`).
    tail: Arc<LogTail>,
    /// Times every synced write (`picket_disk_wal_fsync_duration_seconds`); none offline.
    disk: Option<crate::metrics::disk::DiskMetrics>,
    /// What this member acknowledged, kept outside RocksDB (`storage::wal_tail`); none offline.
    acked: Option<super::wal_tail::AckedRecord>,
    /// When `save_committed` last wrote (openraft calls it on the one store it owns).
    committed_saved_at: Option<Instant>,
    /// This member's id: entries it wrote as the leader wake the flusher after the sends
    /// (`LogFlusher::push_after_sends`). None offline.
    own_id: Option<crate::raft::types::NodeId>,
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// An I/O error naming what was being read or written (openraft 0.10's storage error type).
fn io_err(what: &str, e: impl std::fmt::Display) -> StorageError {
    std::io::Error::other(format!("{what}: {e}"))
}

fn synced() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

impl LogStore {
    /// Opens the log on a database that already has the `raft_log` and `raft_meta` column
    /// families (see `storage::rocks`).
    /// Starts the log's flusher thread.
    pub fn new(db: Arc<DB>) -> Result<Self, StorageError> {
        let flusher = Arc::new(LogFlusher::start(db.clone())?);
        Ok(Self {
            db,
            flusher,
            tail: Arc::default(),
            disk: None,
            acked: None,
            committed_saved_at: None,
            own_id: None,
        })
    }

    /// Names this member, so the entries it appends as the leader are synced after its
    /// replication sends them (`LogFlusher::push_after_sends`).
    pub fn with_own_id(mut self, id: crate::raft::types::NodeId) -> Self {
        self.own_id = Some(id);
        self
    }

    /// The flusher that syncs this log's appends.
    #[cfg(test)]
    pub(crate) fn flusher(&self) -> &LogFlusher {
        &self.flusher
    }

    /// Records every acknowledged append and vote in `record` (see `storage::wal_tail`).
    pub fn with_acked_record(mut self, record: super::wal_tail::AckedRecord) -> Self {
        self.flusher.set_acked_record(record.clone());
        self.acked = Some(record);
        self
    }

    /// The last log index and the vote's term as stored now, read synchronously at start for
    /// `wal_tail::verify`.
    pub fn recovered_position(&self) -> Result<(Option<u64>, Option<u64>), StorageError> {
        let last_purged: Option<LogId> = self.get_meta(KEY_LAST_PURGED, "store")?;
        let last_entry = match self.db.iterator_cf(self.cf(CF_LOG)?, IteratorMode::End).next() {
            None => None,
            Some(item) => {
                let (_, value) = item.map_err(|e| io_err("read logs", e))?;
                Some(Self::decode_entry(&value)?.log_id.index)
            }
        };
        let vote: Option<Vote> = self.get_meta(KEY_VOTE, "vote")?;
        Ok((last_entry.or(last_purged.map(|l| l.index)), vote.map(|v| v.leader_id().term)))
    }

    /// The vote stored on disk, as it was when this store was opened (before openraft reads it).
    pub fn stored_vote(&self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE, "vote")
    }

    /// Observes the latency of every synced write and WAL sync in `disk`.
    pub fn with_metrics(mut self, disk: crate::metrics::disk::DiskMetrics) -> Self {
        self.flusher.set_metrics(disk.clone());
        self.disk = Some(disk);
        self
    }

    /// One synced write of the log, timed as a WAL fsync.
    fn write_synced(&self, batch: WriteBatch) -> Result<(), rocksdb::Error> {
        match &self.disk {
            Some(d) => d.time_wal_fsync(|| self.db.write_opt(batch, &synced())),
            None => self.db.write_opt(batch, &synced()),
        }
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily, StorageError> {
        self.db.cf_handle(name).ok_or_else(|| {
            io_err("read store", std::io::Error::other(format!("column family {name} missing")))
        })
    }

    fn get_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
        subject: &str,
    ) -> Result<Option<T>, StorageError> {
        let raw = self.db.get_cf(self.cf(CF_META)?, key).map_err(|e| io_err(subject, e))?;
        raw.map(|b| postcard::from_bytes(&b).map_err(|e| io_err(subject, e))).transpose()
    }

    fn put_meta<T: Serialize>(
        &self,
        key: &[u8],
        value: &T,
        subject: &str,
        sync: bool,
    ) -> Result<(), StorageError> {
        let bytes = postcard::to_allocvec(value).map_err(|e| io_err(subject, e))?;
        let opts = if sync { synced() } else { WriteOptions::default() };
        self.db.put_cf_opt(self.cf(CF_META)?, key, bytes, &opts).map_err(|e| io_err(subject, e))
    }

    /// Writes `entries` into a log that has never been used, as one synced batch. Only for
    /// building a data dir offline (`crate::restore`); a running node appends through openraft.
    /// Refuses a log that already holds entries, a vote or a purge marker, because overwriting
    /// any of them could contradict what this member already told its peers.
    pub(crate) fn seed(&self, entries: &[Entry]) -> Result<(), StorageError> {
        let used = self.db.iterator_cf(self.cf(CF_LOG)?, IteratorMode::Start).next().is_some()
            || self.db.iterator_cf(self.cf(CF_META)?, IteratorMode::Start).next().is_some();
        if used {
            return Err(io_err(
                "write logs",
                std::io::Error::other("refusing to seed a Raft log that is already in use"),
            ));
        }
        let cf = self.cf(CF_LOG)?;
        let mut batch = WriteBatch::default();
        for entry in entries {
            let bytes = postcard::to_allocvec(entry).map_err(|e| io_err("write logs", e))?;
            batch.put_cf(cf, index_key(entry.log_id.index), bytes);
        }
        // Durability: the seeded entries are this member's first log; synced like any append.
        self.db.write_opt(batch, &synced()).map_err(|e| io_err("write logs", e))
    }

    fn decode_entry(bytes: &[u8]) -> Result<Entry, StorageError> {
        postcard::from_bytes(bytes).map_err(|e| io_err("read logs", e))
    }
}

/// How many bytes of entries (as stored) one AppendEntries carries at most, unless its first
/// entry alone is larger. openraft 0.9 bounds an AppendEntries only by entry count
/// (`max_payload_entries`, 300) and gives it one heartbeat interval (100 ms by default) to be
/// sent, appended and fsynced by the follower; group-commit entries reach 4 MiB, so a follower
/// a few hundred such entries behind was sent the same hundreds of MiB again after every
/// timeout and never caught up (issue 19). 2 MiB crosses loopback or a LAN and is fsynced well
/// within a heartbeat; a larger single entry still goes alone, as it must.
pub const MAX_APPEND_BYTES: usize = 2 * 1024 * 1024;

impl LogStore {
    /// The entries of `range` in order, stopping after the entry that brings the stored bytes
    /// read to `max_bytes` (so at least one entry when there is any): from the tail in memory
    /// when it holds the start of the range, else from RocksDB.
    pub(super) fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x.checked_add(1),
            Bound::Excluded(x) => Some(*x),
            Bound::Unbounded => None,
        };
        match self.tail.read(start, end, max_bytes) {
            Some(entries) => Ok(entries),
            None => self.read_stored(start, &range, max_bytes),
        }
    }

    /// Whether the tail in memory holds entry `index`.
    #[cfg(test)]
    pub(super) fn tail_holds(&self, index: u64) -> bool {
        self.tail.read(index, index.checked_add(1), usize::MAX).is_some()
    }

    /// The tail's stored bytes and entry count.
    #[cfg(test)]
    pub(super) fn tail_held(&self) -> (usize, usize) {
        self.tail.held()
    }

    /// [`Self::read_entries`] from RocksDB.
    pub(super) fn read_stored<RB: RangeBounds<u64>>(
        &self,
        start: u64,
        range: &RB,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let cf = self.cf(CF_LOG)?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let from = index_key(start);
        for item in self.db.iterator_cf(cf, IteratorMode::From(&from, Direction::Forward)) {
            if bytes >= max_bytes {
                break;
            }
            let (key, value) = item.map_err(|e| io_err("read logs", e))?;
            let index = u64::from_be_bytes(key.as_ref().try_into().map_err(|_| {
                io_err("read logs", std::io::Error::other("log key is not 8 bytes"))
            })?);
            if !range.contains(&index) {
                break;
            }
            bytes = bytes.saturating_add(value.len());
            out.push(Self::decode_entry(&value)?);
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_entries(range, usize::MAX)
    }

    /// What openraft replicates from: a prefix of `[start, end)` of at most
    /// [`MAX_APPEND_BYTES`] (but never empty), so every AppendEntries fits its deadline.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_entries(start..end, MAX_APPEND_BYTES)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE, "vote")
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(KEY_LAST_PURGED, "store")?;
        let last = match self.db.iterator_cf(self.cf(CF_LOG)?, IteratorMode::End).next() {
            None => None,
            Some(item) => {
                let (_, value) = item.map_err(|e| io_err("read logs", e))?;
                Some(Self::decode_entry(&value)?.log_id)
            }
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last.or(last_purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        // Durability: a vote must survive a crash before it is acted on, or a restarted node
        // could vote twice in one term. Synced write.
        let timer = self.disk.as_ref().map(|d| d.wal_fsync.start_timer());
        self.put_meta(KEY_VOTE, vote, "vote", true)?;
        drop(timer);
        if let Some(acked) = &self.acked {
            acked.acked_vote(vote.leader_id().term);
        }
        Ok(())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not synced: the committed index is an optimisation that lets a restarted node re-apply
        // up to it at once. Losing it only means waiting for the leader to tell us again. It can
        // never survive a crash that loses entries it covers: it is written to the shared WAL
        // after them (they may still await their sync in `log_flusher`), and a recovered WAL is
        // a prefix of what was written.
        //
        // Written at most every SAVE_COMMITTED_EVERY: openraft calls this on its core task for
        // every commit, before it hands the entries to the state machine, and each call was a
        // RocksDB write and a WAL write(2) on every member, on a lone write's path. A stored id
        // older than the true one is as safe as a lost one: at start openraft takes the larger
        // of it and the state machine's last applied id, and the leader tells it the rest.
        if self.committed_saved_at.is_some_and(|t| t.elapsed() < SAVE_COMMITTED_EVERY) {
            return Ok(());
        }
        self.committed_saved_at = Some(Instant::now());
        self.put_meta(KEY_COMMITTED, &committed, "store", false)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED, "store")?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let cf = self.cf(CF_LOG)?;
        let mut batch = WriteBatch::default();
        let mut last_index = None;
        let mut written = Vec::new();
        // Whether every entry is one this member wrote as the leader (its id in the log id).
        let mut own = self.own_id.is_some();
        for entry in entries {
            let bytes = postcard::to_allocvec(&entry).map_err(|e| io_err("write logs", e))?;
            batch.put_cf(cf, index_key(entry.log_id.index), &bytes);
            last_index = Some(entry.log_id.index);
            own &= Some(entry.log_id.leader_id.node_id) == self.own_id;
            written.push((entry, bytes.len()));
        }
        // Not synced here: the entries are readable once written, which is all openraft 0.10
        // needs before it replicates them. It counts this member towards the commit quorum
        // only when the callback fires, and `log_flusher` fires it after a WAL sync that covers
        // this write (one sync for every append queued meanwhile). Until then a crash may lose
        // these entries, which nobody has been told are durable.
        if let Err(e) = self.db.write_opt(batch, &WriteOptions::default()) {
            callback.io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(io_err("write logs", e));
        }
        // Readable from memory as from RocksDB, and as unsynced: readers may replicate and
        // apply it only under openraft's rules, which wait for the flush where they must.
        self.tail.appended(written);
        if own {
            self.flusher.push_after_sends(last_index, callback)
        } else {
            self.flusher.push(last_index, callback)
        }
    }

    async fn truncate_after(&mut self, last_kept: Option<LogId>) -> Result<(), StorageError> {
        let first_gone = last_kept.as_ref().map_or(0, |l| l.index.saturating_add(1));
        tracing::debug!(log_index = first_gone, "truncating log");
        // Every pending acknowledgement first: one completing after the record is lowered
        // below would raise it above the truncated log (`wal_tail`, point 3).
        self.flusher.drain()?;
        if let Some(acked) = &self.acked {
            // Lowered durably *before* the truncation (see `storage::wal_tail`, point 3).
            acked
                .before_truncate(first_gone.saturating_sub(1))
                .map_err(|e| io_err("write logs", e))?;
        }
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(self.cf(CF_LOG)?, index_key(first_gone), index_key(u64::MAX));
        // The tail first: a reader between the two steps finds the entries in RocksDB, which
        // still holds them until the write below (the other order would let the tail answer
        // with entries already deleted).
        self.tail.truncated(first_gone);
        // Durability: synced so a crash cannot resurrect conflicting entries after the leader
        // has been told they are gone and newer entries replaced them.
        self.write_synced(batch).map_err(|e| io_err("write logs", e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Info: once per snapshot at most, and tests read it to know a follower can no longer
        // catch up from the log (`tests/tests/lock_snapshot.rs`).
        tracing::info!(log_index = log_id.index, "purging log");
        // Not needed for safety (a purge removes only entries a snapshot covers, and the
        // record never goes down here), but it keeps every synced log write after the
        // acknowledgements of the appends before it, which is simpler to reason about.
        self.flusher.drain()?;
        let meta_bytes = postcard::to_allocvec(&log_id).map_err(|e| io_err("write store", e))?;
        let mut batch = WriteBatch::default();
        // The purge marker and the deletion go in one batch, so the log never appears to start
        // after a gap.
        batch.put_cf(self.cf(CF_META)?, KEY_LAST_PURGED, meta_bytes);
        batch.delete_range_cf(
            self.cf(CF_LOG)?,
            index_key(0),
            index_key(log_id.index.saturating_add(1)),
        );
        // Durability: openraft purges only entries covered by a snapshot of the state machine.
        // State-machine writes are not synced individually; syncing here flushes the shared WAL
        // up to this point, so the applied state the snapshot covers is durable before the log
        // entries that could rebuild it disappear.
        self.tail.purged(log_id.index);
        self.write_synced(batch).map_err(|e| io_err("write logs", e))
    }
}

#[cfg(test)]
#[path = "log_store_tests.rs"]
mod tests;
