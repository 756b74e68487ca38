//! The newest-record cache against the engine it stands in front of: after every committed
//! batch, what the apply path's view knows of each key is exactly the engine's newest record.

use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
};

use super::*;
use crate::mvcc::overlay::{Layered, Overlay};
use crate::mvcc::MvccStore;
use crate::storage::engine::{Engine, MemEngine, WriteBatch};
use crate::test_rng::XorShift;

const KEYS: [&[u8]; 4] = [b"a", b"a\0", b"ab", b"b"];

fn known(view: &dyn ReadView, key: &[u8]) -> Option<Option<Record>> {
    let enc = keys::encode_user_key(key);
    view.first_known(Cf::Kv, &enc, &keys::versions_end(&enc)).map(|r| r.expect("read"))
}

fn engine_newest(s: &MvccStore<MemEngine>, key: &[u8]) -> Option<Record> {
    scan_newest(s.engine(), &keys::encode_user_key(key)).expect("scan")
}

fn put(key: &[u8], v: u64) -> PutRequest {
    PutRequest { key: key.to_vec(), value: v.to_be_bytes().to_vec(), ..Default::default() }
}

#[test]
fn the_cache_follows_every_committed_write() {
    let mut s = MvccStore::open(MemEngine::new()).expect("open");
    let no_leases = |_: i64| false;
    // A fixed pseudo-random walk: puts, single-key and range deletes, txns that put and
    // delete the same key, and compactions, several to a batch.
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next();
    for round in 0..300u64 {
        let mut b = s.begin_apply();
        for _ in 0..(next() % 4 + 1) {
            let key = KEYS[(next() % KEYS.len() as u64) as usize];
            match next() % 6 {
                0 | 1 => {
                    b.put(&put(key, round), &no_leases).expect("put");
                }
                2 => {
                    let req = DeleteRangeRequest { key: key.to_vec(), ..Default::default() };
                    b.delete_range(&req).expect("delete");
                }
                3 => {
                    let req = DeleteRangeRequest {
                        key: key.to_vec(),
                        range_end: b"b\0".to_vec(),
                        ..Default::default()
                    };
                    b.delete_range(&req).expect("delete range");
                }
                4 => {
                    let del = DeleteRangeRequest { key: key.to_vec(), ..Default::default() };
                    let ops = vec![
                        RequestOp { request: Some(Op::RequestPut(put(key, round))) },
                        RequestOp { request: Some(Op::RequestDeleteRange(del)) },
                        RequestOp { request: Some(Op::RequestPut(put(key, round + 1))) },
                    ];
                    let t = TxnRequest { success: ops, ..Default::default() };
                    b.txn(&t, &no_leases).expect("txn");
                }
                _ => {
                    let rev = b.revision() - (next() % 3) as i64;
                    if rev > b.compact_revision() {
                        b.compact(&CompactionRequest { revision: rev, physical: false })
                            .expect("compact");
                    }
                }
            }
        }
        b.commit(false).expect("commit");
        for key in KEYS {
            let view = Layered { base: &s, top: &Overlay::default() };
            assert_eq!(
                known(&view, key),
                Some(engine_newest(&s, key)),
                "round {round}: key {key:?}"
            );
        }
    }
}

/// A store holding one version of `k`.
fn store_with_k() -> MvccStore<MemEngine> {
    let mut s = MvccStore::open(MemEngine::new()).expect("open");
    let mut b = s.begin_apply();
    b.put(&put(b"k", 1), &|_: i64| false).expect("put");
    b.commit(false).expect("commit");
    s
}

#[test]
fn an_overlay_answers_only_what_it_can_tell() {
    let s = store_with_k();
    let base = engine_newest(&s, b"k").expect("k has a record");
    let enc = keys::encode_user_key(b"k");
    let newer = (keys::kv_key(b"k", 10), b"newer".to_vec());

    // A plain engine knows nothing without a scan; the store does.
    assert_eq!(known(s.engine(), b"k"), None);
    assert_eq!(known(&s, b"k"), Some(Some(base.clone())));
    // Nothing pending for the key: the base's answer.
    let empty = Overlay::default();
    assert_eq!(known(&Layered { base: &s, top: &empty }, b"k"), Some(Some(base.clone())));
    // A pending newer version comes first.
    let mut top = Overlay::default();
    top.put(Cf::Kv, newer.0.clone(), newer.1.clone());
    assert_eq!(known(&Layered { base: &s, top: &top }, b"k"), Some(Some(newer.clone())));
    // A pending delete of the base's record hides it: only a scan can tell what is left.
    let mut del = Overlay::default();
    del.delete(Cf::Kv, base.0.clone());
    assert_eq!(known(&Layered { base: &s, top: &del }, b"k"), None);
    // A pending delete after the base's first record does not.
    let mut later = Overlay::default();
    later.delete(Cf::Kv, keys::kv_key_encoded(&enc, 0));
    assert_eq!(known(&Layered { base: &s, top: &later }, b"k"), Some(Some(base)));
    // Over a base that cannot tell, neither can the overlay.
    assert_eq!(known(&Layered { base: s.engine(), top: &top }, b"k"), None);
}

#[test]
fn replacing_the_engines_contents_forgets_everything() {
    let mut s = store_with_k();
    assert!(known(&s, b"k").is_some_and(|r| r.is_some()), "cached");
    // A snapshot install writes the engine underneath the store, then reloads it.
    let mut wipe = WriteBatch::new();
    for (k, _) in s.engine().scan(Cf::Kv, b"", None).map(|r| r.expect("scan")) {
        wipe.delete(Cf::Kv, k);
    }
    s.engine().write(wipe, false).expect("write");
    s.reload().expect("reload");
    assert_eq!(known(&s, b"k"), Some(None), "the cache still answered the old record");
}

#[test]
fn records_over_the_limit_are_read_from_the_engine() {
    let mut s = MvccStore::open(MemEngine::new()).expect("open");
    let big = PutRequest {
        key: b"big".to_vec(),
        value: vec![7; MAX_RECORD_BYTES + 1],
        ..Default::default()
    };
    let mut b = s.begin_apply();
    b.put(&big, &|_: i64| false).expect("put");
    b.commit(false).expect("commit");
    assert!(s.newest.lock().map.is_empty(), "a record over the limit was kept");
    assert_eq!(known(&s, b"big"), Some(engine_newest(&s, b"big")));
    assert!(s.newest.lock().map.is_empty(), "a record over the limit was kept after a read");
}

/// The store as a view, counting the scans asked of it.
struct CountingScans<'a> {
    store: &'a MvccStore<MemEngine>,
    scans: std::cell::Cell<usize>,
}

impl ReadView for CountingScans<'_> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.store.get(cf, key)
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> crate::storage::engine::KvIter<'_> {
        self.scans.set(self.scans.get() + 1);
        self.store.scan(cf, start, end)
    }

    fn first_known(&self, cf: Cf, start: &[u8], end: &[u8]) -> crate::storage::engine::Known {
        self.store.first_known(cf, start, end)
    }
}

/// A single-key Range in the apply path (a queue claim checking an in-flight job's claim, a
/// Txn's Get) is answered from the cache, without an engine iterator, and says exactly what the
/// scan says, in every form of the request.
#[test]
fn a_single_key_range_is_answered_without_a_scan() {
    use crate::mvcc::read::range;
    use picket_proto::etcdserverpb::RangeRequest;

    let mut s = store_with_k();
    let mut b = s.begin_apply();
    b.put(&put(b"k", 2), &|_: i64| false).expect("put");
    b.commit(false).expect("commit");
    let (current, compacted) = (s.revision(), s.compact_revision());
    let view = CountingScans { store: &s, scans: Default::default() };

    let get = RangeRequest { key: b"k".to_vec(), ..Default::default() };
    let resp = range(&view, &get, current, compacted).expect("range");
    assert_eq!(view.scans.get(), 0, "a cached key's Range opened an engine iterator");
    assert_eq!((resp.count, resp.kvs.len()), (1, 1));
    assert_eq!(resp.kvs[0].value, 2u64.to_be_bytes());

    let forms = [
        get.clone(),
        RangeRequest { count_only: true, ..get.clone() },
        RangeRequest { keys_only: true, ..get.clone() },
        RangeRequest { limit: 1, ..get.clone() },
        RangeRequest { revision: current - 1, ..get.clone() },
        RangeRequest { min_mod_revision: current, ..get.clone() },
        RangeRequest { max_mod_revision: current - 1, ..get.clone() },
        RangeRequest { key: b"missing".to_vec(), ..get.clone() },
    ];
    for req in forms {
        let scanned = range(s.engine(), &req, current, compacted).expect("scan");
        assert_eq!(range(&view, &req, current, compacted).expect("range"), scanned, "{req:?}");
    }
}
