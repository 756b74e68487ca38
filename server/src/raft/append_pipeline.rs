//! A replication session towards one follower (openraft's `stream_append`): the commit index
//! leaves the moment it advances, even while the follower is still writing the entries it
//! commits.
//!
//! openraft's default session sends one AppendEntries and waits for its answer before making
//! the next. A follower answers entries only after its own fsync, so when the *other* follower
//! made the quorum first, the commit reached this one a whole round trip after its fsync: its
//! answer, the leader's commit, and only then its apply. A client writing through that follower
//! waits for all of it, since the follower answers only once it applied the write itself
//! (`storage::forwarded`); so do its watchers. In a hop trace of a lone put through a follower
//! (docs/benchmarks.md, "Session 37") that was a third of the puts, 190 us slower at the median.
//! With the commit on its way at once, the follower applies the entry as soon as it has it
//! (openraft applies up to the commit index over the entries it *accepted*: committed means
//! durable on a quorum, which is what makes applying it safe, whether or not this member's own
//! fsync has finished), and the follower's side of the stream (`service.rs`) hands each request
//! to Raft as it arrives, so the commit does not queue behind the unanswered entries.
//!
//! What the pipeline keeps from one-at-a-time (session 28 measured a plain pipeline, every
//! request out the moment openraft made it: the lease cycle lost 7-9 % in every round, because
//! the follower got and answered more, smaller messages): **entries still go one request at a
//! time.** Entries openraft makes while an entries request is unanswered are held and merged
//! with whatever follows them (more entries, a newer commit index) into one request, sent when
//! the answer comes, as the one-at-a-time session would have made it. Only a request that
//! carries nothing but the commit index goes out past an unanswered entries request, and one
//! at a time itself. So at most two requests are unanswered, one of each kind.
//!
//! One exception: while the leader's write batcher has more than one entry in flight
//! ([`EntriesInFlight`]), a second entries request goes out without waiting for the first's
//! answer. The batcher starts a second entry only under its light rule (the entry in flight
//! carries a single command, so a lone client's next call need not wait a whole commit), and
//! holding that entry's request here undid the rule: the call still waited for the first
//! entry's round trip. That is a contended lock's hand-off, where the next holder's unlock
//! meets the previous holder's queueing write in flight: with the second request sent at once,
//! 8 contenders made 9 % more hand-offs (median of 15 alternating rounds, ahead in 12) and 32
//! uncontended lockers ~5 % more; the lease cycle, where the rule fires too, lost ~3 % (median
//! round 0.97x) and put x1 was even (docs/benchmarks.md, "Session 44"). Sending every entries
//! request at once (session 28, and session 44 again) cost the lease cycle 7-9 %: a follower a
//! round behind then received many small requests instead of a merged one. Under load an entry
//! carries many commands, the batcher keeps one in flight, and the pipeline holds as before.
//!
//! Requests leave in the order openraft made them (a held request is never overtaken, a
//! commit-only request made while one is held is merged into it), each carrying the previous
//! one's last log id as its `prev_log_id`, so the follower can check every one. Every sent
//! request has its own deadline (the RPC timeout openraft gives the session); a missed one, a
//! broken stream, a refused append or an answer out of order ends the session and closes the
//! stream, and openraft starts a new session from what the follower acknowledged, as after any
//! failed append. A session that ends with every request answered leaves the stream open for
//! the next one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openraft::error::{NetworkError, RPCError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, StreamAppendError, StreamAppendResult,
};
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::{RaftFrame, RaftPayload};
use tokio::time::{Instant, Sleep};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::append_stream::{self, AppendStream, Open};
use super::batcher::EntriesInFlight;
use super::network::{self, answer, encode, timed_out, unreachable};
use super::types::{LogId, NodeId, TypeConfig};

type Request = AppendEntriesRequest<TypeConfig>;
type Item = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// Entries requests unanswered at once while the leader overlaps entries (see the module
/// docs); one otherwise.
const OVERLAPPED_ENTRIES: usize = 2;

/// Requests unanswered at once: one carrying only the commit index, and up to
/// [`OVERLAPPED_ENTRIES`] carrying entries.
pub const MAX_UNANSWERED: usize = 1 + OVERLAPPED_ENTRIES;

/// Requests taken from openraft and not yet sent. Two, so that entries that could not be merged
/// into the first (it is full) still keep their place in line.
const MAX_HELD: usize = 2;

/// The most entries a merged request carries: openraft's own default for one request
/// (`Config::max_payload_entries`), so a merged request is no larger than openraft would make
/// one.
const MAX_MERGED_ENTRIES: usize = 300;

/// What to send next, and when: the pipeline's rules, without the I/O.
#[derive(Default)]
pub struct Plan {
    /// Taken from openraft, not sent yet, in order.
    held: VecDeque<Request>,
    /// Sent and unanswered, oldest first.
    unanswered: VecDeque<Sent>,
}

impl Plan {
    /// Whether to take another request from openraft now. Taking one marks it sent in
    /// openraft's eyes, so the plan takes only what it can hold. `overlap`: the leader has more
    /// than one entry in flight (see [`Plan::next_to_send`]).
    pub fn may_take(&self, overlap: bool) -> bool {
        let unanswered = if overlap { MAX_UNANSWERED } else { MAX_UNANSWERED - 1 };
        self.held.len() < MAX_HELD && self.unanswered.len() < unanswered
    }

    /// A request openraft made: merged into the last held one when it continues it, else held
    /// after it.
    pub fn take(&mut self, req: Request) {
        match self.held.back_mut() {
            Some(last) if continues(last, &req) => merge(last, req),
            _ => self.held.push_back(req),
        }
    }

    /// The next request to send now, if the rules allow one: the oldest held request, when no
    /// request of its kind (entries, or only the commit index) is unanswered, or, with
    /// `overlap` (the leader has more than one entry in flight), when one entries request is.
    /// Record it with [`Plan::sent`] once it is on the stream.
    pub fn next_to_send(&mut self, overlap: bool) -> Option<Request> {
        let entries = !self.held.front()?.entries.is_empty();
        let limit = if entries && overlap { OVERLAPPED_ENTRIES } else { 1 };
        if self.unanswered.iter().filter(|s| s.entries == entries).count() >= limit {
            return None;
        }
        self.held.pop_front()
    }

    /// `req` went out as request number `seq`, to be answered by `deadline`.
    pub fn sent(&mut self, req: &Request, seq: u64, deadline: Instant) {
        // Answers come in order, so a request is answered no sooner than the ones before it:
        // its deadline is never earlier than theirs. Deadlines grow with the payload
        // (`network::deadline_for`): a commit index sent past a large append would otherwise
        // expire while the append it cannot overtake is still, in time, being written.
        let deadline = self.unanswered.back().map_or(deadline, |s| s.deadline.max(deadline));
        self.unanswered.push_back(Sent {
            seq,
            entries: !req.entries.is_empty(),
            prev: req.prev_log_id,
            last: last_log_id(req),
            deadline,
        });
    }

    /// The oldest unanswered request was answered: what it was.
    pub fn answered(&mut self) -> Option<Sent> {
        self.unanswered.pop_front()
    }

    /// When the oldest unanswered request must be answered by.
    pub fn deadline(&self) -> Option<Instant> {
        self.unanswered.front().map(|s| s.deadline)
    }

    /// Nothing held and nothing unanswered.
    pub fn idle(&self) -> bool {
        self.held.is_empty() && self.unanswered.is_empty()
    }
}

/// The last log id a request leaves the follower with.
fn last_log_id(req: &Request) -> Option<LogId> {
    req.entries.last().map(|e| e.log_id).or(req.prev_log_id)
}

/// Whether `next` starts where `last` ends, for the same leader, and both fit in one request.
fn continues(last: &Request, next: &Request) -> bool {
    next.vote == last.vote
        && next.prev_log_id == last_log_id(last)
        && last.entries.len() + next.entries.len() <= MAX_MERGED_ENTRIES
}

/// `last` followed by `next`, as one request: `next`'s commit index is the newer one.
fn merge(last: &mut Request, next: Request) {
    last.entries.extend(next.entries);
    last.leader_commit = last.leader_commit.max(next.leader_commit);
}

/// A sent request: its number, its kind, the log ids its answer is read against, its deadline.
pub struct Sent {
    seq: u64,
    /// It carried entries (else only the commit index).
    entries: bool,
    prev: Option<LogId>,
    last: Option<LogId>,
    deadline: Instant,
}

/// One session: the requests openraft makes in `input`, sent over `appends`' stream (opened if
/// needed), answered in order.
pub fn session<'s, S>(
    client: RaftServiceClient<Channel>,
    target: NodeId,
    appends: &'s mut AppendStream,
    input: S,
    ttl: Duration,
    entries: EntriesInFlight,
) -> BoxStream<'s, Item>
where
    S: Stream<Item = Request> + Send + Unpin + 'static,
{
    let driver = Driver {
        client,
        target,
        appends,
        input: Some(input),
        plan: Plan::default(),
        open: None,
        // Armed once something is unanswered (`step`); one timer for the session, moved to
        // each oldest deadline, rather than one made and dropped on every turn.
        timer: Box::pin(tokio::time::sleep_until(Instant::now() + ttl)),
        timer_at: None,
        ttl,
        entries,
        over: false,
    };
    Box::pin(futures::stream::unfold(driver, |mut d| async move {
        let item = d.step().await?;
        Some((item, d))
    }))
}

struct Driver<'s, S> {
    client: RaftServiceClient<Channel>,
    target: NodeId,
    appends: &'s mut AppendStream,
    /// openraft's requests; `None` once it made its last.
    input: Option<S>,
    plan: Plan,
    open: Option<Open>,
    /// Fires at the oldest unanswered request's deadline (`timer_at`).
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    ttl: Duration,
    /// The leader's write batcher's entries in flight: two or more let a second entries
    /// request go before the first is answered.
    entries: EntriesInFlight,
    /// The session is over: nothing more is read or sent.
    over: bool,
}

impl<S> Driver<'_, S>
where
    S: Stream<Item = Request> + Send + Unpin + 'static,
{
    /// The next answer for openraft, or `None` when the session is over.
    async fn step(&mut self) -> Option<Item> {
        if self.over {
            return None;
        }
        loop {
            let overlap = self.entries.get() >= 2;
            while let Some(req) = self.plan.next_to_send(overlap) {
                if let Err(item) = self.send(req).await {
                    self.over = true;
                    return Some(item);
                }
            }
            if self.input.is_none() && self.plan.idle() {
                // Every request answered: the stream stays open for the next session.
                if let Some(open) = self.open.take() {
                    self.appends.restore(open);
                }
                self.over = true;
                return None;
            }
            let take = self.plan.may_take(overlap);
            let deadline = self.plan.deadline();
            if let Some(d) = deadline.filter(|d| self.timer_at != Some(*d)) {
                self.timer.as_mut().reset(d);
                self.timer_at = Some(d);
            }
            tokio::select! {
                // Answers first: each one frees room to take and send more.
                biased;
                frame = next_frame(self.open.as_mut()), if deadline.is_some() => {
                    return Some(self.on_answer(frame));
                }
                () = self.timer.as_mut(), if deadline.is_some() => {
                    // Bounded like every append (openraft's RPC timeout): a follower that
                    // does not answer in time is retried by openraft after its backoff.
                    self.fail();
                    return Some(Err(timed_out()));
                }
                req = next_request(self.input.as_mut()), if take => match req {
                    Some(req) => self.plan.take(req),
                    None => self.input = None,
                },
            }
        }
    }

    /// Sends `req` on the stream, opening it if there is none. `Err` carries the item that ends
    /// the session.
    async fn send(&mut self, req: Request) -> Result<(), Item> {
        let payload = encode(&req).map_err(|e| Err(RPCError::Network(NetworkError::new(&e))))?;
        let open = match self.open.take().or_else(|| self.appends.take_open()) {
            Some(open) => open,
            None => {
                debug_assert!(self.plan.deadline().is_none(), "requests unanswered on no stream");
                let bytes = payload.payload.clone();
                let ttl = network::deadline_for(self.ttl, bytes.len());
                match tokio::time::timeout(ttl, append_stream::open(&self.client, bytes)).await {
                    Err(_) => return Err(Err(timed_out())),
                    Ok(Ok(open)) => {
                        self.open = Some(open);
                        self.plan.sent(&req, 1, Instant::now() + ttl);
                        return Ok(());
                    }
                    Ok(Err(status)) if status.code() == Code::Unimplemented => {
                        // The peer predates the stream and processed nothing: this request as a
                        // unary call, then the session ends and openraft's next one is
                        // one-at-a-time (`network.rs`).
                        self.appends.set_unary_only();
                        return Err(self.unary(payload, &req).await);
                    }
                    Ok(Err(status)) => return Err(Err(unreachable(&status))),
                }
            }
        };
        let open = self.open.insert(open);
        open.seq += 1;
        let seq = open.seq;
        // Never full: at most `MAX_UNANSWERED` requests are queued or on their way, fewer than
        // the queue holds (`append_stream::QUEUED`). Full or closed, the stream is unusable.
        let ttl = network::deadline_for(self.ttl, payload.payload.len());
        if open.tx.try_send(RaftFrame { seq, payload: payload.payload }).is_err() {
            self.open = None;
            return Err(Err(unreachable(&Status::unavailable("picket: append stream closed"))));
        }
        self.plan.sent(&req, seq, Instant::now() + ttl);
        Ok(())
    }

    /// One request as a unary call, for a peer without the stream.
    async fn unary(&mut self, payload: RaftPayload, req: &Request) -> Item {
        let client = self.client.clone();
        let resp = network::unary(client, self.target, payload, self.ttl, |mut c, p| {
            Box::pin(async move { c.append_entries(p).await })
        })
        .await?;
        Ok(stream_result(resp, req.prev_log_id, last_log_id(req))?.0)
    }

    fn on_answer(&mut self, frame: Result<Option<RaftFrame>, Status>) -> Item {
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                self.fail();
                return Err(unreachable(&Status::unavailable("picket: append stream ended")));
            }
            Err(status) => {
                self.fail();
                return Err(unreachable(&status));
            }
        };
        let Some(sent) = self.plan.answered() else {
            self.fail();
            return Err(unreachable(&Status::internal("picket: append stream answered nothing")));
        };
        if frame.seq != sent.seq {
            self.fail();
            return Err(unreachable(&Status::internal(format!(
                "picket: append stream answered request {} for request {}",
                frame.seq, sent.seq
            ))));
        }
        let read = answer(self.target, &frame.payload)
            .and_then(|resp| stream_result(resp, sent.prev, sent.last));
        match read {
            Ok((result, true)) => Ok(result),
            // A refused append (conflict, higher vote) or one only partly taken: the requests
            // sent after it cannot follow on, so the session ends and openraft decides what
            // comes next from this answer.
            Ok((result, false)) => {
                self.fail();
                Ok(result)
            }
            Err(e) => {
                self.fail();
                Err(e)
            }
        }
    }

    /// Ends the session and closes the stream: answers may still be on their way on it.
    fn fail(&mut self) {
        self.open = None;
        self.over = true;
    }
}

/// openraft's reading of an answer to the request `(prev, last]`, and whether requests sent
/// after it can follow on (the follower took all of it).
fn stream_result(
    resp: AppendEntriesResponse<TypeConfig>,
    prev: Option<LogId>,
    last: Option<LogId>,
) -> Result<(StreamAppendResult<TypeConfig>, bool), RPCError<TypeConfig>> {
    Ok(match resp {
        AppendEntriesResponse::Success => (Ok(last), true),
        AppendEntriesResponse::PartialSuccess(got) => (Ok(got), got == last),
        AppendEntriesResponse::HigherVote(vote) => {
            (Err(StreamAppendError::HigherVote(vote)), false)
        }
        AppendEntriesResponse::Conflict => match prev {
            Some(prev) => (Err(StreamAppendError::Conflict(prev)), false),
            // Nothing precedes the first entry, so no follower can refuse it: a peer answering
            // so is broken, and is treated as unreachable rather than believed.
            None => {
                return Err(RPCError::Network(NetworkError::new(&std::io::Error::other(
                    "peer refused an append that starts the log",
                ))))
            }
        },
    })
}

async fn next_frame(open: Option<&mut Open>) -> Result<Option<RaftFrame>, Status> {
    match open {
        Some(open) => open.rx.message().await,
        // Only polled with requests unanswered, which are on an open stream.
        None => std::future::pending().await,
    }
}

async fn next_request<S>(input: Option<&mut S>) -> Option<Request>
where
    S: Stream<Item = Request> + Unpin,
{
    match input {
        Some(input) => input.next().await,
        // Only polled while openraft may still make requests.
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "append_pipeline_tests.rs"]
mod tests;
