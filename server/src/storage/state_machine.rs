//! The Raft state machine (openraft's `RaftStateMachine`): decodes committed entries, hands
//! each command to [`crate::apply`] (which owns every apply rule), commits the batch, publishes
//! the events, and builds and installs snapshots. It holds no business logic of its own; the
//! state it writes and the API layer reads is [`super::shared`].
//!
//! Every `apply()` call becomes one RocksDB write batch that carries the data changes, the
//! last applied log id and the membership together, so a restart resumes exactly after the last
//! batch that reached the disk, and replaying an entry twice is impossible: openraft re-sends
//! only entries after the `last_applied` we report, and we report what is on disk.

use std::io::Cursor;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder, StorageIOError,
};
use parking_lot::RwLock;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::{CommandResult, Empty};
use tokio::sync::broadcast;

use crate::raft::types::{
    Applied, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::storage::engine::Cf;
use crate::storage::rocks::RocksEngine;
use crate::storage::snapshot::{self, SnapshotFiles};

pub(super) use super::shared::Inner;
pub use super::shared::{FeedItem, RevisionEvents, Shared};

use super::shared::{KEY_APPLIED, KEY_MEMBERSHIP};

/// The `Cf::Meta` keys that record Raft progress rather than data: a snapshot restored into a
/// new cluster (`crate::restore`) drops them, because they name log ids and members of the
/// cluster the snapshot came from.
pub(crate) const RAFT_META_KEYS: [&[u8]; 2] = [KEY_APPLIED, KEY_MEMBERSHIP];

/// The openraft state machine handle. Clones share state.
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

fn sm_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(ErrorSubject::StateMachine, verb, openraft::AnyError::error(e.to_string()))
        .into()
}

fn snap_err(e: impl std::fmt::Display) -> StorageError {
    StorageIOError::new(
        ErrorSubject::Snapshot(None),
        ErrorVerb::Write,
        openraft::AnyError::error(e.to_string()),
    )
    .into()
}

impl StateMachine {
    /// Opens the state machine on `engine`, keeping snapshots under `snapshot_dir`.
    pub fn open(
        engine: RocksEngine,
        snapshot_dir: impl Into<std::path::PathBuf>,
    ) -> Result<Self, StorageError> {
        let inner = Inner::load(&engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let reader = inner.store.reader();
        let revision = AtomicI64::new(inner.store.revision());
        let snapshots = SnapshotFiles::new(snapshot_dir.into()).map_err(snap_err)?;
        // Watchers that fall this far behind are cut off and must resume from history; the bound
        // keeps a stuck watcher from holding unbounded memory.
        let (events, _) = broadcast::channel(4096);
        let auth = crate::auth::AuthCache::load(&engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                reader,
                inner: RwLock::new(inner),
                revision,
                snapshots,
                snapshot_seq: AtomicU64::new(0),
                events,
                auth,
                disk: std::sync::OnceLock::new(),
            }),
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.shared.inner.read();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut guard = self.shared.inner.write();
        let Inner { store, leases, last_applied, membership } = &mut *guard;
        let mut results = Vec::new();
        // The lease table is changed in place: if the batch below fails to commit, the node
        // stops (a storage failure is fatal), so there is no half-applied table to roll back.
        let mut batch = store.begin_apply();
        for entry in entries {
            let log_id = entry.log_id;
            if last_applied.is_some_and(|a| log_id.index <= a.index) {
                // Defensive: openraft never hands us an entry at or below what we reported as
                // applied, but re-applying would double-apply a write, so never do it.
                tracing::warn!(log_index = log_id.index, "skipping already applied entry");
                results.push(Applied(CommandResult { result: Some(CmdResult::Empty(Empty {})) }));
                continue;
            }
            let result = match entry.payload {
                EntryPayload::Blank => CmdResult::Empty(Empty {}),
                EntryPayload::Membership(m) => {
                    *membership = StoredMembership::new(Some(log_id), m);
                    CmdResult::Empty(Empty {})
                }
                EntryPayload::Normal(cmd) => crate::apply::maybe_command(
                    &mut batch,
                    leases,
                    cmd.0.cmd,
                    log_id.leader_id.term,
                )
                .map_err(|e| sm_err(ErrorVerb::Write, e))?,
            };
            *last_applied = Some(log_id);
            tracing::trace!(log_index = log_id.index, "applied entry");
            results.push(Applied(CommandResult { result: Some(result) }));
        }
        let applied_bytes =
            postcard::to_allocvec(&last_applied).map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let membership_bytes =
            postcard::to_allocvec(&membership).map_err(|e| sm_err(ErrorVerb::Write, e))?;
        batch.put_raw(Cf::Meta, KEY_APPLIED, &applied_bytes);
        batch.put_raw(Cf::Meta, KEY_MEMBERSHIP, &membership_bytes);
        // Durability: not synced. The Raft log holds every applied entry durably until a
        // snapshot covers it, and the log purge is a synced write to the same WAL, which flushes
        // this batch first. A crash can lose the tail of applied state, never the log, and
        // replay restarts after the last applied id stored in the same batch.
        let revisions = match self.shared.disk.get() {
            Some(d) => d.time_backend_commit(|| batch.commit(false)),
            None => batch.commit(false),
        }
        .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        self.shared.revision.store(store.revision(), Ordering::Release);
        drop(guard);
        // Before the results reach clients: a client whose auth change succeeded is checked
        // against it next.
        self.shared.auth.refresh(&self.shared.engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        for (revision, events) in revisions {
            // No receivers is fine: nobody is watching.
            let _ = self
                .shared
                .events
                .send(FeedItem::Revision(RevisionEvents { revision, events: Arc::new(events) }));
        }
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        data: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let blob = data.into_inner();
        tracing::info!(
            log_index = meta.last_log_id.map(|l| l.index),
            bytes = blob.len(),
            "installing snapshot"
        );
        // Rewriting the store and reloading its lease table are long synchronous work (seconds
        // for a large store): run them off the runtime's worker threads, and without the
        // state-machine lock, so heartbeats, reads and response headers keep being served
        // meanwhile (issue 19, Medium 9). Until the swap below, lock holders see the old state
        // whole; lock-free readers take a RocksDB view, which shows the atomic rewrite either
        // entirely or not at all. Nothing else writes the store meanwhile: openraft calls
        // apply and install one at a time on this state machine.
        let shared = self.shared.clone();
        let meta_owned = meta.clone();
        let inner = tokio::task::spawn_blocking(move || -> Result<Inner, StorageError> {
            snapshot::install(shared.engine.db(), &blob).map_err(snap_err)?;
            #[cfg(test)]
            tests::pause_in_install();
            let inner = Inner::load(&shared.engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
            if inner.last_applied != meta_owned.last_log_id {
                return Err(snap_err(format!(
                    "snapshot data is at {:?} but its metadata says {:?}",
                    inner.last_applied, meta_owned.last_log_id
                )));
            }
            shared.auth.reload(&shared.engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
            // The snapshot file is written and fsynced here too, off the runtime.
            shared.snapshots.save(&meta_owned, &blob).map_err(snap_err)?;
            Ok(inner)
        })
        .await
        .map_err(snap_err)??;
        let revision = inner.store.revision();
        {
            let mut guard = self.shared.inner.write();
            *guard = inner;
            self.shared.revision.store(revision, Ordering::Release);
        }
        // The entries the snapshot covers were never applied here, so no events went out for
        // them: tell every waiter on the feed to re-read (issue 19). Published after the new
        // state is readable, as revision events are, and before openraft applies anything after
        // the snapshot, so the feed stays in apply order. No receivers is fine.
        let _ = self.shared.events.send(FeedItem::SnapshotInstalled { revision });
        tracing::info!(revision, "snapshot installed; feed subscribers told to re-read");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let loaded = self.shared.snapshots.load().map_err(snap_err)?;
        Ok(loaded.map(|(meta, blob)| Snapshot { meta, snapshot: Box::new(Cursor::new(blob)) }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let shared = self.shared.clone();
        // Building reads the whole store; keep it off the async runtime's worker threads.
        let blob = tokio::task::spawn_blocking(move || snapshot::build(shared.engine.db()))
            .await
            .map_err(snap_err)?
            .map_err(snap_err)?;
        // The blob's own meta column family says which entry it covers.
        let (last_log_id, last_membership) = {
            let records = snapshot::parse(&blob).map_err(snap_err)?;
            let meta_cf =
                snapshot::SNAPSHOT_CFS.iter().position(|c| *c == "meta").unwrap_or(usize::MAX);
            let mut applied: Option<LogId> = None;
            let mut membership = StoredMembership::default();
            for (cf, k, v) in records {
                if cf == meta_cf && k == KEY_APPLIED {
                    applied = postcard::from_bytes(v).map_err(snap_err)?;
                } else if cf == meta_cf && k == KEY_MEMBERSHIP {
                    membership = postcard::from_bytes(v).map_err(snap_err)?;
                }
            }
            (applied, membership)
        };
        let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match last_log_id {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, seq),
            None => format!("--{seq}"),
        };
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id };
        // Written and fsynced off the runtime's worker threads, like the build itself.
        let (shared, meta_owned) = (self.shared.clone(), meta.clone());
        let blob = tokio::task::spawn_blocking(move || {
            shared.snapshots.save(&meta_owned, &blob).map(|()| blob)
        })
        .await
        .map_err(snap_err)?
        .map_err(snap_err)?;
        tracing::info!(
            log_index = last_log_id.map(|l| l.index),
            bytes = blob.len(),
            "built snapshot"
        );
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(blob)) })
    }
}

#[cfg(test)]
#[path = "state_machine_tests.rs"]
mod tests;
