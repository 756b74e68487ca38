//! A follower's calls to the leader over one long-lived stream (`RaftService.Relay`).
//!
//! Two thirds of a three-member cluster's clients talk to a follower, and each of their writes,
//! keep-alives and linearizable reads costs the follower a call to the leader: a forwarded
//! group of proposals, a relayed keep-alive, a read index. As unary gRPC calls each opened and
//! closed an HTTP/2 stream on both members (headers, trailers, a task per call on the leader),
//! which made a client on a follower cost the cluster 20-60 % more CPU per operation than one
//! on the leader (docs/benchmarks.md, "Issue 20, session 16"). On the relay stream each call is
//! one message each way.
//!
//! Rules:
//! - **Calls are numbered and answers matched by number.** Many calls are in flight at once and
//!   the leader answers them as they finish; an answer whose number no caller waits for (the
//!   caller gave up) is dropped.
//! - **A broken stream leaves its calls' outcomes unknown.** Every call in flight when the
//!   stream fails gets the stream's error, which the forwarding rules read as "unknown" unless
//!   the connection was never made (`super::forward::rpc_failure`); a call that could not be
//!   queued because the stream was already over is reported as never sent.
//! - **Old leaders keep working.** A leader that answers `Unimplemented` predates the stream and
//!   processed nothing; the follower uses the unary calls towards it for a while
//!   ([`UNSUPPORTED_FOR`]) and then tries the stream again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use picket_proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::relay_request::Call;
use picket_proto::picket::raft::v1::relay_response::Answer;
use picket_proto::picket::raft::v1::{
    ForwardBatchRequest, ForwardBatchResponse, ReadIndexRequest, ReadIndexResponse, RelayRequest,
    RelayResponse,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Calls queued towards one leader before callers wait for room. The leader reads them as fast
/// as it can start them (up to `relay_serve::MAX_CALLS` in flight); a full queue means HTTP/2
/// flow control is holding them back, and a caller then waits, bounded by its own deadline.
const QUEUE: usize = 256;

/// How long a follower uses the unary calls after a leader answered the stream with
/// `Unimplemented` (a leader from before it, during a rolling upgrade). Then it tries the stream
/// again, so an upgraded leader is used fully within a minute.
pub const UNSUPPORTED_FOR: Duration = Duration::from_secs(60);

/// Why a relayed call has no answer.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The leader predates the stream and processed nothing: use the unary call.
    Unsupported,
    /// The call was never handed to the stream (it was already over): nothing reached the
    /// leader.
    NotSent,
    /// The stream failed with the call in flight (its outcome is unknown), or the leader
    /// answered the call with this status (as the unary call would have failed).
    Status(Status),
}

type Waiter = oneshot::Sender<Result<Answer, Failure>>;

#[derive(Default)]
struct State {
    next_seq: u64,
    pending: HashMap<u64, Waiter>,
    /// Why the stream is over, once it is: no call is queued after that.
    over: Option<Failure>,
    /// Whether the leader has answered anything on this stream (so it knows the stream).
    answered: bool,
}

/// One stream to one leader; cheap to share. Its reader task ends with the stream.
pub struct RelayLink {
    tx: mpsc::Sender<RelayRequest>,
    state: Arc<Mutex<State>>,
}

impl RelayLink {
    /// Opens a stream to the member behind `client`; the first call waits for it to open.
    pub fn open(client: RaftServiceClient<Channel>) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let state = Arc::new(Mutex::new(State::default()));
        tokio::spawn(read_answers(client, rx, state.clone()));
        Arc::new(Self { tx, state })
    }

    /// `Some(why)` once the stream is over.
    pub fn over(&self) -> Option<Failure> {
        self.state.lock().over.clone()
    }

    /// Sends one call and waits for its answer. Not bounded here: every caller bounds it with
    /// its own deadline, and a caller that gives up removes its waiter (the answer, if it comes,
    /// is dropped).
    pub async fn call(&self, call: Call) -> Result<Answer, Failure> {
        let (waiter, answer) = oneshot::channel();
        let seq = {
            let mut state = self.state.lock();
            if let Some(why) = &state.over {
                return Err(match why {
                    Failure::Unsupported => Failure::Unsupported,
                    _ => Failure::NotSent,
                });
            }
            state.next_seq += 1;
            let seq = state.next_seq;
            state.pending.insert(seq, waiter);
            seq
        };
        let _gone = Forget { state: &self.state, seq };
        if self.tx.send(RelayRequest { seq, call: Some(call) }).await.is_err() {
            // The request stream's receiver is gone, so this call was not written.
            return Err(Failure::NotSent);
        }
        // The reader always answers or fails every waiter it holds before it ends; a dropped
        // waiter means the link went away with the call in flight.
        answer.await.unwrap_or_else(|_| Err(Failure::Status(ended())))
    }
}

/// Removes a caller's waiter when the caller returns or gives up.
struct Forget<'a> {
    state: &'a Mutex<State>,
    seq: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.state.lock().pending.remove(&self.seq);
    }
}

fn ended() -> Status {
    Status::unavailable("picket: relay stream to the leader ended")
}

/// Opens the stream, delivers each answer to its caller, and fails every call still waiting
/// once the stream is over. Ends when the stream does: the leader ends it when this member's
/// link is dropped (the request stream ends) or when it stops, and a dead connection is found by
/// the channel's HTTP/2 keep-alive (`network::peer_channel`).
async fn read_answers(
    mut client: RaftServiceClient<Channel>,
    rx: mpsc::Receiver<RelayRequest>,
    state: Arc<Mutex<State>>,
) {
    let why = match client.relay(ReceiverStream::new(rx)).await {
        Err(s) if s.code() == Code::Unimplemented => {
            tracing::info!("leader has no Relay stream; using unary calls towards it for a while");
            Failure::Unsupported
        }
        Err(s) => Failure::Status(s),
        Ok(resp) => {
            let mut answers = resp.into_inner();
            loop {
                match answers.message().await {
                    Ok(Some(RelayResponse { seq, answer })) => {
                        let waiter = {
                            let mut state = state.lock();
                            state.answered = true;
                            state.pending.remove(&seq)
                        };
                        let answer = answer.ok_or_else(|| {
                            Failure::Status(Status::internal("picket: relay answer is empty"))
                        });
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(answer);
                        }
                    }
                    Ok(None) => break Failure::Status(ended()),
                    Err(s) => break Failure::Status(s),
                }
            }
        }
    };
    let waiting = {
        let mut state = state.lock();
        // `Unimplemented` after an answer would not be the leader's "unknown method": only a
        // stream that never answered can mean an old leader.
        let why = match why {
            Failure::Unsupported if state.answered => Failure::Status(ended()),
            why => why,
        };
        state.over = Some(why.clone());
        std::mem::take(&mut state.pending).into_values().map(move |w| (w, why.clone()))
    };
    for (waiter, why) in waiting {
        let _ = waiter.send(Err(why));
    }
}

/// The current leader as a follower calls it: over the relay stream when the leader has it,
/// by unary calls otherwise.
#[derive(Clone)]
pub struct LeaderRelay {
    pub client: RaftServiceClient<Channel>,
    link: Option<Arc<RelayLink>>,
    slot: Arc<RelaySlot>,
    timeout: Duration,
}

impl LeaderRelay {
    /// A relay that only makes unary calls (for tests, and tools that talk to one leader once).
    pub fn unary(client: RaftServiceClient<Channel>, timeout: Duration) -> Self {
        Self { client, link: None, slot: Arc::default(), timeout }
    }

    /// Forwards a group of proposals. `Err(Failure::Unsupported)` means nothing was sent.
    pub async fn forward_batch(
        &self,
        req: ForwardBatchRequest,
    ) -> Result<ForwardBatchResponse, Failure> {
        let Some(link) = &self.link else {
            self.slot.counted(Via::Unary);
            let mut client = self.client.clone();
            return client
                .forward_batch(req)
                .await
                .map(|r| r.into_inner())
                .map_err(Failure::Status);
        };
        match self.relayed(link, Call::ForwardBatch(req)).await? {
            Answer::ForwardBatch(r) => Ok(r),
            other => Err(mismatched(other)),
        }
    }

    /// Asks the leader for a read index.
    pub async fn read_index(&self) -> Result<ReadIndexResponse, Status> {
        let pick = |a| match a {
            Answer::ReadIndex(r) => Ok(r),
            other => Err(other),
        };
        let unary = |mut c: RaftServiceClient<Channel>| async move {
            c.read_index(ReadIndexRequest {}).await.map(|r| r.into_inner())
        };
        self.stream_or_unary(Call::ReadIndex(ReadIndexRequest {}), pick, unary).await
    }

    /// Relays a keep-alive to the leader, bounded by the request timeout.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
        let req = LeaseKeepAliveRequest { id };
        let pick = |a| match a {
            Answer::LeaseKeepAlive(r) => Ok(r),
            other => Err(other),
        };
        let unary = |mut c: RaftServiceClient<Channel>| async move {
            c.lease_keep_alive(req).await.map(|r| r.into_inner())
        };
        let answer = self.stream_or_unary(Call::LeaseKeepAlive(req), pick, unary);
        // Safe to give up: a keep-alive only moves a deadline, and the caller retries it.
        tokio::time::timeout(self.timeout, answer).await.unwrap_or_else(|_| {
            Err(Status::deadline_exceeded("picket: keep-alive relay timed out"))
        })
    }

    /// A call whose request can be made again: on the stream when the leader has it, else by
    /// `unary`, also when the leader turns out not to know the stream (it processed nothing).
    /// `pick` takes the call's own answer out of the stream's reply.
    async fn stream_or_unary<T, U>(
        &self,
        call: Call,
        pick: impl FnOnce(Answer) -> Result<T, Answer>,
        unary: impl FnOnce(RaftServiceClient<Channel>) -> U,
    ) -> Result<T, Status>
    where
        U: std::future::Future<Output = Result<T, Status>>,
    {
        if let Some(link) = &self.link {
            match self.relayed(link, call).await {
                Ok(answer) => return pick(answer).map_err(|other| status(mismatched(other))),
                Err(Failure::Unsupported) => {}
                Err(f) => return Err(status(f)),
            }
        }
        self.slot.counted(Via::Unary);
        unary(self.client.clone()).await
    }

    /// One call on the stream; an old leader's refusal is remembered for [`UNSUPPORTED_FOR`].
    async fn relayed(&self, link: &RelayLink, call: Call) -> Result<Answer, Failure> {
        self.slot.counted(Via::Stream);
        let answer = link.call(call).await;
        if let Err(Failure::Unsupported) = answer {
            self.slot.unsupported(link);
        }
        match answer {
            Ok(Answer::Failed(s)) => {
                Err(Failure::Status(Status::new(Code::from_i32(s.code as i32), s.message)))
            }
            other => other,
        }
    }
}

fn mismatched(answer: Answer) -> Failure {
    let what = match answer {
        Answer::ForwardBatch(_) => "a forwarded batch",
        Answer::ReadIndex(_) => "a read index",
        Answer::LeaseKeepAlive(_) => "a keep-alive",
        Answer::Failed(_) => "a failure",
    };
    Failure::Status(Status::internal(format!("picket: relay answered with {what} of another call")))
}

/// A failure as the unary call's status would have been.
pub fn status(f: Failure) -> Status {
    match f {
        Failure::Status(s) => s,
        Failure::NotSent | Failure::Unsupported => ended(),
    }
}

/// The follower's link to the current leader, replaced when the leader changes or the stream
/// ends. Only one is kept: a link to a former leader is dropped, which ends its stream.
#[derive(Default)]
pub struct RelaySlot {
    current: Mutex<Option<Current>>,
    /// Calls made on the stream (refused ones included) and as unary RPCs, for the metrics.
    stream_calls: AtomicU64,
    unary_calls: AtomicU64,
}

/// How a call went to the leader.
#[derive(Debug, Clone, Copy)]
pub enum Via {
    Stream,
    Unary,
}

struct Current {
    url: String,
    link: Arc<RelayLink>,
    /// Set while the leader at `url` is known not to have the stream.
    unary_until: Option<Instant>,
}

impl RelaySlot {
    /// The relay to the leader at `url` (whose client is `client`).
    pub fn get(
        self: &Arc<Self>,
        url: &str,
        client: RaftServiceClient<Channel>,
        timeout: Duration,
    ) -> LeaderRelay {
        let mut current = self.current.lock();
        let reuse = current.as_ref().filter(|c| c.url == url).and_then(|c| match c.unary_until {
            Some(until) if Instant::now() < until => Some(None),
            Some(_) => None,
            None => c.link.over().is_none().then(|| Some(c.link.clone())),
        });
        let link = match reuse {
            Some(link) => link,
            None => {
                let link = RelayLink::open(client.clone());
                *current =
                    Some(Current { url: url.to_string(), link: link.clone(), unary_until: None });
                Some(link)
            }
        };
        LeaderRelay { client, link, slot: self.clone(), timeout }
    }

    fn counted(&self, via: Via) {
        let calls = match via {
            Via::Stream => &self.stream_calls,
            Via::Unary => &self.unary_calls,
        };
        calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls made so far: (on the stream, unary).
    pub fn calls(&self) -> (u64, u64) {
        (self.stream_calls.load(Ordering::Relaxed), self.unary_calls.load(Ordering::Relaxed))
    }

    /// Records that `link`'s leader refused the stream.
    fn unsupported(&self, link: &RelayLink) {
        let mut current = self.current.lock();
        if let Some(c) = current.as_mut().filter(|c| std::ptr::eq(Arc::as_ptr(&c.link), link)) {
            c.unary_until = Some(Instant::now() + UNSUPPORTED_FOR);
        }
    }
}
