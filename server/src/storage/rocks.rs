//! The production storage engine: one RocksDB database with a column family per [`Cf`].
//!
//! The Raft log store and the state machine share the database (and so its WAL): the log store
//! uses [`RocksEngine::db`] and [`RocksEngine::cf_handle`] directly, the MVCC store goes through
//! the [`Engine`] trait.
//!
//! Options are RocksDB's defaults except that the database and its column families are created
//! when missing. Tuning (block cache, compression per family, bloom filters for `kv` point
//! reads) is deliberately left for when a benchmark asks for it; every option set here is one
//! more thing to keep compatible across restarts.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions,
    SnapshotWithThreadMode, WriteOptions, DB,
};

use super::engine::{Cf, Engine, EngineError, KvIter, ReadView, WriteBatch, WriteOp};

/// A RocksDB-backed [`Engine`]. Clones share the same open database.
#[derive(Clone)]
pub struct RocksEngine {
    db: Arc<DB>,
}

impl std::fmt::Debug for RocksEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksEngine").field("path", &self.db.path()).finish()
    }
}

impl RocksEngine {
    /// Opens (creating if needed) the database at `path` with every column family of [`Cf`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, EngineError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let cfs =
            Cf::ALL.iter().map(|cf| ColumnFamilyDescriptor::new(cf.name(), Options::default()));
        let db = DB::open_cf_descriptors(&opts, path.as_ref(), cfs)
            .map_err(|e| EngineError::backend("open the database", e))?;
        tracing::info!(path = %path.as_ref().display(), "opened rocksdb");
        Ok(Self { db: Arc::new(db) })
    }

    /// The underlying database, for the Raft log store.
    pub fn db(&self) -> &Arc<DB> {
        &self.db
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

fn read_opts(end: Option<&[u8]>) -> ReadOptions {
    let mut ro = ReadOptions::default();
    if let Some(end) = end {
        ro.set_iterate_upper_bound(end.to_vec());
    }
    ro
}

fn box_iter<'a, I>(it: I) -> KvIter<'a>
where
    I: Iterator<Item = Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>> + 'a,
{
    Box::new(it.map(|r| {
        r.map(|(k, v)| (k.into_vec(), v.into_vec())).map_err(|e| EngineError::backend("scan", e))
    }))
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
        let it = self.snap.iterator_cf_opt(
            self.engine.cf_handle(cf),
            read_opts(end),
            IteratorMode::From(start, Direction::Forward),
        );
        box_iter(it)
    }
}

impl ReadView for RocksEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.db.get_cf(self.cf_handle(cf), key).map_err(|e| EngineError::backend("read", e))
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        let it = self.db.iterator_cf_opt(
            self.cf_handle(cf),
            read_opts(end),
            IteratorMode::From(start, Direction::Forward),
        );
        box_iter(it)
    }
}

impl Engine for RocksEngine {
    type View<'a> = RocksView<'a>;

    fn view(&self) -> RocksView<'_> {
        RocksView { engine: self, snap: self.db.snapshot() }
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
}
