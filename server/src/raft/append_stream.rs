//! AppendEntries over one long-lived gRPC stream per replication session.
//!
//! openraft 0.9 keeps one [`super::network::PeerClient`] per follower for the whole time a
//! leader replicates to it, and sends it one AppendEntries at a time (the next only after the
//! answer to the previous one). Every log entry costs two of them per follower: the entries,
//! then the commit index. As unary gRPC calls, each opens and closes an HTTP/2 stream on both
//! members (headers, trailers, a task per call on the server). On a stream, each is one
//! message each way.
//!
//! Safety rests on three rules:
//! - **One request in flight, answers matched by number.** Each request carries the next `seq`
//!   and its answer must carry the same one; anything else closes the stream and the call fails.
//!   An answer can therefore never be taken for another request's.
//! - **Any doubt closes the stream.** A call that failed, timed out or was abandoned half-way
//!   (its future dropped between sending and receiving) leaves the stream closed; the next call
//!   opens a new one. The request may or may not have reached the follower, which Raft allows:
//!   AppendEntries is idempotent, and openraft retries a failed one.
//! - **Old peers keep working.** A peer that answers `Unimplemented` predates the stream; that
//!   client then uses unary calls for the rest of its life (the request was never processed, so
//!   sending it again as a unary call is exact).
//!
//! Short-lived clients (openraft creates one per read-index heartbeat round and per vote) make a
//! single call; opening a stream for it would cost more than it saves, so a client switches to
//! the stream from its second append on.

use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::RaftFrame;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// How a client sends its appends.
#[derive(Debug, Default)]
pub struct AppendStream {
    appends: u64,
    unary_only: bool,
    open: Option<Open>,
}

#[derive(Debug)]
struct Open {
    tx: mpsc::Sender<RaftFrame>,
    rx: Streaming<RaftFrame>,
    seq: u64,
    /// True between sending a request and reading its answer: if still set when the next call
    /// starts, the previous call was abandoned and its answer may still be on the way.
    in_flight: bool,
}

/// What [`AppendStream::call`] decided.
pub enum Sent {
    /// The follower's answer (postcard bytes).
    Answer(Vec<u8>),
    /// Use a unary call for this request (first append of the client, or an old peer); the
    /// request's bytes come back for it.
    Unary(Vec<u8>),
}

impl AppendStream {
    /// Sends one request over the stream (opening it if needed) and waits for its answer.
    /// The caller bounds the whole call with its RPC timeout; a timed-out call drops this future,
    /// which leaves `in_flight` set, so the next call starts on a fresh stream.
    pub async fn call(
        &mut self,
        client: &RaftServiceClient<Channel>,
        payload: Vec<u8>,
    ) -> Result<Sent, Status> {
        self.appends += 1;
        if self.unary_only || self.appends < 2 {
            return Ok(Sent::Unary(payload));
        }
        if self.open.as_ref().is_some_and(|o| o.in_flight) {
            self.open = None;
        }
        let (result, first) = match self.open.as_mut() {
            Some(open) => (Self::exchange(open, payload).await, None),
            // Kept for the unary retry if the peer turns out not to know the stream; once per
            // stream, not per append.
            None => (self.open_with(client, payload.clone()).await, Some(payload)),
        };
        match (result, first) {
            (Ok(answer), _) => Ok(Sent::Answer(answer)),
            (Err(status), Some(payload)) if status.code() == Code::Unimplemented => {
                tracing::info!("peer has no AppendEntriesStream; using unary AppendEntries");
                self.unary_only = true;
                self.open = None;
                Ok(Sent::Unary(payload))
            }
            (Err(status), _) => {
                self.open = None;
                Err(status)
            }
        }
    }

    /// Opens the stream with `payload` as its first request and returns the answer.
    async fn open_with(
        &mut self,
        client: &RaftServiceClient<Channel>,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, Status> {
        // Capacity 1: there is never more than one request in flight.
        let (tx, rx) = mpsc::channel(1);
        // Queued before the call: a server may send its response headers only with its first
        // answer, and the call returns only once it has them.
        tx.send(RaftFrame { seq: 1, payload })
            .await
            .map_err(|_| Status::internal("picket: append stream closed before use"))?;
        let rx = client.clone().append_entries_stream(ReceiverStream::new(rx)).await?.into_inner();
        let open = self.open.insert(Open { tx, rx, seq: 1, in_flight: true });
        Self::answer(open).await
    }

    /// Sends the next request on an open stream and returns its answer.
    async fn exchange(open: &mut Open, payload: Vec<u8>) -> Result<Vec<u8>, Status> {
        open.seq += 1;
        open.in_flight = true;
        open.tx
            .send(RaftFrame { seq: open.seq, payload })
            .await
            .map_err(|_| Status::unavailable("picket: append stream closed"))?;
        Self::answer(open).await
    }

    async fn answer(open: &mut Open) -> Result<Vec<u8>, Status> {
        let frame = open
            .rx
            .message()
            .await?
            .ok_or_else(|| Status::unavailable("picket: append stream ended"))?;
        if frame.seq != open.seq {
            return Err(Status::internal(format!(
                "picket: append stream answered request {} for request {}",
                frame.seq, open.seq
            )));
        }
        open.in_flight = false;
        Ok(frame.payload)
    }
}
