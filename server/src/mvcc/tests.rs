//! Unit tests of the MVCC store on `MemEngine`. Each case states the etcd behaviour it pins.

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::response_op::Response;
use picket_proto::etcdserverpb::{
    CompactionRequest, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest, TxnResponse,
};
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::{Event, KeyValue};
use prost::Message;

use super::*;
use crate::storage::engine::{Cf, MemEngine, ReadView};

const LEASES: [i64; 2] = [7, 8];

fn leases() -> impl LeaseLookup {
    |id: i64| LEASES.contains(&id)
}

fn store() -> MvccStore<MemEngine> {
    MvccStore::open(MemEngine::new()).unwrap()
}

fn put_req(k: &[u8], v: &[u8]) -> PutRequest {
    PutRequest { key: k.to_vec(), value: v.to_vec(), ..Default::default() }
}

fn put(s: &mut MvccStore<MemEngine>, k: &[u8], v: &[u8]) -> i64 {
    put_with(s, put_req(k, v)).unwrap()
}

fn put_with(s: &mut MvccStore<MemEngine>, req: PutRequest) -> Result<i64, MvccError> {
    let mut b = s.begin_apply();
    let r = b.put(&req, &leases());
    b.commit(false)?;
    Ok(r?.header.unwrap().revision)
}

fn del(s: &mut MvccStore<MemEngine>, k: &[u8], end: &[u8]) -> (i64, i64) {
    let mut b = s.begin_apply();
    let r = b
        .delete_range(&DeleteRangeRequest {
            key: k.to_vec(),
            range_end: end.to_vec(),
            prev_kv: false,
        })
        .unwrap();
    b.commit(false).unwrap();
    (r.deleted, r.header.unwrap().revision)
}

fn txn(s: &mut MvccStore<MemEngine>, t: TxnRequest) -> Result<TxnResponse, MvccError> {
    let mut b = s.begin_apply();
    let r = b.txn(&t, &leases());
    b.commit(false).unwrap();
    r
}

fn compact(s: &mut MvccStore<MemEngine>, rev: i64) -> Result<(), MvccError> {
    let mut b = s.begin_apply();
    let r = b.compact(&CompactionRequest { revision: rev, physical: false });
    b.commit(false).unwrap();
    r.map(|_| ())
}

fn rng(k: &[u8], end: &[u8]) -> RangeRequest {
    RangeRequest { key: k.to_vec(), range_end: end.to_vec(), ..Default::default() }
}

fn keys_of(kvs: &[KeyValue]) -> Vec<&[u8]> {
    kvs.iter().map(|kv| kv.key.as_slice()).collect()
}

fn get(s: &MvccStore<MemEngine>, k: &[u8]) -> Option<KeyValue> {
    s.range(&rng(k, b"")).unwrap().kvs.pop()
}

fn kv_records(s: &MvccStore<MemEngine>) -> usize {
    s.engine().scan(Cf::Kv, b"", None).count()
}

#[test]
fn revisions_versions_and_recreation() {
    let mut s = store();
    assert_eq!(s.revision(), 1, "a fresh etcd store is at revision 1");
    assert_eq!(s.compact_revision(), -1);
    assert_eq!(s.range(&rng(b"a", b"")).unwrap().header.unwrap().revision, 1);
    assert_eq!(put(&mut s, b"a", b"1"), 2, "the first write gets revision 2");
    assert_eq!(put(&mut s, b"a", b"2"), 3);
    let kv = get(&s, b"a").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    assert_eq!(del(&mut s, b"a", b""), (1, 4));
    assert_eq!(del(&mut s, b"a", b""), (0, 4), "deleting nothing takes no revision");
    assert_eq!(s.revision(), 4);
    assert_eq!(put(&mut s, b"a", b"3"), 5);
    let kv = get(&s, b"a").unwrap();
    assert_eq!((kv.create_revision, kv.version), (5, 1), "re-creation restarts the version");
    // History stays readable.
    let mut r = rng(b"a", b"");
    r.revision = 3;
    assert_eq!(s.range(&r).unwrap().kvs[0].value, b"2");
    r.revision = 4;
    assert!(s.range(&r).unwrap().kvs.is_empty());
    // Restart: the counters come back from the engine.
    let s2 = MvccStore::open(s.engine().clone()).unwrap();
    assert_eq!(s2.revision(), 5);
}

#[test]
fn range_key_and_range_end_semantics() {
    let mut s = store();
    for k in [&b"a"[..], b"a\x00", b"a\x00\x00", b"a\xff", b"ab", b"b", b"\xff", b"\xff\xff"] {
        put(&mut s, k, b"v");
    }
    let q = |k: &[u8], e: &[u8]| {
        let r = s.range(&rng(k, e)).unwrap();
        assert_eq!(r.count as usize, r.kvs.len());
        keys_of(&r.kvs).iter().map(|k| k.to_vec()).collect::<Vec<_>>()
    };
    assert_eq!(q(b"a", b""), vec![b"a".to_vec()]);
    assert_eq!(q(b"a\x00", b""), vec![b"a\x00".to_vec()]);
    // Prefix "a": range_end "b".
    assert_eq!(q(b"a", b"b").len(), 5);
    // Prefix "a\x00": range_end "a\x01".
    assert_eq!(q(b"a\x00", b"a\x01"), vec![b"a\x00".to_vec(), b"a\x00\x00".to_vec()]);
    // "\0" range_end: every key >= key.
    assert_eq!(
        q(b"ab", b"\x00"),
        vec![
            b"ab".to_vec(),
            b"a\xff".to_vec(),
            b"b".to_vec(),
            b"\xff".to_vec(),
            b"\xff\xff".to_vec()
        ]
    );
    assert_eq!(q(b"\x00", b"\x00").len(), 8, "key and range_end \\0 select every key");
    assert!(q(b"b", b"a").is_empty(), "range_end below key is empty");
    assert!(q(b"zz", b"").is_empty());
    assert_eq!(q(b"\xff", b"\xff\xff"), vec![b"\xff".to_vec()]);
}

#[test]
fn range_limit_count_sort_and_filters() {
    let mut s = store();
    // Revisions: c=2, a=3, b=4, then a again at 5 (version 2), d=6.
    for (k, v) in [(b"c", b"3"), (b"a", b"9"), (b"b", b"1"), (b"a", b"0"), (b"d", b"5")] {
        put(&mut s, k, v);
    }
    let all = || rng(b"a", b"\x00");

    let mut r = all();
    r.limit = 2;
    let resp = s.range(&r).unwrap();
    assert_eq!((keys_of(&resp.kvs), resp.more, resp.count), (vec![&b"a"[..], b"b"], true, 4));
    r.limit = 4;
    assert!(!s.range(&r).unwrap().more);

    let mut r = all();
    r.count_only = true;
    let resp = s.range(&r).unwrap();
    assert_eq!((resp.kvs.len(), resp.count, resp.more), (0, 4, false));

    let mut r = all();
    r.keys_only = true;
    assert!(s.range(&r).unwrap().kvs.iter().all(|kv| kv.value.is_empty()));

    // Target != KEY with order NONE sorts ascending (etcd).
    let mut r = all();
    r.sort_target = SortTarget::Value as i32;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"a"[..], b"b", b"c", b"d"]);
    r.sort_order = SortOrder::Descend as i32;
    r.limit = 2;
    let resp = s.range(&r).unwrap();
    assert_eq!((keys_of(&resp.kvs), resp.more, resp.count), (vec![&b"d"[..], b"c"], true, 4));
    let mut r = all();
    r.sort_target = SortTarget::Create as i32;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"c"[..], b"a", b"b", b"d"]);
    r.sort_target = SortTarget::Key as i32;
    r.sort_order = SortOrder::Descend as i32;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"d"[..], b"c", b"b", b"a"]);
    // Ties keep key order: every key but "a" has version 1.
    r.sort_target = SortTarget::Version as i32;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"a"[..], b"b", b"c", b"d"]);

    // etcd quirk: a non-key target with order NONE and a limit sorts only the first limit + 1
    // keys in key order (a=3, b=4 by create revision), not the whole range (c=2 would win).
    let mut r = all();
    r.sort_target = SortTarget::Create as i32;
    r.limit = 1;
    let resp = s.range(&r).unwrap();
    assert_eq!((keys_of(&resp.kvs), resp.more), (vec![&b"a"[..]], true));
    r.sort_order = SortOrder::Ascend as i32;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"c"[..]]);

    // Filters prune kvs but not count; limit applies after them.
    let mut r = all();
    r.max_create_revision = 3;
    r.limit = 1;
    let resp = s.range(&r).unwrap();
    assert_eq!((keys_of(&resp.kvs), resp.more, resp.count), (vec![&b"a"[..]], true, 4));
    let mut r = all();
    r.min_mod_revision = 5;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"a"[..], b"d"]);
    r.max_mod_revision = 5;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"a"[..]]);
    let mut r = all();
    r.min_create_revision = 4;
    assert_eq!(keys_of(&s.range(&r).unwrap().kvs), vec![&b"b"[..], b"d"]);
}

#[test]
fn range_revision_errors() {
    let mut s = store();
    for i in 0..5u8 {
        put(&mut s, b"k", &[i]);
    }
    assert_eq!(s.revision(), 6);
    let at = |s: &MvccStore<MemEngine>, rev: i64| {
        let mut r = rng(b"k", b"");
        r.revision = rev;
        s.range(&r)
    };
    assert_eq!(at(&s, 7), Err(MvccError::FutureRevision));
    assert_eq!(at(&s, -3).unwrap().kvs[0].value, vec![4], "<= 0 reads the current revision");
    compact(&mut s, 4).unwrap();
    assert_eq!(at(&s, 3), Err(MvccError::Compacted));
    let resp = at(&s, 4).unwrap();
    assert_eq!(resp.kvs[0].value, vec![2], "the compaction point itself is readable");
    assert_eq!(resp.header.unwrap().revision, 6, "the header has the current revision");
}

#[test]
fn compaction_drops_only_invisible_history() {
    let mut s = store();
    put(&mut s, b"a", b"1"); // 2
    put(&mut s, b"a", b"2"); // 3
    put(&mut s, b"b", b"1"); // 4
    del(&mut s, b"b", b""); // 5
    put(&mut s, b"c", b"1"); // 6
    put(&mut s, b"a", b"3"); // 7
    assert_eq!(kv_records(&s), 6);

    assert_eq!(compact(&mut s, 8), Err(MvccError::FutureRevision));
    compact(&mut s, 5).unwrap();
    // a@2 goes (a@3 is visible at 5); b's tombstone and b@4 go; c@6 and a@7 are newer.
    assert_eq!(kv_records(&s), 3);
    assert_eq!(s.compact_revision(), 5);
    assert_eq!(compact(&mut s, 5), Err(MvccError::Compacted));
    assert_eq!(compact(&mut s, 4), Err(MvccError::Compacted));
    let mut r = rng(b"a", b"\x00");
    r.revision = 5;
    let resp = s.range(&r).unwrap();
    assert_eq!(keys_of(&resp.kvs), vec![&b"a"[..]]);
    assert_eq!(resp.kvs[0].value, b"2");

    // Changelog: entries below 5 are gone, 5.. remain.
    assert_eq!(s.events(4, 10), Err(MvccError::Compacted));
    let revs: Vec<i64> = s.events(5, 10).unwrap().iter().map(|(r, _)| *r).collect();
    assert_eq!(revs, vec![5, 6, 7]);

    // Compacting again is incremental and idempotent on untouched keys.
    compact(&mut s, 7).unwrap();
    assert_eq!(kv_records(&s), 2, "a@3 is superseded by a@7");
    assert_eq!(s.events(7, 7).unwrap().len(), 1);
    // Survives a restart.
    let s2 = MvccStore::open(s.engine().clone()).unwrap();
    assert_eq!((s2.revision(), s2.compact_revision()), (7, 7));
}

#[test]
fn compaction_quirks_of_etcd() {
    // A fresh store (compact revision -1) can compact at 0, then not again at 0.
    let mut s = store();
    compact(&mut s, 0).unwrap();
    assert_eq!(compact(&mut s, 0), Err(MvccError::Compacted));
    compact(&mut s, 1).unwrap();
    assert_eq!(compact(&mut s, 2), Err(MvccError::FutureRevision));
}

fn cmp(k: &[u8], target: CompareTarget, result: CompareResult, operand: TargetUnion) -> Compare {
    Compare {
        result: result as i32,
        target: target as i32,
        key: k.to_vec(),
        range_end: vec![],
        target_union: Some(operand),
    }
}

fn op_put(k: &[u8], v: &[u8]) -> RequestOp {
    RequestOp { request: Some(Op::RequestPut(put_req(k, v))) }
}

fn op_get(k: &[u8], end: &[u8]) -> RequestOp {
    RequestOp { request: Some(Op::RequestRange(rng(k, end))) }
}

fn succeeded(s: &mut MvccStore<MemEngine>, c: Compare) -> bool {
    txn(s, TxnRequest { compare: vec![c], success: vec![], failure: vec![] }).unwrap().succeeded
}

#[test]
fn txn_compares() {
    use CompareResult::*;
    use CompareTarget::*;
    let mut s = store();
    let mut p = put_req(b"a", b"v1");
    p.lease = 7;
    put_with(&mut s, p).unwrap(); // a: create 2, mod 2, version 1, lease 7
    put(&mut s, b"b", b"v2"); // 3
    put(&mut s, b"b", b"v3"); // 4

    assert!(succeeded(&mut s, cmp(b"a", Version, Equal, TargetUnion::Version(1))));
    assert!(succeeded(&mut s, cmp(b"b", Version, Greater, TargetUnion::Version(1))));
    assert!(succeeded(&mut s, cmp(b"a", Create, Equal, TargetUnion::CreateRevision(2))));
    assert!(succeeded(&mut s, cmp(b"b", Mod, Less, TargetUnion::ModRevision(5))));
    assert!(succeeded(&mut s, cmp(b"a", Lease, Equal, TargetUnion::Lease(7))));
    assert!(succeeded(&mut s, cmp(b"a", Value, Equal, TargetUnion::Value(b"v1".to_vec()))));
    assert!(succeeded(&mut s, cmp(b"a", Value, Less, TargetUnion::Value(b"v2".to_vec()))));
    assert!(succeeded(&mut s, cmp(b"a", Value, NotEqual, TargetUnion::Value(b"x".to_vec()))));
    // A missing key compares as zero values...
    assert!(succeeded(&mut s, cmp(b"z", Create, Equal, TargetUnion::CreateRevision(0))));
    assert!(succeeded(&mut s, cmp(b"z", Version, Less, TargetUnion::Version(1))));
    assert!(succeeded(&mut s, cmp(b"z", Lease, Equal, TargetUnion::Lease(0))));
    // ...except VALUE, which always fails, even NOT_EQUAL.
    assert!(!succeeded(&mut s, cmp(b"z", Value, NotEqual, TargetUnion::Value(b"x".to_vec()))));
    assert!(!succeeded(&mut s, cmp(b"z", Value, Equal, TargetUnion::Value(vec![]))));
    // A mismatched operand counts as zero.
    assert!(succeeded(&mut s, cmp(b"a", Version, Greater, TargetUnion::Lease(100))));
    // With range_end, every key must satisfy the compare.
    let mut c = cmp(b"a", Version, Greater, TargetUnion::Version(0));
    c.range_end = b"c".to_vec();
    assert!(succeeded(&mut s, c.clone()));
    c.target_union = Some(TargetUnion::Version(1));
    assert!(!succeeded(&mut s, c), "a has version 1");
    assert_eq!(s.revision(), 4, "txns without writes take no revision");
}

#[test]
fn txn_branches_share_one_revision_and_see_own_writes() {
    use CompareResult::*;
    use CompareTarget::*;
    let mut s = store();
    put(&mut s, b"a", b"0"); // 2
    let t = TxnRequest {
        compare: vec![cmp(b"a", Value, Equal, TargetUnion::Value(b"0".to_vec()))],
        success: vec![
            op_put(b"a", b"1"),
            op_put(b"b", b"1"),
            op_get(b"a", b"c"),
            RequestOp {
                request: Some(Op::RequestTxn(TxnRequest {
                    // Nested compares see the state before the txn (etcd compareToPath).
                    compare: vec![cmp(b"a", Value, Equal, TargetUnion::Value(b"0".to_vec()))],
                    success: vec![op_put(b"c", b"nested")],
                    failure: vec![],
                })),
            },
        ],
        failure: vec![op_put(b"x", b"no")],
    };
    let resp = txn(&mut s, t).unwrap();
    assert!(resp.succeeded);
    assert_eq!(resp.header.unwrap().revision, 3);
    let Some(Response::ResponseRange(r)) = &resp.responses[2].response else {
        panic!("range response expected");
    };
    assert_eq!(r.header.as_ref().unwrap().revision, 3);
    assert_eq!(keys_of(&r.kvs), vec![&b"a"[..], b"b"]);
    assert_eq!(r.kvs[0].value, b"1");
    let Some(Response::ResponseTxn(n)) = &resp.responses[3].response else {
        panic!("txn response expected");
    };
    assert!(n.succeeded);
    assert_eq!(n.header.as_ref().unwrap().revision, 0, "nested headers are empty in etcd");
    for k in [b"a", b"b", b"c"] {
        assert_eq!(get(&s, k).unwrap().mod_revision, 3);
    }
    let events = s.events(3, 3).unwrap();
    assert_eq!(events[0].1.len(), 3);
    assert!(get(&s, b"x").is_none());
}

#[test]
fn failed_requests_leave_no_trace() {
    let mut s = store();
    put(&mut s, b"a", b"0"); // 2
    let mut b = s.begin_apply();
    // A txn whose second put names an unknown lease fails as a whole, before any op runs.
    let mut bad = put_req(b"c", b"1");
    bad.lease = 99;
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put(b"b", b"1"), RequestOp { request: Some(Op::RequestPut(bad.clone())) }],
        failure: vec![],
    };
    assert_eq!(b.txn(&t, &leases()), Err(MvccError::LeaseNotFound(99)));
    assert_eq!(b.put(&bad, &leases()), Err(MvccError::LeaseNotFound(99)));
    let mut ign = put_req(b"nope", b"");
    ign.ignore_value = true;
    assert_eq!(b.put(&ign, &leases()), Err(MvccError::KeyNotFound));
    // A later request of the same batch still applies, at the next revision.
    let r = b.put(&put_req(b"d", b"1"), &leases()).unwrap();
    assert_eq!(r.header.unwrap().revision, 3);
    // ...and a delete inside the batch sees the batch's own put.
    let d = b
        .delete_range(&DeleteRangeRequest { key: b"d".to_vec(), range_end: vec![], prev_kv: true })
        .unwrap();
    assert_eq!((d.deleted, d.prev_kvs[0].value.as_slice()), (1, &b"1"[..]));
    let events = b.commit(false).unwrap();
    assert_eq!(events.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(events[1].1[0].r#type, EventType::Delete as i32);
    assert_eq!(events[1].1[0].kv.as_ref().unwrap().mod_revision, 4);
    assert_eq!(s.revision(), 4);
    assert!(get(&s, b"b").is_none());
    assert!(get(&s, b"c").is_none());
}

#[test]
fn txn_range_checks_run_before_ops() {
    let mut s = store();
    put(&mut s, b"a", b"0"); // 2
    let mut future = rng(b"a", b"");
    future.revision = 3;
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put(b"a", b"1"), RequestOp { request: Some(Op::RequestRange(future)) }],
        failure: vec![],
    };
    // etcd checks a range revision against the revision before the txn.
    assert_eq!(txn(&mut s, t), Err(MvccError::FutureRevision));
    assert_eq!(s.revision(), 2);
    // A negative revision in a txn range is checked against the compaction point as is.
    let mut neg = rng(b"a", b"");
    neg.revision = -2;
    let t = TxnRequest {
        compare: vec![],
        success: vec![RequestOp { request: Some(Op::RequestRange(neg)) }],
        failure: vec![],
    };
    assert_eq!(txn(&mut s, t), Err(MvccError::Compacted));
}

#[test]
fn put_options() {
    let mut s = store();
    let mut p = put_req(b"a", b"v");
    p.lease = 7;
    put_with(&mut s, p).unwrap();
    let mut p = put_req(b"a", b"");
    p.ignore_value = true;
    p.prev_kv = true;
    let mut b = s.begin_apply();
    let resp = b.put(&p, &leases()).unwrap();
    b.commit(false).unwrap();
    assert_eq!(resp.prev_kv.unwrap().value, b"v");
    let kv = get(&s, b"a").unwrap();
    assert_eq!((kv.value.as_slice(), kv.lease, kv.version), (&b"v"[..], 0, 2));
    let mut p = put_req(b"a", b"w");
    p.ignore_lease = true;
    put_with(&mut s, p).unwrap();
    assert_eq!(get(&s, b"a").unwrap().lease, 0);
    assert_eq!(s.keys_of_lease(7).unwrap(), Vec::<Vec<u8>>::new());
}

#[test]
fn a_put_carries_over_create_revision_version_and_lease_with_or_without_the_previous_pair() {
    let mut s = store();
    let mut p = put_req(b"a", b"v");
    p.lease = 7;
    let created = put_with(&mut s, p).unwrap();
    // Neither prev_kv nor ignore_value: only the carried fields are decoded (`read::KvMeta`).
    let mut p = put_req(b"a", b"w");
    p.ignore_lease = true;
    put_with(&mut s, p).unwrap();
    let kv = get(&s, b"a").unwrap();
    assert_eq!((kv.create_revision, kv.version, kv.lease), (created, 2, 7));
    assert_eq!(kv.value, b"w");
    // A plain put after it, and one returning the previous pair, count on from it.
    put(&mut s, b"a", b"x");
    let mut p = put_req(b"a", b"y");
    p.prev_kv = true;
    let mut b = s.begin_apply();
    let resp = b.put(&p, &leases()).unwrap();
    b.commit(false).unwrap();
    let prev = resp.prev_kv.unwrap();
    assert_eq!((prev.value.as_slice(), prev.version, prev.lease), (&b"x"[..], 3, 0));
    let kv = get(&s, b"a").unwrap();
    assert_eq!((kv.create_revision, kv.version, kv.lease), (created, 4, 0));
    // A plain put answers without the previous pair.
    let mut b = s.begin_apply();
    assert_eq!(b.put(&put_req(b"a", b"z"), &leases()).unwrap().prev_kv, None);
}

#[test]
fn kv_meta_decodes_the_carried_fields_of_a_stored_key_value() {
    let kv = KeyValue {
        key: b"k\x00".to_vec(),
        create_revision: 5,
        mod_revision: 9,
        version: 3,
        value: vec![0xAB; 300],
        lease: 0x7FFF_0000_0000_0001,
    };
    let meta = read::decode_meta(&kv.encode_to_vec()).unwrap();
    assert_eq!(meta, read::KvMeta::of(&kv));
    assert_eq!((meta.create_revision, meta.version, meta.lease), (5, 3, 0x7FFF_0000_0000_0001));
    assert!(read::decode_meta(&[0x0A, 0x05, 0x01]).is_err(), "a truncated record is refused");
}

#[test]
fn changelog_records_are_revision_events_messages() {
    use picket_proto::picket::storage::v1::RevisionEvents;
    let kv = |k: &[u8], v: &[u8], rev: i64| KeyValue {
        key: k.to_vec(),
        create_revision: 2,
        mod_revision: rev,
        version: rev - 1,
        value: v.to_vec(),
        lease: 3,
    };
    let cases = vec![
        vec![],
        vec![Event { r#type: EventType::Put as i32, kv: Some(kv(b"a", b"1", 4)), prev_kv: None }],
        vec![
            Event {
                r#type: EventType::Put as i32,
                kv: Some(kv(b"a", &[0; 200], 5)),
                prev_kv: None,
            },
            Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue { key: b"b".to_vec(), mod_revision: 5, ..Default::default() }),
                prev_kv: Some(kv(b"b", b"old", 3)),
            },
            Event::default(),
        ],
    ];
    for events in cases {
        let bytes = apply::encode_changes(&events);
        assert_eq!(bytes, RevisionEvents { events: events.clone() }.encode_to_vec());
        assert_eq!(RevisionEvents::decode(bytes.as_slice()).unwrap().events, events);
    }
}

#[test]
fn lease_keys_index() {
    let mut s = store();
    let with_lease = |k: &[u8], l: i64| PutRequest {
        key: k.to_vec(),
        value: b"v".to_vec(),
        lease: l,
        ..Default::default()
    };
    put_with(&mut s, with_lease(b"b\x00", 7)).unwrap();
    put_with(&mut s, with_lease(b"a", 7)).unwrap();
    put_with(&mut s, with_lease(b"c", 8)).unwrap();
    assert_eq!(s.keys_of_lease(7).unwrap(), vec![b"a".to_vec(), b"b\x00".to_vec()]);
    // Moving a key to another lease, then off leases.
    put_with(&mut s, with_lease(b"a", 8)).unwrap();
    assert_eq!(s.keys_of_lease(7).unwrap(), vec![b"b\x00".to_vec()]);
    assert_eq!(s.keys_of_lease(8).unwrap(), vec![b"a".to_vec(), b"c".to_vec()]);
    put_with(&mut s, with_lease(b"c", 0)).unwrap();
    assert_eq!(s.keys_of_lease(8).unwrap(), vec![b"a".to_vec()]);
    del(&mut s, b"b\x00", b"");
    assert!(s.keys_of_lease(7).unwrap().is_empty());

    put_with(&mut s, with_lease(b"d", 8)).unwrap();
    let rev = s.revision();
    let mut b = s.begin_apply();
    assert_eq!(b.revoke_lease_keys(8).unwrap(), vec![b"a".to_vec(), b"d".to_vec()]);
    assert!(b.revoke_lease_keys(7).unwrap().is_empty());
    let events = b.commit(false).unwrap();
    assert_eq!(events.len(), 1, "one revision for all keys of the lease");
    assert_eq!(events[0].0, rev + 1);
    assert_eq!(events[0].1.len(), 2);
    assert!(s.keys_of_lease(8).unwrap().is_empty());
    assert!(get(&s, b"a").is_none());
    assert_eq!(s.revision(), rev + 1);
}

#[test]
fn raw_records_and_read_only_txns() {
    let mut s = store();
    let mut b = s.begin_apply();
    b.put_raw(Cf::Meta, b"raft/x", b"1");
    assert_eq!(b.get_raw(Cf::Meta, b"raft/x").unwrap(), Some(b"1".to_vec()));
    b.put(&put_req(b"a", b"1"), &leases()).unwrap();
    assert_eq!(b.range(&rng(b"a", b"")).unwrap().kvs.len(), 1);
    b.commit(true).unwrap();
    assert_eq!(s.engine().get(Cf::Meta, b"raft/x").unwrap(), Some(b"1".to_vec()));
    let mut b = s.begin_apply();
    b.delete_raw(Cf::Meta, b"raft/x");
    b.commit(false).unwrap();
    assert_eq!(s.engine().get(Cf::Meta, b"raft/x").unwrap(), None);

    let reader = s.reader();
    let t = TxnRequest { compare: vec![], success: vec![op_get(b"a", b"")], failure: vec![] };
    let resp = reader.read_txn(&t).unwrap();
    assert_eq!(resp.header.unwrap().revision, 2);
    let Some(Response::ResponseRange(r)) = &resp.responses[0].response else {
        panic!("range response expected");
    };
    assert_eq!(r.kvs[0].value, b"1");
    let t = TxnRequest { compare: vec![], success: vec![op_put(b"a", b"2")], failure: vec![] };
    assert_eq!(reader.read_txn(&t), Err(MvccError::TxnNotReadOnly));
    assert_eq!(reader.revisions().unwrap(), (2, -1));
}

#[test]
fn reads_use_one_view() {
    // A view taken before a commit keeps answering for the state it saw.
    let mut s = store();
    put(&mut s, b"a", b"1");
    let view = crate::storage::engine::Engine::view(s.engine());
    put(&mut s, b"a", b"2");
    let revs = read::read_revisions(&view).unwrap();
    let resp = read::range(&view, &rng(b"a", b""), revs.current, revs.compacted).unwrap();
    assert_eq!((resp.kvs[0].value.as_slice(), resp.header.unwrap().revision), (&b"1"[..], 2));
}

#[test]
fn long_histories_are_read_correctly_across_reseeks() {
    // More versions than the scan's re-seek threshold, next to keys that sort around it.
    let mut s = store();
    put(&mut s, b"k", b"first"); // 2
    put(&mut s, b"k\x00", b"neighbour"); // 3
    for i in 0..50u8 {
        put(&mut s, b"k", &[i]); // 4..=53
    }
    put(&mut s, b"j", b"before"); // 54
    put(&mut s, b"l", b"after"); // 55
    for (rev, want) in [
        (2, Some(&b"first"[..])),
        (3, Some(b"first")),
        (4, Some(&[0u8][..])),
        (30, Some(&[26u8][..])),
        (55, Some(&[49u8][..])),
    ] {
        let mut r = rng(b"j", b"m");
        r.revision = rev;
        let resp = s.range(&r).unwrap();
        let k = resp.kvs.iter().find(|kv| kv.key == b"k").map(|kv| kv.value.as_slice());
        assert_eq!(k, want, "at revision {rev}");
        let expected = [rev >= 54, true, rev >= 3, rev >= 55].iter().filter(|x| **x).count();
        assert_eq!(resp.count as usize, expected, "at revision {rev}");
    }
    del(&mut s, b"k", b""); // 56
    let resp = s.range(&rng(b"j", b"m")).unwrap();
    assert_eq!(keys_of(&resp.kvs), vec![&b"j"[..], b"k\x00", b"l"]);
    compact(&mut s, 56).unwrap();
    assert_eq!(kv_records(&s), 3, "the whole history of k is gone");
}

#[test]
fn ranges_read_keys_with_few_versions_around_the_reseek() {
    // Keys with 1 to 5 versions side by side: a resolved key is left by stepping or by a seek
    // past its versions depending on how many it has; every key must come out once, at its
    // value for the read revision.
    let mut s = store();
    let mut history = Vec::new(); // (revision, key, value) of every put
    for round in 0..5u8 {
        for k in 1..=5u8 {
            if round < k {
                let rev = put(&mut s, &[b'a' + k], &[round]);
                history.push((rev, k, round));
            }
        }
    }
    let last = history.last().unwrap().0;
    for at in 2..=last {
        let mut r = rng(b"a", b"z");
        r.revision = at;
        let got: Vec<(u8, u8)> =
            s.range(&r).unwrap().kvs.iter().map(|kv| (kv.key[0] - b'a', kv.value[0])).collect();
        let mut want: Vec<(u8, u8)> = Vec::new();
        for k in 1..=5u8 {
            if let Some((_, _, v)) = history.iter().rfind(|(rev, key, _)| *key == k && *rev <= at) {
                want.push((k, *v));
            }
        }
        assert_eq!(got, want, "at revision {at}");
    }
}

/// Watch replay reads the changelog in steps bounded by bytes (issue 19, Medium 10): a step stops
/// after the revision at which its events reach the budget, and always takes one revision.
#[test]
fn events_bounded_stops_at_the_byte_budget() {
    let mut s = MvccStore::open(MemEngine::new()).unwrap();
    for i in 0..10 {
        let mut b = s.begin_apply();
        let req = PutRequest {
            key: format!("k{i}").into_bytes(),
            value: vec![1; 1000],
            ..Default::default()
        };
        b.put(&req, &|_| false).unwrap();
        b.commit(false).unwrap();
    }
    let r = s.reader();
    let (all, through) = r.events_bounded(2, 11, usize::MAX).unwrap();
    assert_eq!((all.len(), through), (10, 11));
    let (some, through) = r.events_bounded(2, 11, 2500).unwrap();
    assert_eq!(some.iter().map(|(rev, _)| *rev).collect::<Vec<_>>(), vec![2, 3, 4]);
    assert_eq!(through, 4);
    let (one, through) = r.events_bounded(2, 11, 1).unwrap();
    assert_eq!((one.len(), through), (1, 2));
}
