//! The apply rules on the in-memory engine, without openraft: each rule in etcd's order, and
//! how a group-committed batch applies its commands.

use picket_proto::etcdserverpb::alarm_request::AlarmAction;
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    AlarmRequest, AlarmType, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};
use picket_proto::picket::raft::v1::{AuthChecked, FencedTxn, LeaseExpire, RaftCommand};

use super::*;
use crate::mvcc::MvccStore;
use crate::storage::engine::MemEngine;

/// One member's replicated state on the in-memory engine.
struct State {
    store: MvccStore<MemEngine>,
    leases: LeaseTable,
}

impl State {
    fn new() -> Self {
        Self { store: MvccStore::open(MemEngine::new()).unwrap(), leases: LeaseTable::default() }
    }

    /// Applies `cmd` as one entry of term `term` and commits it.
    fn apply_in_term(&mut self, cmd: Cmd, term: u64) -> CmdResult {
        let mut batch = self.store.begin_apply();
        let out = command(&mut batch, &mut self.leases, &cmd, term).expect("no fatal error");
        batch.commit(false).unwrap();
        out
    }

    fn apply(&mut self, cmd: Cmd) -> CmdResult {
        self.apply_in_term(cmd, 1)
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        let req = RangeRequest { key: key.into(), ..Default::default() };
        self.store.range(&req).unwrap().kvs.into_iter().next().map(|kv| kv.value)
    }
}

fn put(key: &str, value: &str) -> Cmd {
    Cmd::Put(PutRequest { key: key.into(), value: value.into(), ..Default::default() })
}

fn put_op(key: &str, value: &str) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })),
    }
}

fn error_message(r: &CmdResult) -> &str {
    match r {
        CmdResult::Error(e) => &e.message,
        other => panic!("expected an error result, got {other:?}"),
    }
}

#[test]
fn quota_comes_first_growth_is_refused_under_nospace_but_deletes_apply() {
    let mut s = State::new();
    assert!(matches!(s.apply(put("a", "1")), CmdResult::Put(_)));
    let alarm = AlarmRequest {
        action: AlarmAction::Activate as i32,
        member_id: 1,
        alarm: AlarmType::Nospace as i32,
    };
    assert!(matches!(s.apply(Cmd::Alarm(alarm)), CmdResult::Alarm(_)));
    assert!(error_message(&s.apply(put("b", "1"))).contains("database space exceeded"));
    let grant = Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 5 });
    assert!(error_message(&s.apply(grant)).contains("database space exceeded"));
    let del = Cmd::DeleteRange(DeleteRangeRequest { key: b"a".to_vec(), ..Default::default() });
    assert!(matches!(s.apply(del), CmdResult::DeleteRange(_)));
    assert_eq!((s.get("a"), s.get("b")), (None, None));
}

#[test]
fn a_fenced_txn_applies_only_for_the_current_holder() {
    let mut s = State::new();
    s.apply(put("lk/holder-1", ""));
    s.apply(put("lk/holder-2", ""));
    let holder = s.store.range(&crate::concurrency::holder_range(b"lk")).unwrap().kvs;
    let token = holder[0].create_revision;
    let fenced = |token: i64, value: &str| {
        Cmd::FencedTxn(FencedTxn {
            name: b"lk".to_vec(),
            token,
            txn: Some(TxnRequest { success: vec![put_op("data", value)], ..Default::default() }),
        })
    };
    assert!(matches!(s.apply(fenced(token, "by holder")), CmdResult::Txn(_)));
    let stale = s.apply(fenced(token + 1, "by the next in line"));
    assert!(!error_message(&stale).is_empty());
    assert_eq!(s.get("data"), Some(b"by holder".to_vec()));
    let missing = Cmd::FencedTxn(FencedTxn { name: b"lk".to_vec(), token, txn: None });
    assert!(error_message(&s.apply(missing)).contains("without a txn"));
}

#[test]
fn a_lease_expiry_applies_only_in_the_term_that_decided_it() {
    let mut s = State::new();
    s.apply(Cmd::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 9 }));
    let expire = |term| Cmd::LeaseExpire(LeaseExpire { id: 9, term });
    assert!(error_message(&s.apply_in_term(expire(3), 4)).contains("stale lease expiry"));
    assert!(s.leases.get(9).is_some(), "a stale expiry revokes nothing");
    assert!(matches!(s.apply_in_term(expire(4), 4), CmdResult::LeaseRevoke(_)));
    assert!(s.leases.get(9).is_none());
}

#[test]
fn a_batch_applies_each_command_alone_and_refuses_nesting() {
    let mut s = State::new();
    let wrap = |cmd| RaftCommand { cmd: Some(cmd), forwarded: None };
    let nested = Cmd::Batch(CommandBatch { commands: vec![wrap(put("n", "1"))] });
    let batch = Cmd::Batch(CommandBatch {
        commands: vec![
            wrap(put("x", "1")),
            // Fails deterministically; its neighbours still apply.
            wrap(Cmd::LeaseExpire(LeaseExpire { id: 1, term: 0 })),
            wrap(nested),
            RaftCommand { cmd: None, forwarded: None },
            wrap(put("y", "2")),
        ],
    });
    let CmdResult::Batch(r) = s.apply(batch) else { panic!("a batch result") };
    let results: Vec<_> = r.results.into_iter().map(|r| r.result.unwrap()).collect();
    assert!(matches!(results[0], CmdResult::Put(_)));
    assert!(error_message(&results[1]).contains("stale lease expiry"));
    assert!(error_message(&results[2]).contains("may not contain another batch"));
    assert!(error_message(&results[3]).contains("empty raft command"));
    assert!(matches!(results[4], CmdResult::Put(_)));
    assert_eq!(
        (s.get("x"), s.get("y"), s.get("n")),
        (Some(b"1".to_vec()), Some(b"2".to_vec()), None)
    );
}

#[test]
fn an_auth_checked_command_applies_its_command_and_refuses_nesting_or_none() {
    use crate::auth::replicated::{checked, Judgement};
    let mut s = State::new();
    // A fresh store's auth is off at revision 0: a command judged there is current.
    let judged = Judgement { revision: 0, auth_on: false };
    assert!(matches!(s.apply(checked(judged, put("a", "1"))), CmdResult::Put(_)));
    let nested = checked(judged, checked(judged, put("b", "1")));
    assert!(error_message(&s.apply(nested)).contains("nested in another"));
    let empty = |command| {
        Cmd::AuthChecked(Box::new(AuthChecked {
            auth_revision: 0,
            command,
            judged_with_auth_off: true,
        }))
    };
    assert!(error_message(&s.apply(empty(None))).contains("empty auth-checked command"));
    let no_cmd = Some(Box::new(RaftCommand { cmd: None, forwarded: None }));
    assert!(error_message(&s.apply(empty(no_cmd))).contains("empty auth-checked command"));
    assert_eq!((s.get("a"), s.get("b")), (Some(b"1".to_vec()), None));
}
