//! The Raft network: openraft's `RaftNetwork` over tonic, one lazily connected channel per
//! peer, shared by every client openraft asks for. openraft messages travel as postcard bytes
//! inside `picket.raft.v1.RaftPayload` (or `RaftFrame` on a replication stream, see
//! `append_stream` and `append_pipeline`); the reply carries the remote `Result`, so remote Raft
//! errors come back typed.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::Stream;
use openraft::error::{
    NetworkError, RPCError, RaftError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, VoteRequest,
    VoteResponse,
};
use openraft::RaftNetworkV2;
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::RaftPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::append_pipeline;
use super::append_stream::AppendStream;
use super::batcher::EntriesInFlight;
use super::snapshot_pace::Sending;
use super::types::{Member, NodeId, Snapshot, SnapshotData, TypeConfig, Vote};
use crate::tls::PeerDialer;

/// How long to wait for a TCP connection to a peer. A peer that cannot be reached within this
/// time is reported `Unreachable`, and openraft backs off before retrying, so a dead peer costs
/// one short wait per backoff period rather than a stuck replication stream.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Opens a lazily connected channel to a peer URL, over TLS with the peer certificates when the
/// URL is `https` (see `crate::tls`). tonic reconnects the channel by itself after a failure,
/// so a restarted peer is picked up without creating a new client. Every dial to a peer goes
/// through here, so peer TLS applies to all of them.
pub fn peer_channel(url: &str, dialer: &PeerDialer) -> Result<Channel, tonic::transport::Error> {
    let endpoint = Endpoint::from_shared(url.to_string())?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(dialer.apply(url, endpoint)?.connect_lazy())
}

/// A Raft-service client for a peer, with tonic's message-size limits lifted. Peers are members
/// of this cluster, and their replies can be large by design: a `ForwardBatch` reply carries up
/// to 256 applied results (Txns whose ranges read whole prefixes), a snapshot or an append
/// carries up to a few MiB of entries. With tonic's default 4 MiB decode limit such a reply
/// became an error after the leader had applied the commands (issue 19). What bounds these
/// messages is the sender (the batcher's byte limit, the request size limit), not the receiver.
pub fn peer_client(channel: Channel) -> RaftServiceClient<Channel> {
    RaftServiceClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

pub fn encode<T: Serialize>(v: &T) -> Result<RaftPayload, postcard::Error> {
    Ok(RaftPayload { payload: postcard::to_allocvec(v)? })
}

/// Decodes postcard bytes, the body of a `RaftPayload` or a `RaftFrame`.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// Creates peer clients for openraft, reusing one channel per peer.
///
/// openraft 0.9 asks for a new client far more often than a connection should be made: every
/// replication stream (re)start and, above all, every leadership confirmation
/// (`ensure_linearizable`, used once per read-index round) calls `new_client` for each voter.
/// Opening a fresh channel each time cost a TCP connect and an HTTP/2 handshake per follower per
/// round (about 10,000 sockets in TIME_WAIT after a 10 s lease keep-alive run). A tonic
/// `Channel` multiplexes concurrent RPCs over one HTTP/2 connection, is cheap to clone and
/// reconnects by itself after a failure, so one channel per peer serves every client.
#[derive(Clone, Default)]
pub struct Network {
    /// Keyed by member id; the URL is kept so a member whose peer URL changed (a membership
    /// update) gets a channel to the new URL instead of the stale one.
    channels: HashMap<NodeId, (String, Channel)>,
    /// Plain text or TLS per peer URL; the default dials plain `http` peers only.
    dialer: PeerDialer,
    /// Snapshot sends in flight, which hold snapshot builds back (`snapshot_pace`).
    sending: Sending,
    /// The member's write batcher's entries in flight, read by the append pipeline.
    entries: EntriesInFlight,
}

impl Network {
    /// A network that dials peers with `dialer`, counts its snapshot sends in `sending`, and
    /// paces its appends by the write batcher's `entries` in flight (`append_pipeline`).
    pub fn new(dialer: PeerDialer, sending: Sending, entries: EntriesInFlight) -> Self {
        Network { channels: HashMap::new(), dialer, sending, entries }
    }

    fn channel(&mut self, target: NodeId, url: &str) -> Option<Channel> {
        if let Some((cached_url, ch)) = self.channels.get(&target) {
            if cached_url == url {
                return Some(ch.clone());
            }
        }
        match peer_channel(url, &self.dialer) {
            Ok(ch) => {
                self.channels.insert(target, (url.to_string(), ch.clone()));
                Some(ch)
            }
            Err(_) => {
                self.channels.remove(&target);
                None
            }
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        let url = node.peer_urls.first().map(String::as_str).unwrap_or_default();
        let client = self.channel(target, url).map(peer_client);
        if client.is_none() {
            tracing::warn!(node_id = target, url = %url, "invalid peer url");
        }
        PeerClient {
            target,
            client,
            appends: AppendStream::default(),
            sending: self.sending.clone(),
            entries: self.entries.clone(),
        }
    }
}

/// A connection to one peer.
pub struct PeerClient {
    target: NodeId,
    client: Option<RaftServiceClient<Channel>>,
    /// The append stream kept between replication sessions (`append_stream`).
    appends: AppendStream,
    sending: Sending,
    entries: EntriesInFlight,
}

type RpcResult<T> = Result<T, RPCError<TypeConfig>>;
type AppendItem = RpcResult<StreamAppendResult<TypeConfig>>;

/// One unary method of the generated peer client, boxed so `call` can share the plumbing.
pub type PeerMethod =
    fn(
        RaftServiceClient<Channel>,
        RaftPayload,
    )
        -> futures::future::BoxFuture<'static, Result<tonic::Response<RaftPayload>, tonic::Status>>;

impl PeerClient {
    async fn call<Req, Resp>(
        &mut self,
        req: &Req,
        option: &RPCOption,
        method: PeerMethod,
    ) -> RpcResult<Resp>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let payload = encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.call_encoded(payload, option, method).await
    }

    async fn call_encoded<Resp>(
        &mut self,
        payload: RaftPayload,
        option: &RPCOption,
        method: PeerMethod,
    ) -> RpcResult<Resp>
    where
        Resp: DeserializeOwned,
    {
        let client = self.client.clone().ok_or_else(invalid_url)?;
        unary(client, self.target, payload, option.hard_ttl(), method).await
    }
}

/// The slowest transfer an append's deadline allows for its payload, in bytes per second, on top
/// of openraft's RPC timeout (see [`deadline_for`]): 4 MiB/s, a 32 Mbit/s link, or a debug build
/// on a machine with more runnable threads than cores.
const MIN_APPEND_BYTES_PER_SEC: f64 = (4 << 20) as f64;

/// How long an append of `payload_bytes` may take to be answered: openraft's RPC timeout `ttl`
/// (its heartbeat interval, 100 ms by default) plus the payload's time at
/// [`MIN_APPEND_BYTES_PER_SEC`].
///
/// A follower catching up is sent up to `log_store::MAX_APPEND_BYTES` (2 MiB) per request, or
/// one larger entry alone, and answers after writing and syncing it. Where that takes longer
/// than a heartbeat (a slower link, a loaded machine) a deadline of one heartbeat timed out
/// every attempt, and openraft resent the same payload after each timeout, so the follower
/// never caught up: seen in CI, `catch_up.rs` with a build running beside it, every append to
/// the stopped follower "peer rpc timed out" for the whole minute. The allowance grows with
/// the bytes only, so a small append (a heartbeat, a commit index, a lone write) keeps the
/// short deadline, and a follower that is gone is still noticed within 0.6 s of a 2 MiB
/// append. A slow answer is safe to wait for: nothing about commits waits on this follower while
/// a quorum answers, and openraft treats a late answer like any other.
pub fn deadline_for(ttl: Duration, payload_bytes: usize) -> Duration {
    ttl + Duration::from_secs_f64(payload_bytes as f64 / MIN_APPEND_BYTES_PER_SEC)
}

/// One unary call of `method` to `target`, bounded by `ttl` plus its payload's time
/// ([`deadline_for`]: a peer without the append stream is sent its appends this
/// way, and a large one must not time out on every attempt), its answer decoded ([`answer`]).
pub async fn unary<Resp>(
    client: RaftServiceClient<Channel>,
    target: NodeId,
    payload: RaftPayload,
    ttl: Duration,
    method: PeerMethod,
) -> RpcResult<Resp>
where
    Resp: DeserializeOwned,
{
    let ttl = deadline_for(ttl, payload.payload.len());
    // Bounded by openraft's per-RPC deadline; on expiry openraft backs off and retries, which is
    // safe for all three RPCs (each is idempotent on the receiver).
    let resp = match tokio::time::timeout(ttl, method(client, payload)).await {
        Err(_) => return Err(timed_out()),
        // Connection-level failures: let openraft back off before retrying.
        Ok(Err(status)) => return Err(unreachable(&status)),
        Ok(Ok(r)) => r.into_inner(),
    };
    answer(target, &resp.payload)
}

/// Decodes `target`'s answer: openraft's result, serialized with postcard. A peer whose Raft
/// stopped (a fatal error) is reported unreachable: openraft backs off and retries, as for a
/// peer that is down.
pub fn answer<Resp>(target: NodeId, bytes: &[u8]) -> RpcResult<Resp>
where
    Resp: DeserializeOwned,
{
    let result: Result<Resp, RaftError<TypeConfig>> =
        decode(bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
    result.map_err(|e| {
        tracing::warn!(peer = target, error = %e, "peer's raft answered with an error");
        RPCError::Unreachable(Unreachable::new(&e))
    })
}

/// A peer that could not be reached, or whose call failed at the connection: openraft backs off
/// before retrying.
pub fn unreachable(status: &tonic::Status) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(status))
}

fn invalid_url() -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other("invalid peer url")))
}

/// A peer RPC that outlived its deadline: reported unreachable, so openraft backs off.
pub fn timed_out() -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "peer rpc timed out",
    )))
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    /// One unary call: openraft sends appends through [`Self::stream_append`], which comes here
    /// only for a peer without the append stream (one request at a time).
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<TypeConfig>> {
        self.call(&rpc, &option, |mut c, p| Box::pin(async move { c.append_entries(p).await }))
            .await
    }

    /// openraft's replication sessions: over the append stream with the commit index sent
    /// ahead of unanswered entries (`append_pipeline`); one at a time towards a peer that
    /// predates the stream.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, AppendItem>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>>
            + openraft::OptionalSend
            + Unpin
            + 'static,
    {
        if self.appends.unary_only() {
            return openraft::network::stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            let client = self.client.clone().ok_or_else(invalid_url)?;
            let ttl = option.hard_ttl();
            let entries = self.entries.clone();
            let appends = &mut self.appends;
            Ok(append_pipeline::session(client, self.target, appends, input, ttl, entries))
        })
    }

    /// In chunks over the `install_snapshot` RPC (`snapshot_transfer`).
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let Some(client) = self.client.clone() else {
            return Err(StreamingError::Unreachable(Unreachable::new(&std::io::Error::other(
                "invalid peer url",
            ))));
        };
        let index = snapshot.meta.last_log_id.map_or(0, |l| l.index);
        // Counted until this call returns or is dropped: builds wait meanwhile (`snapshot_pace`).
        let _sending = self.sending.start();
        tracing::info!(peer = self.target, snapshot_index = index, "sending snapshot");
        let sent = super::snapshot_transfer::send(client, vote, snapshot, cancel, option).await;
        match &sent {
            Ok(_) => tracing::info!(peer = self.target, snapshot_index = index, "snapshot sent"),
            Err(e) => {
                tracing::info!(peer = self.target, snapshot_index = index, error = %e, "snapshot send failed")
            }
        }
        sent
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>> {
        self.call(&rpc, &option, |mut c, p| Box::pin(async move { c.vote(p).await })).await
    }

    /// A member from before Pre-Vote answers `Unimplemented`: counted as a grant, as openraft
    /// counts a network without `pre_vote`, so a rolling upgrade never blocks elections. Any
    /// other failure is an error (not a grant), as openraft requires.
    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<TypeConfig>> {
        let payload = encode(&rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.client.clone().ok_or_else(invalid_url)?;
        // Bounded like every unary call; openraft starts a new round at the next timeout.
        match tokio::time::timeout(option.hard_ttl(), client.pre_vote(payload)).await {
            Err(_) => Err(timed_out()),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                Ok(VoteResponse::new(rpc.vote, None, true))
            }
            Ok(Err(status)) => Err(unreachable(&status)),
            Ok(Ok(r)) => answer(self.target, &r.into_inner().payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(url: &str) -> Member {
        Member { name: "n".into(), peer_urls: vec![url.into()], client_urls: Vec::new() }
    }

    // Regression test for issue 9: every `new_client` used to open a new channel (and so a new
    // TCP connection) per call. One cached channel per member, replaced when its URL changes.
    #[tokio::test]
    async fn one_channel_per_member_until_its_url_changes() {
        tracing::info!("repeated clients for one member share a single cached channel");
        let mut net = Network::default();
        for _ in 0..3 {
            assert!(net.new_client(1, &member("http://127.0.0.1:1")).await.client.is_some());
        }
        assert!(net.new_client(2, &member("http://127.0.0.1:2")).await.client.is_some());
        assert_eq!(net.channels.len(), 2);
        assert_eq!(net.channels[&1].0, "http://127.0.0.1:1");

        tracing::info!("a changed peer URL replaces the member's channel");
        assert!(net.new_client(1, &member("http://127.0.0.1:3")).await.client.is_some());
        assert_eq!(net.channels.len(), 2);
        assert_eq!(net.channels[&1].0, "http://127.0.0.1:3");

        tracing::info!("an invalid URL yields no client and drops the stale channel");
        assert!(net.new_client(1, &member("not a url")).await.client.is_none());
        assert!(!net.channels.contains_key(&1));
    }
}
