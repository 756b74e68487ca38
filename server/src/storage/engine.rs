//! The storage engine abstraction: column families, write batches and consistent read views.
//!
//! Everything Picket persists goes through [`Engine`]: the MVCC store ([`crate::mvcc`]) writes
//! one [`WriteBatch`] per Raft `apply()` call and reads through [`ReadView`]s. Two engines
//! implement it:
//! - [`crate::storage::rocks::RocksEngine`], the production engine;
//! - [`MemEngine`], a `BTreeMap` per column family, so MVCC logic and its model tests run without
//!   RocksDB (TiKV's `BTreeEngine`, Xline's in-memory engine).
//!
//! There is exactly one writer (the state machine), and writes are atomic batches. Readers take
//! a [`Engine::view`], a point-in-time snapshot that later writes never change, so a read that
//! needs several lookups (the revision counters, then the keys) cannot observe half a batch.
//! The writer itself reads the latest state through the engine's own [`ReadView`] impl.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Column families. Each holds one kind of record, so each can be scanned, compacted and
/// (in RocksDB) tuned on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cf {
    /// Raft log entries, by log index (owned by `storage::log_store`).
    RaftLog,
    /// Raft vote, committed and purged log ids (owned by `storage::log_store`).
    RaftMeta,
    /// Every version of every user key (see [`crate::mvcc`] for the key layout).
    Kv,
    /// All events of each revision, by revision; watch replay and incremental compaction.
    Changelog,
    /// State-machine metadata: MVCC revision counters, last applied log id, membership.
    Meta,
    /// Granted leases, by lease id.
    Lease,
    /// `(lease id, user key)` for every live key attached to a lease.
    LeaseKeys,
}

impl Cf {
    /// Every column family, in a fixed order (the order of [`Cf::index`]).
    pub const ALL: [Cf; 7] =
        [Cf::RaftLog, Cf::RaftMeta, Cf::Kv, Cf::Changelog, Cf::Meta, Cf::Lease, Cf::LeaseKeys];

    /// The column family's name on disk. Never change these: existing databases use them.
    pub const fn name(self) -> &'static str {
        match self {
            Cf::RaftLog => "raft_log",
            Cf::RaftMeta => "raft_meta",
            Cf::Kv => "kv",
            Cf::Changelog => "changelog",
            Cf::Meta => "meta",
            Cf::Lease => "lease",
            Cf::LeaseKeys => "lease_keys",
        }
    }

    /// Position in [`Cf::ALL`]; handy for per-family arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// Errors of the storage engine. They are never deterministic outcomes of a command: callers
/// treat them as fatal for the node (an I/O failure or a damaged database).
#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum EngineError {
    /// The backend failed an operation; `message` is its own description.
    #[error("storage engine failed to {op}: {message}")]
    Backend { op: String, message: String },
}

impl EngineError {
    /// Wraps a backend error raised while performing `op` (e.g. "write", "read").
    pub fn backend(op: &str, err: impl std::fmt::Display) -> Self {
        EngineError::Backend { op: op.to_owned(), message: err.to_string() }
    }
}

/// One operation of a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    Put {
        cf: Cf,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        cf: Cf,
        key: Vec<u8>,
    },
    /// Deletes every key in `[start, end)`.
    DeleteRange {
        cf: Cf,
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

/// An ordered list of writes applied atomically by [`Engine::write`]. Later operations win over
/// earlier ones on the same key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
}

impl WriteBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, cf: Cf, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.ops.push(WriteOp::Put { cf, key: key.into(), value: value.into() });
    }

    pub fn delete(&mut self, cf: Cf, key: impl Into<Vec<u8>>) {
        self.ops.push(WriteOp::Delete { cf, key: key.into() });
    }

    /// Deletes every key in `[start, end)` of `cf`.
    pub fn delete_range(&mut self, cf: Cf, start: impl Into<Vec<u8>>, end: impl Into<Vec<u8>>) {
        self.ops.push(WriteOp::DeleteRange { cf, start: start.into(), end: end.into() });
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// The operations in the order they will be applied.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }
}

/// A key-ordered stream of `(key, value)` pairs that can jump forward.
///
/// `seek` is what a reader skipping a long run of records needs (the old versions of one key,
/// `mvcc::read::Visible`): it moves this stream's engine iterator instead of opening a new one,
/// which in RocksDB costs an allocation, a reference on every memtable and table file, and a
/// seek through each (issue 20: a contended lock's ranges spent 4.5 % of the members' CPU
/// opening iterators to skip histories).
pub trait Cursor: Iterator<Item = Result<(Vec<u8>, Vec<u8>), EngineError>> {
    /// Continues the stream from the first pair with key `>= key` (and `>=` the scan's start),
    /// still below the scan's end. A seek backwards is allowed and re-reads.
    fn seek(&mut self, key: &[u8]);
}

/// A [`Cursor`] from a [`ReadView::scan`].
pub type KvIter<'a> = Box<dyn Cursor + 'a>;

/// A stream with nothing in it (an inverted or empty range).
pub struct EmptyCursor;

impl Iterator for EmptyCursor {
    type Item = Result<(Vec<u8>, Vec<u8>), EngineError>;
    fn next(&mut self) -> Option<Self::Item> {
        None
    }
}

impl Cursor for EmptyCursor {
    fn seek(&mut self, _key: &[u8]) {}
}

/// Read access to one state of the engine.
///
/// Object safe on purpose: the MVCC layer stacks in-memory overlays on top of a view
/// (`&dyn ReadView`) so that later commands of one apply batch see earlier ones.
/// A key and its value.
pub type Pair = (Vec<u8>, Vec<u8>);

/// What [`ReadView::first_known`] answers: `None` when the view cannot tell without a scan.
pub type Known = Option<Result<Option<Pair>, EngineError>>;

pub trait ReadView {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError>;

    /// Every pair with `start <= key < end` (no upper bound when `end` is `None`), in ascending
    /// key order. Errors are yielded in the stream; a consumer stops at the first one.
    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_>;

    /// The first pair with `start <= key < end`, if this view can tell without a scan (a
    /// cache in front of it knows); `None`: it cannot, scan. Only a view that knows the
    /// answer is exact may answer (`mvcc::newest`).
    fn first_known(&self, _cf: Cf, _start: &[u8], _end: &[u8]) -> Known {
        None
    }
}

/// A storage engine with a single writer and any number of concurrent readers.
///
/// The engine's own [`ReadView`] impl reads the latest written state; it is meant for the single
/// writer, which knows no write is in flight. Concurrent readers use [`Engine::view`].
pub trait Engine: ReadView + Send + Sync + 'static {
    /// A consistent point-in-time view.
    type View<'a>: ReadView
    where
        Self: 'a;

    /// Takes a view of the current state. Writes made after this call are invisible to it.
    fn view(&self) -> Self::View<'_>;

    /// Applies `batch` atomically. With `sync`, the batch is durable (fsynced) when this returns.
    fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), EngineError>;
}

type Tables = [BTreeMap<Vec<u8>, Vec<u8>>; Cf::ALL.len()];

/// An in-memory engine for tests: a `BTreeMap` per column family.
///
/// Clones share the same data, like clones of [`crate::storage::rocks::RocksEngine`]. The maps
/// sit behind an `Arc` that writes copy on demand, so a view is a cheap reference to an
/// immutable state and a write costs a full copy only while some view is still alive. That is
/// fine for tests and nothing else should use this engine. Nothing is ever durable: dropping
/// the last clone loses the data, while "restarting" a store on a clone keeps it.
#[derive(Debug, Clone, Default)]
pub struct MemEngine {
    tables: Arc<RwLock<Arc<Tables>>>,
}

impl MemEngine {
    pub fn new() -> Self {
        Self::default()
    }

    fn snapshot(&self) -> Arc<Tables> {
        self.tables.read().clone()
    }
}

/// A point-in-time view of a [`MemEngine`].
#[derive(Debug, Clone)]
pub struct MemView {
    tables: Arc<Tables>,
}

fn mem_scan(tables: Arc<Tables>, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'static> {
    let end = match end {
        Some(e) => Bound::Excluded(e.to_vec()),
        None => Bound::Unbounded,
    };
    Box::new(MemCursor {
        tables,
        cf,
        start: start.to_vec(),
        next_start: Bound::Included(start.to_vec()),
        end,
    })
}

/// A scan of a [`MemEngine`] state. It re-seeks from the last returned key on every step, so
/// it owns its snapshot and borrows nothing.
struct MemCursor {
    tables: Arc<Tables>,
    cf: Cf,
    start: Vec<u8>,
    next_start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
}

impl Iterator for MemCursor {
    type Item = Result<(Vec<u8>, Vec<u8>), EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e)) =
            (&self.next_start, &self.end)
        {
            // BTreeMap::range panics on an inverted range; an empty result is what we mean.
            if s >= e {
                return None;
            }
        }
        let (k, v) = self.tables[self.cf.index()]
            .range::<Vec<u8>, _>((self.next_start.clone(), self.end.clone()))
            .next()?;
        self.next_start = Bound::Excluded(k.clone());
        Some(Ok((k.clone(), v.clone())))
    }
}

impl Cursor for MemCursor {
    fn seek(&mut self, key: &[u8]) {
        self.next_start = Bound::Included(key.max(self.start.as_slice()).to_vec());
    }
}

impl ReadView for MemView {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.tables[cf.index()].get(key).cloned())
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        mem_scan(self.tables.clone(), cf, start, end)
    }
}

impl ReadView for MemEngine {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(self.tables.read()[cf.index()].get(key).cloned())
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        mem_scan(self.snapshot(), cf, start, end)
    }
}

impl Engine for MemEngine {
    type View<'a> = MemView;

    fn view(&self) -> MemView {
        MemView { tables: self.snapshot() }
    }

    fn write(&self, batch: WriteBatch, _sync: bool) -> Result<(), EngineError> {
        let mut guard = self.tables.write();
        let tables = Arc::make_mut(&mut guard);
        for op in batch.ops {
            match op {
                WriteOp::Put { cf, key, value } => {
                    tables[cf.index()].insert(key, value);
                }
                WriteOp::Delete { cf, key } => {
                    tables[cf.index()].remove(&key);
                }
                WriteOp::DeleteRange { cf, start, end } => {
                    let table = &mut tables[cf.index()];
                    let doomed: Vec<Vec<u8>> =
                        table.keys().filter(|k| **k >= start && **k < end).cloned().collect();
                    for k in doomed {
                        table.remove(&k);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(it: KvIter<'_>) -> Vec<(Vec<u8>, Vec<u8>)> {
        it.collect::<Result<Vec<_>, _>>().unwrap()
    }

    #[test]
    fn cf_names_are_stable_and_indexed() {
        let names: Vec<&str> = Cf::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            ["raft_log", "raft_meta", "kv", "changelog", "meta", "lease", "lease_keys"]
        );
        for (i, cf) in Cf::ALL.iter().enumerate() {
            assert_eq!(cf.index(), i);
        }
    }

    #[test]
    fn mem_engine_batch_scan_and_views() {
        let e = MemEngine::new();
        let mut b = WriteBatch::new();
        b.put(Cf::Kv, b"a".to_vec(), b"1".to_vec());
        b.put(Cf::Kv, b"b".to_vec(), b"2".to_vec());
        b.put(Cf::Kv, b"c".to_vec(), b"3".to_vec());
        b.put(Cf::Meta, b"a".to_vec(), b"m".to_vec());
        b.delete(Cf::Kv, b"c".to_vec());
        assert_eq!(b.len(), 5);
        e.write(b, true).unwrap();

        let view = e.view();
        let mut b = WriteBatch::new();
        b.delete_range(Cf::Kv, b"a".to_vec(), b"b".to_vec());
        b.put(Cf::Kv, b"d".to_vec(), b"4".to_vec());
        e.write(b, false).unwrap();

        // The old view is unaffected by the second batch.
        assert_eq!(
            collect(view.scan(Cf::Kv, b"", None)),
            vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"2".to_vec())]
        );
        assert_eq!(view.get(Cf::Meta, b"a").unwrap(), Some(b"m".to_vec()));
        // The latest state sees it.
        assert_eq!(
            collect(e.scan(Cf::Kv, b"", None)),
            vec![(b"b".to_vec(), b"2".to_vec()), (b"d".to_vec(), b"4".to_vec())]
        );
        assert_eq!(collect(e.scan(Cf::Kv, b"b", Some(b"d"))), vec![(b"b".to_vec(), b"2".to_vec())]);
        assert!(collect(e.scan(Cf::Kv, b"z", Some(b"a"))).is_empty());
        assert_eq!(e.get(Cf::Kv, b"a").unwrap(), None);
        // Clones share data.
        assert_eq!(e.clone().get(Cf::Kv, b"d").unwrap(), Some(b"4".to_vec()));
    }
}

#[cfg(test)]
#[path = "cursor_tests.rs"]
pub(crate) mod cursor_tests;
