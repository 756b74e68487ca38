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
//! ([`build`]). A received one is read back record by record ([`Records`]) into table files the
//! store ingests (`storage::snapshot_install`). (Until session 29 every build wrote the blob
//! to `snapshots/current.snap`; a file left by an older version is removed at start.)

use std::fs;
use std::io::{Read, Write};
use std::path::PathBuf;

use rocksdb::{IteratorMode, SnapshotWithThreadMode, DB};

use super::rocks::RocksEngine;
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
pub fn build(engine: &RocksEngine) -> Result<Vec<u8>, SnapshotError> {
    let db = engine.db();
    let view = engine.whole(|| db.snapshot());
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

/// Reads a blob record by record from a stream, hashing as it goes, so a snapshot of any size
/// is read with one record in memory. The checksum is known only at the end: a caller must not
/// act on what it read until [`Records::next_into`] returned `Ok(None)`.
pub struct Records<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Records<R> {
    /// Checks the header.
    pub fn new(inner: R) -> Result<Self, SnapshotError> {
        let mut records = Self { inner, hash: Sha256::new() };
        let mut head = [0u8; MAGIC.len() + 1];
        records.read(&mut head, "bad header")?;
        if !head.starts_with(MAGIC) {
            return Err(SnapshotError::Malformed("bad header"));
        }
        if head[MAGIC.len()] != VERSION {
            return Err(SnapshotError::Malformed("unknown version"));
        }
        Ok(records)
    }

    fn read(&mut self, buf: &mut [u8], short: &'static str) -> Result<(), SnapshotError> {
        read_full(&mut self.inner, buf, short)?;
        self.hash.update(&*buf);
        Ok(())
    }

    /// Reads the next record's key and value into `key` and `value` (buffers reused from call
    /// to call) and returns its column family index; `None` at the end marker, once the
    /// checksum matched and nothing follows it.
    pub fn next_into(
        &mut self,
        key: &mut Vec<u8>,
        value: &mut Vec<u8>,
    ) -> Result<Option<usize>, SnapshotError> {
        let mut tag = [0u8];
        self.read(&mut tag, "truncated")?;
        if tag[0] == END {
            let mut digest = [0u8; 32];
            read_full(&mut self.inner, &mut digest, "truncated")?;
            if std::mem::take(&mut self.hash).finalize().as_slice() != digest {
                return Err(SnapshotError::Checksum);
            }
            if self.inner.read(&mut tag)? != 0 {
                return Err(SnapshotError::Malformed("data after end marker"));
            }
            return Ok(None);
        }
        let cf = tag[0] as usize;
        if cf >= SNAPSHOT_CFS.len() {
            return Err(SnapshotError::Malformed("unknown column family"));
        }
        self.chunk(key)?;
        self.chunk(value)?;
        Ok(Some(cf))
    }

    fn chunk(&mut self, out: &mut Vec<u8>) -> Result<(), SnapshotError> {
        let mut len = [0u8; 4];
        self.read(&mut len, "truncated length")?;
        let len = u64::from(u32::from_le_bytes(len));
        out.clear();
        // Grown as the bytes arrive, not sized from the length field: a damaged length must
        // not allocate 4 GiB before the end of the stream shows it is wrong.
        (&mut self.inner).take(len).read_to_end(out)?;
        if out.len() as u64 != len {
            return Err(SnapshotError::Malformed("truncated record"));
        }
        self.hash.update(&*out);
        Ok(())
    }
}

/// A blob of `records` (column family index, key, value) as given, in order or not: for tests
/// of what reading a blob refuses.
#[cfg(test)]
pub(crate) fn encode_records(records: &[(u8, &[u8], &[u8])]) -> Vec<u8> {
    let mut w = Hashing { inner: Vec::new(), hash: Sha256::new(), bytes: 0 };
    let mut put = || -> Result<(), SnapshotError> {
        w.write_all(MAGIC)?;
        w.write_all(&[VERSION])?;
        for (cf, k, v) in records {
            w.write_all(&[*cf])?;
            write_chunk(&mut w, k)?;
            write_chunk(&mut w, v)?;
        }
        w.write_all(&[END])?;
        Ok(())
    };
    put().expect("writing to memory");
    let Hashing { mut inner, hash, .. } = w;
    inner.extend_from_slice(&hash.finalize());
    inner
}

/// `read_exact`, with a stream that ends early reported as a malformed snapshot.
fn read_full(r: &mut impl Read, buf: &mut [u8], short: &'static str) -> Result<(), SnapshotError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => SnapshotError::Malformed(short),
        _ => SnapshotError::Io(e),
    })
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
