//! A follower's side of one replication session (`RaftService.AppendEntriesStream`): each
//! request is handed to Raft the moment it arrives, and the answers leave in request order.
//!
//! Reading the next request only after answering the previous one (as this side did until
//! session 37) held a commit index that the leader sent ahead (`append_pipeline`) behind the
//! entries it commits, whose answer waits for this member's fsync: the commit reached Raft, and
//! the entries the state machine, only after that fsync. Handed over at once, the commit lets
//! Raft apply the entries as soon as it has them (they are committed, so durable on a quorum),
//! while the fsync still runs.
//!
//! openraft's `Raft::stream_append` does the handing over: one task reads the requests and
//! passes each to Raft's core in arrival order, and the answers come back in the same order;
//! this side decodes the frames, remembers each one's number and leader, and encodes the
//! answers as the one-at-a-time handler did, so either kind of leader can talk to it. A frame
//! that cannot be decoded, or a broken request stream, ends the session with an error once the
//! requests before it are answered; the leader then opens a new one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use parking_lot::Mutex;
use picket_proto::picket::raft::v1::RaftFrame;
use tokio::sync::watch;
use tonic::{Status, Streaming};

use super::network::decode;
use super::proposer::Proposer;
use super::service::{bad_payload, encode_reply, record_contact, vote_leader};
use super::types::{NodeId, TypeConfig};

/// The answers of one session, in request order.
pub type Answers = Pin<Box<dyn Stream<Item = Result<RaftFrame, Status>> + Send + 'static>>;

/// The requests handed to Raft and not answered yet, and why the session ended early.
#[derive(Default)]
struct Line {
    /// Each request's number and the leader that sent it, oldest first.
    waiting: VecDeque<(u64, NodeId)>,
    /// The request stream broke or carried an undecodable frame.
    failure: Option<Status>,
}

/// Serves one session: the requests in `inbound`, until the leader closes it or `stop` turns
/// true (the member is stopping; the leader then reconnects to whatever answers next).
pub fn serve(
    proposer: Proposer,
    inbound: Streaming<RaftFrame>,
    stop: watch::Receiver<bool>,
) -> Answers {
    let line = Arc::new(Mutex::new(Line::default()));
    let requests = futures::stream::unfold(
        (inbound, stop, line.clone()),
        |(mut inbound, mut stop, line)| async move {
            let frame = tokio::select! {
                next = inbound.message() => match next {
                    Ok(Some(frame)) => frame,
                    // The leader closed its side: the session is over.
                    Ok(None) => return None,
                    Err(status) => {
                        line.lock().failure = Some(status);
                        return None;
                    }
                },
                _ = stop.wait_for(|s| *s) => return None,
            };
            match decode::<AppendEntriesRequest<TypeConfig>>(&frame.payload) {
                Ok(rpc) => {
                    line.lock().waiting.push_back((frame.seq, vote_leader(&rpc.vote)));
                    Some((rpc, (inbound, stop, line)))
                }
                Err(e) => {
                    line.lock().failure = Some(bad_payload(e));
                    None
                }
            }
        },
    );
    let answered = line.clone();
    let answers = proposer.raft().stream_append(Box::pin(requests)).map(move |answer| {
        // Raft answers each request it was handed, in order, so the oldest waiting one is this
        // answer's.
        let Some((seq, leader)) = answered.lock().waiting.pop_front() else {
            return Err(Status::internal("picket: raft answered an append it was not given"));
        };
        let answer: Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> = match answer
        {
            Ok(result) => Ok(AppendEntriesResponse::from(result)),
            Err(fatal) => Err(RaftError::Fatal(fatal)),
        };
        record_contact(&proposer, leader, &answer);
        encode_reply(&answer).map(|p| RaftFrame { seq, payload: p.payload })
    });
    let failure = futures::stream::once(async move { line.lock().failure.take() })
        .filter_map(|failure| async move { failure.map(Err) });
    Box::pin(answers.chain(failure))
}
