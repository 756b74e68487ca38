//! The SHA-256 trailer etcd appends to a streamed snapshot.
//!
//! etcd's `Maintenance.Snapshot` streams the bbolt file and then its SHA-256 (32 bytes), and
//! `etcdctl snapshot save` writes both to disk. A bbolt file is a whole number of pages, and
//! pages are multiples of 512 bytes, so etcd's restore decides that a trailer is present exactly
//! when the length modulo 512 is 32; a database file copied from a data directory has none.

use sha2::{Digest, Sha256};

use crate::Error;

/// The trailer's length.
pub const LEN: usize = 32;

/// Whether `bytes` ends with a trailer by etcd's rule (`len % 512 == 32`).
pub fn present(bytes: &[u8]) -> bool {
    bytes.len() % 512 == LEN
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Splits off and verifies the trailer when there is one: the database bytes and whether a
/// trailer was found. A trailer that does not match the bytes before it is an error.
pub fn split(bytes: &[u8]) -> Result<(&[u8], bool), Error> {
    if !present(bytes) {
        return Ok((bytes, false));
    }
    let (db, expected) = bytes.split_at(bytes.len() - LEN);
    let computed = Sha256::digest(db);
    if computed.as_slice() != expected {
        return Err(Error::TrailerMismatch { expected: hex(expected), computed: hex(&computed) });
    }
    Ok((db, true))
}
