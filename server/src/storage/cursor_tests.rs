//! Every engine's [`Cursor`]: a random walk of steps and seeks, each answer compared with a
//! model (the expected pairs in a `BTreeMap`). Shared with `mvcc::overlay`'s tests, which walk
//! overlays stacked on each engine.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::storage::engine::{Cf, Engine, MemEngine, ReadView, WriteBatch};
use crate::storage::rocks::RocksEngine;
use crate::test_rng::XorShift;

/// A key from a small alphabet, so walks hit existing keys, gaps and both ends.
pub(crate) fn random_key(rng: &mut XorShift) -> Vec<u8> {
    let len = 1 + rng.below(3) as usize;
    (0..len).map(|_| b'a' + rng.below(6) as u8).collect()
}

/// Walks `view`'s `cf` with random scans, steps and seeks (`walks` scans of up to 40 steps
/// each), checking every answer against `model`, the pairs `view` holds in `cf`.
pub(crate) fn walk_matches_model(
    view: &dyn ReadView,
    cf: Cf,
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    rng: &mut XorShift,
    walks: usize,
) {
    for walk in 0..walks {
        let start = random_key(rng);
        let end = (rng.below(4) != 0).then(|| random_key(rng));
        let mut cursor = view.scan(cf, &start, end.as_deref());
        // The model's position: the next pair is the first with key >= `from`.
        let mut from = Bound::Included(start.clone());
        for step in 0..40 {
            if rng.below(3) == 0 {
                let target = random_key(rng);
                cursor.seek(&target);
                from = Bound::Included(target.max(start.clone()));
                continue;
            }
            let want = {
                let lower = from.clone();
                let inverted = match (&lower, &end) {
                    (Bound::Included(l) | Bound::Excluded(l), Some(e)) => l >= e,
                    _ => false,
                };
                if inverted {
                    None
                } else {
                    let upper = end.clone().map_or(Bound::Unbounded, Bound::Excluded);
                    model.range::<Vec<u8>, _>((lower, upper)).next()
                }
            };
            let got = cursor.next().map(|r| r.expect("no engine errors here"));
            let ctx = || format!("walk {walk} step {step}: scan [{start:?}, {end:?})");
            match (got, want) {
                (None, None) => {}
                (Some((k, v)), Some((wk, wv))) => {
                    assert_eq!((&k, &v), (wk, wv), "{}", ctx());
                    from = Bound::Excluded(k);
                }
                (got, want) => panic!("{}: got {got:?}, want {want:?}", ctx()),
            }
        }
    }
}

/// Random pairs in `cf` of `engine` (and in the returned model).
pub(crate) fn fill(engine: &impl Engine, cf: Cf, rng: &mut XorShift) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = BTreeMap::new();
    let mut batch = WriteBatch::new();
    for i in 0..60 {
        let k = random_key(rng);
        let v = format!("v{i}").into_bytes();
        batch.put(cf, k.clone(), v.clone());
        model.insert(k, v);
    }
    engine.write(batch, false).unwrap();
    model
}

#[test]
fn rocksdb_cursors_step_and_seek_like_a_fresh_scan() {
    let dir = tempfile::tempdir().unwrap();
    let engine = RocksEngine::open(dir.path()).unwrap();
    let mut rng = XorShift(0x5eed_c0de);
    let model = fill(&engine, Cf::Kv, &mut rng);
    // Another family's pairs must never show through.
    fill(&engine, Cf::Changelog, &mut rng);
    walk_matches_model(&engine, Cf::Kv, &model, &mut rng, 300);
    let view = engine.view();
    // Written after the view: invisible to it.
    let mut later = WriteBatch::new();
    later.put(Cf::Kv, b"b".to_vec(), b"later".to_vec());
    engine.write(later, false).unwrap();
    walk_matches_model(&view, Cf::Kv, &model, &mut rng, 300);
}

#[test]
fn memory_cursors_step_and_seek_like_a_fresh_scan() {
    let engine = MemEngine::new();
    let mut rng = XorShift(0xfeed_beef);
    let model = fill(&engine, Cf::Kv, &mut rng);
    walk_matches_model(&engine, Cf::Kv, &model, &mut rng, 300);
    walk_matches_model(&engine.view(), Cf::Kv, &model, &mut rng, 300);
}
