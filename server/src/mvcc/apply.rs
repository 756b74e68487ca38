//! The write side: an [`ApplyBatch`] spans every command of one Raft `apply()` call.
//!
//! Commands accumulate in an in-memory overlay that later commands read through, and
//! [`ApplyBatch::commit`] writes the whole overlay as one engine batch together with the
//! revision counters and whatever the state machine added with [`ApplyBatch::put_raw`] (last
//! applied log id, membership, lease records). A crash therefore leaves either all of an
//! `apply()` call on disk or none of it. Dropping a batch without committing discards it.

use picket_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::{Event, KeyValue};

use super::compact::{self, DELETES_PER_STEP};
use super::error::MvccError;
use super::follow::Follower;
use super::keys;
use super::overlay::{Layered, Overlay};
use super::request::{header, Request};
use super::store::MvccStore;
use super::{read, txn, LeaseLookup};
use crate::storage::engine::{Cf, Engine, ReadView};

/// Writes of one Raft `apply()` call; see the module docs. Created by
/// [`MvccStore::begin_apply`].
pub struct ApplyBatch<'s, E: Engine> {
    store: &'s mut MvccStore<E>,
    overlay: Overlay,
    revision: i64,
    compacted: i64,
    /// The physical compaction point including the steps run so far in this batch.
    physical: i64,
    events: Vec<(i64, Vec<Event>)>,
}

impl<'s, E: Engine> ApplyBatch<'s, E> {
    pub(crate) fn new(store: &'s mut MvccStore<E>) -> Self {
        let (revision, compacted) = (store.revision(), store.compact_revision());
        let physical = store.compact_physical();
        Self {
            store,
            overlay: Overlay::default(),
            revision,
            compacted,
            physical,
            events: Vec::new(),
        }
    }

    /// The store revision including the requests applied so far in this batch.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The compaction point including compactions applied so far in this batch (-1 if the
    /// store was never compacted).
    pub fn compact_revision(&self) -> i64 {
        self.compacted
    }

    /// This batch's writes so far.
    #[cfg(test)]
    pub(crate) fn overlay_for_tests(&self) -> &Overlay {
        &self.overlay
    }

    /// The engine under the store, without the store's caches.
    #[cfg(test)]
    pub(crate) fn engine_for_tests(&self) -> &E {
        self.store.engine()
    }

    fn view(&self) -> Layered<'_> {
        // The store, not its engine: it adds the newest-record cache (`newest`).
        Layered { base: &*self.store, top: &self.overlay }
    }

    /// Runs one request in its own layer; keeps its writes (and takes its revision) only if it
    /// succeeds.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Request<'_>) -> Result<T, MvccError>,
    ) -> Result<T, MvccError> {
        // One bounded step of a pending physical compaction rides on every request, so the
        // steps follow the log and every member runs the same ones (see `compact`).
        self.compact_step(DELETES_PER_STEP)?;
        let (out, mut layer, changes) = {
            let base = self.view();
            let mut req = Request::new(&base, self.revision, self.compacted);
            let out = f(&mut req)?;
            (out, req.layer, req.changes)
        };
        if !changes.is_empty() {
            // A key put below a scan floor lowers it, so the floor stays at or below every live
            // key under its prefix. Deletes cannot break that.
            if !self.store.floors.is_empty() {
                for e in changes.iter().filter(|e| e.r#type == EventType::Put as i32) {
                    let Some(kv) = e.kv.as_ref() else { continue };
                    for (prefix, floor) in self.store.floors.iter_mut() {
                        if kv.key.starts_with(prefix) && kv.key < *floor {
                            floor.clone_from(&kv.key);
                        }
                    }
                }
            }
            // Followers hear of the request before any later one runs (`follow`).
            if !self.store.followers.is_empty() {
                self.store.followers.follow(&changes);
            }
            let rev = self.revision + 1;
            layer.put(Cf::Changelog, keys::changelog_key(rev).to_vec(), encode_changes(&changes));
            self.revision = rev;
            self.events.push((rev, changes));
            tracing::trace!(revision = rev, "request applied");
        }
        self.overlay.absorb(layer);
        Ok(out)
    }

    /// etcd Put. `leases` says which leases exist.
    pub fn put(
        &mut self,
        req: &PutRequest,
        leases: &dyn LeaseLookup,
    ) -> Result<PutResponse, MvccError> {
        self.run(|r| r.put(req, leases, true))
    }

    /// etcd DeleteRange. Deleting nothing takes no revision.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, MvccError> {
        self.run(|r| r.delete_range(req))
    }

    /// etcd Txn (see [`crate::mvcc`] for the rules). All writes share one revision; a txn that
    /// writes nothing takes none.
    pub fn txn(
        &mut self,
        req: &TxnRequest,
        leases: &dyn LeaseLookup,
    ) -> Result<TxnResponse, MvccError> {
        self.run(|r| txn::txn(r, req, leases))
    }

    /// A Range that sees this batch's writes.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        read::range(&self.view(), req, self.revision, self.compacted)
    }

    /// Up to `limit` live keys of `[key, range_end)` (etcd's range pair) in key order, at this
    /// batch's revision. Unlike [`Self::range`] it stops at the limit instead of counting every
    /// key in the range.
    pub fn live(
        &self,
        key: &[u8],
        range_end: &[u8],
        limit: usize,
    ) -> Result<Vec<KeyValue>, MvccError> {
        let view = self.view();
        read::Visible::etcd_range(&view, key, range_end, self.revision)
            .take(limit)
            .map(|v| read::decode_kv(&v?))
            .collect()
    }

    /// The user keys attached to `lease`, in key order, as this batch sees them.
    pub fn lease_keys(&self, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        super::request::lease_keys(&self.view(), lease)
    }

    /// Where a scan of the live keys under `prefix` may start: a key at or below every live key
    /// under it, or `None` (start at the prefix). A deleted key stays in the history until
    /// compaction, and a scan from the prefix passes every one; a reader that scans one prefix
    /// over and over while keys under it come and go (a queue's claim-order index) records with
    /// [`Self::set_scan_floor`] where the live keys began, and starts there next time.
    ///
    /// Floors are this member's own and start empty, but a scan from the floor sees exactly the
    /// live keys a scan from the prefix sees: every put below a floor lowers it (in the request
    /// that writes it), so applying stays deterministic. A floor set from this batch's view is
    /// kept even if the batch were not committed; that is safe because a batch that fails to
    /// commit stops the member (`apply::Fatal`), dropping the store with its floors.
    pub fn scan_floor(&self, prefix: &[u8]) -> Option<Vec<u8>> {
        self.store.floors.get(prefix).cloned()
    }

    /// Records that no live key under `prefix` is below `floor` (the caller scanned from the
    /// prefix or from the previous floor and found the first live key at `floor`, or none: then
    /// `floor` is the prefix's end). A floor outside the prefix is ignored.
    pub fn set_scan_floor(&mut self, prefix: &[u8], floor: Vec<u8>) {
        if floor.as_slice() >= prefix {
            self.store.floors.insert(prefix.to_vec(), floor);
        }
    }

    /// The follower of `prefix` (see [`super::follow`]), made by `make` if this store has
    /// none yet. It hears of every write under `prefix` from the next request on, this batch's
    /// included.
    pub fn follower<T: Follower>(&mut self, prefix: &[u8], make: impl FnOnce() -> T) -> &mut T {
        self.store.followers.get_or_insert(prefix, make)
    }

    /// Forgets every scan floor and follower, as a member that just opened the store has none:
    /// tests run each command with and without them and compare.
    #[cfg(test)]
    pub(crate) fn forget_hints(&mut self) {
        self.store.floors.clear();
        self.store.followers.clear();
    }

    /// etcd Compact: records the new compaction point, from which on reads below it are
    /// refused, and runs the first bounded step of dropping the history no revision at or
    /// after it can show; later requests run the rest (see `compact`). The response header
    /// has the current revision.
    pub fn compact(&mut self, req: &CompactionRequest) -> Result<CompactionResponse, MvccError> {
        let rev = req.revision;
        if rev <= self.compacted {
            return Err(MvccError::Compacted);
        }
        if rev > self.revision {
            return Err(MvccError::FutureRevision);
        }
        tracing::info!(revision = rev, previous = self.compacted, "compacted");
        self.compacted = rev;
        self.compact_step(DELETES_PER_STEP)?;
        Ok(CompactionResponse { header: header(self.revision) })
    }

    /// Runs one step of physical compaction, buffering at most about `limit` deletes (see
    /// `compact::step`), if any remains. Returns how many records it deletes. Changes nothing
    /// any read at or above the compaction point sees.
    pub(crate) fn compact_step(&mut self, limit: usize) -> Result<usize, MvccError> {
        if self.physical >= self.compacted {
            return Ok(0);
        }
        let step = compact::step(&self.view(), self.physical, self.compacted, limit)?;
        self.overlay.absorb(step.deletes);
        self.physical = step.reached;
        Ok(step.count)
    }

    /// A `CompactStep` command: one step of the standard size, proposed by the leader while
    /// physical compaction lags and no client write drives it (see `compact`). A no-op when
    /// nothing is pending.
    pub fn run_compact_step(&mut self) -> Result<usize, MvccError> {
        self.compact_step(DELETES_PER_STEP)
    }

    /// The physical compaction point including this batch's steps; equal to
    /// [`ApplyBatch::compact_revision`] when no step remains.
    pub fn compact_physical(&self) -> i64 {
        self.physical
    }

    /// Deletes every key attached to `lease`, all in one new revision (none if there are no
    /// such keys). Returns the deleted keys in key order. The lease record itself is the
    /// caller's (see [`ApplyBatch::delete_raw`]).
    pub fn revoke_lease_keys(&mut self, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        self.run(|r| r.revoke_lease_keys(lease))
    }

    /// Reads a record of a non-MVCC column family, seeing this batch's writes.
    pub fn get_raw(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, MvccError> {
        Ok(self.view().get(cf, key)?)
    }

    /// Writes a record in the same engine batch. Meant for the state machine's own records
    /// (`Cf::Meta` keys outside `mvcc/`, `Cf::Lease`); the MVCC column families (`Kv`,
    /// `Changelog`, `LeaseKeys`) and the `mvcc/` meta keys belong to this module.
    pub fn put_raw(&mut self, cf: Cf, key: &[u8], value: &[u8]) {
        self.overlay.put(cf, key.to_vec(), value.to_vec());
    }

    /// Whether this batch writes (puts or deletes) the record `key` of `cf`, so far.
    pub fn writes_raw(&self, cf: Cf, key: &[u8]) -> bool {
        self.overlay.table(cf).contains_key(key)
    }

    /// Deletes a record in the same engine batch; see [`ApplyBatch::put_raw`].
    pub fn delete_raw(&mut self, cf: Cf, key: &[u8]) {
        self.overlay.delete(cf, key.to_vec());
    }

    /// Writes the batch and returns the events of each new revision, in revision order, for
    /// the watchers. With `sync` the write is durable when this returns.
    pub fn commit(mut self, sync: bool) -> Result<Vec<(i64, Vec<Event>)>, MvccError> {
        if self.revision != self.store.revision() || self.compacted != self.store.compact_revision()
        {
            self.overlay.put(
                Cf::Meta,
                keys::META_REVISION.to_vec(),
                self.revision.to_be_bytes().to_vec(),
            );
            self.overlay.put(
                Cf::Meta,
                keys::META_COMPACT_REVISION.to_vec(),
                self.compacted.to_be_bytes().to_vec(),
            );
        }
        if self.physical != self.store.compact_physical()
            || self.compacted != self.store.compact_revision()
        {
            let key = keys::META_COMPACT_PHYSICAL.to_vec();
            if self.physical == self.compacted {
                self.overlay.delete(Cf::Meta, key);
            } else {
                self.overlay.put(Cf::Meta, key, self.physical.to_be_bytes().to_vec());
            }
        }
        let overlay = std::mem::take(&mut self.overlay);
        if !overlay.is_empty() {
            // The caches take the batch's Kv and Meta writes from the overlay before it is
            // consumed; if the write then fails they are cleared, so they never answer for
            // records the engine does not hold (`newest`, `meta_cache`). Nothing reads them in
            // between: this is their only user.
            let table = overlay.table(Cf::Kv);
            self.store.newest.committed(table.iter().map(|(k, v)| (k.as_slice(), v.as_deref())));
            let table = overlay.table(Cf::Meta);
            self.store.meta.committed(table.iter().map(|(k, v)| (k.as_slice(), v.as_deref())));
            if let Err(e) = self.store.engine().write(overlay.into_write_batch(), sync) {
                self.store.newest.clear();
                self.store.meta.clear();
                return Err(e.into());
            }
        }
        self.store.set_revisions(self.revision, self.compacted, self.physical);
        Ok(self.events)
    }
}

/// The `Cf::Changelog` record of one revision's events: the bytes of a
/// `picket.storage.v1.RevisionEvents` holding them, encoded from the borrowed events (building
/// the message would first clone every event, key and value included, only to encode it).
pub(crate) fn encode_changes(events: &[Event]) -> Vec<u8> {
    use prost::encoding::message;
    let mut out = Vec::with_capacity(message::encoded_len_repeated(1, events));
    for e in events {
        message::encode(1, e, &mut out);
    }
    out
}
