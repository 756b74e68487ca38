//! [`MvccStore`], the MVCC key-value store over an [`Engine`], and [`MvccReader`], a cloneable
//! read-only handle to it.
//!
//! Reads never use in-memory state: each takes one engine view and reads the revision counters
//! from that same view, so a concurrent apply or compaction cannot tear a read. (The apply path,
//! the single writer, reads through the store itself, which puts its newest-record cache in
//! front of the engine: `newest`.)

use picket_proto::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use picket_proto::mvccpb::Event;
use picket_proto::picket::storage::v1::RevisionEvents;
use prost::Message;

use super::apply::ApplyBatch;
use super::compact::read_physical;
use super::error::MvccError;
use super::follow::Followers;
use super::meta_cache::MetaCache;
use super::newest::NewestCache;
use super::read::{self, read_revisions};
use super::request::{lease_keys, Request};
use super::{keys, txn, validate, LeaseLookup};
use crate::storage::engine::{Cf, Engine, EngineError, Known, KvIter, ReadView};

/// Events by revision, in revision order.
pub type History = Vec<(i64, Vec<Event>)>;

/// The MVCC store. The single writer (the state machine) owns it; see [`MvccStore::reader`]
/// for concurrent readers.
pub struct MvccStore<E: Engine> {
    engine: E,
    revision: i64,
    compacted: i64,
    /// How far old records were physically dropped; `<= compacted` (see `compact`).
    physical: i64,
    /// Scan floors, by key prefix: every live key under the prefix is at or above its floor
    /// (see [`crate::mvcc::ApplyBatch::scan_floor`]). This member's own, never replicated and
    /// empty at open.
    pub(super) floors: std::collections::HashMap<Vec<u8>, Vec<u8>>,
    /// State beside the store that follows the writes under a prefix (`follow`). This
    /// member's own, never replicated and empty at open.
    pub(super) followers: Followers,
    /// The newest record of recently used keys, for the apply path only (`newest`).
    pub(super) newest: NewestCache,
    /// The meta records the apply path reads, as committed (`meta_cache`).
    pub(super) meta: MetaCache,
}

/// The committed state as the apply path reads it: the engine, with the newest-record cache
/// in front of single-key version reads (`newest`) and the meta cache in front of meta reads
/// (`meta_cache`).
impl<E: Engine> ReadView for MvccStore<E> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        match cf {
            Cf::Meta => self.meta.get(&self.engine, key),
            _ => self.engine.get(cf, key),
        }
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        self.engine.scan(cf, start, end)
    }

    fn first_known(&self, cf: Cf, start: &[u8], end: &[u8]) -> Known {
        // Exactly one user key's versions: `[enc, versions_end(enc))`.
        (cf == Cf::Kv && keys::is_versions_range(start, end))
            .then(|| self.newest.newest(&self.engine, start))
    }
}

impl<E: Engine> std::fmt::Debug for MvccStore<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MvccStore")
            .field("revision", &self.revision)
            .field("compact_revision", &self.compacted)
            .field("compact_physical", &self.physical)
            .finish_non_exhaustive()
    }
}

impl<E: Engine> MvccStore<E> {
    /// Opens the store on `engine`, recovering the revision counters. An empty engine is a
    /// fresh store at revision 1 (etcd's first write gets revision 2).
    pub fn open(engine: E) -> Result<Self, MvccError> {
        let revs = read_revisions(&engine)?;
        let physical = read_physical(&engine, revs.compacted)?;
        tracing::info!(
            revision = revs.current,
            compact_revision = revs.compacted,
            compact_physical = physical,
            "mvcc store opened"
        );
        Ok(Self {
            engine,
            revision: revs.current,
            compacted: revs.compacted,
            physical,
            floors: Default::default(),
            followers: Followers::default(),
            newest: NewestCache::default(),
            meta: MetaCache::default(),
        })
    }

    /// Re-reads the revision counters, after the engine's contents were replaced underneath
    /// (snapshot install).
    pub fn reload(&mut self) -> Result<(), MvccError> {
        self.newest.clear();
        self.meta.clear();
        // What a scan learned of the old contents says nothing of the new.
        self.floors.clear();
        self.followers.clear();
        let revs = read_revisions(&self.engine)?;
        self.physical = read_physical(&self.engine, revs.compacted)?;
        self.revision = revs.current;
        self.compacted = revs.compacted;
        Ok(())
    }

    /// The revision of the last committed change (1 on a fresh store).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The compaction point, or -1 if the store was never compacted (etcd's initial value).
    pub fn compact_revision(&self) -> i64 {
        self.compacted
    }

    /// How far old records were physically dropped: equal to [`MvccStore::compact_revision`]
    /// once compaction has caught up, lower while bounded steps remain (see `compact`).
    pub fn compact_physical(&self) -> i64 {
        self.physical
    }

    pub(crate) fn set_revisions(&mut self, revision: i64, compacted: i64, physical: i64) {
        self.revision = revision;
        self.compacted = compacted;
        self.physical = physical;
    }

    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Starts the batch for one Raft `apply()` call.
    pub fn begin_apply(&mut self) -> ApplyBatch<'_, E> {
        ApplyBatch::new(self)
    }

    /// A read-only handle that can live on other threads while this store keeps applying.
    pub fn reader(&self) -> MvccReader<E>
    where
        E: Clone,
    {
        MvccReader { engine: self.engine.clone() }
    }

    /// etcd Range; see [`MvccReader::range`].
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        range(&self.engine, req)
    }

    /// A read-only Txn; see [`MvccReader::read_txn`].
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        read_txn(&self.engine, req)
    }

    /// Changelog events; see [`MvccReader::events`].
    pub fn events(&self, from_rev: i64, to_rev: i64) -> Result<Vec<(i64, Vec<Event>)>, MvccError> {
        events(&self.engine, from_rev, to_rev)
    }

    /// Keys attached to a lease; see [`MvccReader::keys_of_lease`].
    pub fn keys_of_lease(&self, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        keys_of_lease(&self.engine, lease)
    }
}

/// Read-only access to an [`MvccStore`]'s engine; every call reads one consistent view.
#[derive(Debug, Clone)]
pub struct MvccReader<E> {
    engine: E,
}

impl<E: Engine> MvccReader<E> {
    /// etcd Range. The header carries the store's current revision at the read, whatever
    /// revision was read.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        range(&self.engine, req)
    }

    /// A txn whose ops are all ranges ([`validate::is_txn_read_only`]), served from one view
    /// without going through apply. Anything else is [`MvccError::TxnNotReadOnly`].
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        read_txn(&self.engine, req)
    }

    /// The events of every revision in `[from_rev, to_rev]`, in revision order, from the
    /// changelog (watch replay). [`MvccError::Compacted`] if `from_rev` is below the compaction
    /// point; revisions past the current one are simply absent.
    pub fn events(&self, from_rev: i64, to_rev: i64) -> Result<Vec<(i64, Vec<Event>)>, MvccError> {
        events(&self.engine, from_rev, to_rev)
    }

    /// Like [`MvccReader::events`], but stops after the revision at which the events read
    /// reach `max_bytes` encoded (at least one revision is read). Returns the events and the
    /// revision they cover through (`to_rev` if the whole range was read).
    pub fn events_bounded(
        &self,
        from_rev: i64,
        to_rev: i64,
        max_bytes: usize,
    ) -> Result<(History, i64), MvccError> {
        events_bounded(&self.engine, from_rev, to_rev, max_bytes)
    }

    /// Every live key attached to `lease`, in key order.
    pub fn keys_of_lease(&self, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        keys_of_lease(&self.engine, lease)
    }

    /// The current and compacted revisions, read together.
    pub fn revisions(&self) -> Result<(i64, i64), MvccError> {
        let revs = read_revisions(&self.engine.view())?;
        Ok((revs.current, revs.compacted))
    }
}

fn range<E: Engine>(engine: &E, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
    let view = engine.view();
    let revs = read_revisions(&view)?;
    read::range(&view, req, revs.current, revs.compacted)
}

/// No lease exists: a read-only txn has no puts to check.
struct NoLeases;

impl LeaseLookup for NoLeases {
    fn exists(&self, _id: i64) -> bool {
        false
    }
}

fn read_txn<E: Engine>(engine: &E, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
    if !validate::is_txn_read_only(req) {
        return Err(MvccError::TxnNotReadOnly);
    }
    let view = engine.view();
    let revs = read_revisions(&view)?;
    let mut ctx = Request::new(&view, revs.current, revs.compacted);
    txn::txn(&mut ctx, req, &NoLeases)
}

fn events<E: Engine>(
    engine: &E,
    from_rev: i64,
    to_rev: i64,
) -> Result<Vec<(i64, Vec<Event>)>, MvccError> {
    events_bounded(engine, from_rev, to_rev, usize::MAX).map(|(batch, _)| batch)
}

/// The events of `[from_rev, to_rev]` in revision order, stopping after the first revision at
/// which their encoded size reaches `max_bytes` (at least one revision, however large). Returns
/// them and the revision they cover through: `to_rev` when the range was read to its end.
fn events_bounded<E: Engine>(
    engine: &E,
    from_rev: i64,
    to_rev: i64,
    max_bytes: usize,
) -> Result<(History, i64), MvccError> {
    let view = engine.view();
    let revs = read_revisions(&view)?;
    if from_rev < revs.compacted {
        return Err(MvccError::Compacted);
    }
    let from = from_rev.max(1);
    if to_rev < from {
        return Ok((Vec::new(), to_rev));
    }
    let start = keys::changelog_key(from);
    let end = keys::changelog_key(to_rev.saturating_add(1));
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for item in view.scan(Cf::Changelog, &start, Some(&end)) {
        let (k, v) = item?;
        let rev = keys::decode_changelog_key(&k)
            .ok_or_else(|| MvccError::Corrupt(format!("malformed changelog key {k:02x?}")))?;
        bytes = bytes.saturating_add(v.len());
        out.push((rev, RevisionEvents::decode(v.as_slice())?.events));
        if bytes >= max_bytes && rev < to_rev {
            return Ok((out, rev));
        }
    }
    Ok((out, to_rev))
}

fn keys_of_lease<E: Engine>(engine: &E, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
    lease_keys(&engine.view(), lease)
}
