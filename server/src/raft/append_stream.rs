//! AppendEntries over one long-lived gRPC stream per follower (`RaftService.AppendEntriesStream`).
//!
//! As unary gRPC calls, every AppendEntries opened and closed an HTTP/2 stream on both members
//! (headers, trailers, a task per call on the server); on a stream each is one message each
//! way. openraft's replication sessions and heartbeats send over it through
//! `append_pipeline`; this file is the stream and who holds it between sessions.
//!
//! Safety rests on three rules:
//! - **Answers matched by number, in order.** Each request carries the next `seq` and its answer
//!   must carry the same one (the follower answers a stream's requests in the order they came,
//!   `append_serve`); anything else closes the stream and the session fails. An answer can
//!   therefore never be taken for another request's.
//! - **Any doubt closes the stream.** A session that failed, timed out or was abandoned with
//!   requests unanswered (openraft dropped it) drops its stream; the next session opens a new
//!   one. Those requests may or may not have reached the follower, which Raft allows:
//!   AppendEntries is idempotent, and openraft resends from what the follower acknowledged.
//! - **Old peers keep working.** A peer that answers `Unimplemented` predates the stream; that
//!   client then uses unary calls for the rest of its life (the request was never processed, so
//!   sending it again as a unary call is exact).

use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::RaftFrame;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

/// Requests a stream holds before the connection task writes them: more than the replication
/// pipeline keeps unanswered (`append_pipeline::MAX_UNANSWERED`), so queuing a request never
/// waits (each queued request is unanswered: its answer can only come after it left the queue).
const QUEUED: usize = 4;

// The margin above, checked where it is relied on: session 44 raised `MAX_UNANSWERED` to 3.
const _: () = assert!(QUEUED > super::append_pipeline::MAX_UNANSWERED);

/// One client's stream to its follower, kept between sessions.
#[derive(Debug, Default)]
pub struct AppendStream {
    unary_only: bool,
    open: Option<Open>,
}

/// An open stream. A session takes it ([`AppendStream::take_open`]) and gives it back
/// ([`AppendStream::restore`]) only when it ends with every request answered.
#[derive(Debug)]
pub struct Open {
    pub(super) tx: mpsc::Sender<RaftFrame>,
    pub(super) rx: Streaming<RaftFrame>,
    /// The number of the last request sent.
    pub(super) seq: u64,
}

impl AppendStream {
    /// Whether the peer predates the stream (it answered `Unimplemented`).
    pub fn unary_only(&self) -> bool {
        self.unary_only
    }

    /// Records that the peer predates the stream: every later append is a unary call.
    pub fn set_unary_only(&mut self) {
        tracing::info!("peer has no AppendEntriesStream; using unary AppendEntries");
        self.unary_only = true;
        self.open = None;
    }

    /// The open stream, if there is one.
    pub fn take_open(&mut self) -> Option<Open> {
        self.open.take()
    }

    /// Gives back a stream whose every request was answered, for the next session.
    pub fn restore(&mut self, open: Open) {
        self.open = Some(open);
    }
}

/// Opens a stream with `payload` as its first request (number 1, unanswered).
pub async fn open(client: &RaftServiceClient<Channel>, payload: Vec<u8>) -> Result<Open, Status> {
    let (tx, rx) = mpsc::channel(QUEUED);
    // Queued before the call: a server may send its response headers only with its first
    // answer, and the call returns only once it has them.
    tx.try_send(RaftFrame { seq: 1, payload })
        .map_err(|_| Status::internal("picket: append stream closed before use"))?;
    let rx = client.clone().append_entries_stream(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Open { tx, rx, seq: 1 })
}
