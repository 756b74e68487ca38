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
//! Building streams the blob record by record from a RocksDB snapshot straight into the
//! snapshot file (`<data-dir>/snapshots/current.snap`, [`SnapshotFiles::save_from`]), hashing
//! as it goes, so a member holds no copy of the store in memory to build one. (Before issue 20
//! every member serialized the whole store into one `Vec` every `--snapshot-count` entries: 80
//! to 220 MB at a time under the mixed benchmark, with the members' RSS growing by that much
//! each time.) openraft sends and receives the file as it is (`raft::snapshot_data`); only
//! installing a received one reads its blob into memory, as the install is one atomic batch.

use std::fs;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use rocksdb::{IteratorMode, SnapshotWithThreadMode, WriteBatch, WriteOptions, DB};
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
/// build theirs into a file with [`SnapshotFiles::save_from`]).
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

/// The newest snapshot kept on disk as one file, `<dir>/current.snap`: a length-prefixed
/// postcard [`SnapshotMeta`] followed by the blob. One file, so one rename replaces both at once.
pub struct SnapshotFiles {
    dir: PathBuf,
    /// Numbers the files of snapshots being received.
    receiving: std::sync::atomic::AtomicU64,
}

impl SnapshotFiles {
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, SnapshotError> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        // A snapshot that was being received when the member stopped is incomplete: openraft
        // starts any transfer over, so its file is garbage.
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with(RECEIVING) {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(Self { dir, receiving: std::sync::atomic::AtomicU64::new(0) })
    }

    /// Saves a snapshot with write-to-temp, fsync, rename, fsync-dir, so a crash leaves either
    /// the old or the new snapshot, never a torn one.
    pub fn save(&self, meta: &SnapshotMeta, blob: &[u8]) -> Result<(), SnapshotError> {
        let meta_bytes = postcard::to_allocvec(meta)?;
        write_durably(&self.dir, "current.snap", |f| {
            write_chunk(f, &meta_bytes)?;
            f.write_all(blob)?;
            Ok(())
        })
    }

    /// Saves a snapshot of the store as `view` sees it, the blob streamed from the view into
    /// the file ([`write_blob`]): the same file [`Self::save`] writes for that blob, durable the
    /// same way, with no copy of the store in memory. Returns the blob's length and the file
    /// opened for reading with the offset of the blob in it (not verified again: it was hashed
    /// as it was written).
    pub fn save_from(
        &self,
        meta: &SnapshotMeta,
        db: &DB,
        view: &View<'_>,
    ) -> Result<(u64, fs::File, u64), SnapshotError> {
        let meta_bytes = postcard::to_allocvec(meta)?;
        let n = write_durably(&self.dir, "current.snap", |f| {
            // Large writes: the blob is written in 1 MiB pieces, not record by record.
            let mut w = BufWriter::with_capacity(1 << 20, f);
            write_chunk(&mut w, &meta_bytes)?;
            let n = write_blob(db, view, &mut w)?;
            w.flush()?;
            Ok(n)
        })?;
        // Only the caller writes this file meanwhile (openraft builds and installs one snapshot
        // at a time), so what opens is what was just written.
        let file = fs::File::open(self.dir.join("current.snap"))?;
        Ok((n, file, 4 + meta_bytes.len() as u64))
    }

    /// The newest snapshot on disk, its checksum verified by reading it through once (nothing of
    /// it held in memory): the metadata, the open file, and the offset of the blob in it.
    pub fn open(&self) -> Result<Option<(SnapshotMeta, fs::File, u64)>, SnapshotError> {
        let mut file = match fs::File::open(self.dir.join("current.snap")) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let total = file.metadata()?.len();
        let mut len = [0u8; 4];
        file.read_exact(&mut len)?;
        let meta_len = u64::from(u32::from_le_bytes(len));
        if 4 + meta_len > total {
            return Err(SnapshotError::Malformed("truncated record"));
        }
        let mut meta_bytes = vec![0u8; meta_len as usize];
        file.read_exact(&mut meta_bytes)?;
        let meta: SnapshotMeta = postcard::from_bytes(&meta_bytes)?;
        let base = 4 + meta_len;
        verify(&mut file, total - base)?;
        Ok(Some((meta, file, base)))
    }

    /// A fresh path for a snapshot being received (removed by its data when dropped).
    pub fn receiving_path(&self) -> PathBuf {
        let n = self.receiving.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.dir.join(format!("{RECEIVING}{n}.tmp"))
    }
}

/// Prefix of the files of snapshots being received.
const RECEIVING: &str = "receiving-";

/// Checks a blob of `len` bytes read from `r` as [`parse`] does its header and trailer, reading
/// it in pieces: the header, then the SHA-256 of everything before the last 32 bytes.
fn verify(r: &mut impl Read, len: u64) -> Result<(), SnapshotError> {
    let head = (MAGIC.len() + 1) as u64;
    if len < head + 1 + 32 {
        return Err(SnapshotError::Malformed("bad header"));
    }
    let mut hash = Sha256::new();
    let mut header = vec![0u8; head as usize];
    r.read_exact(&mut header)?;
    if !header.starts_with(MAGIC) {
        return Err(SnapshotError::Malformed("bad header"));
    }
    if header[MAGIC.len()] != VERSION {
        return Err(SnapshotError::Malformed("unknown version"));
    }
    hash.update(&header);
    let mut left = len - head - 32;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        r.read_exact(&mut buf[..n])?;
        hash.update(&buf[..n]);
        left -= n as u64;
    }
    let mut digest = [0u8; 32];
    r.read_exact(&mut digest)?;
    if hash.finalize().as_slice() != digest {
        return Err(SnapshotError::Checksum);
    }
    Ok(())
}

fn write_durably<T>(
    dir: &Path,
    name: &str,
    fill: impl FnOnce(&mut fs::File) -> Result<T, SnapshotError>,
) -> Result<T, SnapshotError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = fs::File::create(&tmp)?;
    let out = fill(&mut f)?;
    // Durability: the file's contents must be on disk before the rename makes it current.
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    // Durability: fsync the directory so the rename itself survives a crash.
    fs::File::open(dir)?.sync_all()?;
    Ok(out)
}
