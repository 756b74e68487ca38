//! The `Cf::Meta` records the apply path reads, kept as committed (issue 20).
//!
//! Apply reads some meta records for every command: the auth store's revision, which every
//! API write carries to be re-checked (`auth::replicated::check_revision`), was a RocksDB point
//! read per command, 2.5 % of the members' CPU under 64-client puts. Like `newest`, this cache
//! relies on the apply path being the store's only writer while it runs:
//! - [`crate::mvcc::ApplyBatch::commit`] hands the batch's `Cf::Meta` writes to
//!   [`MetaCache::committed`] before the engine write (which updates the keys it holds) and
//!   clears the cache if that write fails;
//! - replacing the engine's contents (snapshot install, [`crate::mvcc::MvccStore::reload`])
//!   opens a new store or clears it;
//! - the state machine's own meta records (applied log id, membership) are written through the
//!   same batch; offline writers (`restore`) run before any store is opened;
//! - debug builds (every test) check each hit against the engine.
//!
//! Reads inside a batch see the batch's own writes first (the overlay), so only the committed
//! state is cached. Bounded: larger records are read each time, and the cache holds at most
//! [`MAX_KEYS`] keys (meta keys are a fixed few; the bound only guards against a bug).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::storage::engine::{Cf, EngineError, ReadView};

/// Larger records (a big auth store) are read from the engine each time.
pub const MAX_RECORD_BYTES: usize = 16 << 10;

/// More distinct keys than meta ever has; past it the cache starts over.
pub const MAX_KEYS: usize = 256;

/// See the module docs. The mutex is never contended (one applier); it keeps the store `Sync`.
#[derive(Default)]
pub struct MetaCache {
    /// Key -> its committed value, `None` when the record does not exist.
    map: Mutex<HashMap<Vec<u8>, Option<Vec<u8>>>>,
}

impl MetaCache {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Option<Vec<u8>>>> {
        super::newest::lock_or_reset(&self.map)
    }

    fn insert(map: &mut HashMap<Vec<u8>, Option<Vec<u8>>>, key: &[u8], value: Option<&[u8]>) {
        if value.is_some_and(|v| v.len() > MAX_RECORD_BYTES) {
            map.remove(key);
            return;
        }
        if map.len() >= MAX_KEYS && !map.contains_key(key) {
            map.clear();
        }
        map.insert(key.to_vec(), value.map(<[u8]>::to_vec));
    }

    /// The committed meta record `key` of `engine`, the state this cache follows.
    pub fn get(&self, engine: &dyn ReadView, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        if let Some(hit) = self.lock().get(key).cloned() {
            debug_assert_eq!(
                Ok(&hit),
                engine.get(Cf::Meta, key).as_ref(),
                "meta cache disagrees with the engine for {key:02x?}"
            );
            return Ok(hit);
        }
        let value = engine.get(Cf::Meta, key)?;
        Self::insert(&mut self.lock(), key, value.as_deref());
        Ok(value)
    }

    /// Records a committed batch's `Cf::Meta` writes (`Some` a put, `None` a delete) for the
    /// keys apply has read. Others are left out: every batch writes records apply never reads
    /// (the applied log id, the membership), and a key not held is read from the engine, which
    /// has the write by then.
    pub fn committed<'a>(&self, writes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>) {
        let mut g = self.lock();
        for (key, value) in writes {
            if g.contains_key(key) {
                Self::insert(&mut g, key, value);
            }
        }
    }

    /// Forgets everything (the engine's contents were replaced, or a write failed).
    pub fn clear(&self) {
        self.lock().clear();
    }
}

#[cfg(test)]
#[path = "meta_cache_tests.rs"]
mod tests;
