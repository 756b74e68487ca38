//! The production storage engine: one RocksDB database with a column family per [`Cf`].
//!
//! The Raft log store and the state machine share the database (and so its WAL): the log store
//! uses [`RocksEngine::db`] and [`RocksEngine::cf_handle`] directly, the MVCC store goes through
//! the [`Engine`] trait.
//!
//! Options are RocksDB's defaults except that the database and its column families are created
//! when missing, and the crash-recovery and corruption-detection choices are spelled out (see
//! [`db_options`]). Tuning (block cache, compression per family, bloom filters for `kv` point
//! reads) is deliberately left for when a benchmark asks for it; every option set here is one
//! more thing to keep compatible across restarts.
//!
//! # Crash safety and corruption
//!
//! A member starts through [`RocksEngine::open_verified`], which opens the database and then
//! reads every block of every column family with checksums verified. Any corruption RocksDB can
//! see (a bad or incomplete WAL record, a missing or damaged table file, a flipped bit in any
//! data block) makes the start fail with [`OpenError::Corrupt`], and the member refuses to serve:
//! its peers still hold the data, and a member that served from a damaged store could answer
//! reads with data that differs from theirs. The end-to-end checks are in
//! `tests/tests/crash_safety.rs`.
//!
//! One exception, for power losses: [`RocksEngine::open_verified_tolerating_torn_tail`] also
//! accepts a newest WAL whose last record is cut short, which only an unsynced write can leave;
//! `storage::wal_tail` explains why that is safe and checks that nothing acknowledged is
//! missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBRawIteratorWithThreadMode,
    DBRecoveryMode, ErrorKind, IteratorMode, Options, ReadOptions, SnapshotWithThreadMode,
    WriteOptions, DB,
};
use thiserror::Error;

use super::engine::{Cf, Cursor, Engine, EngineError, KvIter, ReadView, WriteBatch, WriteOp};

/// A RocksDB-backed [`Engine`]. Clones share the same open database.
#[derive(Clone)]
pub struct RocksEngine {
    db: Arc<DB>,
    /// Keeps views from being taken while a snapshot install replaces the state-machine
    /// column families one after another ([`RocksEngine::whole`]). Shared by clones.
    install: Arc<parking_lot::RwLock<()>>,
}

impl std::fmt::Debug for RocksEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksEngine").field("path", &self.db.path()).finish()
    }
}

impl RocksEngine {
    /// Opens (creating if needed) the database at `path` with every column family of [`Cf`].
    /// Offline tools use this; a member that will serve uses [`RocksEngine::open_verified`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, EngineError> {
        Self::open_raw(path.as_ref()).map_err(|e| EngineError::backend("open the database", e))
    }

    fn open_raw(path: &Path) -> Result<Self, rocksdb::Error> {
        Self::open_with(path, db_options())
    }

    fn open_with(path: &Path, opts: Options) -> Result<Self, rocksdb::Error> {
        // Memory: one block cache for every column family. Without it each family's table
        // factory makes its own 32 MiB cache, and reads of several families (the log, `kv`,
        // `changelog`) fill theirs (issue 20: RSS).
        let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
        let cfs = Cf::ALL.iter().map(|cf| {
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&cache);
            let mut o = Options::default();
            o.set_block_based_table_factory(&table);
            ColumnFamilyDescriptor::new(cf.name(), o)
        });
        let db = DB::open_cf_descriptors(&opts, path, cfs)?;
        tracing::info!(path = %path.display(), "opened rocksdb");
        Ok(Self { db: Arc::new(db), install: Arc::default() })
    }

    /// Opens the database at `path` like [`RocksEngine::open`], then reads all of it with block
    /// checksums verified, so that a member never starts serving from a store with corruption
    /// RocksDB can detect. Corruption, found while opening or while reading, is reported as
    /// [`OpenError::Corrupt`]; the caller must not serve from this directory.
    ///
    /// Opening alone is not enough: RocksDB checks a table file's footer, index and properties
    /// when it opens the file, but a data block only when something reads it. A flipped bit in a
    /// data block would otherwise surface as failed reads (or a failed compaction) at some later
    /// time, after the member had already told clients and peers it was healthy. The scan costs
    /// one sequential read of the store per start, proportional to its size on disk, which is
    /// small next to what replaying or reinstalling a member costs; it bypasses the block cache
    /// so it does not evict anything useful.
    pub fn open_verified(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let engine = Self::open_raw(path).map_err(|e| corrupt(path, e))?;
        engine.verify_all(path)?;
        Ok(engine)
    }

    /// Like [`RocksEngine::open_verified`], except that if the strict open fails with corruption
    /// it is retried once with RocksDB's `TolerateCorruptedTailRecords` WAL recovery, which
    /// accepts exactly one more case: a WAL whose last record is cut short by the end of the
    /// file (the torn, unsynced tail a power loss leaves). A record that fails its checksum, a
    /// shortened older WAL (tracked in the MANIFEST) and damaged table files still fail.
    /// Returns the engine and whether the tolerant retry was needed. The caller must check that
    /// nothing it acknowledged as durable was in the dropped tail (`storage::wal_tail`).
    pub fn open_verified_tolerating_torn_tail(
        path: impl AsRef<Path>,
    ) -> Result<(Self, bool), OpenError> {
        let path = path.as_ref();
        let (engine, tolerated) = match Self::open_raw(path) {
            Ok(engine) => (engine, false),
            Err(e) if e.kind() == ErrorKind::Corruption => {
                tracing::warn!(
                    path = %path.display(),
                    error = %e,
                    "strict WAL recovery failed; retrying with a torn WAL tail tolerated"
                );
                let mut opts = db_options();
                // Safe only together with the acknowledged-position check the caller makes:
                // see `storage::wal_tail` for why a cut-short last record was never acknowledged.
                opts.set_wal_recovery_mode(DBRecoveryMode::TolerateCorruptedTailRecords);
                (Self::open_with(path, opts).map_err(|e| corrupt(path, e))?, true)
            }
            Err(e) => return Err(corrupt(path, e)),
        };
        engine.verify_all(path)?;
        Ok((engine, tolerated))
    }

    /// Reads every entry of every column family with checksums verified.
    fn verify_all(&self, path: &Path) -> Result<(), OpenError> {
        let engine = self;
        let mut entries = 0u64;
        for cf in Cf::ALL {
            let mut ro = ReadOptions::default();
            // Both are RocksDB's defaults for `verify_checksums`; stated because the scan exists
            // only for the checksum verification.
            ro.set_verify_checksums(true);
            ro.fill_cache(false);
            for item in engine.db.iterator_cf_opt(engine.cf_handle(cf), ro, IteratorMode::Start) {
                item.map_err(|e| corrupt(path, e))?;
                entries += 1;
            }
        }
        tracing::info!(path = %path.display(), entries, "verified every block checksum of the store");
        Ok(())
    }

    /// The underlying database, for the Raft log store.
    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    /// Runs `take` (which takes a RocksDB snapshot) where no snapshot install is half done, so
    /// the view shows the store wholly before or wholly after any install. An install replaces
    /// the column families one by one (`storage::snapshot_install`: RocksDB ingests table files
    /// one family at a time); every view of the store is taken through this. Waits at most for
    /// one install's replace step, which moves files and flushes memtables but copies no data.
    pub fn whole<T>(&self, take: impl FnOnce() -> T) -> T {
        let _no_install = self.install.read();
        take()
    }

    /// Holds off every [`RocksEngine::whole`] while the returned guard lives: for the step of
    /// a snapshot install that replaces the state-machine column families.
    pub(crate) fn replacing(&self) -> parking_lot::RwLockWriteGuard<'_, ()> {
        self.install.write()
    }

    /// The handle of a column family.
    pub fn cf_handle(&self, cf: Cf) -> &ColumnFamily {
        // Invariant: `open` creates or opens every family of `Cf::ALL`, and families are never
        // dropped while the database is open, so the lookup cannot fail.
        self.db.cf_handle(cf.name()).expect("every Cf column family is opened by RocksEngine::open")
    }

    fn to_rocks_batch(&self, batch: WriteBatch) -> rocksdb::WriteBatch {
        let mut wb = rocksdb::WriteBatch::default();
        for op in batch.ops() {
            match op {
                WriteOp::Put { cf, key, value } => wb.put_cf(self.cf_handle(*cf), key, value),
                WriteOp::Delete { cf, key } => wb.delete_cf(self.cf_handle(*cf), key),
                WriteOp::DeleteRange { cf, start, end } => {
                    wb.delete_range_cf(self.cf_handle(*cf), start, end)
                }
            }
        }
        wb
    }
}

fn corrupt(path: &Path, e: rocksdb::Error) -> OpenError {
    if e.kind() == ErrorKind::Corruption {
        OpenError::Corrupt { path: path.to_path_buf(), detail: e.into_string() }
    } else {
        OpenError::Engine(EngineError::backend("open the database", e))
    }
}

/// Why [`RocksEngine::open_verified`] failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OpenError {
    /// RocksDB found corruption in the store. Not retryable: the directory must be rebuilt from
    /// the member's peers (or a backup).
    #[error("data in {} is corrupt: {detail}", path.display())]
    Corrupt { path: PathBuf, detail: String },
    /// Any other failure to open, e.g. permissions, a full disk, or a second process holding
    /// the lock.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Database options. Every choice here that affects what survives a crash says why it is safe.
/// The memtable budget of the whole database (see [`db_options`]).
const MEMTABLE_BUDGET: usize = 64 << 20;
/// The block cache all column families share (see [`RocksEngine::open`]).
const BLOCK_CACHE_BYTES: usize = 32 << 20;

fn db_options() -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    // Corruption detection: with paranoid checks (RocksDB's default, stated so it is not turned
    // off by accident) RocksDB verifies what it can while opening and, once running, stops
    // accepting writes after any background corruption or I/O error instead of continuing on a
    // store it knows to be damaged. A member whose writes fail stops applying, which is safe:
    // it falls behind but never acknowledges or serves something its peers do not have.
    opts.set_paranoid_checks(true);
    // WAL recovery: replay every WAL completely, and fail the open with `Corruption` if any
    // record is incomplete or fails its checksum, including at the very end of the newest WAL
    // (RocksDB's default, `PointInTime`, would instead drop everything from the first bad record
    // on and open). Why this is the safe choice for a Raft member:
    // - Every write Picket acknowledges, to a peer or a client (a log append, a vote, a
    //   truncation, a purge), is an fsynced write into this WAL (see `log_store`). A WAL that
    //   ends early or has a bad record may have lost such writes, and RocksDB cannot tell that
    //   apart from an unsynced tail. A member that came back with fewer log entries than it
    //   acknowledged breaks Raft's assumptions: the leader may already have counted those
    //   entries towards a commit quorum, and openraft 0.9 treats a follower log that goes
    //   backwards as a bug (debug builds panic the leader's Raft core; release builds keep a
    //   wrong matching index). With `PointInTime`, `crash_safety.rs`'s truncated-WAL test saw
    //   the damaged member roll back its log and rejoin, then the leader's Raft core panic and
    //   stop serving. Refusing to start is what the error message then tells the operator to
    //   repair.
    // - A process crash (SIGKILL, panic, OOM) does not produce such a WAL: RocksDB hands each
    //   write group to the kernel in `write` calls on a buffer (one call for requests of up to
    //   its 1 MiB buffer, so every Picket write short of the largest requests), and the page
    //   cache outlives the process, so the WAL is replayed in full and the member restarts
    //   normally (the SIGKILL loop test kills members mid-write dozens of times).
    // - After a power loss or kernel crash, a WAL whose unsynced tail was partly written
    //   fails this strict open, although what was lost there was never acknowledged. A member
    //   then retries with `TolerateCorruptedTailRecords`, which accepts only a last record cut
    //   short by the end of the file, and checks its acknowledged-position record
    //   (`open_verified_tolerating_torn_tail`, `storage::wal_tail`).
    opts.set_wal_recovery_mode(DBRecoveryMode::AbsoluteConsistency);
    // Closed WALs are fully synced before RocksDB records them in the MANIFEST with their size.
    // Tracking them makes a missing or shortened older WAL (which a crash cannot produce) fail
    // the open with `Corruption`, instead of silently losing synced writes. No cost per write:
    // only closed WALs are tracked, not each sync of the live one.
    opts.set_track_and_verify_wals_in_manifest(true);
    // Memory: one budget for the memtables of all column families together. RocksDB's default
    // lets each family fill two 64 MiB memtables before flushing, and under writes the log,
    // `kv` and `changelog` families all grow theirs, so a member's RSS climbed by hundreds of
    // MiB over a few benchmark rounds (issue 20: three members' RSS after three rounds of 64-
    // client puts above etcd's). With the budget, the largest memtable is flushed when the
    // total reaches it. Durability is the WAL's, not the memtables', so flushing sooner changes
    // only when data moves to table files.
    opts.set_db_write_buffer_size(MEMTABLE_BUDGET);
    // Not set: `recycle_log_file_num` (overwriting old WAL files in place, so an fdatasync skips
    // the inode write: 0.24 -> 0.14 ms measured on this disk, docs/benchmarks.md). RocksDB
    // silently turns it off under both recovery modes used above (`SanitizeOptions` in
    // db_impl_open.cc: a recycled tail is indistinguishable from a corrupt record), and those
    // modes are what keeps acknowledged log writes safe, so the lever is not available here.
    opts
}

fn read_opts(end: Option<&[u8]>) -> ReadOptions {
    let mut ro = ReadOptions::default();
    if let Some(end) = end {
        ro.set_iterate_upper_bound(end.to_vec());
    }
    ro
}

/// A scan over one RocksDB iterator, which [`Cursor::seek`] moves in place.
struct RawCursor<'a> {
    it: DBRawIteratorWithThreadMode<'a, DB>,
    start: Vec<u8>,
    /// The iterator stands on a pair not yielded yet (just after a seek).
    fresh: bool,
    /// An error was yielded: the stream is over.
    failed: bool,
}

impl<'a> RawCursor<'a> {
    fn new(mut it: DBRawIteratorWithThreadMode<'a, DB>, start: &[u8]) -> Box<Self> {
        it.seek(start);
        Box::new(Self { it, start: start.to_vec(), fresh: true, failed: false })
    }
}

impl Iterator for RawCursor<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>), EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if !std::mem::take(&mut self.fresh) {
            self.it.next();
        }
        match self.it.item() {
            Some((k, v)) => Some(Ok((k.to_vec(), v.to_vec()))),
            // Not valid: the end of the range, or an error the iterator holds.
            None => match self.it.status() {
                Ok(()) => None,
                Err(e) => {
                    self.failed = true;
                    Some(Err(EngineError::backend("scan", e)))
                }
            },
        }
    }
}

impl Cursor for RawCursor<'_> {
    fn seek(&mut self, key: &[u8]) {
        if self.failed {
            return;
        }
        self.it.seek(key.max(self.start.as_slice()));
        self.fresh = true;
    }
}

/// A consistent view of a [`RocksEngine`], backed by a RocksDB snapshot.
pub struct RocksView<'a> {
    engine: &'a RocksEngine,
    snap: SnapshotWithThreadMode<'a, DB>,
}

impl ReadView for RocksView<'_> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.snap
            .get_cf(self.engine.cf_handle(cf), key)
            .map_err(|e| EngineError::backend("read", e))
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        RawCursor::new(
            self.snap.raw_iterator_cf_opt(self.engine.cf_handle(cf), read_opts(end)),
            start,
        )
    }
}

impl ReadView for RocksEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.db.get_cf(self.cf_handle(cf), key).map_err(|e| EngineError::backend("read", e))
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        RawCursor::new(self.db.raw_iterator_cf_opt(self.cf_handle(cf), read_opts(end)), start)
    }
}

impl Engine for RocksEngine {
    type View<'a> = RocksView<'a>;

    fn view(&self) -> RocksView<'_> {
        RocksView { engine: self, snap: self.whole(|| self.db.snapshot()) }
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), EngineError> {
        let wb = self.to_rocks_batch(batch);
        let mut wo = WriteOptions::default();
        // Durability: with `sync` the WAL is fsynced before this returns, so the batch survives
        // a power loss. Without it the batch is in the OS page cache and survives a process
        // crash but not a machine crash; callers that pass `false` must be able to rebuild the
        // batch (the state machine re-applies it from the Raft log, which is synced).
        wo.set_sync(sync);
        self.db.write_opt(wb, &wo).map_err(|e| EngineError::backend("write", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocks_engine_round_trip_and_snapshot_views() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        let mut b = WriteBatch::new();
        for cf in Cf::ALL {
            b.put(cf, b"k1".to_vec(), cf.name().as_bytes().to_vec());
        }
        b.put(Cf::Kv, b"k2".to_vec(), b"v2".to_vec());
        b.put(Cf::Kv, b"k3".to_vec(), b"v3".to_vec());
        e.write(b, true).unwrap();

        let view = e.view();
        let mut b = WriteBatch::new();
        b.delete(Cf::Kv, b"k1".to_vec());
        b.delete_range(Cf::Kv, b"k2".to_vec(), b"k3".to_vec());
        e.write(b, false).unwrap();

        let scan = |v: &dyn ReadView, end: Option<&[u8]>| {
            v.scan(Cf::Kv, b"k", end).map(|r| r.unwrap().0).collect::<Vec<_>>()
        };
        assert_eq!(scan(&view, None), vec![b"k1".to_vec(), b"k2".to_vec(), b"k3".to_vec()]);
        assert_eq!(scan(&view, Some(b"k3")), vec![b"k1".to_vec(), b"k2".to_vec()]);
        assert_eq!(scan(&e, None), vec![b"k3".to_vec()]);
        assert_eq!(view.get(Cf::Lease, b"k1").unwrap(), Some(b"lease".to_vec()));
        assert_eq!(e.get(Cf::Kv, b"k1").unwrap(), None);
        drop(view);

        // Reopening finds every family and the data.
        drop(e);
        let e = RocksEngine::open(dir.path()).unwrap();
        assert_eq!(e.get(Cf::RaftLog, b"k1").unwrap(), Some(b"raft_log".to_vec()));
        assert!(e.db().cf_handle("lease_keys").is_some());
    }

    /// Files in `dir` whose names end with `suffix`, sorted by name (RocksDB numbers them
    /// increasingly, so the last is the newest).
    fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(suffix))
            .collect();
        out.sort();
        out
    }

    fn write_keys(e: &RocksEngine, n: u32) {
        for i in 0..n {
            let mut b = WriteBatch::new();
            b.put(Cf::Kv, format!("key{i:05}").into_bytes(), vec![b'v'; 100]);
            e.write(b, true).unwrap();
        }
    }

    fn assert_corrupt(res: Result<RocksEngine, OpenError>, what: &str) {
        match res {
            Err(OpenError::Corrupt { detail, .. }) => {
                assert!(detail.starts_with("Corruption"), "{what}: {detail}")
            }
            Err(e) => panic!("{what}: expected OpenError::Corrupt, got {e}"),
            Ok(_) => panic!("{what}: a damaged store opened"),
        }
    }

    #[test]
    fn open_verified_refuses_a_truncated_wal_tail() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open_verified(dir.path()).unwrap();
        write_keys(&e, 200);
        drop(e);
        // An undamaged store reopens with everything.
        let e = RocksEngine::open_verified(dir.path()).unwrap();
        assert!(e.get(Cf::Kv, b"key00199").unwrap().is_some());
        write_keys(&e, 200);
        drop(e);
        let wal = files(dir.path(), ".log").pop().expect("a WAL file");
        let len = std::fs::metadata(&wal).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(len - len / 3).unwrap();
        assert_corrupt(RocksEngine::open_verified(dir.path()), "truncated WAL");
    }

    #[test]
    fn open_verified_refuses_a_flipped_bit_in_a_data_block_that_open_alone_misses() {
        let dir = tempfile::tempdir().unwrap();
        let e = RocksEngine::open(dir.path()).unwrap();
        write_keys(&e, 200);
        e.db().flush_cf(e.cf_handle(Cf::Kv)).unwrap();
        drop(e);
        let sst = files(dir.path(), ".sst").pop().expect("a table file");
        let mut bytes = std::fs::read(&sst).unwrap();
        // Data blocks come first in a block-based table; the index and footer are at the end.
        let at = bytes.len() / 4;
        bytes[at] ^= 0x10;
        std::fs::write(&sst, &bytes).unwrap();
        // Opening checks the footer and index, not data blocks: this is why the scan exists.
        drop(RocksEngine::open(dir.path()).expect("plain open does not read data blocks"));
        assert_corrupt(RocksEngine::open_verified(dir.path()), "flipped bit in a data block");
    }
}
