//! The leader's side of a follower's relay stream (`super::relay` explains the follower's):
//! each call runs as the unary RPC of the same name would, concurrently with the others, and is
//! answered with its own number as soon as it finishes.

use std::pin::Pin;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use picket_proto::picket::raft::v1::relay_request::Call;
use picket_proto::picket::raft::v1::relay_response::Answer;
use picket_proto::picket::raft::v1::{
    ForwardBatchResponse, ReadIndexResponse, RelayRequest, RelayResponse, RelayStatus,
};
use tokio::sync::watch;
use tonic::{Status, Streaming};

use super::proposer::{ProposeError, Proposer};
use super::service::LeaderLeases;

/// Calls of one stream running at once. A follower keeps at most two forwarded groups and one
/// read-index round in flight, so what reaches this bound is relayed keep-alives (one per
/// client keep-alive). Past it the leader stops reading the stream until a call finishes, and
/// HTTP/2 flow control holds the follower's next calls back, each bounded by its own deadline.
pub const MAX_CALLS: usize = 1024;

pub type Answers = Pin<Box<dyn Stream<Item = Result<RelayResponse, Status>> + Send + 'static>>;

enum Event {
    Answered(RelayResponse),
    Read(Result<Option<RelayRequest>, Status>),
}

struct Serving {
    inbound: Option<Streaming<RelayRequest>>,
    running: FuturesUnordered<BoxFuture<'static, RelayResponse>>,
    stop: watch::Receiver<bool>,
    proposer: Proposer,
    leases: Arc<dyn LeaderLeases>,
}

/// Answers one relay stream. It ends once the follower has closed its side and every call has
/// been answered, when a request cannot be read (the follower opens a new stream), or when this
/// member stops (a graceful server shutdown waits for every open stream).
pub fn serve(
    inbound: Streaming<RelayRequest>,
    stop: watch::Receiver<bool>,
    proposer: Proposer,
    leases: Arc<dyn LeaderLeases>,
) -> Answers {
    let serving = Serving {
        inbound: Some(inbound),
        running: FuturesUnordered::new(),
        stop,
        proposer,
        leases,
    };
    Box::pin(futures::stream::unfold(Some(serving), |serving| async move {
        let mut s = serving?;
        loop {
            let reading = s.inbound.is_some() && s.running.len() < MAX_CALLS;
            let event = tokio::select! {
                Some(answer) = s.running.next(), if !s.running.is_empty() => Event::Answered(answer),
                next = read(&mut s.inbound), if reading => Event::Read(next),
                _ = s.stop.wait_for(|stopping| *stopping) => return None,
                else => return None,
            };
            match event {
                Event::Answered(answer) => return Some((Ok(answer), Some(s))),
                Event::Read(Ok(Some(req))) => {
                    let call = start(&s.proposer, &s.leases, req);
                    s.running.push(call);
                }
                // The follower closed its side: answer what runs, then end.
                Event::Read(Ok(None)) => s.inbound = None,
                Event::Read(Err(status)) => return Some((Err(status), None)),
            }
        }
    }))
}

async fn read(
    inbound: &mut Option<Streaming<RelayRequest>>,
) -> Result<Option<RelayRequest>, Status> {
    match inbound {
        Some(inbound) => inbound.message().await,
        None => Ok(None),
    }
}

/// Starts one call: the same work as its unary RPC, in `service`.
fn start(
    proposer: &Proposer,
    leases: &Arc<dyn LeaderLeases>,
    req: RelayRequest,
) -> BoxFuture<'static, RelayResponse> {
    let seq = req.seq;
    let proposer = proposer.clone();
    let leases = leases.clone();
    async move {
        let answer = match req.call {
            // Each command is proposed only locally, never forwarded again (as `forward_batch`).
            Some(Call::ForwardBatch(batch)) => {
                let outcomes = super::forward::serve_group(&proposer, batch.commands).await;
                Answer::ForwardBatch(ForwardBatchResponse { outcomes })
            }
            Some(Call::ReadIndex(_)) => match proposer.local_read_index().await {
                Ok(read_index) => Answer::ReadIndex(ReadIndexResponse {
                    read_index,
                    leader_id: proposer.node_id(),
                }),
                Err(e) => failed(ProposeError::into_status(e)),
            },
            // Answered only by the leader itself: a relayed keep-alive is never relayed again.
            Some(Call::LeaseKeepAlive(ka)) => match leases.keep_alive(ka.id).await {
                Ok(r) => Answer::LeaseKeepAlive(r),
                Err(s) => failed(s),
            },
            None => failed(Status::invalid_argument("picket: relay request without a call")),
        };
        RelayResponse { seq, answer: Some(answer) }
    }
    .boxed()
}

fn failed(s: Status) -> Answer {
    Answer::Failed(RelayStatus { code: s.code() as u32, message: s.message().to_string() })
}
