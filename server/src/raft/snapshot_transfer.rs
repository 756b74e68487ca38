//! Sending and receiving a snapshot in chunks over the peer `install_snapshot` RPC.
//!
//! openraft 0.10 hands the network a whole snapshot to send (`RaftNetworkV2::full_snapshot`)
//! and takes a whole one to install (`Raft::install_full_snapshot`); cutting it into chunks and
//! putting them back together is Picket's. A chunk keeps openraft 0.9's `InstallSnapshotRequest`
//! layout (postcard is positional: vote, metadata with a snapshot id, offset, bytes, done), and
//! the answer its `InstallSnapshotResponse` layout (the receiver's vote), so members of both
//! versions can send each other snapshots during a rolling upgrade.
//!
//! The receiver writes chunks into a temp file (`SnapshotData::create_temp`), never into
//! memory, and installs when the last one arrives. One transfer at a time: a chunk at offset 0
//! starts over (the previous partial file is removed), and a chunk that does not continue the
//! transfer in progress is refused, after which the leader resends the snapshot from the start.

use openraft::async_runtime::WatchReceiver;
use std::future::Future;
use std::io::SeekFrom;
use std::path::PathBuf;

use openraft::error::{ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::SnapshotResponse;
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::Status;

use super::network::{decode, encode};
use super::types::{
    LogId, Raft, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig, Vote,
};

/// How many bytes one chunk carries when openraft does not say: openraft 0.9's default
/// (`snapshot_max_chunk_size`, 3 MiB), which crosses a LAN and is written well within the
/// per-chunk timeout (`install_snapshot_timeout`).
const DEFAULT_CHUNK: usize = 3 * 1024 * 1024;

/// openraft 0.9's `SnapshotMeta` layout, whose last field names the transfer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkMeta {
    pub last_log_id: Option<LogId>,
    pub last_membership: StoredMembership,
    pub snapshot_id: String,
}

/// One chunk: openraft 0.9's `InstallSnapshotRequest` layout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Chunk {
    pub vote: Vote,
    pub meta: ChunkMeta,
    pub offset: u64,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    pub done: bool,
}

/// What the receiver answers a chunk: its vote (openraft 0.9's `InstallSnapshotResponse` and
/// 0.10's `SnapshotResponse` have this one field), or the error that stopped its Raft.
type ChunkReply = Result<SnapshotResponse<TypeConfig>, openraft::error::RaftError<TypeConfig>>;

fn unreachable(e: impl std::fmt::Display) -> StreamingError<TypeConfig> {
    StreamingError::Unreachable(Unreachable::new(&std::io::Error::other(e.to_string())))
}

/// Sends `snapshot` to a peer chunk by chunk, each bounded by the RPC deadline, until the peer
/// has installed it or answers with a newer vote (openraft then steps down). `cancel` ends the
/// transfer between chunks when openraft stops replicating to the peer.
pub async fn send(
    client: RaftServiceClient<Channel>,
    vote: Vote,
    mut snapshot: Snapshot,
    cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
    option: RPCOption,
) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
    tokio::pin!(cancel);
    let data = &mut snapshot.snapshot;
    // A snapshot this member took is a view until now: written out once per transfer (off the
    // runtime), then read in chunks like a received one.
    data.spill().await.map_err(unreachable)?;
    let len = data.seek(SeekFrom::End(0)).await.map_err(unreachable)?;
    data.seek(SeekFrom::Start(0)).await.map_err(unreachable)?;
    #[allow(clippy::disallowed_methods)] // names a transfer on the network, far from apply
    let nonce = rand::random::<u64>();
    let meta = ChunkMeta {
        last_log_id: snapshot.meta.last_log_id,
        last_membership: snapshot.meta.last_membership.clone(),
        // Names this transfer, so chunks of an older one are never mistaken for its own.
        snapshot_id: format!("{}-{}", snapshot.meta.last_log_id.map_or(0, |l| l.index), nonce),
    };
    let size = option.snapshot_chunk_size().unwrap_or(DEFAULT_CHUNK).max(1);
    let mut offset = 0u64;
    loop {
        let mut buf = Vec::with_capacity(size.min((len - offset) as usize));
        (&mut *data).take(size as u64).read_to_end(&mut buf).await.map_err(unreachable)?;
        let done = offset + buf.len() as u64 >= len;
        let n = buf.len() as u64;
        let chunk = Chunk { vote, meta: meta.clone(), offset, data: buf, done };
        let payload = encode(&chunk).map_err(unreachable)?;
        let mut c = client.clone();
        // Bounded by openraft's per-chunk deadline (`install_snapshot_timeout`); on expiry the
        // whole transfer fails and openraft starts it again later, which the receiver allows
        // (a chunk at offset 0 starts over).
        let answer = tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            r = tokio::time::timeout(option.hard_ttl(), c.install_snapshot(payload)) => r,
        };
        let reply: ChunkReply = match answer {
            Err(_) => return Err(unreachable("snapshot chunk timed out")),
            Ok(Err(status)) => return Err(unreachable(status)),
            Ok(Ok(r)) => decode(&r.into_inner().payload).map_err(unreachable)?,
        };
        let resp = reply.map_err(unreachable)?;
        if done || resp.vote > vote {
            return Ok(resp);
        }
        offset += n;
    }
}

/// A transfer being received.
struct Receiving {
    id: String,
    data: SnapshotData,
    received: u64,
}

/// The receiving side: at most one transfer in progress per member.
#[derive(Default)]
pub struct Receiver {
    current: tokio::sync::Mutex<Option<Receiving>>,
}

impl Receiver {
    /// Takes one chunk; when it is the last, installs the snapshot through `raft`. `temp` names
    /// a new file for a transfer that starts with this chunk.
    pub async fn chunk(
        &self,
        raft: &Raft,
        chunk: Chunk,
        temp: impl FnOnce() -> PathBuf,
    ) -> Result<ChunkReply, Status> {
        let mine = raft.metrics().borrow_watched().vote;
        if chunk.vote < mine {
            // A stale leader: tell it our vote; it steps down and stops sending.
            return Ok(Ok(SnapshotResponse::new(mine)));
        }
        let vote = chunk.vote;
        match self.accept(chunk, temp).await? {
            None => Ok(Ok(SnapshotResponse::new(mine))),
            Some(snapshot) => {
                Ok(raft.install_full_snapshot(vote, snapshot).await.map_err(Into::into))
            }
        }
    }

    /// Writes one chunk into the transfer in progress; returns the whole snapshot, its data
    /// positioned at the start, once the last chunk is in.
    async fn accept(
        &self,
        chunk: Chunk,
        temp: impl FnOnce() -> PathBuf,
    ) -> Result<Option<Snapshot>, Status> {
        // Held across the writes: chunks of one transfer arrive one after another, so nobody
        // waits here in practice.
        let mut current = self.current.lock().await;
        if chunk.offset == 0 {
            // Dropping the previous transfer's data removes its file.
            *current = None;
            let data = SnapshotData::create_temp(temp()).await.map_err(internal)?;
            *current = Some(Receiving { id: chunk.meta.snapshot_id.clone(), data, received: 0 });
        }
        let Some(rx) = current.as_mut() else {
            return Err(Status::failed_precondition("picket: snapshot chunk without a transfer"));
        };
        if rx.id != chunk.meta.snapshot_id || rx.received != chunk.offset {
            *current = None;
            return Err(Status::failed_precondition(format!(
                "picket: snapshot chunk at {} of {:?} does not continue the transfer in progress",
                chunk.offset, chunk.meta.snapshot_id
            )));
        }
        rx.data.write_all(&chunk.data).await.map_err(internal)?;
        rx.received += chunk.data.len() as u64;
        if !chunk.done {
            return Ok(None);
        }
        let Some(mut rx) = current.take() else { unreachable!("checked above") };
        drop(current);
        rx.data.flush().await.map_err(internal)?;
        rx.data.seek(SeekFrom::Start(0)).await.map_err(internal)?;
        let meta = SnapshotMeta {
            last_log_id: chunk.meta.last_log_id,
            last_membership: chunk.meta.last_membership,
        };
        Ok(Some(Snapshot { meta, snapshot: rx.data }))
    }
}

fn internal(e: std::io::Error) -> Status {
    Status::internal(format!("picket: receiving a snapshot: {e}"))
}

#[cfg(test)]
#[path = "snapshot_transfer_tests.rs"]
mod tests;
