//! The MVCC key-value store: etcd v3.5's data model on a [`crate::storage::engine::Engine`].
//!
//! This module knows nothing of Raft: the state machine hands it decoded requests inside an
//! [`ApplyBatch`], and the API layer reads through [`MvccStore`]/[`MvccReader`]. Apply is
//! deterministic (no clocks, randomness or hash-order iteration), so every replica computes the
//! same state, responses and errors. It runs unchanged on
//! [`crate::storage::engine::MemEngine`], which is what the unit and model tests use.
//!
//! # Data model (etcd's)
//! - One global revision. A fresh store is at revision 1, so the first write gets revision 2.
//!   Every request that changes something takes exactly one new revision, shared by all keys
//!   it changes; a delete that deletes nothing and a txn that writes nothing take none.
//! - Each key has `create_revision`, `mod_revision`, `version` (1 on creation, +1 per put,
//!   reset by a delete) and `lease` (0 = none).
//! - Compaction at `C` drops history no read at a revision `>= C` can see. Reads below `C` fail
//!   with [`MvccError::Compacted`]; reading at `C` itself works.
//!
//! # On-disk layout
//! | column family | key | value |
//! |---|---|---|
//! | `kv` | `enc(user key) ++ be64(u64::MAX - revision)` | prost `mvccpb.KeyValue`, or empty for a deletion tombstone |
//! | `changelog` | `be64(revision)` | prost `picket.storage.v1.RevisionEvents`: every event of the revision in op order |
//! | `meta` | `mvcc/current_revision`, `mvcc/compact_revision` | `be64(i64)`; absent = 1 and -1 |
//! | `lease_keys` | `be64(lease id) ++ user key` | empty; one entry per live key attached to a lease |
//!
//! `enc` (see [`keys`]) escapes `0x00` as `0x00 0xFF` and terminates with `0x00 0x01`, which
//! keeps byte order and makes encodings prefix-free. So all versions of a key are contiguous,
//! newest first, an etcd key range `[key, range_end)` is the encoded range
//! `[enc(key), enc(range_end))`, and "the version visible at revision R" is the first record
//! at or after `enc(key) ++ be64(u64::MAX - R)`. PUT events in the changelog carry the full
//! key-value; DELETE events carry only the key and `mod_revision` (etcd's watch events).
//! The changelog serves watch replay ([`MvccReader::events`]) and lets compaction visit only
//! keys changed since the previous compaction instead of the whole store.
//!
//! # Files
//! - [`keys`]: byte layouts. [`overlay`]: in-memory write layers over an engine view.
//! - `newest`, `meta_cache`: what the apply path read or wrote, kept as committed.
//! - [`follow`]: in-memory state that follows the writes under a prefix (a queue's claimed run).
//! - [`read`]: visible versions and etcd Range. [`compare`]: txn guards.
//! - `request`: Put, DeleteRange and lease revocation inside one request.
//! - `txn`: etcd's Txn order (compares, checks, ops). `compact`: incremental compaction.
//! - [`apply`]: [`ApplyBatch`]. [`store`]: [`MvccStore`], [`MvccReader`].
//! - [`validate`]: request checks for the API layer. [`error`]: [`MvccError`].

pub mod apply;
mod compact;
pub mod compare;
pub mod error;
pub mod follow;
pub mod hash;
pub mod keys;
mod meta_cache;
mod newest;
pub mod overlay;
pub mod read;
mod request;
pub mod retention;
pub mod store;
mod txn;
pub mod validate;

pub use apply::ApplyBatch;
pub use error::MvccError;
pub use store::{MvccReader, MvccStore};

/// Whether a lease exists, as the lease table knows at this point of apply.
pub trait LeaseLookup {
    fn exists(&self, id: i64) -> bool;
}

impl<F: Fn(i64) -> bool> LeaseLookup for F {
    fn exists(&self, id: i64) -> bool {
        self(id)
    }
}

#[cfg(test)]
mod compact_tests;
#[cfg(test)]
mod tests;
