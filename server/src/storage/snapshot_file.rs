//! The snapshot *file* that `Maintenance.Snapshot` streams and `etcdctl snapshot save` writes:
//! a state-machine snapshot blob ([`crate::storage::snapshot`]) wrapped the way etcd tools
//! expect a backup to look.
//!
//! etcd streams its bbolt file followed by the SHA-256 of everything before it; its restore
//! recognises the checksum because the data before it is a whole number of 512-byte blocks
//! (`size % 512 == 32`). Picket's blob is its own format, so it is framed to keep that shape:
//!
//! ```text
//! "PICKETSNAPFILE" version:u8 blob_len:u64le blob zero-padding   (a multiple of 512 bytes)
//! sha256(everything above):32
//! ```
//!
//! Restoring such a file is Picket's job (`picket snapshot restore`), not etcd's: etcd's restore
//! would accept the checksum and then fail to open the contents as a bbolt database.

use sha2::{Digest, Sha256};
use thiserror::Error;

const MAGIC: &[u8] = b"PICKETSNAPFILE";
const VERSION: u8 = 1;
/// etcd's restore looks for the checksum after a whole number of blocks of this size.
pub const BLOCK: usize = 512;
const DIGEST_LEN: usize = 32;
const HEADER_LEN: usize = MAGIC.len() + 1 + 8;

#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotFileError {
    #[error("not a Picket snapshot file (bad header)")]
    NotPicket,
    #[error("snapshot file version {0} is not supported")]
    Version(u8),
    #[error("snapshot file is truncated or padded wrongly")]
    Length,
    #[error("snapshot file checksum mismatch: the file is damaged")]
    Checksum,
}

/// Wraps a state-machine snapshot blob as a snapshot file.
pub fn encode(blob: &[u8]) -> Vec<u8> {
    let body = HEADER_LEN + blob.len();
    let padded = body.div_ceil(BLOCK) * BLOCK;
    let mut out = Vec::with_capacity(padded + DIGEST_LEN);
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(blob.len() as u64).to_le_bytes());
    out.extend_from_slice(blob);
    out.resize(padded, 0);
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// Checks a snapshot file and returns the blob inside it (whose own checksum
/// [`crate::storage::snapshot::parse`] verifies).
pub fn decode(file: &[u8]) -> Result<&[u8], SnapshotFileError> {
    if !file.starts_with(MAGIC) {
        return Err(SnapshotFileError::NotPicket);
    }
    // A file that starts like ours but is too short to hold a header and checksum was cut off:
    // say so, rather than that it is not ours.
    if file.len() < HEADER_LEN + DIGEST_LEN {
        return Err(SnapshotFileError::Length);
    }
    if file[MAGIC.len()] != VERSION {
        return Err(SnapshotFileError::Version(file[MAGIC.len()]));
    }
    if file.len() % BLOCK != DIGEST_LEN {
        return Err(SnapshotFileError::Length);
    }
    let (body, digest) = file.split_at(file.len() - DIGEST_LEN);
    if Sha256::digest(body).as_slice() != digest {
        return Err(SnapshotFileError::Checksum);
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&body[MAGIC.len() + 1..HEADER_LEN]);
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| SnapshotFileError::Length)?;
    let end = HEADER_LEN.checked_add(len).ok_or(SnapshotFileError::Length)?;
    if end > body.len() || body.len() - end >= BLOCK || body[end..].iter().any(|&b| b != 0) {
        return Err(SnapshotFileError::Length);
    }
    Ok(&body[HEADER_LEN..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_etcd_shape() {
        for n in [0usize, 1, 512 - HEADER_LEN, 512 - HEADER_LEN + 1, 5000] {
            let blob: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            let file = encode(&blob);
            // etcd's `snapshot restore` test for an appended checksum.
            assert_eq!(file.len() % BLOCK, DIGEST_LEN, "blob of {n} bytes");
            let digest = Sha256::digest(&file[..file.len() - DIGEST_LEN]);
            assert_eq!(&file[file.len() - DIGEST_LEN..], digest.as_slice());
            assert_eq!(decode(&file), Ok(blob.as_slice()));
        }
    }

    #[test]
    fn damage_is_detected() {
        let file = encode(b"some state");
        let mut bad = file.clone();
        bad[HEADER_LEN] ^= 1;
        assert_eq!(decode(&bad), Err(SnapshotFileError::Checksum));
        assert_eq!(decode(&file[..file.len() - 1]), Err(SnapshotFileError::Length));
        assert_eq!(decode(b"PICKETSNAP"), Err(SnapshotFileError::NotPicket));
        assert_eq!(decode(&file[..HEADER_LEN]), Err(SnapshotFileError::Length));
    }
}
