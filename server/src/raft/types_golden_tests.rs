//! Golden bytes of every openraft type Picket stores (postcard, in RocksDB and the snapshot
//! file) or sends between members (postcard inside `RaftPayload`). A change of openraft (the
//! planned 0.9 -> 0.10 move, docs/openraft-0.10-migration.md) or of serde/postcard that changed
//! one of these layouts would make existing data directories or mixed-version clusters
//! unreadable; these tests fail first. The expected bytes were produced by openraft 0.9.25; on
//! openraft 0.10 every one of them still decodes and re-encodes the same, except where noted
//! (the snapshot id 0.10 no longer has, the vote request's new trailing flag).

use std::collections::{BTreeMap, BTreeSet};

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::{EntryPayload, Membership};
use picket_proto::etcdserverpb::PutRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RaftCommand;

use super::*;

fn hex<T: Serialize>(v: &T) -> String {
    postcard::to_allocvec(v).expect("encode").iter().map(|b| format!("{b:02x}")).collect()
}

fn log_id() -> LogId {
    crate::raft::types::log_id(3, 7, 42)
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
    StoredMembership::new(Some(log_id()), Membership::new(vec![voters], nodes).expect("valid"))
}

fn command() -> Command {
    Command::new(RaftCommand {
        cmd: Some(Cmd::Put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })),
        forwarded: None,
    })
}

/// Asserts the encoding, and that the expected bytes decode to a value that encodes to them
/// again (so the bytes, not only this build's encoder, are understood).
fn golden<T>(v: &T, expected: &str)
where
    T: Serialize + serde::de::DeserializeOwned + fmt::Debug,
{
    assert_eq!(hex(v), expected, "postcard layout of {v:?} changed");
    let back: T = postcard::from_bytes(&unhex(expected)).expect("decode");
    assert_eq!(hex(&back), expected);
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex")).collect()
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
    // openraft 0.10 dropped the snapshot id but keeps its slot: it writes an empty id where 0.9
    // wrote one, and reads (and ignores) whatever id a 0.9 file holds.
    let meta = SnapshotMeta { last_log_id: Some(log_id()), last_membership: membership() };
    let layout = "0103072a0103072a0101070107026e31010d687474703a2f2f613a32333830010d687474703a2f2f613a32333739";
    golden(&meta, &format!("{layout}00"));
    let from_09: SnapshotMeta =
        postcard::from_bytes(&unhex(&format!("{layout}027331"))).expect("0.9 meta");
    assert_eq!(from_09, meta);
}

#[test]
fn peer_messages_keep_their_bytes() {
    let vote = Vote::new_committed(3, 7);
    // 0.10 added a trailing `leadership_transfer` flag; the peer service appends a zero byte to
    // what it receives (`service::vote_request_bytes`), so a 0.9 member's request still reads.
    golden(&VoteRequest::<TypeConfig>::new(vote, Some(log_id())), "0307010103072a00");
    let from_09: VoteRequest<TypeConfig> =
        postcard::from_bytes(&crate::raft::service::vote_request_bytes(&unhex("0307010103072a")))
            .expect("0.9 vote request, padded");
    assert_eq!(from_09, VoteRequest::<TypeConfig>::new(vote, Some(log_id())));
    let from_010: VoteRequest<TypeConfig> =
        postcard::from_bytes(&crate::raft::service::vote_request_bytes(&unhex("0307010103072a01")))
            .expect("0.10 vote request, padded");
    assert!(from_010.leadership_transfer);
    golden(&VoteResponse::<TypeConfig>::new(vote, Some(log_id()), true), "030701010103072a");
    let append = AppendEntriesRequest::<TypeConfig> {
        vote,
        prev_log_id: Some(log_id()),
        entries: vec![Entry {
            log_id: crate::raft::types::log_id(3, 7, 43),
            payload: EntryPayload::Normal(command()),
        }],
        leader_commit: Some(log_id()),
    };
    golden(&append, "0307010103072a0103072b01080a060a016b1201760103072a");
    golden(&AppendEntriesResponse::<TypeConfig>::Success, "00");
}
