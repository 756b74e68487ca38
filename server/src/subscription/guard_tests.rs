//! The guard through a real apply batch on `MemEngine`: group records are ordinary keys read
//! through the batch, and compaction lands where the rules say.

use picket_proto::etcdserverpb::{CompactionRequest, PutRequest, RangeRequest};
use picket_proto::picket::v1::SubscriptionGroup;
use prost::Message;

use super::compact;
use crate::mvcc::{MvccError, MvccStore};
use crate::storage::engine::MemEngine;
use crate::subscription::group_key;

fn put(s: &mut MvccStore<MemEngine>, k: &[u8], v: &[u8]) -> i64 {
    let mut b = s.begin_apply();
    let req = PutRequest { key: k.to_vec(), value: v.to_vec(), ..Default::default() };
    b.put(&req, &|_id: i64| false).unwrap();
    b.commit(false).unwrap();
    s.revision()
}

fn group(s: &mut MvccStore<MemEngine>, name: &str, committed: i64, max_lag: i64) {
    let rec = SubscriptionGroup {
        key: b"a/".to_vec(),
        range_end: b"a0".to_vec(),
        committed,
        max_lag_revisions: max_lag,
    };
    put(s, &group_key(name), &rec.encode_to_vec());
}

fn guarded_compact(s: &mut MvccStore<MemEngine>, rev: i64) -> Result<(), MvccError> {
    let mut b = s.begin_apply();
    let out = compact(&mut b, &CompactionRequest { revision: rev, physical: false });
    b.commit(false)?;
    out.map(|_| ())
}

fn readable_at(s: &MvccStore<MemEngine>, rev: i64) -> bool {
    let req = RangeRequest {
        key: b"a/".to_vec(),
        range_end: b"a0".to_vec(),
        revision: rev,
        ..Default::default()
    };
    s.reader().range(&req).is_ok()
}

#[test]
fn compaction_is_clamped_at_the_group_and_hand_written_records_are_ignored() {
    let mut s = MvccStore::open(MemEngine::new()).unwrap();
    let first = put(&mut s, b"a/1", b"x");
    group(&mut s, "g", first, 1000);
    put(&mut s, &group_key("garbage"), b"not a record");
    for i in 0..5 {
        put(&mut s, format!("a/{i}").as_bytes(), b"y");
    }
    let head = s.revision();
    guarded_compact(&mut s, head).unwrap();
    assert_eq!(s.compact_revision(), first + 1);
    assert!(readable_at(&s, first + 1));

    // Nothing more may go: a second compaction succeeds and changes nothing.
    guarded_compact(&mut s, head).unwrap();
    assert_eq!(s.compact_revision(), first + 1);

    // etcd's own errors are untouched.
    assert!(matches!(guarded_compact(&mut s, first), Err(MvccError::Compacted)));
    assert!(matches!(guarded_compact(&mut s, head + 100), Err(MvccError::FutureRevision)));
}

#[test]
fn a_group_past_its_bound_does_not_hold_compaction() {
    let mut s = MvccStore::open(MemEngine::new()).unwrap();
    let first = put(&mut s, b"a/1", b"x");
    group(&mut s, "slow", first, 3);
    for i in 0..6 {
        put(&mut s, format!("a/{i}").as_bytes(), b"y");
    }
    let head = s.revision();
    guarded_compact(&mut s, head).unwrap();
    assert_eq!(s.compact_revision(), head, "the lagging group was passed");
    assert!(!readable_at(&s, first + 1));
}
