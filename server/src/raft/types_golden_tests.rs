//! Golden bytes of every openraft type Picket stores (postcard, in RocksDB and the snapshot
//! file) or sends between members (postcard inside `RaftPayload`). A change of openraft (the
//! planned 0.9 -> 0.10 move, docs/openraft-0.10-migration.md) or of serde/postcard that changed
//! one of these layouts would make existing data directories or mixed-version clusters
//! unreadable; these tests fail first. The expected bytes were produced by openraft 0.9.25.

use std::collections::{BTreeMap, BTreeSet};

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::{CommittedLeaderId, EntryPayload, Membership};
use picket_proto::etcdserverpb::PutRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RaftCommand;

use super::*;

fn hex<T: Serialize>(v: &T) -> String {
    postcard::to_allocvec(v).expect("encode").iter().map(|b| format!("{b:02x}")).collect()
}

fn log_id() -> LogId {
    LogId::new(CommittedLeaderId::new(3, 7), 42)
}

fn member() -> Member {
    Member {
        name: "n1".into(),
        peer_urls: vec!["http://a:2380".into()],
        client_urls: vec!["http://a:2379".into()],
    }
}

fn membership() -> StoredMembership {
    let voters = BTreeSet::from([7u64]);
    let nodes = BTreeMap::from([(7u64, member())]);
    StoredMembership::new(Some(log_id()), Membership::new(vec![voters], nodes))
}

fn command() -> Command {
    Command(RaftCommand {
        cmd: Some(Cmd::Put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })),
    })
}

/// Asserts the encoding, and that the expected bytes decode to a value that encodes to them
/// again (so the bytes, not only this build's encoder, are understood).
fn golden<T>(v: &T, expected: &str)
where
    T: Serialize + serde::de::DeserializeOwned + fmt::Debug,
{
    assert_eq!(hex(v), expected, "postcard layout of {v:?} changed");
    let bytes: Vec<u8> = (0..expected.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&expected[i..i + 2], 16).expect("hex"))
        .collect();
    let back: T = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(hex(&back), expected);
}

#[test]
fn stored_formats_keep_their_bytes() {
    golden(&log_id(), "03072a");
    golden(&Some(log_id()), "0103072a");
    golden(&Vote::new_committed(3, 7), "030701");
    golden(&Vote::new(4, 7), "040700");
    golden(
        &membership(),
        "0103072a0101070107026e31010d687474703a2f2f613a32333830010d687474703a2f2f613a32333739",
    );
    let normal = Entry { log_id: log_id(), payload: EntryPayload::Normal(command()) };
    golden(&normal, "03072a01080a060a016b120176");
    let blank = Entry { log_id: log_id(), payload: EntryPayload::Blank };
    golden(&blank, "03072a00");
    let m = Entry {
        log_id: log_id(),
        payload: EntryPayload::Membership(membership().membership().clone()),
    };
    golden(
        &m,
        "03072a020101070107026e31010d687474703a2f2f613a32333830010d687474703a2f2f613a32333739",
    );
    let meta = SnapshotMeta {
        last_log_id: Some(log_id()),
        last_membership: membership(),
        snapshot_id: "s1".into(),
    };
    golden(&meta, "0103072a0103072a0101070107026e31010d687474703a2f2f613a32333830010d687474703a2f2f613a32333739027331");
}

#[test]
fn peer_messages_keep_their_bytes() {
    let vote = Vote::new_committed(3, 7);
    golden(&VoteRequest::new(vote, Some(log_id())), "0307010103072a");
    golden(&VoteResponse::new(vote, Some(log_id()), true), "030701010103072a");
    let append = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(log_id()),
        entries: vec![Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 7), 43),
            payload: EntryPayload::Normal(command()),
        }],
        leader_commit: Some(log_id()),
    };
    golden(&append, "0307010103072a0103072b01080a060a016b1201760103072a");
    golden(&AppendEntriesResponse::<NodeId>::Success, "00");
}
