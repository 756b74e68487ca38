//! Storage: the key-value engine under everything Picket persists.
//!
//! Layers, from the bottom up:
//! - [`engine`]: the engine abstraction. Column families ([`engine::Cf`]), ordered write
//!   batches, point-in-time read views, and [`engine::MemEngine`], an in-memory engine for tests
//!   (after TiKV's `BTreeEngine`). Nothing above this module needs to know which engine runs.
//! - [`rocks`]: the production engine on RocksDB. The Raft log store uses its `DB` handle and
//!   column families directly.
//! - `log_store`: openraft's `RaftLogStorage` on the `raft_log`/`raft_meta` column families;
//!   `log_flusher` syncs its appends in groups, off openraft's core task.
//! - `state_machine`: openraft's `RaftStateMachine`; decodes committed commands and dispatches
//!   them to [`crate::mvcc`] and [`crate::lease`], one engine write batch per `apply()` call.
//! - `forwarded`: hands the results of commands this member forwarded to the leader to their
//!   waiters as the state machine applies them.
//! - `snapshot`: the snapshot blob, written from a consistent engine view; `pinned`: a
//!   snapshot kept as a pinned view until it is sent; `snapshot_install`: a received blob
//!   turned into table files the store ingests, finished at the next start if a crash cut it
//!   short.
//!
//! The MVCC data model (revisions, key versions, compaction) lives in [`crate::mvcc`], which
//! only sees the [`engine::Engine`] trait, so it runs unchanged on [`engine::MemEngine`].

pub mod engine;
pub mod rocks;

// Owned by the Raft layer (see the list above).
pub mod forwarded;
pub mod log_flusher;
pub mod log_store;
pub mod log_tail;
pub mod pinned;
pub mod shared;
pub mod snapshot;
pub mod snapshot_file;
pub mod snapshot_install;
pub mod state_machine;
#[cfg(test)]
pub(crate) mod test_member;
pub mod wal_tail;
