use futures::FutureExt;
use picket_proto::etcdserverpb::{PutRequest, RangeRequest};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{CommandBatch, RaftCommand};

use super::ForwardedResults;
use crate::storage::test_member::Member;

fn put(key: &str) -> RaftCommand {
    let req = PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() };
    RaftCommand { cmd: Some(Cmd::Put(req)), forwarded: None }
}

fn revision_of(result: &CmdResult) -> i64 {
    match result {
        CmdResult::Put(r) => r.header.as_ref().map_or(0, |h| h.revision),
        other => panic!("not a put result: {other:?}"),
    }
}

/// The follower's side of a forwarded write: its own apply of the entry hands the result to the
/// waiting caller, and by then the write is readable on this member.
#[test]
fn this_members_apply_hands_a_forwarded_commands_result_to_its_waiter() {
    let mut member = Member::new();
    let registry = member.sm.shared().forwarded().clone();
    let (tagged, mut waiter) = registry.tag(put("a"));
    assert!(waiter.applied().now_or_never().is_none(), "nothing is applied yet");

    let applied = member.apply_command(tagged);
    let handed = waiter.applied().now_or_never().expect("handed over by the apply");
    let handed = handed.result.expect("a result");
    assert_eq!(handed, applied, "the waiter gets what apply decided");

    let read = member
        .sm
        .shared()
        .reader()
        .range(&RangeRequest { key: b"a".to_vec(), ..Default::default() })
        .expect("read");
    assert_eq!(read.kvs.len(), 1, "the write is readable here once its waiter is answered");
    assert_eq!(read.kvs[0].mod_revision, revision_of(&handed));
}

/// In a group-committed entry each forwarded command gets its own slot's result; commands of
/// other members (another origin) and untagged ones are nobody's here.
#[test]
fn each_slot_of_a_batch_goes_to_its_own_waiter() {
    let mut member = Member::new();
    let ours = member.sm.shared().forwarded().clone();
    let theirs = std::sync::Arc::new(ForwardedResults::new());
    let (b, mut wait_b) = ours.tag(put("b"));
    let (c, _wait_c_elsewhere) = theirs.tag(put("c"));
    let (d, mut wait_d) = ours.tag(put("d"));
    let batch = CommandBatch { commands: vec![put("a"), b, c, d] };
    let result =
        member.apply_command(RaftCommand { cmd: Some(Cmd::Batch(batch)), forwarded: None });
    let CmdResult::Batch(results) = result else { panic!("a batch result") };
    let slot = |i: usize| results.results[i].result.clone().expect("slot result");

    let got_b = wait_b.applied().now_or_never().expect("b handed over").result.unwrap();
    let got_d = wait_d.applied().now_or_never().expect("d handed over").result.unwrap();
    assert_eq!(got_b, slot(1));
    assert_eq!(got_d, slot(3));
    assert_eq!(revision_of(&got_d), revision_of(&got_b) + 2, "c applied between them");
}

/// A tag from another run of this member (a restart draws a new origin) or from another member
/// matches no waiter, even with the same ticket: replayed entries answer nobody.
#[test]
fn a_tag_of_another_origin_answers_nobody() {
    let mut member = Member::new();
    let ours = member.sm.shared().forwarded().clone();
    let earlier_run = std::sync::Arc::new(ForwardedResults::new());
    let (mut mine, mut waiter) = ours.tag(put("a"));
    let (old, _) = earlier_run.tag(put("a"));
    // Same ticket number, different origin.
    assert_eq!(mine.forwarded.as_ref().unwrap().ticket, old.forwarded.as_ref().unwrap().ticket);
    member.apply_command(old);
    assert!(waiter.applied().now_or_never().is_none(), "another origin's result is not ours");

    mine.cmd = Some(put("b").cmd.unwrap());
    member.apply_command(mine);
    assert!(waiter.applied().now_or_never().is_some());
}

/// A caller that gave up (its waiter dropped) leaves nothing registered behind.
#[test]
fn a_dropped_waiter_is_unregistered() {
    let registry = std::sync::Arc::new(ForwardedResults::new());
    let (tagged, waiter) = registry.tag(put("a"));
    drop(waiter);
    assert!(registry.waiting.lock().is_empty());
    // Its command may still be applied later: the result is owed to nobody and dropped.
    let super::Ours::Whole(ticket) = registry.ours(&tagged) else { panic!("our tag") };
    registry.deliver(vec![(ticket, Default::default())]);
    assert!(registry.waiting.lock().is_empty());
}

/// What the state machine's apply yields for (`state_machine::apply`): a command, alone or in
/// a batch, that another member forwarded; not one this member forwarded, nor a local one.
#[test]
fn forwarded_elsewhere_names_only_other_members_commands() {
    let here = std::sync::Arc::new(ForwardedResults::default());
    let there = std::sync::Arc::new(ForwardedResults::default());
    let (theirs, _waiter) = there.tag(put("a"));
    let (ours, _our_waiter) = here.tag(put("b"));
    assert!(here.forwarded_elsewhere(&theirs));
    assert!(!there.forwarded_elsewhere(&theirs));
    assert!(!here.forwarded_elsewhere(&ours));
    assert!(!here.forwarded_elsewhere(&put("c")));
    let batch = |commands| RaftCommand {
        cmd: Some(Cmd::Batch(CommandBatch { commands })),
        forwarded: None,
    };
    assert!(here.forwarded_elsewhere(&batch(vec![put("c"), ours.clone(), theirs])));
    assert!(!here.forwarded_elsewhere(&batch(vec![put("c"), ours])));
}
