//! A lease expiry decided by a leader of an earlier term is ignored at apply. Found by the
//! Jepsen harness: a leader SIGSTOPped past the lease TTL wakes with a stale clock and proposes
//! revokes; forwarded to the new leader (which renewed every lease when it took over) they
//! would expire leases early. Apply compares the command's term with the entry's own term.

use openraft::EntryPayload;
use picket_proto::etcdserverpb::LeaseGrantRequest;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{LeaseExpire, RaftCommand};
use picket_server::raft::types::log_id;
use picket_server::raft::types::{Command, Entry};
use picket_server::storage::rocks::RocksEngine;
use picket_server::storage::state_machine::StateMachine;

fn entry(term: u64, index: u64, cmd: Cmd) -> Entry {
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Normal(Command::new(RaftCommand {
            cmd: Some(cmd),
            forwarded: None,
        })),
    }
}

#[tokio::test]
async fn expiry_from_an_earlier_term_is_ignored() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
    let sm = StateMachine::open(engine, dir.path().join("snapshots")).expect("open sm");
    let id = 7;
    let results = sm
        .apply_entries(vec![
            entry(1, 1, Cmd::LeaseGrant(LeaseGrantRequest { ttl: 5, id })),
            // Decided in term 1, appended by the term-2 leader: stale.
            entry(2, 2, Cmd::LeaseExpire(LeaseExpire { id, term: 1 })),
        ])
        .expect("apply");
    match &results[1].0.result {
        Some(CmdResult::Error(e)) => {
            let kind = picket_proto::picket::raft::v1::RefusalKind::LeaseExpiryStale;
            assert_eq!(e.kind, kind as i32, "{e:?}");
            assert!(e.message.contains("stale lease expiry"), "{e:?}");
        }
        other => panic!("stale expiry applied: {other:?}"),
    }
    assert!(sm.shared().with_leases(|t| t.get(id).is_some()), "lease must survive");

    // Decided by the current term's leader: the lease is revoked.
    let results = sm
        .apply_entries(vec![entry(2, 3, Cmd::LeaseExpire(LeaseExpire { id, term: 2 }))])
        .expect("apply");
    assert!(
        matches!(results[0].0.result, Some(CmdResult::LeaseRevoke(_))),
        "{:?}",
        results[0].0.result
    );
    assert!(sm.shared().with_leases(|t| t.get(id).is_none()), "lease must be gone");
}
