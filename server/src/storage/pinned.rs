//! A snapshot kept as a pinned point-in-time view of the store, not as a copy.
//!
//! openraft asks for a snapshot every `--snapshot-count` applied entries, so that it may purge
//! the log the snapshot covers; it reads the snapshot's data only to send it to a follower that
//! needs the purged part. Picket used to write the whole store (its history included) into
//! `snapshots/current.snap` at every build: in session 28's 600 s `set` long run each member
//! built 112-133 snapshots of up to 950 MB, about 100 GB written per member, for 19 sends. etcd
//! copies nothing to snapshot (its database file is the snapshot). Here a build takes a RocksDB
//! snapshot (a sequence number the engine keeps readable) and reads the metadata from it, which
//! costs the same whatever the store's size; the blob is written from the view the first time
//! it is sent ([`crate::raft::snapshot_data::SnapshotData::spill`], into a file kept as long as
//! the snapshot is current or being sent) or when it is installed elsewhere.
//!
//! What keeps this safe:
//! - **The blob and the metadata are one cut.** Both are read from the same view, as before.
//! - **The view is durable before the log it replaces is purged.** The state it shows was
//!   written by apply through the shared WAL without a sync; openraft purges log entries only
//!   after the build returns, and the purge is a synced write to that WAL, which makes every
//!   earlier apply durable first (`storage::log_store`'s purge).
//! - **A restart needs no file.** The view is memory only. After a restart the member's first
//!   snapshot is its store as recovered (`last_applied` >= anything purged, by the rule above),
//!   pinned when openraft first asks for the current snapshot.
//! - **What a pin costs.** While pinned, RocksDB keeps the versions the view sees even if they
//!   are overwritten or deleted since (compaction cannot drop them): at most one snapshot
//!   interval of overwrites, mostly the Raft log entries purged meanwhile. An older view being
//!   sent stays pinned until its transfer ends.

use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rocksdb::DB;

use super::engine::Cf;
use super::rocks::RocksEngine;
use super::shared::raft_progress;
use super::snapshot::{self, SnapshotError, View};
use crate::raft::snapshot_data::SnapshotSource;
use crate::raft::types::SnapshotMeta;

self_cell::self_cell!(
    /// A RocksDB view together with the database handle it borrows from, so the view can
    /// outlive the call that took it.
    struct PinnedView {
        owner: Arc<DB>,
        #[covariant]
        dependent: View,
    }
);

/// Prefix of the files a snapshot's blob is written into to be sent; each is removed with its
/// snapshot, and any left by a crash at the next start (`SnapshotFiles::new`).
pub(crate) const SENDING: &str = "sending-";

/// Numbers the files snapshots are written into to be sent.
static SPILLS: AtomicU64 = AtomicU64::new(0);

/// One snapshot: the store as a view saw it, and that view's Raft metadata.
pub struct Pinned {
    view: PinnedView,
    meta: SnapshotMeta,
    /// Where the file to send it from is made (the member's snapshot directory).
    dir: PathBuf,
    /// That file, once written: kept while this snapshot is current or being sent, so every
    /// transfer of it (one per follower, and openraft's retries) reads one copy. Locked while
    /// it is written, so a second transfer waits for the first copy instead of making its own.
    blob_file: parking_lot::Mutex<Option<PathBuf>>,
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinned").field("meta", &self.meta).finish()
    }
}

impl Pinned {
    /// Pins the store as it is now. Cheap: a RocksDB snapshot and two point reads.
    pub fn take(engine: &RocksEngine, dir: PathBuf) -> Result<Self, SnapshotError> {
        let view = engine.whole(|| PinnedView::new(Arc::clone(engine.db()), |db| db.snapshot()));
        let meta = view.with_dependent(|_, v| snapshot_meta(engine, v))?;
        Ok(Self { view, meta, dir, blob_file: parking_lot::Mutex::new(None) })
    }

    pub fn meta(&self) -> &SnapshotMeta {
        &self.meta
    }
}

impl SnapshotSource for Pinned {
    fn write_blob(&self, out: &mut dyn io::Write) -> io::Result<u64> {
        self.view.with_dependent(|db, view| snapshot::write_blob(db, view, out)).map_err(
            |e| match e {
                SnapshotError::Io(e) => e,
                other => io::Error::other(other),
            },
        )
    }

    fn open_blob(&self) -> io::Result<std::fs::File> {
        let mut blob_file = self.blob_file.lock();
        let path = match &*blob_file {
            Some(path) => path.clone(),
            None => {
                let n = SPILLS.fetch_add(1, Ordering::Relaxed);
                let index = self.meta.last_log_id.map_or(0, |l| l.index);
                let path = self.dir.join(format!("{SENDING}{index}-{n}.snap"));
                let mut w = io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
                // Not synced: the file only feeds transfers of this snapshot, which a crash
                // ends anyway (and the next start removes it).
                let written = self.write_blob(&mut w).and_then(|_| w.flush());
                if let Err(e) = written {
                    // Nothing else refers to a half-written file; an error removing it leaves
                    // it to the next start.
                    let _ = std::fs::remove_file(&path);
                    return Err(e);
                }
                *blob_file = Some(path.clone());
                path
            }
        };
        std::fs::File::open(path)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(path) = self.blob_file.get_mut().take() {
            // An error leaves the file to the next start, which removes every `sending-` file.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The metadata of a snapshot of `view`: which entry it covers and the membership then, read
/// from the view's own meta column family, so they describe exactly the cut.
fn snapshot_meta(engine: &RocksEngine, view: &View<'_>) -> Result<SnapshotMeta, SnapshotError> {
    let meta_cf = engine.cf_handle(Cf::Meta);
    let (last_log_id, last_membership) = raft_progress(|key| view.get_cf(meta_cf, key))?;
    // openraft 0.10 dropped the snapshot id; each transfer names itself
    // (`raft::snapshot_transfer`).
    Ok(SnapshotMeta { last_log_id, last_membership })
}
