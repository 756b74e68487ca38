//! The follower's side of the relay stream against fake leaders: many calls on one stream
//! answered out of order, a caller that gives up, a stream that breaks with calls in flight, an
//! old leader without the stream, and a large forwarded reply.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use picket_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use picket_proto::picket::raft::v1::raft_service_server::{RaftService, RaftServiceServer};
use picket_proto::picket::raft::v1::relay_request::Call;
use picket_proto::picket::raft::v1::relay_response::Answer;
use picket_proto::picket::raft::v1::{
    CommandResult, ForwardBatchRequest, ForwardBatchResponse, ForwardOutcome, ForwardRequest,
    RaftCommand, RaftFrame, RaftPayload, ReadIndexRequest, ReadIndexResponse, RelayRequest,
    RelayResponse,
};
use prost::Message;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status, Streaming};

use super::proposer::ProposeError;
use super::relay::{LeaderRelay, RelaySlot};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Answers every call, keep-alive `id` after `(id % 8) * 3` ms, so concurrent calls finish
    /// out of order; a forwarded group gets one large result per command.
    Answer,
    /// Reads one call, then fails the stream (a connection reset with the call in flight).
    Break,
    /// Predates the stream: `Unimplemented`; answers unary keep-alives with ttl = id.
    Old,
}

/// Over tonic's default 4 MiB decode limit (issue 19, finding 3).
const BIG_RESULT: usize = 5 * 1024 * 1024;

struct Fake {
    mode: Mode,
    /// Relay calls opened (refused ones included).
    opened: Arc<AtomicU64>,
    unary: Arc<AtomicU64>,
}

type Frames = Pin<Box<dyn Stream<Item = Result<RaftFrame, Status>> + Send + 'static>>;
type Relayed = Pin<Box<dyn Stream<Item = Result<RelayResponse, Status>> + Send + 'static>>;

fn nope<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("fake"))
}

fn big_outcomes(n: usize) -> Vec<ForwardOutcome> {
    use picket_proto::etcdserverpb::PutResponse;
    use picket_proto::mvccpb::KeyValue;
    use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
    use picket_proto::picket::raft::v1::forward_outcome::Outcome;
    let big = CommandResult {
        result: Some(CmdResult::Put(PutResponse {
            header: None,
            prev_kv: Some(KeyValue { value: vec![b'x'; BIG_RESULT], ..Default::default() }),
        })),
    };
    (0..n)
        .map(|i| ForwardOutcome {
            outcome: Some(Outcome::Result(big.clone())),
            log_index: i as u64,
        })
        .collect()
}

async fn answer(req: RelayRequest) -> RelayResponse {
    let answer = match req.call {
        Some(Call::LeaseKeepAlive(ka)) => {
            tokio::time::sleep(Duration::from_millis((ka.id % 8) as u64 * 3)).await;
            Answer::LeaseKeepAlive(LeaseKeepAliveResponse { header: None, id: ka.id, ttl: ka.id })
        }
        Some(Call::ForwardBatch(b)) => {
            Answer::ForwardBatch(ForwardBatchResponse { outcomes: big_outcomes(b.commands.len()) })
        }
        Some(Call::ReadIndex(_)) => {
            Answer::ReadIndex(ReadIndexResponse { read_index: req.seq, leader_id: 9 })
        }
        None => panic!("a call without a body"),
    };
    RelayResponse { seq: req.seq, answer: Some(answer) }
}

#[tonic::async_trait]
impl RaftService for Fake {
    type RelayStream = Relayed;

    async fn relay(
        &self,
        req: Request<Streaming<RelayRequest>>,
    ) -> Result<Response<Relayed>, Status> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        let inbound = req.into_inner();
        let answers: Relayed = match self.mode {
            Mode::Old => return nope(),
            Mode::Answer => Box::pin(
                inbound.map(|r| async move { Ok(answer(r?).await) }).buffer_unordered(usize::MAX),
            ),
            Mode::Break => Box::pin(
                inbound
                    .take(1)
                    .then(|_| async { Err(Status::unavailable("connection reset by the fake")) }),
            ),
        };
        Ok(Response::new(answers))
    }

    async fn lease_keep_alive(
        &self,
        req: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        self.unary.fetch_add(1, Ordering::SeqCst);
        let id = req.into_inner().id;
        Ok(Response::new(LeaseKeepAliveResponse { header: None, id, ttl: id }))
    }

    async fn forward_batch(
        &self,
        _: Request<ForwardBatchRequest>,
    ) -> Result<Response<ForwardBatchResponse>, Status> {
        self.unary.fetch_add(1, Ordering::SeqCst);
        nope()
    }

    type AppendEntriesStreamStream = Frames;
    async fn append_entries_stream(
        &self,
        _: Request<Streaming<RaftFrame>>,
    ) -> Result<Response<Frames>, Status> {
        nope()
    }
    async fn append_entries(
        &self,
        _: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        nope()
    }
    async fn vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        nope()
    }
    async fn pre_vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        nope()
    }
    async fn install_snapshot(
        &self,
        _: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        nope()
    }
    async fn forward(&self, _: Request<ForwardRequest>) -> Result<Response<CommandResult>, Status> {
        nope()
    }
    async fn read_index(
        &self,
        _: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        nope()
    }
    async fn lease_time_to_live(
        &self,
        _: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        nope()
    }
}

struct Leader {
    url: String,
    client: picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient<Channel>,
    slot: Arc<RelaySlot>,
    opened: Arc<AtomicU64>,
    unary: Arc<AtomicU64>,
}

impl Leader {
    fn relay(&self) -> LeaderRelay {
        self.slot.get(&self.url, self.client.clone(), Duration::from_secs(5))
    }
}

async fn leader(mode: Mode) -> Leader {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let opened = Arc::new(AtomicU64::new(0));
    let unary = Arc::new(AtomicU64::new(0));
    let fake = Fake { mode, opened: opened.clone(), unary: unary.clone() };
    tokio::spawn(
        Server::builder()
            // The real peer service lifts its limits the same way (node.rs).
            .add_service(RaftServiceServer::new(fake).max_encoding_message_size(usize::MAX))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = Channel::from_shared(url.clone()).unwrap().connect_lazy();
    let client = super::network::peer_client(channel);
    Leader { url, client, slot: Arc::default(), opened, unary }
}

#[tokio::test]
async fn concurrent_calls_share_one_stream_and_each_gets_its_own_answer() {
    let l = leader(Mode::Answer).await;
    tracing::info!("64 keep-alives at once, answered out of order by the fake");
    let calls = (0..64i64).map(|id| {
        let relay = l.relay();
        async move { (id, relay.lease_keep_alive(id).await) }
    });
    for (id, r) in futures::future::join_all(calls).await {
        let r = r.unwrap_or_else(|s| panic!("keep-alive {id}: {s}"));
        assert_eq!((r.id, r.ttl), (id, id), "keep-alive {id} got another call's answer");
    }
    let read = l.relay().read_index().await.unwrap();
    assert_eq!(read.leader_id, 9);
    assert_eq!(l.opened.load(Ordering::SeqCst), 1, "one stream for every call");
    assert_eq!(l.unary.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_caller_that_gives_up_leaves_the_other_answers_right() {
    let l = leader(Mode::Answer).await;
    let relay = l.relay();
    tracing::info!("keep-alive 7 is answered after 21 ms; its caller gives up at 5 ms");
    let gave_up = tokio::time::timeout(Duration::from_millis(5), relay.lease_keep_alive(7)).await;
    assert!(gave_up.is_err());
    for id in [8, 15, 16] {
        let r = relay.lease_keep_alive(id).await.unwrap();
        assert_eq!(r.id, id);
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(relay.lease_keep_alive(23).await.unwrap().id, 23);
    assert_eq!(l.opened.load(Ordering::SeqCst), 1);
}

/// A forwarded group in flight when the stream breaks may have been applied by the leader: its
/// commands' outcomes are unknown (never "not leader", which would invite a retry that applies
/// them twice). The next call opens a new stream.
#[tokio::test]
async fn a_stream_that_breaks_leaves_forwarded_commands_unknown() {
    let l = leader(Mode::Break).await;
    let cmds = vec![RaftCommand::default(); 3];
    let outcomes = super::forward::forward_group(&l.relay(), cmds, &Default::default()).await;
    assert_eq!(outcomes.len(), 3);
    for o in outcomes {
        assert!(matches!(o, Err(ProposeError::Timeout)), "{o:?}");
    }
    tracing::info!("the broken stream is not reused");
    let read = l.relay().read_index().await;
    assert!(read.is_err());
    assert_eq!(l.opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_leader_without_the_stream_is_called_unary_and_remembered() {
    let l = leader(Mode::Old).await;
    for id in 1..=3 {
        assert_eq!(l.relay().lease_keep_alive(id).await.unwrap().ttl, id);
    }
    assert_eq!(l.unary.load(Ordering::SeqCst), 3);
    assert_eq!(l.opened.load(Ordering::SeqCst), 1, "the refusal is remembered");
    tracing::info!("a forwarded group goes unary too, so the refusal costs no command");
    let cmds = vec![RaftCommand::default(); 2];
    let outcomes = super::forward::forward_group(&l.relay(), cmds, &Default::default()).await;
    assert_eq!(l.unary.load(Ordering::SeqCst), 4);
    for o in outcomes {
        // The fake refuses the unary ForwardBatch too (a leader from before it): retryable.
        assert!(matches!(o, Err(ProposeError::NotLeader(None))), "{o:?}");
    }
}

/// The relay's answer to a forwarded group is as large as the unary reply could be (issue 19,
/// finding 3): results over 4 MiB reach every caller.
#[tokio::test]
async fn a_forward_reply_over_4_mib_reaches_every_caller_on_the_stream() {
    let l = leader(Mode::Answer).await;
    let cmds = vec![RaftCommand::default(); 2];
    let outcomes = super::forward::forward_group(&l.relay(), cmds, &Default::default()).await;
    assert_eq!(outcomes.len(), 2);
    for (i, o) in outcomes.into_iter().enumerate() {
        let applied = o.unwrap_or_else(|e| panic!("command {i}: {e}"));
        assert!(applied.result.encoded_len() > BIG_RESULT, "command {i}");
        assert_eq!(applied.log_index, i as u64);
    }
    assert_eq!(l.opened.load(Ordering::SeqCst), 1);
}
