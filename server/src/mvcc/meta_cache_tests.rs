//! The meta cache against the engine it stands in front of.

use std::cell::Cell;

use super::*;
use crate::mvcc::MvccStore;
use crate::storage::engine::{Engine, KvIter, MemEngine, WriteBatch};
use crate::test_rng::XorShift;

/// An engine view that counts its point reads.
struct Counting {
    engine: MemEngine,
    gets: Cell<usize>,
}

impl ReadView for Counting {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.gets.set(self.gets.get() + 1);
        self.engine.get(cf, key)
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        self.engine.scan(cf, start, end)
    }
}

fn write(engine: &MemEngine, key: &[u8], value: Option<&[u8]>) {
    let mut b = WriteBatch::new();
    match value {
        Some(v) => b.put(Cf::Meta, key.to_vec(), v.to_vec()),
        None => b.delete(Cf::Meta, key.to_vec()),
    }
    engine.write(b, false).expect("write");
}

/// Engine reads made only to check a hit: debug builds compare every hit with the engine.
fn checks(hits: usize) -> usize {
    if cfg!(debug_assertions) {
        hits
    } else {
        0
    }
}

/// After the first read of a key (present or absent) the engine is not read again for it, and
/// committed writes (puts and deletes) of the keys it holds are what later reads answer.
#[test]
fn a_meta_record_is_read_from_the_engine_once() {
    let view = Counting { engine: MemEngine::new(), gets: Cell::new(0) };
    write(&view.engine, b"auth/revision", Some(b"r1"));
    let cache = MetaCache::default();
    for _ in 0..3 {
        assert_eq!(cache.get(&view, b"auth/revision").unwrap(), Some(b"r1".to_vec()));
        assert_eq!(cache.get(&view, b"absent").unwrap(), None);
    }
    assert_eq!(view.gets.get(), 2 + checks(4), "one engine read per key");

    write(&view.engine, b"auth/revision", Some(b"r2"));
    write(&view.engine, b"absent", Some(b"now here"));
    cache.committed([(&b"auth/revision"[..], Some(&b"r2"[..])), (b"absent", Some(b"now here"))]);
    assert_eq!(cache.get(&view, b"auth/revision").unwrap(), Some(b"r2".to_vec()));
    assert_eq!(cache.get(&view, b"absent").unwrap(), Some(b"now here".to_vec()));
    write(&view.engine, b"auth/revision", None);
    cache.committed([(&b"auth/revision"[..], None)]);
    assert_eq!(cache.get(&view, b"auth/revision").unwrap(), None);
    assert_eq!(view.gets.get(), 2 + checks(7), "committed writes need no engine read");

    // A key apply never read is not taken in by a commit: its first read goes to the engine.
    write(&view.engine, b"raft/last_applied", Some(b"7"));
    cache.committed([(&b"raft/last_applied"[..], Some(&b"7"[..]))]);
    assert_eq!(cache.get(&view, b"raft/last_applied").unwrap(), Some(b"7".to_vec()));
    assert_eq!(view.gets.get(), 3 + checks(7));

    // Too large to keep: read each time.
    let big = vec![7u8; MAX_RECORD_BYTES + 1];
    write(&view.engine, b"big", Some(&big));
    cache.committed([(&b"big"[..], Some(big.as_slice()))]);
    assert_eq!(cache.get(&view, b"big").unwrap(), Some(big.clone()));
    assert_eq!(cache.get(&view, b"big").unwrap(), Some(big));
    assert_eq!(view.gets.get(), 5 + checks(7));
}

/// Batches that put, delete and read meta records (and write the MVCC counters, as every
/// write does): after every commit, and inside every batch, the apply path reads exactly what
/// the engine plus the batch's own writes hold. Debug builds also check every cache hit.
#[test]
fn apply_reads_of_meta_follow_every_commit() {
    let mut s = MvccStore::open(MemEngine::new()).expect("open");
    let keys: [&[u8]; 3] = [b"auth/revision", b"quota/alarms", b"raft/last_applied"];
    let mut g = XorShift(0x2545_f491_4f6c_dd1d);
    for round in 0..300u64 {
        let mut b = s.begin_apply();
        for _ in 0..1 + g.below(4) {
            let key = keys[usize::try_from(g.below(3)).unwrap()];
            match g.below(3) {
                0 => b.put_raw(Cf::Meta, key, &round.to_be_bytes()),
                1 => b.delete_raw(Cf::Meta, key),
                _ => {
                    let seen = b.get_raw(Cf::Meta, key).expect("read");
                    let table = b.overlay_for_tests().table(Cf::Meta);
                    let expect = match table.get(key) {
                        Some(v) => v.clone(),
                        None => s_engine_get(&b, key),
                    };
                    assert_eq!(seen, expect, "round {round}");
                }
            }
        }
        b.commit(false).expect("commit");
        for key in keys {
            assert_eq!(
                ReadView::get(&s, Cf::Meta, key).expect("read"),
                s.engine().get(Cf::Meta, key).expect("engine"),
                "round {round}"
            );
        }
    }
}

fn s_engine_get(b: &crate::mvcc::ApplyBatch<'_, MemEngine>, key: &[u8]) -> Option<Vec<u8>> {
    b.engine_for_tests().get(Cf::Meta, key).expect("engine")
}
