//! Content hashes of the MVCC store, for `Maintenance.HashKV` and `Maintenance.Hash`: operators
//! and tests compare them across members to detect divergence (etcd's corruption check).
//!
//! [`hash_kv`] follows etcd's `HashByRev`: it covers every record of the `kv` column family up to
//! a revision, but below the compaction point only the versions compaction keeps (the newest
//! version of each key at or below it, unless that is a tombstone). So two members that have
//! applied the same log agree, and so do members that differ only in whether a compaction has
//! physically removed old versions yet. As in etcd, hashes are comparable only between answers
//! with the same `compact_revision`.
//!
//! The checksum is CRC-32 (IEEE) over the raw engine keys and values, in key order; etcd uses
//! CRC-32C over its own layout, so Picket's values are not comparable with etcd's, only with each
//! other.

use super::error::MvccError;
use super::keys;
use super::read::{read_revisions, NEVER_COMPACTED};
use crate::storage::engine::{Cf, ReadView};

/// The result of [`hash_kv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHash {
    pub hash: u32,
    /// The compaction point the hash was taken at (-1 if never compacted).
    pub compact_revision: i64,
    /// The store's current revision in the same view.
    pub current_revision: i64,
    /// The revision the hash covers (the requested one, or the current one for 0).
    pub revision: i64,
}

/// Hashes the `kv` column family as of revision `rev` (0 = the current revision), from one
/// consistent `view`. Fails with [`MvccError::FutureRevision`] past the current revision and
/// [`MvccError::Compacted`] below the compaction point, like a Range at that revision.
pub fn hash_kv(view: &dyn ReadView, rev: i64) -> Result<KvHash, MvccError> {
    let revs = read_revisions(view)?;
    if rev > revs.current {
        return Err(MvccError::FutureRevision);
    }
    if rev > 0 && revs.compacted != NEVER_COMPACTED && rev < revs.compacted {
        return Err(MvccError::Compacted);
    }
    let upper = if rev <= 0 { revs.current } else { rev };
    let mut h = crc32fast::Hasher::new();
    // etcd starts with the bucket name; so do we, so an empty store has a fixed, non-zero hash.
    h.update(Cf::Kv.name().as_bytes());
    // Encoded user key of the record last seen, and whether its kept version at or below the
    // compaction point has already been passed (records of one key come newest first).
    let mut current: Option<Vec<u8>> = None;
    let mut passed_compacted = false;
    for item in view.scan(Cf::Kv, b"", None) {
        let (k, v) = item?;
        let (enc, r) = keys::split_kv_key(&k)
            .ok_or_else(|| MvccError::Corrupt(format!("malformed kv key {k:02x?}")))?;
        if current.as_deref() != Some(enc) {
            current = Some(enc.to_vec());
            passed_compacted = false;
        }
        if r > upper {
            continue;
        }
        if r <= revs.compacted {
            // Only the newest version at or below the compaction point survives compaction,
            // and only if it is not a tombstone.
            let kept = !passed_compacted && !v.is_empty();
            passed_compacted = true;
            if !kept {
                continue;
            }
        }
        h.update(&k);
        h.update(&v);
    }
    Ok(KvHash {
        hash: h.finalize(),
        compact_revision: revs.compacted,
        current_revision: revs.current,
        revision: upper,
    })
}

/// Hashes the whole replicated store: every MVCC column family and the MVCC counters, but not
/// the Raft bookkeeping (last applied log id, membership), which legitimately differs between
/// members at the same revision. etcd's `Hash` covers its whole backend; it is meant for tests.
pub fn hash_store(view: &dyn ReadView) -> Result<u32, MvccError> {
    let mut h = crc32fast::Hasher::new();
    for cf in [Cf::Kv, Cf::Changelog, Cf::Lease, Cf::LeaseKeys] {
        h.update(cf.name().as_bytes());
        for item in view.scan(cf, b"", None) {
            let (k, v) = item?;
            h.update(&k);
            h.update(&v);
        }
    }
    h.update(Cf::Meta.name().as_bytes());
    for key in [keys::META_REVISION, keys::META_COMPACT_REVISION] {
        if let Some(v) = view.get(Cf::Meta, key)? {
            h.update(key);
            h.update(&v);
        }
    }
    Ok(h.finalize())
}

#[cfg(test)]
mod tests {
    use picket_proto::etcdserverpb::{CompactionRequest, DeleteRangeRequest, PutRequest};

    use super::*;
    use crate::mvcc::{LeaseLookup, MvccStore};
    use crate::storage::engine::{Engine, MemEngine};

    fn no_leases() -> impl LeaseLookup {
        |_id: i64| false
    }

    fn put(s: &mut MvccStore<MemEngine>, k: &str, v: &str) {
        let req = PutRequest { key: k.into(), value: v.into(), ..Default::default() };
        let mut b = s.begin_apply();
        b.put(&req, &no_leases()).unwrap();
        b.commit(false).unwrap();
    }

    fn del(s: &mut MvccStore<MemEngine>, k: &str) {
        let req = DeleteRangeRequest { key: k.into(), ..Default::default() };
        let mut b = s.begin_apply();
        b.delete_range(&req).unwrap();
        b.commit(false).unwrap();
    }

    fn compact(s: &mut MvccStore<MemEngine>, rev: i64) {
        let mut b = s.begin_apply();
        b.compact(&CompactionRequest { revision: rev, physical: false }).unwrap();
        b.commit(false).unwrap();
    }

    /// The same writes give the same hash; later writes do not change a hash at an earlier
    /// revision; the hash at the current revision changes with every write.
    #[test]
    fn deterministic_and_bounded_by_revision() {
        let mut a = MvccStore::open(MemEngine::new()).unwrap();
        let mut b = MvccStore::open(MemEngine::new()).unwrap();
        for s in [&mut a, &mut b] {
            put(s, "k1", "v1");
            put(s, "k2", "v2");
            put(s, "k1", "v3");
        }
        let ha = hash_kv(&a.engine().view(), 0).unwrap();
        assert_eq!(ha, hash_kv(&b.engine().view(), 0).unwrap());
        assert_eq!((ha.revision, ha.compact_revision, ha.current_revision), (4, -1, 4));

        put(&mut a, "k3", "v4");
        assert_eq!(hash_kv(&a.engine().view(), 4).unwrap().hash, ha.hash);
        assert_ne!(hash_kv(&a.engine().view(), 0).unwrap().hash, ha.hash);
        assert_ne!(hash_kv(&a.engine().view(), 3).unwrap().hash, ha.hash);
        assert!(matches!(hash_kv(&a.engine().view(), 6), Err(MvccError::FutureRevision)));
    }

    /// The hash leaves out exactly what compaction removes: a store compacted at 5 hashes like the
    /// same store that only records the compaction point without deleting anything yet.
    #[test]
    fn compaction_does_not_change_hash_above_it() {
        let history = |s: &mut MvccStore<MemEngine>| {
            put(s, "a", "1");
            put(s, "a", "2");
            put(s, "b", "1");
            del(s, "b");
            put(s, "c", "1");
        };
        let mut compacted = MvccStore::open(MemEngine::new()).unwrap();
        history(&mut compacted);
        compact(&mut compacted, 5);
        let mut logical = MvccStore::open(MemEngine::new()).unwrap();
        history(&mut logical);
        let mut b = logical.begin_apply();
        b.put_raw(Cf::Meta, keys::META_COMPACT_REVISION, &5i64.to_be_bytes());
        b.commit(false).unwrap();

        let h = hash_kv(&compacted.engine().view(), 6).unwrap();
        assert_eq!(h.compact_revision, 5);
        assert_eq!(hash_kv(&logical.engine().view(), 6).unwrap(), h);
        assert_eq!(
            hash_kv(&logical.engine().view(), 5).unwrap(),
            hash_kv(&compacted.engine().view(), 5).unwrap()
        );
        assert!(matches!(hash_kv(&compacted.engine().view(), 4), Err(MvccError::Compacted)));
    }

    #[test]
    fn store_hash_ignores_raft_bookkeeping() {
        let mut s = MvccStore::open(MemEngine::new()).unwrap();
        put(&mut s, "a", "1");
        let h1 = hash_store(&s.engine().view()).unwrap();
        let mut b = s.begin_apply();
        b.put_raw(Cf::Meta, b"raft/last_applied", b"x");
        b.commit(false).unwrap();
        assert_eq!(hash_store(&s.engine().view()).unwrap(), h1);
        put(&mut s, "a", "2");
        assert_ne!(hash_store(&s.engine().view()).unwrap(), h1);
    }
}
