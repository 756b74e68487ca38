//! The client side of AppendEntriesStream against fake peers: the switch from unary calls, one
//! stream for many calls, answers matched by number, abandoned calls, and old peers (also their
//! answer to Pre-Vote, which they do not know).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use picket_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::raft_service_server::{RaftService, RaftServiceServer};
use picket_proto::picket::raft::v1::{
    CommandResult, ForwardBatchRequest, ForwardBatchResponse, ForwardRequest, RaftCommand,
    RaftFrame, RaftPayload, ReadIndexRequest, ReadIndexResponse, RelayRequest, RelayResponse,
};
use prost::Message;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status, Streaming};

use super::append_stream::{AppendStream, Sent};

/// How the fake peer answers on the stream.
#[derive(Clone, Copy)]
enum Mode {
    /// Answers each request with its own number and its payload reversed.
    Echo,
    /// Answers with the wrong number.
    WrongSeq,
    /// Answers the first request of each stream after `SLOW`, later ones at once.
    SlowFirst,
    /// Predates the stream: `Unimplemented`.
    Old,
    /// Answers `ForwardBatch` with one result per command, each over 4 MiB (a Txn whose range
    /// read a large value), as a leader that applied them would.
    BigForward,
}

/// The size of each result `Mode::BigForward` answers with: over tonic's default 4 MiB.
const BIG_RESULT: usize = 5 * 1024 * 1024;

const SLOW: Duration = Duration::from_millis(300);

struct Fake {
    mode: Mode,
    streams: Arc<AtomicU64>,
    unary: Arc<AtomicU64>,
}

type Frames = Pin<Box<dyn Stream<Item = Result<RaftFrame, Status>> + Send + 'static>>;
type Relayed = Pin<Box<dyn Stream<Item = Result<RelayResponse, Status>> + Send + 'static>>;

fn nope<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("fake"))
}

#[tonic::async_trait]
impl RaftService for Fake {
    type AppendEntriesStreamStream = Frames;

    async fn append_entries_stream(
        &self,
        req: Request<Streaming<RaftFrame>>,
    ) -> Result<Response<Frames>, Status> {
        let mode = self.mode;
        if let Mode::Old = mode {
            return nope();
        }
        self.streams.fetch_add(1, Ordering::SeqCst);
        let answers = req.into_inner().enumerate().then(move |(i, frame)| async move {
            let mut frame = frame?;
            match mode {
                Mode::WrongSeq => frame.seq += 1,
                Mode::SlowFirst if i == 0 => tokio::time::sleep(SLOW).await,
                _ => {}
            }
            frame.payload.reverse();
            Ok(frame)
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn append_entries(
        &self,
        req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.unary.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(req.into_inner()))
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
    async fn forward_batch(
        &self,
        req: Request<ForwardBatchRequest>,
    ) -> Result<Response<ForwardBatchResponse>, Status> {
        use picket_proto::etcdserverpb::{PutResponse, ResponseHeader};
        use picket_proto::mvccpb::KeyValue;
        use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
        use picket_proto::picket::raft::v1::forward_outcome::Outcome;
        use picket_proto::picket::raft::v1::ForwardOutcome;
        if !matches!(self.mode, Mode::BigForward) {
            return nope();
        }
        let big = |i: usize| CommandResult {
            result: Some(CmdResult::Put(PutResponse {
                header: Some(ResponseHeader { revision: i as i64 + 2, ..Default::default() }),
                prev_kv: Some(KeyValue { value: vec![b'x'; BIG_RESULT], ..Default::default() }),
            })),
        };
        let outcomes = (0..req.into_inner().commands.len())
            .map(|i| ForwardOutcome { outcome: Some(Outcome::Result(big(i))), log_index: 0 })
            .collect();
        Ok(Response::new(ForwardBatchResponse { outcomes }))
    }
    async fn read_index(
        &self,
        _: Request<ReadIndexRequest>,
    ) -> Result<Response<ReadIndexResponse>, Status> {
        nope()
    }
    async fn lease_keep_alive(
        &self,
        _: Request<LeaseKeepAliveRequest>,
    ) -> Result<Response<LeaseKeepAliveResponse>, Status> {
        nope()
    }
    async fn lease_time_to_live(
        &self,
        _: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        nope()
    }
    type RelayStream = Relayed;
    async fn relay(
        &self,
        _: Request<Streaming<RelayRequest>>,
    ) -> Result<Response<Relayed>, Status> {
        nope()
    }
}

struct Peer {
    client: RaftServiceClient<Channel>,
    streams: Arc<AtomicU64>,
    url: String,
}

async fn peer(mode: Mode) -> Peer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicU64::new(0));
    let fake = Fake { mode, streams: streams.clone(), unary: Arc::new(AtomicU64::new(0)) };
    tokio::spawn(
        Server::builder()
            // The real peer service lifts its limits the same way (node.rs).
            .add_service(RaftServiceServer::new(fake).max_encoding_message_size(usize::MAX))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let url = format!("http://{addr}");
    let channel = Channel::from_shared(url.clone()).unwrap().connect_lazy();
    Peer { client: super::network::peer_client(channel), streams, url }
}

async fn answer(s: &mut AppendStream, p: &Peer, bytes: &[u8]) -> Result<Vec<u8>, Status> {
    match s.call(&p.client, bytes.to_vec()).await? {
        Sent::Answer(a) => Ok(a),
        Sent::Unary(_) => panic!("expected the stream to be used"),
    }
}

#[tokio::test]
async fn second_append_on_switches_to_one_stream() {
    let p = peer(Mode::Echo).await;
    let mut s = AppendStream::default();
    tracing::info!("the first append of a client goes unary, untouched");
    match s.call(&p.client, vec![1, 2, 3]).await.unwrap() {
        Sent::Unary(b) => assert_eq!(b, vec![1, 2, 3]),
        Sent::Answer(_) => panic!("first append must be unary"),
    }
    assert_eq!(p.streams.load(Ordering::SeqCst), 0);
    tracing::info!("later appends share one stream and get their own answers");
    for i in 0..20u8 {
        assert_eq!(answer(&mut s, &p, &[i, 7]).await.unwrap(), vec![7, i]);
    }
    assert_eq!(p.streams.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_answer_with_the_wrong_number_fails_the_call_and_closes_the_stream() {
    let p = peer(Mode::WrongSeq).await;
    let mut s = AppendStream::default();
    let _ = s.call(&p.client, vec![0]).await.unwrap();
    for expected_streams in 1..=3 {
        let err = answer(&mut s, &p, &[1]).await.unwrap_err();
        assert!(err.message().contains("answered request"), "{err:?}");
        assert_eq!(p.streams.load(Ordering::SeqCst), expected_streams);
    }
}

#[tokio::test]
async fn an_abandoned_call_is_never_answered_by_the_next_one() {
    let p = peer(Mode::SlowFirst).await;
    let mut s = AppendStream::default();
    let _ = s.call(&p.client, vec![0]).await.unwrap();
    tracing::info!("the caller gives up while the first answer is still on its way");
    let gave_up = tokio::time::timeout(SLOW / 3, s.call(&p.client, vec![1])).await;
    assert!(gave_up.is_err());
    tracing::info!("the next call gets its own answer, from a new stream");
    assert_eq!(answer(&mut s, &p, &[2, 3]).await.unwrap(), vec![3, 2]);
    assert_eq!(p.streams.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_peer_without_the_stream_gets_unary_calls_for_good() {
    let p = peer(Mode::Old).await;
    let mut s = AppendStream::default();
    let _ = s.call(&p.client, vec![0]).await.unwrap();
    tracing::info!("the refused request comes back whole, to be sent unary");
    for i in 0..3u8 {
        match s.call(&p.client, vec![i, 9]).await.unwrap() {
            Sent::Unary(b) => assert_eq!(b, vec![i, 9]),
            Sent::Answer(_) => panic!("an old peer has no stream"),
        }
    }
    assert_eq!(p.streams.load(Ordering::SeqCst), 0);
}

/// Issue 19, finding 3: a leader's `ForwardBatch` reply over 4 MiB (applied commands whose
/// results are large) must reach the follower's callers as their results. Seen failing on
/// 163ae63: with tonic's default 4 MiB decode limit on the peer client, every command of the
/// group got "decoded message length too large" as a definite error although the leader had
/// applied them.
#[tokio::test]
async fn a_forward_reply_over_4_mib_reaches_every_caller() {
    let p = peer(Mode::BigForward).await;
    let cmds = vec![RaftCommand::default(); 2];
    let leader = super::relay::LeaderRelay::unary(p.client, Duration::from_secs(5));
    let outcomes = super::forward::forward_group(&leader, cmds, &Default::default()).await;
    assert_eq!(outcomes.len(), 2);
    for (i, o) in outcomes.into_iter().enumerate() {
        let r = o.unwrap_or_else(|e| panic!("command {i}: {e}")).result;
        assert!(r.encoded_len() > BIG_RESULT, "command {i}: a result of {}", r.encoded_len());
    }
}

/// A member from before Pre-Vote answers `PreVote` with `Unimplemented`: that counts as a grant
/// (openraft's rule for peers without Pre-Vote), so a cluster mid-upgrade can still elect. A
/// peer that cannot be reached is no grant.
#[tokio::test]
async fn pre_vote_to_a_member_without_it_is_granted_and_to_a_dead_one_is_not() {
    use openraft::network::{RPCOption, RaftNetworkFactory};
    use openraft::raft::VoteRequest;
    use openraft::RaftNetworkV2;

    use super::network::Network;
    use super::types::{Member, Vote};

    let p = peer(Mode::Old).await;
    let member = |url: &str| Member { peer_urls: vec![url.to_string()], ..Default::default() };
    let mut net = Network::default();
    let req = VoteRequest::new(Vote::new(3, 1), None);
    let option = RPCOption::new(Duration::from_secs(2));
    let mut old = net.new_client(2, &member(&p.url)).await;
    let resp = old.pre_vote(req.clone(), option.clone()).await.expect("an old member's answer");
    assert!(resp.vote_granted, "{resp:?}");
    tracing::info!("a peer that refuses connections does not count as granting");
    let mut dead = net.new_client(3, &member("http://127.0.0.1:1")).await;
    assert!(dead.pre_vote(req, option).await.is_err());
}
