//! Fake peers for the client side of the peer RPCs: a follower's side of the append stream
//! (used by `append_pipeline_tests`), a leader answering large forwarded groups, and old peers
//! (also their answer to Pre-Vote, which they do not know).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
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

/// How the fake peer answers on the stream.
#[derive(Clone, Copy)]
pub(super) enum Mode {
    /// Predates the stream: `Unimplemented` (a unary append is answered `Ok(Success)`).
    Old,
    /// Answers `ForwardBatch` with one result per command, each over 4 MiB (a Txn whose range
    /// read a large value), as a leader that applied them would.
    BigForward,
    /// A follower that takes every append (answers `Ok(Success)`) at once, and records each
    /// request in `Peer::seen`.
    Follower,
    /// [`Mode::Follower`], but still writing the entries it got: the answer to a request with
    /// entries leaves only after the next request arrived (or the stream ended).
    FollowerSyncing,
    /// [`Mode::Follower`] answering each request with the wrong number.
    FollowerWrongSeq,
    /// [`Mode::Follower`] answering the first request of each stream after `SLOW`.
    FollowerSlowFirst,
    /// [`Mode::Follower`] taking [`PER_MIB`] to receive, write and sync each MiB of a request
    /// before it answers (a slower link or disk, or a loaded machine), one request at a time.
    FollowerPerMib,
}

/// How long [`Mode::FollowerPerMib`] takes per MiB of a request: 10 MiB/s.
pub(super) const PER_MIB: Duration = Duration::from_millis(100);

/// What a fake follower saw of one request: its number, how many entries, the commit index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    pub seq: u64,
    pub entries: usize,
    pub commit: Option<u64>,
}

type SeenLog = Arc<parking_lot::Mutex<Vec<Seen>>>;

/// The size of each result `Mode::BigForward` answers with: over tonic's default 4 MiB.
const BIG_RESULT: usize = 5 * 1024 * 1024;

pub(super) const SLOW: Duration = Duration::from_millis(300);

struct Fake {
    mode: Mode,
    streams: Arc<AtomicU64>,
    unary: Arc<AtomicU64>,
    seen: SeenLog,
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
        Ok(Response::new(follower(req.into_inner(), mode, self.seen.clone())))
    }

    async fn append_entries(
        &self,
        _req: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.unary.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(RaftPayload { payload: success() }))
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

/// A follower's answer to any append: `Ok(Success)`, as postcard bytes.
fn success() -> Vec<u8> {
    use openraft::error::RaftError;
    use openraft::raft::AppendEntriesResponse;

    use super::types::TypeConfig;

    let ok: Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>> =
        Ok(AppendEntriesResponse::Success);
    super::network::encode(&ok).unwrap().payload
}

/// A fake follower's answers: `Ok(Success)` for each request, in order, bent as `mode` says.
fn follower(inbound: Streaming<RaftFrame>, mode: Mode, seen: SeenLog) -> Frames {
    use std::collections::VecDeque;

    use openraft::raft::AppendEntriesRequest;

    use super::network::decode;
    use super::types::TypeConfig;

    let syncing = matches!(mode, Mode::FollowerSyncing);
    let state = (inbound, None::<u64>, VecDeque::<u64>::new(), 0u64);
    Box::pin(futures::stream::unfold(state, move |(mut inbound, mut syncing_seq, mut ready, n)| {
        let seen = seen.clone();
        async move {
            loop {
                if let Some(seq) = ready.pop_front() {
                    let seq = match mode {
                        Mode::FollowerWrongSeq => seq + 1,
                        Mode::FollowerSlowFirst if n == 0 => {
                            tokio::time::sleep(SLOW).await;
                            seq
                        }
                        _ => seq,
                    };
                    let frame = RaftFrame { seq, payload: success() };
                    return Some((Ok(frame), (inbound, syncing_seq, ready, n + 1)));
                }
                match inbound.message().await {
                    Ok(Some(frame)) => {
                        if let Mode::FollowerPerMib = mode {
                            let mib = frame.payload.len() as f64 / f64::from(1u32 << 20);
                            tokio::time::sleep(PER_MIB.mul_f64(mib)).await;
                        }
                        let req: AppendEntriesRequest<TypeConfig> = decode(&frame.payload).unwrap();
                        seen.lock().push(Seen {
                            seq: frame.seq,
                            entries: req.entries.len(),
                            commit: req.leader_commit.map(|c| c.index),
                        });
                        ready.extend(syncing_seq.take());
                        if syncing && !req.entries.is_empty() {
                            syncing_seq = Some(frame.seq);
                        } else {
                            ready.push_back(frame.seq);
                        }
                    }
                    _ => match syncing_seq.take() {
                        Some(seq) => ready.push_back(seq),
                        None => return None,
                    },
                }
            }
        }
    }))
}

pub(super) struct Peer {
    pub client: RaftServiceClient<Channel>,
    pub streams: Arc<AtomicU64>,
    pub url: String,
    pub seen: SeenLog,
    /// Unary appends the fake answered.
    pub unary: Arc<AtomicU64>,
}

pub(super) async fn peer(mode: Mode) -> Peer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let streams = Arc::new(AtomicU64::new(0));
    let seen = SeenLog::default();
    let unary = Arc::new(AtomicU64::new(0));
    let fake = Fake { mode, streams: streams.clone(), unary: unary.clone(), seen: seen.clone() };
    tokio::spawn(
        Server::builder()
            // The real peer service lifts its limits the same way (node.rs).
            .add_service(RaftServiceServer::new(fake).max_encoding_message_size(usize::MAX))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let url = format!("http://{addr}");
    let channel = Channel::from_shared(url.clone()).unwrap().connect_lazy();
    Peer { client: super::network::peer_client(channel), streams, url, seen, unary }
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
