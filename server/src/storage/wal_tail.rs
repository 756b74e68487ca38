//! Starting after a power loss: tolerating a torn, unsynced WAL tail without ever losing what
//! this member acknowledged.
//!
//! # The problem
//!
//! The Raft log and the state machine share one RocksDB WAL. Log appends, votes, truncations and
//! purges are synced writes (`log_store`); state-machine batches and the committed index are
//! not. After a power loss (or kernel crash) the WAL ends with whatever the kernel had written
//! of the unsynced writes after the last fsync: possibly a record cut short. With strict WAL
//! recovery (`AbsoluteConsistency`, see `rocks::db_options`) such a member refuses to start,
//! although nothing it acknowledged was lost.
//!
//! # What openraft assumes
//!
//! A member must never lose a log entry it acknowledged (the leader counted it towards a commit
//! quorum; a follower log that goes backwards panics openraft 0.9's leader in debug builds and
//! leaves a wrong matching index in release builds), nor a vote it cast (it could vote twice in
//! one term). It may lose anything it never acknowledged: unsynced state-machine writes are
//! rebuilt by replaying the log, and a lost committed index is learnt again from the leader.
//!
//! # The argument
//!
//! 1. An acknowledgement follows the fsync of the write it covers (`log_flusher` fires an
//!    append's callback after a WAL sync that began after the append was written; `save_vote`
//!    returns after its synced write). A write is
//!    complete in the WAL before its fsync returns. So a record that is *cut short by the end
//!    of the file* was never synced, and was never acknowledged: dropping it (and nothing
//!    else) loses only unacknowledged data. RocksDB's `TolerateCorruptedTailRecords` recovery
//!    drops exactly such a record; a record that fails its checksum anywhere, an older WAL
//!    that is shorter than the MANIFEST recorded, and every table-file check still fail the
//!    open ([`RocksEngine::open_verified_tolerating_torn_tail`]).
//! 2. The argument in 1 trusts the file system's fsync contract. What it cannot see is synced
//!    data that went missing while looking like a clean end: a WAL cut exactly on a record
//!    boundary, or a tail cut inside a synced record by a file system that broke the contract.
//!    Against those, [`AckedRecord`] keeps, outside RocksDB, the highest log index and vote
//!    term this member acknowledged, and [`verify`] refuses to start if the recovered log ends
//!    before that index or the recovered vote is older than that term. The check runs at
//!    every start, not only after a tolerated tail.
//! 3. The record is written and fsynced by a background thread, at most once per
//!    [`RECORD_INTERVAL`] (coalesced: everything acknowledged meanwhile goes into the next
//!    write), so appends pay nothing for it; it therefore lags the acknowledgements by up to
//!    that interval plus one small write and fsync. Entries acknowledged within that window
//!    rest on point 1 alone. Writing after every acknowledgement (one extra fsync per log
//!    append on every member) doubled the fsyncs the disk served and cost single-client puts
//!    about a fifth of their latency on a shared disk (docs/benchmarks.md, "Write path"). A truncation first waits until every pending append's
//!    acknowledgement is done (`LogFlusher::drain`, so none can raise the record afterwards),
//!    then lowers the record *synchronously, before* the truncating write, so the record never
//!    claims more than the log may legitimately hold.
//! 4. The record has two slots, written alternately, each with a sequence number and a CRC: a
//!    torn write of one slot leaves the other. A missing file (a data dir from before this
//!    check, or built offline by `picket snapshot restore`) means "nothing recorded".

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use thiserror::Error;

use super::rocks::{OpenError, RocksEngine};

/// The record's file name, in the data directory next to `db/`.
pub const ACKED_FILE: &str = "raft-acked";
/// Offsets of the two slots: different 512-byte sectors, so one torn write spoils one slot.
const SLOTS: [u64; 2] = [0, 512];
const SLOT_LEN: usize = 32;
const MAGIC: &[u8; 4] = b"PKA1";

/// Least time between two background writes of the record (module docs, point 3). Safe at any
/// value: the record only narrows what a restart accepts, and a lagging record accepts more
/// (it never refuses a good store). 50 ms keeps the record within a few hundred writes of the
/// log under load while adding at most 20 fsyncs a second to the disk.
pub const RECORD_INTERVAL: Duration = Duration::from_millis(50);

/// What a member acknowledged as durable: the last log index and the vote's term.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acked {
    pub log_index: u64,
    pub vote_term: u64,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WalTailError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("acknowledged-position record {}: {source}", path.display())]
    Record { path: PathBuf, source: std::io::Error },
    /// Something this member acknowledged as durable is missing from its store.
    #[error(
        "the store lost writes this member acknowledged as durable: {what} (recorded in {}). \
         Its peers may have counted them; serving from this store could break Raft's safety",
        path.display()
    )]
    LostAcknowledged { path: PathBuf, what: String },
}

struct Inner {
    path: PathBuf,
    /// The newest values to record; the writer thread catches the file up with them.
    log_index: AtomicU64,
    vote_term: AtomicU64,
    /// Guards the file and what was last written to it.
    file: Mutex<RecordFile>,
    /// Wakes the writer thread (paired with `poke`).
    poke: Mutex<Poke>,
    wake: Condvar,
}

/// What the writer thread has been asked to do, and whether it waits to be asked.
#[derive(Default)]
struct Poke {
    /// There are newer values to record.
    pending: bool,
    /// The writer waits on `wake`: a poke must wake it. Otherwise it is writing or pacing
    /// itself and looks at `pending` before it waits again, so the wake (a system call on every
    /// log sync) is skipped.
    waiting: bool,
}

/// The acknowledged-position record (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct AckedRecord {
    inner: Arc<Inner>,
}

fn encode(seq: u64, a: Acked) -> [u8; SLOT_LEN] {
    let mut b = [0u8; SLOT_LEN];
    b[..4].copy_from_slice(MAGIC);
    b[4..12].copy_from_slice(&seq.to_le_bytes());
    b[12..20].copy_from_slice(&a.log_index.to_le_bytes());
    b[20..28].copy_from_slice(&a.vote_term.to_le_bytes());
    let crc = crc32fast::hash(&b[..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<(u64, Acked)> {
    if b.len() < SLOT_LEN || &b[..4] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[28..32].try_into().ok()?);
    if crc != crc32fast::hash(&b[..28]) {
        return None;
    }
    let seq = u64::from_le_bytes(b[4..12].try_into().ok()?);
    let log_index = u64::from_le_bytes(b[12..20].try_into().ok()?);
    let vote_term = u64::from_le_bytes(b[20..28].try_into().ok()?);
    Some((seq, Acked { log_index, vote_term }))
}

/// Reads the record at `path`: the valid slot with the highest sequence number, or the default
/// (nothing recorded) if the file is missing or neither slot is valid.
pub fn read_record(path: &Path) -> std::io::Result<(u64, Acked)> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, Acked::default())),
        Err(e) => return Err(e),
    }
    let best = SLOTS
        .iter()
        .filter_map(|&off| bytes.get(off as usize..).and_then(decode))
        .max_by_key(|(seq, _)| *seq);
    Ok(best.unwrap_or((0, Acked::default())))
}

impl AckedRecord {
    /// Opens (creating if needed) the record at `path` and starts its writer thread, which
    /// stops once every clone is dropped.
    pub fn open(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let (seq, acked) = read_record(&path)?;
        let existed = path.exists();
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        if !existed {
            // Durability: a new file's name is on disk only once its directory is synced; a
            // power loss before that would lose the whole record, leaving `verify` nothing to
            // check (issue 19, Low). Once per data directory, so the cost does not matter.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
        }
        let inner = Arc::new(Inner {
            path,
            log_index: AtomicU64::new(acked.log_index),
            vote_term: AtomicU64::new(acked.vote_term),
            file: Mutex::new(RecordFile { file, seq, written: acked }),
            poke: Mutex::new(Poke::default()),
            wake: Condvar::new(),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new().name("picket-acked".into()).spawn(move || writer(weak))?;
        Ok(Self { inner })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What the record holds now (including values not yet written).
    pub fn current(&self) -> Acked {
        Acked {
            log_index: self.inner.log_index.load(Ordering::SeqCst),
            vote_term: self.inner.vote_term.load(Ordering::SeqCst),
        }
    }

    /// Called after entries up to `index` were synced and acknowledged.
    pub fn acked_log(&self, index: u64) {
        self.inner.log_index.fetch_max(index, Ordering::SeqCst);
        self.poke();
    }

    /// Called after a vote of `term` was synced.
    pub fn acked_vote(&self, term: u64) {
        self.inner.vote_term.fetch_max(term, Ordering::SeqCst);
        self.poke();
    }

    /// Called before a truncation that leaves the log ending at `last_kept`: lowers the
    /// record to it and makes that durable before returning (see the module docs, point 3).
    pub fn before_truncate(&self, last_kept: u64) -> std::io::Result<()> {
        let mut file = self.lock_file();
        self.inner.log_index.fetch_min(last_kept, Ordering::SeqCst);
        write_slot(&mut file, self.current())
    }

    /// Makes the current values durable now (tests and shutdown).
    pub fn flush(&self) -> std::io::Result<()> {
        let mut file = self.lock_file();
        write_slot(&mut file, self.current())
    }

    fn lock_file(&self) -> std::sync::MutexGuard<'_, RecordFile> {
        // A poisoned lock means a writer panicked mid-write; the slot scheme tolerates a torn
        // slot, so carrying on with the file is safe.
        self.inner.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn poke(&self) {
        let mut poke = self.inner.poke.lock().unwrap_or_else(|p| p.into_inner());
        poke.pending = true;
        let wake = poke.waiting;
        drop(poke);
        if wake {
            self.inner.wake.notify_one();
        }
    }
}

/// The open record file and what its newest slot holds.
struct RecordFile {
    file: File,
    /// Sequence number of the newest slot written.
    seq: u64,
    /// The values in the newest slot, so the writer thread skips a write that `flush` or
    /// `before_truncate` already made.
    written: Acked,
}

/// Writes the next slot with `acked` and fsyncs it.
fn write_slot(f: &mut RecordFile, acked: Acked) -> std::io::Result<()> {
    let seq = f.seq + 1;
    let off = SLOTS[(seq % 2) as usize];
    f.file.seek(SeekFrom::Start(off))?;
    f.file.write_all(&encode(seq, acked))?;
    // Durability: the record is only useful once on disk (see the module docs, point 3).
    // `sync_data` suffices after the first write: the file's size no longer changes.
    f.file.sync_data()?;
    f.seq = seq;
    f.written = acked;
    Ok(())
}

/// The writer thread: catches the file up with the newest values whenever poked, at most once
/// per [`RECORD_INTERVAL`].
fn writer(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        {
            let mut poke = inner.poke.lock().unwrap_or_else(|p| p.into_inner());
            poke.waiting = true;
            // The timeout only lets the thread notice that every handle was dropped.
            let (mut poke, _) = inner
                .wake
                .wait_timeout_while(poke, Duration::from_secs(1), |p| !p.pending)
                .unwrap_or_else(|p| p.into_inner());
            poke.waiting = false;
            poke.pending = false;
        }
        {
            let mut file = inner.file.lock().unwrap_or_else(|p| p.into_inner());
            let now = Acked {
                log_index: inner.log_index.load(Ordering::SeqCst),
                vote_term: inner.vote_term.load(Ordering::SeqCst),
            };
            if now != file.written {
                if let Err(e) = write_slot(&mut file, now) {
                    // Retried on the next poke; until then the record lags further, which only
                    // narrows what `verify` can check, never makes it refuse a good store.
                    tracing::warn!(error = %e, "writing the acknowledged-position record");
                }
            }
        }
        // Not holding a strong reference while pacing, so dropping every handle ends the thread
        // within one interval.
        drop(inner);
        std::thread::sleep(RECORD_INTERVAL);
    }
}

/// Opens a member's store in `data_dir` (see the module docs): strict recovery, or a torn WAL
/// tail tolerated; then the caller runs [`verify`] once the log can be read.
pub fn open_store(data_dir: &Path) -> Result<(RocksEngine, AckedRecord), WalTailError> {
    let (engine, tolerated) = RocksEngine::open_verified_tolerating_torn_tail(data_dir.join("db"))?;
    if tolerated {
        tracing::warn!(
            data_dir = %data_dir.display(),
            "recovered after dropping a torn (unsynced) WAL tail; checking that nothing \
             acknowledged was lost"
        );
    }
    let path = data_dir.join(ACKED_FILE);
    let record =
        AckedRecord::open(&path).map_err(|source| WalTailError::Record { path, source })?;
    Ok((engine, record))
}

/// Refuses a store whose recovered log ends before the recorded acknowledged index, or whose
/// vote is older than the recorded vote term.
pub fn verify(
    record: &AckedRecord,
    last_log_index: Option<u64>,
    vote_term: Option<u64>,
) -> Result<(), WalTailError> {
    let acked = record.current();
    let lost =
        |what: String| WalTailError::LostAcknowledged { path: record.path().to_path_buf(), what };
    let last = last_log_index.unwrap_or(0);
    if last < acked.log_index {
        return Err(lost(format!(
            "the Raft log ends at index {last} but entries up to {} were acknowledged",
            acked.log_index
        )));
    }
    let term = vote_term.unwrap_or(0);
    if term < acked.vote_term {
        return Err(lost(format!(
            "the stored vote is for term {term} but a vote in term {} was acknowledged",
            acked.vote_term
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "wal_tail_tests.rs"]
mod tests;
