//! Unit tests of the quota: the size measure falls after compaction and defragment (or the
//! NOSPACE alarm could never clear), the alarm set is applied deterministically, and the gate
//! refuses exactly the commands that grow the store.

use picket_proto::etcdserverpb::request_op::Request as OpRequest;
use picket_proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RequestOp, TxnRequest,
};
use picket_proto::picket::raft::v1::queue_command::Op as QueueOp;
use picket_proto::picket::raft::v1::{QueueAckClaimOp, QueueAckOp, QueueClaimOp, QueueCommand};

use super::*;
use crate::lease::LeaseTable;
use crate::mvcc::MvccStore;

fn put(key: &str, len: usize) -> PutRequest {
    PutRequest { key: key.as_bytes().to_vec(), value: vec![b'x'; len], ..Default::default() }
}

fn alarm(action: AlarmAction, member_id: u64) -> AlarmRequest {
    AlarmRequest { action: action as i32, member_id, alarm: AlarmType::Nospace as i32 }
}

#[test]
fn size_falls_after_compaction_and_defragment() {
    let dir = tempfile::tempdir().unwrap();
    let engine = RocksEngine::open(dir.path()).unwrap();
    let mut store = MvccStore::open(engine.clone()).unwrap();
    let leases = LeaseTable::default();
    let (empty, _) = backend_sizes(&engine);
    for round in 0..50 {
        let mut b = store.begin_apply();
        for k in 0..8 {
            b.put(&put(&format!("k{k}"), 4096), &leases).unwrap();
        }
        let _ = round;
        b.commit(false).unwrap();
    }
    let (full, _) = backend_sizes(&engine);
    // 400 versions of 4 KiB, each in `kv` and `changelog`: well over 1 MiB.
    assert!(full > empty + 1024 * 1024, "empty {empty} full {full}");
    let mut b = store.begin_apply();
    let rev = b.revision();
    b.compact(&CompactionRequest { revision: rev, physical: false }).unwrap();
    b.commit(false).unwrap();
    for cf in Cf::ALL {
        engine.db().compact_range_cf(engine.cf_handle(cf), None::<&[u8]>, None::<&[u8]>);
    }
    let (after, _) = backend_sizes(&engine);
    // Eight live keys of 4 KiB remain, plus their changelog records.
    assert!(after < full / 4, "full {full} after {after}");
}

#[test]
fn alarms_apply_deterministically_and_gate_growing_commands() {
    let dir = tempfile::tempdir().unwrap();
    let engine = RocksEngine::open(dir.path()).unwrap();
    let mut store = MvccStore::open(engine.clone()).unwrap();
    let txn_put = Cmd::Txn(TxnRequest {
        success: vec![RequestOp { request: Some(OpRequest::RequestPut(put("a", 1))) }],
        ..Default::default()
    });
    let txn_delete = Cmd::Txn(TxnRequest {
        failure: vec![RequestOp {
            request: Some(OpRequest::RequestDeleteRange(DeleteRangeRequest {
                key: b"a".to_vec(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    });
    // Queue commands: a claim writes its claim key, so does an ack_claim (refused whole, its
    // ack with it); a plain ack only deletes.
    let queue = |op: QueueOp| Cmd::Queue(QueueCommand { op: Some(op), ..Default::default() });
    let claim = QueueClaimOp::default();
    let ack = QueueAckOp::default();
    let ack_claim = QueueAckClaimOp { ack: Some(ack.clone()), claim: Some(claim.clone()) };
    let growing = [
        Cmd::Put(put("a", 1)),
        Cmd::LeaseGrant(LeaseGrantRequest::default()),
        txn_put,
        queue(QueueOp::Claim(claim)),
        queue(QueueOp::AckClaim(ack_claim)),
    ];
    let harmless = [
        Cmd::DeleteRange(DeleteRangeRequest { key: b"a".to_vec(), ..Default::default() }),
        Cmd::Compaction(CompactionRequest::default()),
        txn_delete,
        queue(QueueOp::Ack(ack)),
    ];

    let mut b = store.begin_apply();
    for c in growing.iter().chain(&harmless) {
        assert_eq!(gate(&b, c).unwrap(), Ok(()), "no alarm: {c:?}");
    }
    let r = apply_alarm(&mut b, &alarm(AlarmAction::Activate, 7)).unwrap();
    assert!(matches!(r, CmdResult::Alarm(ref a) if a.alarms.len() == 1), "{r:?}");
    // Activating twice changes nothing and says so.
    let r = apply_alarm(&mut b, &alarm(AlarmAction::Activate, 7)).unwrap();
    assert!(matches!(r, CmdResult::Alarm(ref a) if a.alarms.is_empty()), "{r:?}");
    // The gate sees the alarm within the same batch (a later entry of the same apply call).
    for c in &growing {
        let refused = gate(&b, c).unwrap();
        assert_eq!(refused, Err(NoSpace), "{c:?}");
    }
    for c in &harmless {
        assert_eq!(gate(&b, c).unwrap(), Ok(()), "{c:?}");
    }
    b.commit(false).unwrap();
    let set = read_alarms(&engine).unwrap();
    assert_eq!(set.into_iter().collect::<Vec<_>>(), vec![(7, AlarmType::Nospace as i32)]);
    let alarms = AlarmCache::load(&engine).unwrap();
    assert!(check_propose(&alarms, &growing[0]).is_err());
    assert!(check_propose(&alarms, &harmless[0]).is_ok());
    // Client writes are proposed wrapped with the auth revision they were checked at.
    let judged = crate::auth::replicated::Judgement { revision: 3, auth_on: false };
    let wrapped = |c: &Cmd| crate::auth::replicated::checked(judged, c.clone());
    assert!(check_propose(&alarms, &wrapped(&growing[0])).is_err());
    assert!(check_propose(&alarms, &wrapped(&harmless[0])).is_ok());

    let mut b = store.begin_apply();
    apply_alarm(&mut b, &alarm(AlarmAction::Deactivate, 7)).unwrap();
    assert_eq!(gate(&b, &growing[0]).unwrap(), Ok(()));
    b.commit(false).unwrap();
    assert!(read_alarms(&engine).unwrap().is_empty());
    alarms.refresh(&engine).unwrap();
    assert!(check_propose(&alarms, &growing[0]).is_ok());
}

#[test]
fn monitor_decisions_have_a_margin() {
    let quota = 1000;
    let none = AlarmSet::new();
    let mine: AlarmSet = [(1, AlarmType::Nospace as i32)].into_iter().collect();
    let others: AlarmSet = [(2, AlarmType::Nospace as i32)].into_iter().collect();
    assert_eq!(decide(1, 1001, quota, &none), Some(AlarmAction::Activate));
    assert_eq!(decide(1, 1000, quota, &none), None);
    assert_eq!(decide(1, 1001, quota, &mine), None);
    // Between 90 % and the quota an active alarm stays.
    assert_eq!(decide(1, 950, quota, &mine), None);
    assert_eq!(decide(1, 899, quota, &mine), Some(AlarmAction::Deactivate));
    // Another member's alarm is that member's to clear (or the operator's).
    assert_eq!(decide(1, 10, quota, &others), None);
    assert_eq!(decide(1, 1001, quota, &others), Some(AlarmAction::Activate));
    assert_eq!(effective_quota(0), DEFAULT_QUOTA_BYTES);
    assert_eq!(effective_quota(5), 5);
}
