//! Byte layouts of the MVCC records (described in the [`crate::mvcc`] module docs).
//!
//! User keys are arbitrary bytes, but every version of a key must sit next to the others and
//! keys must sort like etcd's (plain byte order). Appending a revision to the raw key would
//! break both ("a" + rev would sort among "a\x00..."), so the user key is first encoded in an
//! order-preserving, prefix-free form:
//!
//! - each `0x00` byte becomes `0x00 0xFF`, every other byte is copied;
//! - the key ends with the terminator `0x00 0x01`.
//!
//! Then `enc(a) < enc(b)` exactly when `a < b`, and no encoding is a prefix of another, so
//! `enc(k) ++ suffix` never interleaves with another key's records and the user range
//! `[start, end)` maps onto the encoded range `[enc(start), enc(end))`.

/// Length of a revision suffix.
pub const REV_LEN: usize = 8;

const ESCAPE: u8 = 0xFF;
const TERMINATOR: u8 = 0x01;

/// Appends the order-preserving encoding of `key` to `out`.
pub fn encode_user_key_into(key: &[u8], out: &mut Vec<u8>) {
    out.reserve(key.len() + 2);
    for &b in key {
        if b == 0 {
            out.extend_from_slice(&[0, ESCAPE]);
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(&[0, TERMINATOR]);
}

pub fn encode_user_key(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2 + REV_LEN);
    encode_user_key_into(key, &mut out);
    out
}

/// Inverse of [`encode_user_key`]; `None` if `enc` is not exactly one encoded key.
pub fn decode_user_key(enc: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(enc.len());
    let mut i = 0;
    while i < enc.len() {
        match enc[i] {
            0 => match enc.get(i + 1) {
                Some(&ESCAPE) => {
                    out.push(0);
                    i += 2;
                }
                Some(&TERMINATOR) if i + 2 == enc.len() => return Some(out),
                _ => return None,
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

/// The revision suffix: `u64::MAX - rev`, big-endian, so a key's newest version comes first.
/// Revisions below zero never exist; they are clamped so that a seek with one lands after every
/// version.
pub fn inverted_rev(rev: i64) -> [u8; REV_LEN] {
    (u64::MAX - rev.max(0).unsigned_abs()).to_be_bytes()
}

/// `Cf::Kv` key of the version of `key` written at `rev`.
pub fn kv_key(key: &[u8], rev: i64) -> Vec<u8> {
    let mut out = encode_user_key(key);
    out.extend_from_slice(&inverted_rev(rev));
    out
}

/// `Cf::Kv` key built from an already encoded user key.
pub fn kv_key_encoded(enc_key: &[u8], rev: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(enc_key.len() + REV_LEN);
    out.extend_from_slice(enc_key);
    out.extend_from_slice(&inverted_rev(rev));
    out
}

/// Splits a `Cf::Kv` key into the encoded user key and the revision.
pub fn split_kv_key(k: &[u8]) -> Option<(&[u8], i64)> {
    if k.len() < REV_LEN + 2 {
        return None;
    }
    let (enc, rev) = k.split_at(k.len() - REV_LEN);
    let mut buf = [0u8; REV_LEN];
    buf.copy_from_slice(rev);
    let rev = i64::try_from(u64::MAX - u64::from_be_bytes(buf)).ok()?;
    Some((enc, rev))
}

/// The smallest encoded key greater than every `Cf::Kv` key of the encoded user key `enc_key`.
///
/// An encoding ends in the terminator `0x00 0x01`; raising it to `0x00 0x02` sorts after every
/// `enc_key ++ suffix`, and before every other key's encoding, because after a `0x00` byte an
/// encoding only ever has `0x01` or `0xFF`.
pub fn versions_end(enc_key: &[u8]) -> Vec<u8> {
    let mut out = enc_key.to_vec();
    if let Some(last) = out.last_mut() {
        *last = TERMINATOR + 1;
    }
    out
}

/// Whether `[start, end)` is exactly `[enc_key, versions_end(enc_key))` for some encoded user
/// key: every version of one key. Allocates nothing (it runs on every apply-path key read).
pub fn is_versions_range(start: &[u8], end: &[u8]) -> bool {
    match (start.split_last(), end.split_last()) {
        (Some((&TERMINATOR, s)), Some((&last, e))) => last == TERMINATOR + 1 && s == e,
        _ => false,
    }
}

/// The encoded `Cf::Kv` bounds of an etcd `(key, range_end)` pair, as etcd interprets it:
/// an empty `range_end` is the single key; `range_end == "\0"` is every key `>= key`; otherwise
/// the half-open range `[key, range_end)` (empty when `range_end <= key`).
pub fn kv_bounds(key: &[u8], range_end: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
    let start = encode_user_key(key);
    let end = match range_end {
        [] => Some(versions_end(&start)),
        [0] => None,
        end => Some(encode_user_key(end)),
    };
    (start, end)
}

/// `Cf::Changelog` key of a revision.
pub fn changelog_key(rev: i64) -> [u8; 8] {
    rev.max(0).unsigned_abs().to_be_bytes()
}

pub fn decode_changelog_key(k: &[u8]) -> Option<i64> {
    let buf: [u8; 8] = k.try_into().ok()?;
    i64::try_from(u64::from_be_bytes(buf)).ok()
}

/// `Cf::LeaseKeys` key: lease id (two's complement, big-endian) followed by the raw user key.
/// The id has a fixed width, so no escaping is needed to scan one lease's keys.
pub fn lease_key(lease: i64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + key.len());
    out.extend_from_slice(&lease.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// Bounds of every `Cf::LeaseKeys` entry of `lease`.
pub fn lease_bounds(lease: i64) -> ([u8; 8], Option<[u8; 8]>) {
    let id = u64::from_be_bytes(lease.to_be_bytes());
    (id.to_be_bytes(), id.checked_add(1).map(u64::to_be_bytes))
}

/// `Cf::Meta` key of the current revision (8 bytes, big-endian i64).
pub const META_REVISION: &[u8] = b"mvcc/current_revision";
/// `Cf::Meta` key of the compacted revision (8 bytes, big-endian i64).
pub const META_COMPACT_REVISION: &[u8] = b"mvcc/compact_revision";
/// `Cf::Meta` key of the physical compaction point (8 bytes, big-endian i64): how far the old
/// records have actually been dropped (see `compact`). Absent when it equals the compaction
/// point, which is always the case once compaction has caught up.
pub const META_COMPACT_PHYSICAL: &[u8] = b"mvcc/compact_physical";

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
