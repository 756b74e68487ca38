//! The compares and writes of each queue Txn: what makes claims exclusive and fenced.

use picket_proto::etcdserverpb::compare::{CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{Compare, RequestOp, TxnRequest};
use picket_proto::picket::v1::{
    QueueClaimRecord, QueueDeadRecord, QueueJobRecord, QueuePendingRecord,
};
use prost::Message;

use super::*;
use crate::queue::keys;

fn compares(t: &TxnRequest) -> Vec<(Vec<u8>, CompareTarget, i64)> {
    t.compare
        .iter()
        .map(|c: &Compare| {
            let v = match c.target_union {
                Some(TargetUnion::CreateRevision(r)) | Some(TargetUnion::ModRevision(r)) => r,
                _ => panic!("unexpected compare value"),
            };
            (c.key.clone(), CompareTarget::try_from(c.target).unwrap(), v)
        })
        .collect()
}

#[derive(Debug, PartialEq)]
enum W {
    Put(Vec<u8>, i64),
    Del(Vec<u8>),
    Get(Vec<u8>),
}

fn writes(ops: &[RequestOp]) -> Vec<W> {
    ops.iter()
        .map(|o| match o.request.as_ref().unwrap() {
            Op::RequestPut(p) => W::Put(p.key.clone(), p.lease),
            Op::RequestDeleteRange(d) => {
                assert!(d.range_end.is_empty(), "queue txns delete single keys only");
                W::Del(d.key.clone())
            }
            Op::RequestRange(r) => W::Get(r.key.clone()),
            Op::RequestTxn(_) => panic!("no nested txns"),
        })
        .collect()
}

fn job() -> QueueJobRecord {
    QueueJobRecord { payload: b"p".to_vec(), priority: 3, max_attempts: 5, ..Default::default() }
}

#[test]
fn enqueue_requires_a_new_id_and_a_new_dedup_id() {
    let t = enqueue("q", "j1", &job(), 70, 7, Some("d"));
    assert_eq!(
        compares(&t),
        vec![
            (keys::job_key("q", "j1"), CompareTarget::Create, 0),
            (keys::dedup_key("q", "d"), CompareTarget::Create, 0),
        ]
    );
    assert_eq!(
        writes(&t.success),
        vec![
            W::Put(keys::job_key("q", "j1"), 0),
            W::Put(keys::pending_key("q", 3, 77, "j1"), 0),
            W::Put(keys::dedup_key("q", "d"), 0),
        ]
    );
    // The failure branch reads the dedup key so the existing job can be returned.
    assert_eq!(writes(&t.failure), vec![W::Get(keys::dedup_key("q", "d"))]);
    let p = match &t.success[1].request {
        Some(Op::RequestPut(p)) => QueuePendingRecord::decode(p.value.as_slice()).unwrap(),
        _ => unreachable!(),
    };
    assert_eq!((p.attempts, p.max_attempts, p.job_id.as_str()), (0, 5, "j1"));
    // The entry is ready at 70 + 7 and says it was written with a 7 ms delay.
    assert_eq!(p.delay_ms, Some(7));
    let t = enqueue("q", "j1", &job(), 77, 0, None);
    assert_eq!(t.compare.len(), 1);
    assert!(t.failure.is_empty());
}

#[test]
fn claim_compares_the_entry_and_the_absent_claim_and_attaches_the_lease() {
    let pk = keys::pending_key("q", 3, 77, "j1");
    let bumped = QueuePendingRecord { attempts: 1, ..Default::default() };
    let t = claim("q", "j1", &pk, 41, &bumped, 0x99, &QueueClaimRecord::default());
    assert_eq!(
        compares(&t),
        vec![
            (pk.clone(), CompareTarget::Mod, 41),
            (keys::claim_key("q", "j1"), CompareTarget::Create, 0),
        ]
    );
    assert_eq!(
        writes(&t.success),
        vec![
            W::Put(pk, 0),
            W::Put(keys::claim_key("q", "j1"), 0x99),
            W::Get(keys::job_key("q", "j1")),
        ]
    );
}

#[test]
fn ack_nack_extend_are_fenced_by_the_token() {
    let pk = keys::pending_key("q", 3, 77, "j1");
    let fenced = vec![(keys::claim_key("q", "j1"), CompareTarget::Create, 12)];
    let explain = vec![W::Get(keys::claim_key("q", "j1")), W::Get(keys::job_key("q", "j1"))];

    let t = ack("q", "j1", 12, &pk);
    assert_eq!(compares(&t), fenced);
    assert_eq!(
        writes(&t.success),
        vec![
            W::Del(keys::claim_key("q", "j1")),
            W::Del(pk.clone()),
            W::Del(keys::job_key("q", "j1"))
        ]
    );
    assert_eq!(writes(&t.failure), explain);

    let new_pk = keys::pending_key("q", 3, 5000, "j1");
    let t = nack("q", "j1", 12, &pk, &new_pk, &QueuePendingRecord::default());
    assert_eq!(compares(&t), fenced);
    assert_eq!(
        writes(&t.success),
        vec![W::Del(keys::claim_key("q", "j1")), W::Del(pk.clone()), W::Put(new_pk, 0)]
    );
    // Same ready time: no delete and put of one key in one Txn (etcd refuses duplicates).
    let t = nack("q", "j1", 12, &pk, &pk, &QueuePendingRecord::default());
    assert_eq!(writes(&t.success), vec![W::Del(keys::claim_key("q", "j1")), W::Put(pk.clone(), 0)]);

    let t = extend("q", "j1", 12, 0x99, &QueueClaimRecord::default());
    assert_eq!(compares(&t), fenced);
    assert_eq!(writes(&t.success), vec![W::Put(keys::claim_key("q", "j1"), 0x99)]);
}

#[test]
fn dead_letter_moves_the_job_under_its_guard() {
    let pk = keys::pending_key("q", 3, 77, "j1");
    let t = dead_letter(
        "q",
        "j1",
        unclaimed("q", "j1", &pk, 41),
        &pk,
        &QueueDeadRecord::default(),
        false,
    );
    assert_eq!(
        compares(&t),
        vec![
            (pk.clone(), CompareTarget::Mod, 41),
            (keys::claim_key("q", "j1"), CompareTarget::Create, 0)
        ]
    );
    assert_eq!(
        writes(&t.success),
        vec![
            W::Del(pk.clone()),
            W::Del(keys::job_key("q", "j1")),
            W::Put(keys::dead_key("q", "j1"), 0)
        ]
    );
    let t =
        dead_letter("q", "j1", vec![holds("q", "j1", 12)], &pk, &QueueDeadRecord::default(), true);
    assert_eq!(writes(&t.success)[0], W::Del(keys::claim_key("q", "j1")));
}

#[test]
fn reap_and_requeue_compare_what_they_read() {
    let t = reap("q", "j1", 50);
    assert_eq!(compares(&t), vec![(keys::claim_key("q", "j1"), CompareTarget::Mod, 50)]);
    let t = requeue("q", "j1", 60, &job(), 1000);
    assert_eq!(
        compares(&t),
        vec![
            (keys::dead_key("q", "j1"), CompareTarget::Mod, 60),
            (keys::job_key("q", "j1"), CompareTarget::Create, 0)
        ]
    );
    assert_eq!(
        writes(&t.success),
        vec![
            W::Del(keys::dead_key("q", "j1")),
            W::Put(keys::job_key("q", "j1"), 0),
            W::Put(keys::pending_key("q", 3, 1000, "j1"), 0),
        ]
    );
}
