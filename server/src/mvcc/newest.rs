//! The newest record of each recently written or read key, for the apply path (issue 20).
//!
//! Every Put reads the key's previous version (its create revision, version and lease), and a
//! single-key delete reads whether the key is live. In RocksDB that is an iterator and a seek
//! through every memtable and level: about a tenth of the servers' CPU under 64-client puts
//! (perf, docs/benchmarks.md "Issue 20, session 12"). The apply path is this store's only
//! writer, so it can remember what it wrote: [`NewestCache`] maps an encoded user key to its
//! newest `Cf::Kv` record (key and value, a tombstone included) as committed, filled on reads
//! that missed and updated by every commit. Measured: under puts the memtable insert that
//! follows now pays the cache misses the seek used to take, so puts gained nothing; txn
//! compares and single-key deletes (the lock rows) did (benchmarks, same section). A
//! single-key Range in apply (`read::range`: a Txn's Get, a queue claim checking each in-flight
//! job's claim) is answered here too: 10-17 % of a 16-worker queue cycle ("Issue 20, session 18").
//!
//! Why the answers stay exact:
//! - Only [`crate::mvcc::ApplyBatch::commit`] writes `Cf::Kv`, and it hands the batch's `Kv`
//!   writes to [`NewestCache::committed`] with the engine write (clearing the cache if that
//!   write fails): a put is a new
//!   revision, newer than anything stored, so it becomes the key's newest record; a delete
//!   (compaction dropping old records) forgets the key, and the next read goes to the engine.
//! - Replacing the engine's contents (snapshot install) clears the cache
//!   ([`crate::mvcc::MvccStore::reload`]).
//! - Client reads never use it: they read engine views at their own revision
//!   ("reads never use in-memory state", `store`).
//! - Debug builds (every test) check each hit against the engine.
//!
//! Bounded: records over [`MAX_RECORD_BYTES`] are not kept, and the whole cache is dropped when
//! it holds more than [`BUDGET_BYTES`]; a miss only costs the engine read it replaces.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::keys;
use crate::storage::engine::{Cf, EngineError, Pair, ReadView};

/// What the cache may hold, keys and values together.
pub const BUDGET_BYTES: usize = 8 << 20;

/// Larger records are read from the engine each time rather than kept.
pub const MAX_RECORD_BYTES: usize = 16 << 10;

/// A `Cf::Kv` record: its key (encoded user key and revision) and value.
pub type Record = Pair;

#[derive(Default)]
struct Inner {
    /// Encoded user key -> its newest record, or `None`: the key has no record at all.
    map: HashMap<Vec<u8>, Option<Record>>,
    bytes: usize,
}

/// See the module docs. Interior mutability: reads fill it through `&self`. The mutex is never
/// contended (one applier); it only keeps the store `Sync`.
#[derive(Default)]
pub struct NewestCache {
    inner: Mutex<Inner>,
}

/// Locks an apply-path cache. A panic while the lock was held can only have left it partly
/// updated: it starts over empty (a miss only costs the engine read it replaces).
pub(super) fn lock_or_reset<T: Default>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| {
        let mut g = p.into_inner();
        *g = T::default();
        g
    })
}

fn size(enc: &[u8], rec: &Option<Record>) -> usize {
    enc.len() + rec.as_ref().map_or(0, |(k, v)| k.len() + v.len())
}

impl NewestCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock_or_reset(&self.inner)
    }

    /// Forgets everything (the engine's contents were replaced).
    pub fn clear(&self) {
        let mut g = self.lock();
        g.map.clear();
        g.bytes = 0;
    }

    fn insert(g: &mut Inner, enc: Vec<u8>, rec: Option<Record>) {
        if let Some(old) = g.map.remove(&enc) {
            g.bytes -= size(&enc, &old);
        }
        let n = size(&enc, &rec);
        if rec.as_ref().is_some_and(|(_, v)| v.len() > MAX_RECORD_BYTES) {
            return;
        }
        if g.bytes + n > BUDGET_BYTES {
            g.map.clear();
            g.bytes = 0;
        }
        g.bytes += n;
        g.map.insert(enc, rec);
    }

    /// The newest record of the encoded user key `enc` in `engine`, the committed state this
    /// cache follows.
    pub fn newest(&self, engine: &dyn ReadView, enc: &[u8]) -> Result<Option<Record>, EngineError> {
        if let Some(hit) = self.lock().map.get(enc).cloned() {
            debug_assert_eq!(
                Ok(&hit),
                scan_newest(engine, enc).as_ref(),
                "newest-record cache disagrees with the engine for {enc:02x?}"
            );
            return Ok(hit);
        }
        let rec = scan_newest(engine, enc)?;
        Self::insert(&mut self.lock(), enc.to_vec(), rec.clone());
        Ok(rec)
    }

    /// Records a committed batch's `Cf::Kv` writes (`Some` a put, `None` a delete), in key
    /// order; see the module docs.
    pub fn committed<'a>(&self, writes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>) {
        let mut g = self.lock();
        for (k, v) in writes {
            let Some((enc, _)) = keys::split_kv_key(k) else { continue };
            match v {
                // Keys sort newest revision first, so the first put of a key in the batch is
                // its newest record; a later (older) one must not replace it.
                Some(v) => {
                    let newer = match g.map.get(enc) {
                        Some(Some((old, _))) => k < old.as_slice(),
                        _ => true,
                    };
                    if newer {
                        Self::insert(&mut g, enc.to_vec(), Some((k.to_vec(), v.to_vec())));
                    }
                }
                None => {
                    if let Some(old) = g.map.remove(enc) {
                        g.bytes -= size(enc, &old);
                    }
                }
            }
        }
    }
}

/// The newest record of `enc` by a scan: the first of its versions (newest revision first).
pub fn scan_newest(view: &dyn ReadView, enc: &[u8]) -> Result<Option<Record>, EngineError> {
    view.scan(Cf::Kv, enc, Some(&keys::versions_end(enc))).next().transpose()
}

#[cfg(test)]
#[path = "newest_tests.rs"]
mod tests;
