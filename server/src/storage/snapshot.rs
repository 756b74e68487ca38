//! Snapshots of the state machine, written from a RocksDB point-in-time view.
//!
//! A snapshot is every key of the state-machine column families (never the Raft log's), in one
//! self-checking blob:
//!
//! ```text
//! "PICKETSNAP" version:u8
//! { cf:u8  key_len:u32le key  value_len:u32le value }*
//! 0xFF  sha256(everything before):32
//! ```
//!
//! [`write_blob`] streams the blob record by record from a view, hashing as it goes, so nothing
//! of the store is held in memory to write one. A member keeps its current snapshot as a pinned
//! view, not as a blob (`storage::pinned`): the blob is written only to send it to a follower
//! (into a `sending-*.snap` file in `<data-dir>/snapshots/`, kept while the snapshot is in
//! use) or to answer `Maintenance.Snapshot`
//! ([`build`]). Only installing a received one reads its blob into memory, as the install is one
//! atomic batch. (Until session 29 every build wrote the blob to `snapshots/current.snap`; a
//! file left by an older version is removed at start.)

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use rocksdb::{IteratorMode, SnapshotWithThreadMode, WriteBatch, WriteOptions, DB};
use sha2::{Digest, Sha256};
use thiserror::Error;

const MAGIC: &[u8] = b"PICKETSNAP";
const VERSION: u8 = 1;
const END: u8 = 0xFF;

/// The state-machine column families a snapshot carries, in the order they are written. The
/// index in this list is the `cf` byte of a record.
pub const SNAPSHOT_CFS: &[&str] = &["kv", "changelog", "meta", "lease", "lease_keys"];

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error("snapshot is malformed: {0}")]
    Malformed(&'static str),
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("storage: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
    #[error("snapshot metadata: {0}")]
    Meta(#[from] postcard::Error),
}

fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, SnapshotError> {
    db.cf_handle(name).ok_or(SnapshotError::Malformed("column family missing"))
}

/// A point-in-time view of the database.
pub type View<'a> = SnapshotWithThreadMode<'a, DB>;

/// A writer that hashes and counts what passes through it, so the blob's trailer is computed
/// while the blob streams.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the blob of the state-machine column families as `view` sees them into `out`, one
/// record at a time, so it is a consistent cut even while apply keeps writing and nothing of the
/// store is held in memory. Returns the blob's length.
pub fn write_blob(db: &DB, view: &View<'_>, out: impl Write) -> Result<u64, SnapshotError> {
    let mut w = Hashing { inner: out, hash: Sha256::new(), bytes: 0 };
    w.write_all(MAGIC)?;
    w.write_all(&[VERSION])?;
    for (i, name) in SNAPSHOT_CFS.iter().enumerate() {
        let handle = cf(db, name)?;
        for item in view.iterator_cf(handle, IteratorMode::Start) {
            let (k, v) = item?;
            w.write_all(&[i as u8])?;
            write_chunk(&mut w, &k)?;
            write_chunk(&mut w, &v)?;
        }
    }
    w.write_all(&[END])?;
    let Hashing { mut inner, hash, bytes } = w;
    inner.write_all(&hash.finalize())?;
    Ok(bytes + 32)
}

/// The blob of the store as it is now, in memory (`Maintenance.Snapshot` and tests; members
/// keep theirs as pinned views, `storage::pinned`).
pub fn build(db: &DB) -> Result<Vec<u8>, SnapshotError> {
    let view = db.snapshot();
    let mut out = Vec::with_capacity(1 << 16);
    write_blob(db, &view, &mut out)?;
    Ok(out)
}

fn write_chunk(w: &mut impl Write, bytes: &[u8]) -> Result<(), SnapshotError> {
    let len =
        u32::try_from(bytes.len()).map_err(|_| SnapshotError::Malformed("record over 4 GiB"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(bytes)?;
    Ok(())
}

/// One decoded record: column family index, key, value.
type Record<'a> = (usize, &'a [u8], &'a [u8]);

/// Checks the trailer and splits the blob into records, without touching the database.
pub fn parse(blob: &[u8]) -> Result<Vec<Record<'_>>, SnapshotError> {
    if blob.len() < MAGIC.len() + 1 + 1 + 32 || !blob.starts_with(MAGIC) {
        return Err(SnapshotError::Malformed("bad header"));
    }
    if blob[MAGIC.len()] != VERSION {
        return Err(SnapshotError::Malformed("unknown version"));
    }
    let (body, digest) = blob.split_at(blob.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err(SnapshotError::Checksum);
    }
    let mut rest = &body[MAGIC.len() + 1..];
    let mut records = Vec::new();
    loop {
        let (&tag, tail) = rest.split_first().ok_or(SnapshotError::Malformed("truncated"))?;
        if tag == END {
            if !tail.is_empty() {
                return Err(SnapshotError::Malformed("data after end marker"));
            }
            return Ok(records);
        }
        let cf = tag as usize;
        if cf >= SNAPSHOT_CFS.len() {
            return Err(SnapshotError::Malformed("unknown column family"));
        }
        let (key, tail) = take_chunk(tail)?;
        let (value, tail) = take_chunk(tail)?;
        records.push((cf, key, value));
        rest = tail;
    }
}

fn take_chunk(buf: &[u8]) -> Result<(&[u8], &[u8]), SnapshotError> {
    if buf.len() < 4 {
        return Err(SnapshotError::Malformed("truncated length"));
    }
    let (len, rest) = buf.split_at(4);
    let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if rest.len() < len {
        return Err(SnapshotError::Malformed("truncated record"));
    }
    Ok(rest.split_at(len))
}

/// Replaces the whole state machine with the snapshot's contents in one atomic, synced write.
pub fn install(db: &DB, blob: &[u8]) -> Result<(), SnapshotError> {
    let records = parse(blob)?;
    let mut batch = WriteBatch::default();
    for name in SNAPSHOT_CFS {
        let handle = cf(db, name)?;
        // Delete key by key rather than by range: user keys are unbounded byte strings, so no
        // finite range end covers them all.
        for item in db.iterator_cf(handle, IteratorMode::Start) {
            let (k, _) = item?;
            batch.delete_cf(handle, k);
        }
    }
    for (i, k, v) in records {
        batch.put_cf(cf(db, SNAPSHOT_CFS[i])?, k, v);
    }
    let mut opts = WriteOptions::default();
    // Durability: after install openraft may purge every log entry the snapshot covers, so the
    // installed state must be on disk before we return.
    opts.set_sync(true);
    db.write_opt(batch, &opts)?;
    Ok(())
}

/// The member's snapshot directory: files of snapshots being received, and the files snapshots
/// are written into to be sent (`storage::pinned`).
pub struct SnapshotFiles {
    dir: PathBuf,
    /// Numbers the files of snapshots being received.
    receiving: std::sync::atomic::AtomicU64,
}

/// Files of earlier versions: the snapshot every build used to write, and its temp file.
const OLD_CURRENT: [&str; 2] = ["current.snap", "current.snap.tmp"];

impl SnapshotFiles {
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // A snapshot that was being received when the member stopped is incomplete (openraft
            // starts any transfer over), one being written to send was for a transfer that
            // ended, and a snapshot file of an older version is never read again: all garbage.
            if name.starts_with(RECEIVING)
                || name.starts_with(super::pinned::SENDING)
                || OLD_CURRENT.contains(&name.as_str())
            {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(Self { dir, receiving: std::sync::atomic::AtomicU64::new(0) })
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// A fresh path for a snapshot being received (removed by its data when dropped).
    pub fn receiving_path(&self) -> PathBuf {
        let n = self.receiving.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.dir.join(format!("{RECEIVING}{n}.tmp"))
    }
}

/// Prefix of the files of snapshots being received.
const RECEIVING: &str = "receiving-";
