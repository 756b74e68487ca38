//! etcd's revision encoding: the keys of the `key` bucket and the compaction marks in `meta`.
//!
//! A revision is 17 bytes: the main revision as a big-endian u64, the byte `_`, and the sub
//! revision (the operation's index within its transaction) as a big-endian u64. Big-endian makes
//! bbolt's byte order the revision order. A tombstone (the record of a delete) carries an 18th
//! byte, `t`.

/// The length of an encoded revision.
pub const LEN: usize = 17;

/// The mark byte appended to a tombstone's revision.
const TOMBSTONE: u8 = b't';

/// A decoded `key` bucket key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevKey {
    pub main: i64,
    pub sub: i64,
    pub tombstone: bool,
}

fn be_i64(b: &[u8]) -> Result<i64, &'static str> {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    // etcd's revisions are int64 stored as uint64; the high bit set means a corrupt key.
    i64::try_from(u64::from_be_bytes(a)).map_err(|_| "revision above i64::MAX")
}

/// Decodes a 17-byte revision, or an 18-byte tombstone revision when `allow_mark`.
fn decode(b: &[u8], allow_mark: bool) -> Result<RevKey, &'static str> {
    let tombstone = match b.len() {
        LEN => false,
        18 if allow_mark && b[LEN] == TOMBSTONE => true,
        18 if allow_mark => return Err("18-byte revision whose mark is not `t`"),
        _ if allow_mark => return Err("not a 17-byte revision or an 18-byte tombstone"),
        _ => return Err("not a 17-byte revision"),
    };
    if b[8] != b'_' {
        return Err("revision without the `_` separator at byte 8");
    }
    Ok(RevKey { main: be_i64(b)?, sub: be_i64(&b[9..])?, tombstone })
}

/// Decodes a `key` bucket key.
pub fn key(b: &[u8]) -> Result<RevKey, &'static str> {
    decode(b, true)
}

/// Decodes a compaction mark of the `meta` bucket (a revision whose sub revision is 0): its main
/// revision.
pub fn main(b: &[u8]) -> Result<i64, &'static str> {
    decode(b, false).map(|r| r.main)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(main: u64, sub: u64) -> Vec<u8> {
        let mut v = main.to_be_bytes().to_vec();
        v.push(b'_');
        v.extend_from_slice(&sub.to_be_bytes());
        v
    }

    #[test]
    fn decodes_revisions_and_tombstones() {
        assert_eq!(key(&enc(7, 2)), Ok(RevKey { main: 7, sub: 2, tombstone: false }));
        let mut t = enc(9, 0);
        t.push(b't');
        assert_eq!(key(&t), Ok(RevKey { main: 9, sub: 0, tombstone: true }));
        assert_eq!(main(&enc(5, 0)), Ok(5));
    }

    #[test]
    fn rejects_malformed_revisions() {
        assert!(key(&enc(7, 2)[..16]).is_err());
        let mut x = enc(9, 0);
        x.push(b'x');
        assert!(key(&x).is_err());
        assert!(main(&x).is_err());
        let mut sep = enc(1, 1);
        sep[8] = b'-';
        assert!(key(&sep).is_err());
        assert!(key(&enc(u64::MAX, 0)).is_err());
    }
}
