//! Bounded physical compaction (issue 19): each step buffers a bounded number of deletes, reads
//! never notice the steps, and once the steps are done the store is exactly what the old
//! all-at-once compaction produced.

use std::collections::BTreeSet;

use picket_proto::etcdserverpb::{CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest};
use picket_proto::picket::storage::v1::RevisionEvents;
use prost::Message;

use super::compact::DELETES_PER_STEP;
use super::error::MvccError;
use super::hash::hash_store;
use super::keys;
use super::overlay::Overlay;
use super::MvccStore;
use crate::storage::engine::{Cf, Engine, MemEngine, ReadView};

/// Deletes one explicit step may buffer in these tests: small, so a history of a few thousand
/// revisions takes many steps.
const LIMIT: usize = 40;

fn no_leases(_id: i64) -> bool {
    false
}

/// The compaction of the code before issue 19, kept as the reference: every delete of
/// compacting from `old` to `new`, computed at once.
fn reference_deletes(view: &dyn ReadView, old: i64, new: i64) -> Overlay {
    let mut out = Overlay::default();
    let mut touched: BTreeSet<Vec<u8>> = BTreeSet::new();
    let start = keys::changelog_key(old);
    let end = keys::changelog_key(new.saturating_add(1));
    for item in view.scan(Cf::Changelog, &start, Some(&end)) {
        let (k, v) = item.unwrap();
        let rev = keys::decode_changelog_key(&k).unwrap();
        if rev > old {
            for ev in RevisionEvents::decode(v.as_slice()).unwrap().events {
                touched.insert(ev.kv.unwrap().key);
            }
        }
        if rev < new {
            out.delete(Cf::Changelog, k);
        }
    }
    for key in &touched {
        let enc = keys::encode_user_key(key);
        let from = keys::kv_key_encoded(&enc, new);
        let to = keys::versions_end(&enc);
        let mut newest = true;
        for item in view.scan(Cf::Kv, &from, Some(&to)) {
            let (k, v) = item.unwrap();
            if std::mem::take(&mut newest) && !v.is_empty() {
                continue;
            }
            out.delete(Cf::Kv, k);
        }
    }
    out
}

/// Compacts `s` to `rev` the old way: every delete and the new point in one write.
fn reference_compact(s: &mut MvccStore<MemEngine>, rev: i64) {
    let mut deletes = reference_deletes(&s.engine().view(), s.compact_revision(), rev);
    deletes.put(Cf::Meta, keys::META_COMPACT_REVISION.to_vec(), rev.to_be_bytes().to_vec());
    s.engine().write(deletes.into_write_batch(), false).unwrap();
    s.reload().unwrap();
}

/// A small deterministic generator, so the history is varied but the same on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("k{i:02}").into_bytes()
}

/// Applies `n` requests to both stores, the same on each, one batch per request: mostly puts
/// over 30 keys, some single deletes and some range deletes (several events in one revision).
fn write_history(stores: &mut [&mut MvccStore<MemEngine>], rng: &mut Lcg, n: usize) {
    for i in 0..n {
        let k = rng.next(30);
        let op = rng.next(10);
        for s in stores.iter_mut() {
            let mut b = s.begin_apply();
            match op {
                0 => {
                    b.delete_range(&DeleteRangeRequest { key: key(k), ..Default::default() })
                        .unwrap();
                }
                1 => {
                    let req = DeleteRangeRequest {
                        key: key(k),
                        range_end: key(k + 4),
                        ..Default::default()
                    };
                    b.delete_range(&req).unwrap();
                }
                _ => {
                    let req = PutRequest {
                        key: key(k),
                        value: format!("v{i}").into_bytes(),
                        ..Default::default()
                    };
                    b.put(&req, &no_leases).unwrap();
                }
            }
            b.commit(false).unwrap();
        }
    }
}

/// Every record of the MVCC column families and the MVCC meta keys.
fn contents(s: &MvccStore<MemEngine>) -> Vec<(Cf, Vec<u8>, Vec<u8>)> {
    let view = s.engine().view();
    let mut out = Vec::new();
    for cf in [Cf::Kv, Cf::Changelog, Cf::LeaseKeys] {
        for item in view.scan(cf, b"", None) {
            let (k, v) = item.unwrap();
            out.push((cf, k, v));
        }
    }
    for item in view.scan(Cf::Meta, b"mvcc/", Some(b"mvcc0")) {
        let (k, v) = item.unwrap();
        out.push((Cf::Meta, k, v));
    }
    out
}

/// Key, value and mod revision of each key a range returns.
type Answer = Vec<(Vec<u8>, Vec<u8>, i64)>;

fn range_at(s: &MvccStore<MemEngine>, rev: i64) -> Result<Answer, MvccError> {
    let req =
        RangeRequest { key: vec![0], range_end: vec![0], revision: rev, ..Default::default() };
    let resp = s.range(&req)?;
    Ok(resp.kvs.into_iter().map(|kv| (kv.key, kv.value, kv.mod_revision)).collect())
}

/// Checks that `s` answers every read at or above its compaction point as `reference` does,
/// and refuses reads below it.
fn same_answers(s: &MvccStore<MemEngine>, reference: &MvccStore<MemEngine>) {
    let (c, current) = (s.compact_revision(), s.revision());
    assert_eq!((c, current), (reference.compact_revision(), reference.revision()));
    assert_eq!(range_at(s, c - 1), Err(MvccError::Compacted));
    assert_eq!(s.events(c - 1, current), Err(MvccError::Compacted));
    for rev in (c..=current).step_by(7).chain([current]) {
        assert_eq!(range_at(s, rev), range_at(reference, rev), "range at {rev}");
    }
    assert_eq!(s.events(c, current), reference.events(c, current));
    let (hs, hr) = (s.engine().view(), reference.engine().view());
    for rev in [c, (c + current) / 2, current] {
        let (a, b) = (super::hash::hash_kv(&hs, rev), super::hash::hash_kv(&hr, rev));
        assert_eq!(a.map(|h| h.hash), b.map(|h| h.hash), "HashKV at {rev}");
    }
}

/// Runs explicit steps until physical compaction has caught up, checking each one's bound and
/// that the answers never change. Returns the number of steps.
fn drain(s: &mut MvccStore<MemEngine>, reference: &MvccStore<MemEngine>) -> usize {
    let mut steps = 0;
    while s.compact_physical() < s.compact_revision() {
        let before = s.compact_physical();
        let mut b = s.begin_apply();
        let deletes = b.compact_step(LIMIT).unwrap();
        b.commit(false).unwrap();
        // Every revision here has at most 4 events (a range delete of 4 keys): cost 9.
        assert!(deletes <= LIMIT + 1, "a step buffered {deletes} deletes (limit {LIMIT})");
        assert!(s.compact_physical() > before, "a step made no progress");
        same_answers(s, reference);
        steps += 1;
        assert!(steps < 10_000, "physical compaction does not finish");
    }
    steps
}

#[test]
fn compaction_runs_in_bounded_steps_and_ends_where_compacting_at_once_does() {
    tracing::info!("the same history of 3,000 requests in two stores");
    let (mut bounded, mut reference) =
        (MvccStore::open(MemEngine::new()).unwrap(), MvccStore::open(MemEngine::new()).unwrap());
    let mut rng = Lcg(19);
    write_history(&mut [&mut bounded, &mut reference], &mut rng, 3_000);

    tracing::info!("compact both at 2,000: the reference at once, the other one logically");
    let c1 = 2_000;
    reference_compact(&mut reference, c1);
    let mut b = bounded.begin_apply();
    b.compact(&CompactionRequest { revision: c1, physical: false }).unwrap();
    b.commit(false).unwrap();
    assert_eq!(bounded.compact_revision(), c1);
    assert!(
        bounded.compact_physical() < c1,
        "one step of {DELETES_PER_STEP} deletes cannot drop 2,000 revisions of history"
    );
    same_answers(&bounded, &reference);

    tracing::info!("a few explicit steps, then a restart in the middle of the work");
    for _ in 0..5 {
        let mut b = bounded.begin_apply();
        assert!(b.compact_step(LIMIT).unwrap() <= LIMIT + 1);
        b.commit(false).unwrap();
    }
    let physical = bounded.compact_physical();
    assert!(physical < c1);
    let engine = bounded.engine().clone();
    let mut bounded = MvccStore::open(engine).unwrap();
    assert_eq!(bounded.compact_physical(), physical, "the physical point survives a restart");
    same_answers(&bounded, &reference);

    tracing::info!("more writes run steps of their own; then a second compaction moves the target");
    write_history(&mut [&mut bounded, &mut reference], &mut rng, 500);
    assert!(bounded.compact_physical() > physical, "writes carry compaction steps");
    let c2 = bounded.revision() - 100;
    reference_compact(&mut reference, c2);
    let mut b = bounded.begin_apply();
    b.compact(&CompactionRequest { revision: c2, physical: false }).unwrap();
    b.commit(false).unwrap();
    same_answers(&bounded, &reference);

    tracing::info!("the remaining steps, each bounded; the end result equals the reference");
    let steps = drain(&mut bounded, &reference);
    assert!(steps > 10, "only {steps} steps: the test history is too small to split");
    assert_eq!(bounded.compact_physical(), c2);
    assert_eq!(contents(&bounded), contents(&reference));
    assert_eq!(
        hash_store(&bounded.engine().view()).unwrap(),
        hash_store(&reference.engine().view()).unwrap()
    );
    assert_eq!(bounded.engine().view().get(Cf::Meta, keys::META_COMPACT_PHYSICAL).unwrap(), None);
}

#[test]
fn a_small_compaction_ends_in_its_own_step() {
    let (mut bounded, mut reference) =
        (MvccStore::open(MemEngine::new()).unwrap(), MvccStore::open(MemEngine::new()).unwrap());
    let mut rng = Lcg(7);
    write_history(&mut [&mut bounded, &mut reference], &mut rng, 20);
    for rev in [5, bounded.revision()] {
        reference_compact(&mut reference, rev);
        let mut b = bounded.begin_apply();
        b.compact(&CompactionRequest { revision: rev, physical: false }).unwrap();
        b.commit(false).unwrap();
        assert_eq!(bounded.compact_physical(), rev);
        assert_eq!(contents(&bounded), contents(&reference));
    }
}

/// Records in the column families compaction deletes from.
fn history_records(s: &MvccStore<MemEngine>) -> usize {
    let view = s.engine().view();
    [Cf::Kv, Cf::Changelog].into_iter().map(|cf| view.scan(cf, b"", None).count()).sum()
}

/// The failing-first test of issue 19 Medium 8 (uses only APIs the old code had): one Compact
/// request, applied in one step under the state-machine lock on every member, must not delete
/// the whole compacted history at once. Seen failing on 5c13469: "one apply step removed 3996
/// records (bound 257)".
#[test]
fn one_compact_request_removes_a_bounded_number_of_records() {
    let mut s = MvccStore::open(MemEngine::new()).unwrap();
    for i in 0..2_000u64 {
        let mut b = s.begin_apply();
        let req = PutRequest { key: key(i % 3), value: vec![b'x'], ..Default::default() };
        b.put(&req, &no_leases).unwrap();
        b.commit(false).unwrap();
    }
    let (before, head) = (history_records(&s), s.revision());
    let mut b = s.begin_apply();
    b.compact(&CompactionRequest { revision: head, physical: false }).unwrap();
    b.commit(false).unwrap();
    let removed = before - history_records(&s);
    assert!(
        removed <= DELETES_PER_STEP + 1,
        "one apply step removed {removed} records (bound {})",
        DELETES_PER_STEP + 1
    );
}
