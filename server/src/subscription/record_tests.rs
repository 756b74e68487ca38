//! Group records written by plain Put/Txn (issue 19, Medium #11).
//!
//! A group record is an ordinary key, so any etcd client may write one; anyone who may write
//! under `picket/sub/` (everyone, with auth off) could write a record with no lag bound
//! (`max_lag_revisions <= 0`) and hold compaction back forever. Apply refuses a Put, or a Txn
//! (either branch, nested txns too) that would store a record CreateGroup would not have
//! written, with one deterministic error; a well-formed record (what `etcdctl make-mirror` or a
//! restore by replaying keys writes) still goes in.

use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    CompactionRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RefusalKind;
use picket_proto::picket::v1::SubscriptionGroup;
use prost::Message;

use super::group_key;
use crate::storage::test_member::Member;

impl Member {
    fn exists(&self, key: &[u8]) -> bool {
        let req = RangeRequest { key: key.to_vec(), ..Default::default() };
        !self.sm.shared().reader().range(&req).expect("read").kvs.is_empty()
    }
}

fn record(committed: i64, max_lag: i64) -> Vec<u8> {
    SubscriptionGroup {
        key: b"app/".to_vec(),
        range_end: b"app0".to_vec(),
        committed,
        max_lag_revisions: max_lag,
    }
    .encode_to_vec()
}

fn put(key: &[u8], value: Vec<u8>) -> PutRequest {
    PutRequest { key: key.to_vec(), value, ..Default::default() }
}

fn put_op(p: PutRequest) -> RequestOp {
    RequestOp { request: Some(Op::RequestPut(p)) }
}

fn assert_refused(r: CmdResult, what: &str) {
    match r {
        CmdResult::Error(e) => {
            assert_eq!(e.kind, RefusalKind::GroupBadRecord as i32, "{what}: {e:?}");
            assert!(e.message.contains("subscription group record"), "{what}: {e:?}");
        }
        other => panic!("{what}: applied: {other:?}"),
    }
}

#[tokio::test]
async fn a_group_record_without_a_lag_bound_written_by_put_or_txn_is_refused() {
    let mut m = Member::new();
    let key = group_key("g");
    for max_lag in [0, -1] {
        let r = m.apply(Cmd::Put(put(&key, record(0, max_lag)))).await;
        assert_refused(r, &format!("put with max_lag_revisions {max_lag}"));
    }
    assert_refused(m.apply(Cmd::Put(put(&key, b"not a record".to_vec()))).await, "garbage");
    // In a txn, in the branch that would not even run: refused as a whole, as etcd refuses a
    // txn with an invalid op in either branch.
    let txn = TxnRequest {
        success: vec![put_op(put(b"app/1", b"v".to_vec()))],
        failure: vec![put_op(put(&key, record(0, 0)))],
        ..Default::default()
    };
    assert_refused(m.apply(Cmd::Txn(txn)).await, "txn");
    assert!(!m.exists(&key), "no record stored");
    assert!(!m.exists(b"app/1"), "nothing of the refused txn applied");

    // The point of it: compaction is never held back by a hand-written unbounded record.
    for i in 0..5 {
        let r = m.apply(Cmd::Put(put(format!("app/{i}").as_bytes(), b"v".to_vec()))).await;
        assert!(matches!(r, CmdResult::Put(_)), "{r:?}");
    }
    let head = m.sm.shared().revision();
    let r = m.apply(Cmd::Compaction(CompactionRequest { revision: head, ..Default::default() }));
    assert!(matches!(r.await, CmdResult::Compaction(_)));
    let compacted = m.sm.shared().reader().revisions().expect("revisions").1;
    assert_eq!(compacted, head);
}

#[tokio::test]
async fn a_well_formed_group_record_written_by_put_still_applies() {
    // What CreateGroup writes, or a mirror/restore tool copying keys: accepted.
    let mut m = Member::new();
    let key = group_key("g");
    let r = m.apply(Cmd::Put(put(&key, record(0, 1000)))).await;
    assert!(matches!(r, CmdResult::Put(_)), "{r:?}");
    // Other keys are not judged, even ones that merely look close.
    let r = m.apply(Cmd::Put(put(b"picket/subx", b"anything".to_vec()))).await;
    assert!(matches!(r, CmdResult::Put(_)), "{r:?}");
}
