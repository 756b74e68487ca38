//! The replication pipeline: its rules on their own (`Plan`), then whole sessions through
//! `PeerClient::stream_append` against fake followers (`append_stream_tests`).

use std::time::Duration;

use futures::StreamExt;
use openraft::error::RPCError;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, StreamAppendResult};
use openraft::{EntryPayload, RaftNetworkV2};

use super::Plan;
use crate::raft::append_stream_tests::{peer, Mode, Seen, PER_MIB, SLOW};
use crate::raft::network::{deadline_for, Network, PeerClient};
use crate::raft::types::{log_id, Entry, Member, TypeConfig, Vote};

type Request = AppendEntriesRequest<TypeConfig>;

/// A request from leader 1 in term 1: entries `first..=last` (none when `first > last`) after
/// entry `first - 1`, with commit index `commit`.
fn req(first: u64, last: u64, commit: Option<u64>) -> Request {
    let prev = first.checked_sub(1).filter(|&p| p > 0).map(|p| log_id(1, 1, p));
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: prev,
        leader_commit: commit.map(|c| log_id(1, 1, c)),
        entries: (first..=last)
            .map(|i| Entry { log_id: log_id(1, 1, i), payload: EntryPayload::Blank })
            .collect(),
    }
}

/// A request that carries only the commit index, after entry `last`.
fn commit_only(last: u64, commit: u64) -> Request {
    req(last + 1, last, Some(commit))
}

/// What a request is: (its first entry's index, how many entries, its commit index).
fn shape(r: &Request) -> (Option<u64>, usize, Option<u64>) {
    (r.entries.first().map(|e| e.log_id.index), r.entries.len(), r.leader_commit.map(|c| c.index))
}

/// The plan's next request, recorded as sent the way the session records it, with one entry
/// in flight on the leader.
fn send(plan: &mut Plan) -> Option<Request> {
    send_with(plan, false)
}

/// [`send`], with `overlap`: whether the leader has more than one entry in flight.
fn send_with(plan: &mut Plan, overlap: bool) -> Option<Request> {
    let r = plan.next_to_send(overlap)?;
    plan.sent(&r, 0, tokio::time::Instant::now());
    Some(r)
}

#[test]
fn the_commit_index_goes_out_past_unanswered_entries_and_entries_wait() {
    let mut plan = Plan::default();
    plan.take(req(1, 1, None));
    assert_eq!(send(&mut plan).map(|r| shape(&r)), Some((Some(1), 1, None)));
    tracing::info!("the commit of entry 1 leaves while entry 1 is unanswered");
    plan.take(commit_only(1, 1));
    assert_eq!(send(&mut plan).map(|r| shape(&r)), Some((None, 0, Some(1))));
    assert!(!plan.may_take(false), "two unanswered: one of each kind");
    tracing::info!("entry 2 waits for entry 1's answer");
    plan.answered();
    assert!(plan.may_take(false));
    plan.take(req(2, 2, Some(1)));
    plan.answered();
    assert_eq!(send(&mut plan).map(|r| shape(&r)), Some((Some(2), 1, Some(1))));
    plan.answered();
    assert!(plan.idle());
}

#[test]
fn what_waits_is_merged_into_one_request_with_the_newest_commit() {
    let mut plan = Plan::default();
    plan.take(req(1, 1, None));
    assert!(send(&mut plan).is_some());
    tracing::info!("entries 2-3 and then the commit of 1 arrive while entry 1 is unanswered");
    plan.take(req(2, 2, None));
    plan.take(req(3, 3, None));
    plan.take(commit_only(3, 1));
    assert!(send(&mut plan).is_none(), "no second entries request while one is unanswered");
    plan.answered();
    let merged = send(&mut plan).expect("the held entries, once entry 1 is answered");
    assert_eq!(shape(&merged), (Some(2), 2, Some(1)));
    assert_eq!(merged.prev_log_id, Some(log_id(1, 1, 1)));
    tracing::info!("a commit-only request that waits takes the entries made after it");
    plan.take(commit_only(3, 2));
    assert!(send(&mut plan).is_some(), "commit-only, past the unanswered entries");
    plan.take(commit_only(3, 3));
    assert!(send(&mut plan).is_none(), "one commit-only request unanswered at a time");
    plan.take(req(4, 4, Some(3)));
    plan.answered();
    let next = send(&mut plan).expect("entries 2-3 answered: the merged request goes");
    assert_eq!(shape(&next), (Some(4), 1, Some(3)));
    assert_eq!(next.prev_log_id, Some(log_id(1, 1, 3)));
}

#[test]
fn requests_that_do_not_continue_each_other_or_overflow_are_not_merged() {
    let mut plan = Plan::default();
    plan.take(req(1, 1, None));
    assert!(send(&mut plan).is_some());
    plan.take(req(2, 301, None));
    plan.take(req(302, 302, None));
    assert!(!plan.may_take(false), "two held requests: nothing more is taken");
    plan.answered();
    assert_eq!(send(&mut plan).map(|r| shape(&r)), Some((Some(2), 300, None)));
    plan.answered();
    assert_eq!(send(&mut plan).map(|r| shape(&r)), Some((Some(302), 1, None)));
    tracing::info!("another leader's request, or one that does not follow on, stays apart");
    let mut other = req(303, 303, None);
    other.vote = Vote::new_committed(2, 3);
    plan.take(other);
    plan.take(req(310, 310, None));
    plan.answered();
    assert_eq!(send(&mut plan).map(|r| r.vote), Some(Vote::new_committed(2, 3)));
    plan.answered();
    assert_eq!(send(&mut plan).map(|r| shape(&r)), Some((Some(310), 1, None)));
}

/// While the leader has a second entry in flight (its batcher's light rule), the second
/// entry's request goes out before the first is answered, never a third; the commit index still
/// goes one request at a time. With one entry in flight the rules are as before.
#[test]
fn a_second_entry_in_flight_goes_out_before_the_first_is_answered() {
    let mut plan = Plan::default();
    plan.take(req(1, 1, None));
    assert!(send_with(&mut plan, true).is_some());
    plan.take(req(2, 2, None));
    assert!(send_with(&mut plan, false).is_none(), "one entry in flight: entry 2 waits");
    let second = send_with(&mut plan, true).expect("two entries in flight: entry 2 goes");
    assert_eq!(shape(&second), (Some(2), 1, None));
    assert_eq!(second.prev_log_id, Some(log_id(1, 1, 1)));
    tracing::info!("a third entries request waits, and a commit index still goes past them");
    plan.take(req(3, 3, None));
    assert!(send_with(&mut plan, true).is_none(), "at most two entries requests unanswered");
    assert!(!plan.may_take(false), "one entry in flight: two unanswered is the most");
    plan.answered();
    let third = send_with(&mut plan, true).expect("entry 1 answered: entry 3 goes");
    assert_eq!(shape(&third), (Some(3), 1, None));
    plan.take(commit_only(3, 2));
    assert_eq!(send_with(&mut plan, true).map(|r| shape(&r)), Some((None, 0, Some(2))));
    plan.take(commit_only(3, 3));
    assert!(send_with(&mut plan, true).is_none(), "one commit-only request at a time");
    plan.answered();
    plan.answered();
    plan.answered();
    assert_eq!(send_with(&mut plan, true).map(|r| shape(&r)), Some((None, 0, Some(3))));
}

type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// A commit index sent past a large append is answered after it (answers come in order), so
/// it is given at least the append's time. Seen failing with each request's own deadline: the
/// commit-only request's came 500 ms before the append's, and once the append was answered the
/// session would have timed out at once unless the next answer was already there.
#[test]
fn a_request_behind_a_slower_one_keeps_its_deadline() {
    use tokio::time::Instant;
    let mut plan = Plan::default();
    let now = Instant::now();
    plan.take(req(1, 2, None));
    let entries = plan.next_to_send(false).expect("the entries go out");
    plan.sent(&entries, 1, now + Duration::from_millis(600));
    plan.take(commit_only(2, 2));
    let commit = plan.next_to_send(false).expect("the commit index goes out past them");
    plan.sent(&commit, 2, now + Duration::from_millis(100));
    assert_eq!(plan.deadline(), Some(now + Duration::from_millis(600)));
    plan.answered().expect("the entries' answer");
    assert_eq!(plan.deadline(), Some(now + Duration::from_millis(600)), "not 100 ms");
}

/// A replication client towards the fake follower at `url`, as openraft makes one.
async fn client(url: &str) -> PeerClient {
    let member = Member { peer_urls: vec![url.to_string()], ..Default::default() };
    Network::default().new_client(2, &member).await
}

/// One session through the network's `stream_append`, as openraft's replication runs it:
/// `requests`, then the end of openraft's requests. Returns what openraft was told, in order.
async fn session(client: &mut PeerClient, requests: Vec<Request>) -> Vec<Answer> {
    session_within(client, requests, Duration::from_secs(3)).await
}

/// [`session`] with `ttl` as openraft's RPC timeout.
async fn session_within(
    client: &mut PeerClient,
    requests: Vec<Request>,
    ttl: Duration,
) -> Vec<Answer> {
    let option = RPCOption::new(ttl);
    let answers = client
        .stream_append(futures::stream::iter(requests), option)
        .await
        .expect("the session starts");
    answers.collect().await
}

/// A follower answers entries only once it wrote them. Here it is still writing when the
/// commit index advances: the commit must reach it anyway, so it can apply. Seen failing with
/// the plan sending one request at a time (each waiting for the previous answer, as openraft's
/// default session does): the commit never left while entry 1 was unanswered, and the session
/// timed out ("peer rpc timed out", one answer instead of two).
#[tokio::test]
async fn the_commit_reaches_a_follower_still_writing_the_entries() {
    let p = peer(Mode::FollowerSyncing).await;
    let mut c = client(&p.url).await;
    let answers = tokio::time::timeout(
        Duration::from_secs(10),
        session(&mut c, vec![req(1, 1, None), commit_only(1, 1)]),
    )
    .await
    .expect("the session ends");
    assert!(matches!(answers.as_slice(), [Ok(Ok(Some(_))), Ok(Ok(Some(_)))]), "{answers:?}");
    let seen = p.seen.lock().clone();
    assert_eq!(
        seen,
        vec![
            Seen { seq: 1, entries: 1, commit: None },
            Seen { seq: 2, entries: 0, commit: Some(1) },
        ]
    );
}

/// Entries made while entries are unanswered travel together with the newest commit, as
/// one-at-a-time would send them; the stream stays open for the next session.
#[tokio::test]
async fn entries_made_meanwhile_travel_together_on_one_stream() {
    let p = peer(Mode::Follower).await;
    let first = vec![req(1, 1, None), req(2, 2, None), req(3, 3, None), commit_only(3, 1)];
    let mut c = client(&p.url).await;
    for requests in [first, vec![req(4, 4, Some(3))]] {
        let answers = session(&mut c, requests).await;
        assert!(answers.iter().all(|a| matches!(a, Ok(Ok(Some(_))))), "{answers:?}");
    }
    let seen: Vec<_> = p.seen.lock().iter().map(|s| (s.entries, s.commit)).collect();
    // Entry 1 alone; 2-3 with the commit of 1 once 1 is answered (the fake answers at once, so
    // how many of them were taken before that answer varies); then entry 4 on the same stream.
    assert_eq!(seen.first(), Some(&(1, None)));
    assert_eq!(seen.last(), Some(&(1, Some(3))));
    let entries: usize = seen.iter().map(|s| s.0).sum();
    assert_eq!(entries, 4, "{seen:?}");
    assert_eq!(p.streams.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// An answer with another request's number fails the session and closes the stream: the next
/// session opens a new one.
#[tokio::test]
async fn an_answer_with_the_wrong_number_fails_the_session_and_closes_the_stream() {
    let p = peer(Mode::FollowerWrongSeq).await;
    let mut c = client(&p.url).await;
    for expected_streams in 1..=3 {
        let answers = session(&mut c, vec![req(1, 1, None)]).await;
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert!(format!("{:?}", answers[0]).contains("answered request"), "{answers:?}");
        assert_eq!(p.streams.load(std::sync::atomic::Ordering::SeqCst), expected_streams);
    }
}

/// A session openraft drops with a request unanswered leaves its stream behind: the next
/// session gets its own answer, on a new stream.
#[tokio::test]
async fn a_session_dropped_halfway_is_never_answered_on_the_next_one() {
    let p = peer(Mode::FollowerSlowFirst).await;
    let mut c = client(&p.url).await;
    {
        let option = RPCOption::new(Duration::from_secs(3));
        let mut answers = c
            .stream_append(futures::stream::iter(vec![req(1, 1, None)]), option)
            .await
            .expect("the session starts");
        tracing::info!("openraft gives up while the first answer is still on its way");
        let gave_up = tokio::time::timeout(SLOW / 3, answers.next()).await;
        assert!(gave_up.is_err());
    }
    let answers = session(&mut c, vec![req(2, 2, None)]).await;
    assert!(matches!(answers.as_slice(), [Ok(Ok(Some(l)))] if l.index == 2), "{answers:?}");
    assert_eq!(p.streams.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// A follower that does not answer within openraft's RPC timeout fails the session, and the
/// next session starts on a new stream.
#[tokio::test]
async fn an_answer_past_its_deadline_fails_the_session() {
    let p = peer(Mode::FollowerSlowFirst).await;
    let mut c = client(&p.url).await;
    let answers = session_within(&mut c, vec![req(1, 1, None)], SLOW / 3).await;
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert!(format!("{:?}", answers[0]).contains("timed out"), "{answers:?}");
    let answers = session(&mut c, vec![req(2, 2, None)]).await;
    assert!(matches!(answers.as_slice(), [Ok(Ok(Some(l)))] if l.index == 2), "{answers:?}");
    assert_eq!(p.streams.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// An old follower without the stream gets this request as a unary call, and every later
/// session one at a time.
#[tokio::test]
async fn a_follower_without_the_stream_is_served_one_at_a_time() {
    let p = peer(Mode::Old).await;
    let mut c = client(&p.url).await;
    for _ in 0..2 {
        let answers = session(&mut c, vec![req(1, 1, None)]).await;
        assert!(matches!(answers.as_slice(), [Ok(Ok(Some(_)))]), "{answers:?}");
    }
    assert_eq!(p.streams.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(p.unary.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Entries `first..=last` after entry `first - 1`, each a put of `value_bytes`.
fn big(first: u64, last: u64, value_bytes: usize) -> Request {
    use picket_proto::etcdserverpb::PutRequest;
    use picket_proto::picket::raft::v1::raft_command::Cmd;
    use picket_proto::picket::raft::v1::RaftCommand;

    use crate::raft::types::Command;
    let mut r = req(first, last, None);
    for e in &mut r.entries {
        e.payload = EntryPayload::Normal(Command::new(RaftCommand {
            cmd: Some(Cmd::Put(PutRequest {
                key: format!("big/{}", e.log_id.index).into_bytes(),
                value: vec![b'v'; value_bytes],
                ..Default::default()
            })),
            forwarded: None,
        }));
    }
    r
}

/// A follower catching up gets up to 2 MiB per append and answers once it wrote and synced
/// them. Where that takes longer than openraft's RPC timeout (a heartbeat), the append must
/// still be waited for: timed out, openraft resends the same payload after each timeout and
/// the follower never catches up. Seen failing with a deadline of one heartbeat for every
/// request: the first append here "peer rpc timed out" and the session ended (and `catch_up.rs`
/// failed in CI with a build running beside it, and here with three busy loops on two cores:
/// the stopped follower's appends timed out for the whole minute). Small appends keep the
/// heartbeat's deadline.
#[tokio::test]
async fn a_large_append_is_given_time_for_its_bytes() {
    let ttl = Duration::from_millis(100);
    let p = peer(Mode::FollowerPerMib).await;
    let mut c = client(&p.url).await;
    // Two appends of ~2 MiB each: 200 ms apiece at the fake's 10 MiB/s, twice the heartbeat.
    let requests = vec![big(1, 2, 1 << 20), big(3, 4, 1 << 20)];
    let answers =
        tokio::time::timeout(Duration::from_secs(10), session_within(&mut c, requests, ttl))
            .await
            .expect("the session ends");
    assert!(matches!(answers.as_slice(), [Ok(Ok(Some(_))), Ok(Ok(Some(_)))]), "{answers:?}");
    let two_mib = 2 << 20;
    assert!(PER_MIB * 2 > ttl, "the fake must be slower than the heartbeat for this test");
    assert!(deadline_for(ttl, two_mib) > PER_MIB * 3, "room beyond the fake's 200 ms");
    assert_eq!(deadline_for(ttl, 0), ttl, "an empty append keeps the heartbeat");
    assert!(deadline_for(ttl, 400) < ttl + Duration::from_micros(100), "small appends");
}
