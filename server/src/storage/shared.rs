//! State shared by the state machine (the only writer) and the API layer (readers): the
//! engine, the applied MVCC store and lease table behind one lock, a lock-free copy of the store
//! revision for response headers, the applied-state feed, and the applied auth store.
//! `state_machine` holds the openraft glue that writes it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use picket_proto::mvccpb::Event;
use tokio::sync::broadcast;

use picket_proto::picket::storage::v1::LeaseRecord;
use prost::Message;

use super::engine::Cf;
use super::rocks::RocksEngine;
use super::snapshot::{SnapshotError, SnapshotFiles};
use crate::lease::LeaseTable;
use crate::mvcc::{MvccReader, MvccStore};
use crate::raft::types::{LogId, StoredMembership};

/// `Cf::Meta` key of the last applied log id, written in every apply batch.
pub(super) const KEY_APPLIED: &[u8] = b"raft/last_applied";
/// `Cf::Meta` key of the last applied membership, written in every apply batch.
pub(super) const KEY_MEMBERSHIP: &[u8] = b"raft/membership";

/// Events of one applied revision, published after the batch that produced them is written.
#[derive(Debug, Clone)]
pub struct RevisionEvents {
    pub revision: i64,
    pub events: Arc<Vec<Event>>,
}

/// One item of the applied-state feed ([`Shared::subscribe`]), in apply order.
///
/// A member that falls behind the leader's purged log catches up by installing a snapshot, which
/// replaces the state without applying (or publishing) the entries it covers. A consumer waiting
/// for a particular event (a lock waiter for its predecessor's delete, a watcher for the next
/// revision) would wait forever for an event that will never be published, so the install is
/// announced as its own item, and every consumer must treat it as "anything may have changed":
/// re-read the state (or replay history) instead of waiting on. It is an enum rather than a flag
/// on [`RevisionEvents`] so that a new consumer cannot compile without deciding what to do.
#[derive(Debug, Clone)]
pub enum FeedItem {
    /// The events of one applied revision.
    Revision(RevisionEvents),
    /// A snapshot was installed; the store is now at `revision`, reached without events.
    SnapshotInstalled { revision: i64 },
}

/// State shared by the state machine (writer) and the API layer (readers).
pub struct Shared {
    pub(super) engine: RocksEngine,
    pub(super) reader: MvccReader<RocksEngine>,
    pub(super) inner: RwLock<Inner>,
    /// The store revision as of the last apply or snapshot install, readable without the lock:
    /// every response header needs it, and a header must never wait for an apply or an install
    /// (issue 19, Medium 9).
    pub(super) revision: AtomicI64,
    pub(super) snapshots: SnapshotFiles,
    /// The current snapshot: the view the last build or install pinned (`super::pinned`);
    /// `None` until openraft first asks for one after a start.
    pub(super) current: parking_lot::Mutex<Option<Arc<super::pinned::Pinned>>>,
    pub(super) events: broadcast::Sender<FeedItem>,
    /// The applied auth store, for permission checks on the API layer (`crate::auth`).
    pub(super) auth: crate::auth::AuthCache,
    /// Whether the applied alarm set has NOSPACE, for the propose-time check (`crate::quota`).
    pub(super) alarms: crate::quota::AlarmCache,
    /// Waiters of the commands this member forwarded to the leader (`super::forwarded`).
    pub(super) forwarded: Arc<super::forwarded::ForwardedResults>,
    /// Times batch commits (`picket_disk_backend_commit_duration_seconds`) once set.
    pub(super) disk: std::sync::OnceLock<crate::metrics::disk::DiskMetrics>,
}

pub(super) struct Inner {
    pub(super) store: MvccStore<RocksEngine>,
    pub(super) leases: LeaseTable,
    pub(super) last_applied: Option<LogId>,
    pub(super) membership: StoredMembership,
}

/// The last applied log id and the membership recorded in the meta column family, read with
/// `get` (the live database at open, or one snapshot's view of it).
pub(super) fn raft_progress(
    get: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, rocksdb::Error>,
) -> Result<(Option<LogId>, StoredMembership), SnapshotError> {
    let last_applied = match get(KEY_APPLIED)? {
        Some(b) => postcard::from_bytes(&b)?,
        None => None,
    };
    let membership = match get(KEY_MEMBERSHIP)? {
        Some(b) => postcard::from_bytes(&b)?,
        None => StoredMembership::default(),
    };
    Ok((last_applied, membership))
}

impl Inner {
    /// Loads the applied state from the engine (at open, and after a snapshot install rewrote
    /// it). An error means the store cannot be read or decoded: the member must stop.
    pub(super) fn load(engine: &RocksEngine) -> Result<Self, String> {
        let store = MvccStore::open(engine.clone()).map_err(|e| e.to_string())?;
        let meta = engine.cf_handle(Cf::Meta);
        let (last_applied, membership) =
            raft_progress(|key| engine.db().get_cf(meta, key)).map_err(|e| e.to_string())?;
        let mut records = Vec::new();
        for item in
            engine.db().iterator_cf(engine.cf_handle(Cf::Lease), rocksdb::IteratorMode::Start)
        {
            let (_, v) = item.map_err(|e| e.to_string())?;
            records.push(LeaseRecord::decode(v.as_ref()).map_err(|e| e.to_string())?);
        }
        Ok(Self { store, leases: LeaseTable::from_records(records), last_applied, membership })
    }
}

impl Shared {
    /// Reads from the MVCC store. Every read takes its own consistent engine view, so readers
    /// need no lock and never block apply.
    pub fn reader(&self) -> &MvccReader<RocksEngine> {
        &self.reader
    }

    /// Runs `f` with read access to the MVCC store. Reads use a consistent RocksDB view, so
    /// holding the lock only keeps the store from being swapped by a snapshot install.
    pub fn with_store<T>(&self, f: impl FnOnce(&MvccStore<RocksEngine>) -> T) -> T {
        f(&self.inner.read().store)
    }

    pub fn with_leases<T>(&self, f: impl FnOnce(&LeaseTable) -> T) -> T {
        f(&self.inner.read().leases)
    }

    /// The store revision as of the last apply or install; never waits for either.
    pub fn revision(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }

    pub fn last_applied(&self) -> Option<LogId> {
        self.inner.read().last_applied
    }

    pub fn membership(&self) -> StoredMembership {
        self.inner.read().membership.clone()
    }

    pub fn engine(&self) -> &RocksEngine {
        &self.engine
    }

    /// The applied alarm set's NOSPACE, as of the last applied batch (`crate::quota`).
    pub fn alarms(&self) -> &crate::quota::AlarmCache {
        &self.alarms
    }

    /// Where a forwarding member registers its waiters (`super::forwarded`).
    pub fn forwarded(&self) -> &Arc<super::forwarded::ForwardedResults> {
        &self.forwarded
    }

    /// Observes batch commit latency in `disk` from now on (the first call wins).
    pub fn set_disk_metrics(&self, disk: crate::metrics::disk::DiskMetrics) {
        let _ = self.disk.set(disk);
    }

    /// The applied auth store (users, roles, permissions; `crate::auth`).
    pub fn auth(&self) -> Arc<picket_proto::picket::storage::v1::AuthState> {
        self.auth.get()
    }

    /// A new path for a snapshot being received from the leader (`raft::snapshot_transfer`).
    pub fn snapshot_receiving_path(&self) -> std::path::PathBuf {
        self.snapshots.receiving_path()
    }

    /// Subscribes to the events of every revision applied from now on, and to every snapshot
    /// install (see [`FeedItem`]).
    pub fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        self.events.subscribe()
    }
}
