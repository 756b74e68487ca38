use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use super::*;

fn op_put(k: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest { key: k.to_vec(), ..Default::default() })),
    }
}

fn op_del(k: &[u8], end: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
            key: k.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        })),
    }
}

fn op_get(k: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestRange(RangeRequest { key: k.to_vec(), ..Default::default() })),
    }
}

fn nested(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> RequestOp {
    RequestOp { request: Some(Op::RequestTxn(TxnRequest { compare: vec![], success, failure })) }
}

fn txn_of(success: Vec<RequestOp>) -> TxnRequest {
    TxnRequest { compare: vec![], success, failure: vec![] }
}

#[test]
fn simple_requests() {
    assert_eq!(range(&RangeRequest::default()), Err(MvccError::KeyNotProvided));
    assert_eq!(delete_range(&DeleteRangeRequest::default()), Err(MvccError::KeyNotProvided));
    let mut p = PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        ignore_value: true,
        ..Default::default()
    };
    assert_eq!(put(&p), Err(MvccError::ValueProvided));
    p.value.clear();
    assert_eq!(put(&p), Ok(()));
    p.ignore_lease = true;
    p.lease = 5;
    assert_eq!(put(&p), Err(MvccError::LeaseProvided));
    p.key.clear();
    assert_eq!(put(&p), Err(MvccError::KeyNotProvided));
}

#[test]
fn txn_sizes_and_keys() {
    let t = txn_of(vec![op_put(b"a"), op_put(b"b"), op_put(b"c")]);
    assert_eq!(txn(&t, 3), Ok(()));
    assert_eq!(txn(&t, 2), Err(MvccError::TooManyOps));
    // A nested txn gets what the outer one leaves: 3 - 2 = 1 op.
    let t = txn_of(vec![op_put(b"a"), nested(vec![op_put(b"b"), op_put(b"c")], vec![])]);
    assert_eq!(txn(&t, 3), Err(MvccError::TooManyOps));
    assert_eq!(txn(&t, 4), Ok(()));
    let mut t = txn_of(vec![op_get(b"a")]);
    t.compare.push(Compare::default());
    assert_eq!(txn(&t, 8), Err(MvccError::KeyNotProvided));
    let t = txn_of(vec![RequestOp { request: None }]);
    assert_eq!(txn(&t, 8), Err(MvccError::KeyNotFound));
    let t = txn_of(vec![op_get(b"")]);
    assert_eq!(txn(&t, 8), Err(MvccError::KeyNotProvided));
}

#[test]
fn duplicate_keys_as_etcd_check_intervals() {
    let dup = |ops: Vec<RequestOp>| txn(&txn_of(ops), 128);
    assert_eq!(dup(vec![op_put(b"a"), op_put(b"a")]), Err(MvccError::DuplicateKey));
    assert_eq!(dup(vec![op_put(b"a"), op_put(b"b")]), Ok(()));
    // A put inside a deleted range, in either order.
    assert_eq!(dup(vec![op_del(b"a", b"c"), op_put(b"b")]), Err(MvccError::DuplicateKey));
    assert_eq!(dup(vec![op_put(b"b"), op_del(b"a", b"c")]), Err(MvccError::DuplicateKey));
    assert_eq!(dup(vec![op_put(b"c"), op_del(b"a", b"c")]), Ok(()));
    assert_eq!(dup(vec![op_put(b"a"), op_del(b"a", b"")]), Err(MvccError::DuplicateKey));
    assert_eq!(dup(vec![op_put(b"a\x00"), op_del(b"a", b"")]), Ok(()));
    // etcd quirk: a "from key" delete (range_end "\0") never conflicts.
    assert_eq!(dup(vec![op_put(b"b"), op_del(b"a", b"\x00")]), Ok(()));
    assert_eq!(dup(vec![op_put(b"a"), op_del(b"a", b"\x00")]), Ok(()));
    // Two deletes are fine.
    assert_eq!(dup(vec![op_del(b"a", b"z"), op_del(b"b", b"")]), Ok(()));
    // Nested: then/else may share keys; a key in a nested branch and at the outer level may not.
    assert_eq!(dup(vec![nested(vec![op_put(b"a")], vec![op_put(b"a")])]), Ok(()));
    assert_eq!(
        dup(vec![op_put(b"a"), nested(vec![op_put(b"a")], vec![])]),
        Err(MvccError::DuplicateKey)
    );
    assert_eq!(
        dup(vec![op_put(b"a"), nested(vec![], vec![op_put(b"a")])]),
        Err(MvccError::DuplicateKey)
    );
    assert_eq!(
        dup(vec![op_del(b"a", b"b"), nested(vec![op_put(b"a")], vec![])]),
        Err(MvccError::DuplicateKey)
    );
    assert_eq!(
        dup(vec![nested(vec![op_del(b"a", b"b")], vec![]), op_put(b"a")]),
        Err(MvccError::DuplicateKey)
    );
    assert_eq!(
        dup(vec![nested(vec![op_put(b"a")], vec![]), nested(vec![op_put(b"a")], vec![])]),
        Err(MvccError::DuplicateKey)
    );
    // etcd's asymmetry: an earlier nested put and a later nested delete pass.
    assert_eq!(
        dup(vec![nested(vec![op_put(b"a")], vec![]), nested(vec![op_del(b"a", b"")], vec![])]),
        Ok(())
    );
    // The failure branch is checked on its own.
    let t = TxnRequest {
        compare: vec![],
        success: vec![op_put(b"a")],
        failure: vec![op_put(b"a"), op_put(b"a")],
    };
    assert_eq!(txn(&t, 8), Err(MvccError::DuplicateKey));
}

#[test]
fn read_only_txns() {
    assert!(is_txn_read_only(&txn_of(vec![op_get(b"a"), op_get(b"b")])));
    assert!(is_txn_read_only(&txn_of(vec![])));
    assert!(!is_txn_read_only(&txn_of(vec![op_get(b"a"), op_put(b"b")])));
    assert!(!is_txn_read_only(&txn_of(vec![nested(vec![op_get(b"a")], vec![])])));
}
