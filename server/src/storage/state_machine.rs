//! The Raft state machine (openraft's `RaftStateMachine`): decodes committed entries, hands
//! each command to [`crate::apply`] (which owns every apply rule), commits the batch, publishes
//! the events, and builds and installs snapshots. It holds no business logic of its own; the
//! state it writes and the API layer reads is [`super::shared`].
//!
//! Every `apply()` call becomes one RocksDB write batch that carries the data changes, the
//! last applied log id and the membership together, so a restart resumes exactly after the last
//! batch that reached the disk, and replaying an entry twice is impossible: openraft re-sends
//! only entries after the `last_applied` we report, and we report what is on disk.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use parking_lot::RwLock;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::{CommandResult, Empty};
use tokio::sync::broadcast;

use crate::raft::snapshot_data::SnapshotData;
use crate::raft::types::{
    Applied, Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::storage::engine::Cf;
use crate::storage::pinned::Pinned;
use crate::storage::rocks::RocksEngine;
use crate::storage::snapshot::SnapshotFiles;
use crate::storage::snapshot_install;

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

/// Which side of the state machine failed, for the I/O error openraft 0.10 takes.
#[derive(Clone, Copy)]
enum ErrorVerb {
    Read,
    Write,
}

fn sm_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    let verb = match verb {
        ErrorVerb::Read => "read",
        ErrorVerb::Write => "write",
    };
    std::io::Error::other(format!("{verb} state machine: {e}"))
}

fn snap_err(e: impl std::fmt::Display) -> StorageError {
    std::io::Error::other(format!("snapshot: {e}"))
}

impl StateMachine {
    /// Opens the state machine on `engine`, keeping snapshots under `snapshot_dir`.
    pub fn open(
        engine: RocksEngine,
        snapshot_dir: impl Into<std::path::PathBuf>,
    ) -> Result<Self, StorageError> {
        let snapshots = SnapshotFiles::new(snapshot_dir.into()).map_err(snap_err)?;
        // Before anything reads the store: an install a crash cut short is finished first.
        snapshot_install::resume(&engine, snapshots.dir()).map_err(snap_err)?;
        let inner = Inner::load(&engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let reader = inner.store.reader();
        let revision = AtomicI64::new(inner.store.revision());
        // Watchers that fall this far behind are cut off and must resume from history; the bound
        // keeps a stuck watcher from holding unbounded memory.
        let (events, _) = broadcast::channel(4096);
        let auth = crate::auth::AuthCache::load(&engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let alarms =
            crate::quota::AlarmCache::load(&engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                reader,
                inner: RwLock::new(inner),
                revision,
                snapshots,
                current: parking_lot::Mutex::new(None),
                events,
                auth,
                alarms,
                forwarded: Arc::default(),
                disk: std::sync::OnceLock::new(),
            }),
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Applies `entries` as one batch: hands each command to `crate::apply`, commits the batch,
    /// refreshes auth and publishes the events; one result per entry, in order.
    pub fn apply_entries(&self, entries: Vec<Entry>) -> Result<Vec<Applied>, StorageError> {
        let mut guard = self.shared.inner.write();
        let Inner { store, leases, last_applied, membership } = &mut *guard;
        let mut results = Vec::with_capacity(entries.len());
        // The lease table is changed in place: if the batch below fails to commit, the node
        // stops (a storage failure is fatal), so there is no half-applied table to roll back.
        let mut batch = store.begin_apply();
        // Results owed to this member's own forwarded commands (`super::forwarded`).
        let mut forwarded = Vec::new();
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
                EntryPayload::Normal(cmd) => {
                    let ours = self.shared.forwarded.ours(cmd.get());
                    let result = crate::apply::maybe_command(
                        &mut batch,
                        leases,
                        cmd.get().cmd.as_ref(),
                        log_id.leader_id.term,
                    )
                    .map_err(|e| sm_err(ErrorVerb::Write, e))?;
                    ours.collect(&result, &mut forwarded);
                    result
                }
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
        let alarms_changed = batch.writes_raw(Cf::Meta, crate::quota::KEY_ALARMS);
        // Every auth mutation rewrites the revision record in its batch (`auth::replicated`),
        // and an install reloads the cache itself: a batch that does not write it cannot
        // change the auth state, so the cache needs no read (one point read per batch saved).
        let auth_changed = batch.writes_raw(Cf::Meta, crate::auth::replicated::KEY_REVISION);
        let revisions = match self.shared.disk.get() {
            Some(d) => d.time_backend_commit(|| batch.commit(false)),
            None => batch.commit(false),
        }
        .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        self.shared.revision.store(store.revision(), Ordering::Release);
        drop(guard);
        // Before the results reach clients: a client whose auth change succeeded is checked
        // against it next.
        if auth_changed {
            self.shared
                .auth
                .refresh(&self.shared.engine)
                .map_err(|e| sm_err(ErrorVerb::Read, e))?;
        }
        if alarms_changed {
            self.shared
                .alarms
                .refresh(&self.shared.engine)
                .map_err(|e| sm_err(ErrorVerb::Read, e))?;
        }
        for (revision, events) in revisions {
            // No receivers is fine: nobody is watching.
            let _ = self
                .shared
                .events
                .send(FeedItem::Revision(RevisionEvents { revision, events: Arc::new(events) }));
        }
        // After the commit, the auth refresh and the feed, as the leader's answers come after
        // this function returns: a client answered here reads its write here.
        self.shared.forwarded.deliver(forwarded);
        Ok(results)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let inner = self.shared.inner.read();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<Strm>(&mut self, entries: Strm) -> Result<(), StorageError>
    where
        Strm:
            Stream<Item = Result<EntryResponder<TypeConfig>, StorageError>> + Unpin + OptionalSend,
    {
        // Collected before the (synchronous) state lock is taken: one batch per call.
        let items: Vec<EntryResponder<TypeConfig>> = entries.try_collect().await?;
        let (entries, responders): (Vec<Entry>, Vec<_>) = items.into_iter().unzip();
        // A command another member forwarded is answered by that member once it has applied it
        // itself, which it can do only when the commit index reaches it. openraft hands the
        // commit to the replication tasks and the entries to this task together; on one
        // runtime thread the connection tasks that write the commit messages then ran only
        // after this apply (~50-70 us later on the forwarding member's path, session 35's hop
        // trace). Yielding once lets them go first. Only for such entries: for a command of this
        // member's own client, the apply is what the reply waits for. And only for entries this
        // member proposed (openraft hands their responders only to the member that proposed
        // them, the leader): a follower sends no commits, and it sees the leader's own clients'
        // commands tagged too (`super::forwarded`); yielding there only put its apply, and the
        // lock hand-offs and answers waiting on it, behind whatever else was queued.
        let forwarded = entries.iter().zip(&responders).any(|(e, r)| match &e.payload {
            EntryPayload::Normal(cmd) => {
                r.is_some() && self.shared.forwarded.forwarded_elsewhere(cmd.get())
            }
            _ => false,
        });
        if forwarded {
            tokio::task::yield_now().await;
        }
        let results = self.apply_entries(entries)?;
        // The batch is committed in apply order, auth refreshed and the events out: only now do
        // the results reach the clients waiting on them.
        for (responder, applied) in responders.into_iter().zip(results) {
            if let Some(r) = responder {
                r.send(applied);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        data: SnapshotData,
    ) -> Result<(), StorageError> {
        // The blob stays in its file; the install reads it record by record
        // (`storage::snapshot_install`).
        let blob =
            data.into_path(self.shared.snapshots.receiving_path()).await.map_err(snap_err)?;
        tracing::info!(
            log_index = meta.last_log_id.map(|l| l.index),
            bytes = std::fs::metadata(&blob).map(|m| m.len()).ok(),
            "installing snapshot"
        );
        // Rewriting the store and reloading its lease table are long synchronous work (seconds
        // for a large store): run them off the runtime's worker threads, and without the
        // state-machine lock, so heartbeats, reads and response headers keep being served
        // meanwhile (issue 19, Medium 9). Until the swap below, lock holders see the old state
        // whole; lock-free readers take their views through `RocksEngine::whole`, which shows
        // the install entirely or not at all. Nothing else writes the state-machine families
        // meanwhile: openraft calls apply and install one at a time on this state machine.
        let shared = self.shared.clone();
        let meta_owned = meta.clone();
        let inner = tokio::task::spawn_blocking(move || -> Result<Inner, StorageError> {
            let dir = shared.snapshots.dir();
            snapshot_install::install_received(&shared.engine, dir, &blob).map_err(snap_err)?;
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
            shared.alarms.refresh(&shared.engine).map_err(|e| sm_err(ErrorVerb::Read, e))?;
            // The installed state is this member's current snapshot now (openraft's contract:
            // `get_current_snapshot` returns it). Pinned before anything is applied after it,
            // so the view is exactly the snapshot.
            set_current(&shared, Arc::new(pin(&shared)?));
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
        // No I/O: openraft calls this on its state-machine task (to send a snapshot, and at
        // start), where a whole-store write would hold up apply; the blob is written by whoever
        // reads the data (`SnapshotData::spill` in the transfer).
        let mut current = self.shared.current.lock();
        if current.is_none() {
            // First call since the start: the store as recovered is the snapshot (see
            // `storage::pinned`). Nothing applied yet: no snapshot.
            if self.shared.inner.read().last_applied.is_none() {
                return Ok(None);
            }
            *current = Some(Arc::new(pin(&self.shared)?));
        }
        Ok(current
            .clone()
            .map(|p| Snapshot { meta: p.meta().clone(), snapshot: SnapshotData::deferred(p) }))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        // Cheap whatever the store's size: a pinned view and its metadata, no copy
        // (`storage::pinned`). openraft keeps only the metadata of what this returns.
        let pinned = Arc::new(pin(&self.shared)?);
        tracing::info!(log_index = pinned.meta().last_log_id.map(|l| l.index), "built snapshot");
        set_current(&self.shared, Arc::clone(&pinned));
        Ok(Snapshot { meta: pinned.meta().clone(), snapshot: SnapshotData::deferred(pinned) })
    }
}

/// Makes `pinned` the current snapshot unless the current one is newer: a build runs beside
/// apply and installs, so a build that pinned before an install may finish after it, and the
/// current snapshot must never go back below what openraft was told (it purges by it).
fn set_current(shared: &Shared, pinned: Arc<Pinned>) {
    let mut current = shared.current.lock();
    if current.as_ref().is_none_or(|c| c.meta().last_log_id <= pinned.meta().last_log_id) {
        *current = Some(pinned);
    }
}

/// Pins the store as it is now as a snapshot (`storage::pinned`).
fn pin(shared: &Shared) -> Result<Pinned, StorageError> {
    Pinned::take(&shared.engine, shared.snapshots.dir().to_path_buf()).map_err(snap_err)
}

#[cfg(test)]
#[path = "state_machine_tests.rs"]
mod tests;
