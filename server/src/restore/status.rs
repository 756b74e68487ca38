//! `picket snapshot status FILE`: what a snapshot file holds, for either format, in the fields
//! `etcdctl snapshot status` prints (hash, revision, total keys, total size).
//!
//! - An **etcd** snapshot (bbolt) gets exactly etcdctl's numbers (`picket-etcdsnap`): the
//!   CRC-32C over every bucket name, key and value, the revision of the last `key` record, the
//!   count of keys in every bucket, and the database size.
//! - A **Picket** snapshot gets the same rules over its own records: a CRC-32C over each
//!   column family's name and every key and value in the file's order, the store's current
//!   revision, the count of records, and the file size. Two files with the same hash hold the
//!   same state; the hash is not comparable with etcd's or with HashKV.
//!
//! Both checksums of a file are verified first (the SHA-256 trailer of etcd's, when present;
//! the framing and inner checksums of Picket's), so a damaged file is an error, not a status.

use std::fs;
use std::path::Path;

use super::RestoreError;
use crate::mvcc::keys;
use crate::storage::snapshot::{self, SNAPSHOT_CFS};
use crate::storage::snapshot_file;

/// Which program wrote a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFormat {
    /// Picket's own (`PICKETSNAPFILE`): `picket snapshot save`, or `etcdctl snapshot save`
    /// against Picket. Only Picket restores it.
    Picket,
    /// etcd's bbolt database: `etcdctl snapshot save` against etcd. etcd and Picket restore it.
    Etcd,
}

/// What `picket snapshot status` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotStatus {
    pub format: SnapshotFormat,
    pub hash: u32,
    pub revision: i64,
    pub total_keys: u64,
    pub total_size: u64,
}

/// Reads and checks the snapshot file at `path` and reports it (blocking file I/O).
pub fn snapshot_status(path: &Path) -> Result<SnapshotStatus, RestoreError> {
    let file = fs::read(path)
        .map_err(|source| RestoreError::ReadSnapshot { path: path.to_path_buf(), source })?;
    if picket_etcdsnap::is_etcd_snapshot(&file) {
        let s = picket_etcdsnap::status(&file)
            .map_err(|source| RestoreError::EtcdSnapshot { path: path.to_path_buf(), source })?;
        return Ok(SnapshotStatus {
            format: SnapshotFormat::Etcd,
            hash: s.hash,
            revision: s.revision,
            total_keys: s.total_keys,
            total_size: s.total_size,
        });
    }
    let blob = snapshot_file::decode(&file)
        .map_err(|source| RestoreError::SnapshotFile { path: path.to_path_buf(), source })?;
    let records = snapshot::parse(blob)
        .map_err(|source| RestoreError::SnapshotData { path: path.to_path_buf(), source })?;
    let meta = SNAPSHOT_CFS.iter().position(|cf| *cf == "meta");
    let mut revision = 1;
    let mut hash = picket_etcdsnap::Crc32c::default();
    let mut last_cf = None;
    for (cf, key, value) in &records {
        if last_cf != Some(*cf) {
            hash.update(SNAPSHOT_CFS[*cf].as_bytes());
            last_cf = Some(*cf);
        }
        hash.update(key);
        hash.update(value);
        if Some(*cf) == meta && *key == keys::META_REVISION {
            if let Ok(be) = <[u8; 8]>::try_from(*value) {
                revision = i64::from_be_bytes(be);
            }
        }
    }
    Ok(SnapshotStatus {
        format: SnapshotFormat::Picket,
        hash: hash.sum(),
        revision,
        total_keys: records.len() as u64,
        total_size: file.len() as u64,
    })
}
