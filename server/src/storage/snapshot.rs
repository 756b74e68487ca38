//! Snapshots of the state machine, built from a RocksDB point-in-time view.
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
//! The blob is held in memory whole (openraft 0.9's default `Cursor<Vec<u8>>` snapshot data),
//! which bounds the store size we can snapshot by RAM; streaming it through
//! `generic-snapshot-data` is future work. The newest snapshot is also kept as a file in
//! `<data-dir>/snapshots/` so a restarted node can serve it to a lagging follower.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::raft::types::SnapshotMeta;

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

/// Serializes the state-machine column families as seen by one RocksDB snapshot, so the blob is
/// a consistent cut even while apply keeps writing.
pub fn build(db: &DB) -> Result<Vec<u8>, SnapshotError> {
    let snap = db.snapshot();
    let mut out = Vec::with_capacity(1 << 16);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    for (i, name) in SNAPSHOT_CFS.iter().enumerate() {
        let handle = cf(db, name)?;
        for item in snap.iterator_cf(handle, IteratorMode::Start) {
            let (k, v) = item?;
            out.push(i as u8);
            put_chunk(&mut out, &k)?;
            put_chunk(&mut out, &v)?;
        }
    }
    out.push(END);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    Ok(out)
}

fn put_chunk(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), SnapshotError> {
    let len =
        u32::try_from(bytes.len()).map_err(|_| SnapshotError::Malformed("record over 4 GiB"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
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

/// The newest snapshot kept on disk as one file, `<dir>/current.snap`: a length-prefixed
/// postcard [`SnapshotMeta`] followed by the blob. One file, so one rename replaces both at once.
pub struct SnapshotFiles {
    dir: PathBuf,
}

impl SnapshotFiles {
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// Saves a snapshot with write-to-temp, fsync, rename, fsync-dir, so a crash leaves either
    /// the old or the new snapshot, never a torn one.
    pub fn save(&self, meta: &SnapshotMeta, blob: &[u8]) -> Result<(), SnapshotError> {
        let meta_bytes = postcard::to_allocvec(meta)?;
        let mut file = Vec::with_capacity(4 + meta_bytes.len() + blob.len());
        put_chunk(&mut file, &meta_bytes)?;
        file.extend_from_slice(blob);
        write_durably(&self.dir, "current.snap", &file)
    }

    pub fn load(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, SnapshotError> {
        let path = self.dir.join("current.snap");
        if !path.exists() {
            return Ok(None);
        }
        let file = fs::read(path)?;
        let (meta_bytes, blob) = take_chunk(&file)?;
        let meta: SnapshotMeta = postcard::from_bytes(meta_bytes)?;
        parse(blob)?;
        Ok(Some((meta, blob.to_vec())))
    }
}

fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), SnapshotError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    // Durability: the file's contents must be on disk before the rename makes it current.
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    // Durability: fsync the directory so the rename itself survives a crash.
    fs::File::open(dir)?.sync_all()?;
    Ok(())
}
