//! Cluster membership and maintenance (etcd's `Cluster` and `Maintenance` services).

use futures::{Stream, StreamExt};
use picket_proto::etcdserverpb::alarm_request::AlarmAction;
use picket_proto::etcdserverpb::cluster_client::ClusterClient;
use picket_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use picket_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, DefragmentRequest, HashKvRequest, HashKvResponse, Member,
    MemberAddRequest, MemberAddResponse, MemberListRequest, MemberPromoteRequest,
    MemberRemoveRequest, MemberUpdateRequest, MoveLeaderRequest, SnapshotRequest, StatusRequest,
    StatusResponse,
};

use crate::client::{request, Client, Retry};
use crate::error::{classify, Error, Failure};

/// One piece of a snapshot stream, with how much is left: enough to show progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// The next bytes of the snapshot file, to append in order.
    pub blob: Vec<u8>,
    /// Bytes the server still has to send after this chunk (0 on the last chunk). Received
    /// bytes plus this is the file's total size.
    pub remaining_bytes: u64,
}

fn status_error(s: tonic::Status) -> Error {
    match classify(&s) {
        Failure::Final(e) => e,
        Failure::NotApplied(m) => Error::Unavailable(m),
        Failure::MaybeApplied(m) => Error::OutcomeUnknown(m),
    }
}

impl Client {
    /// Every member, linearizably (learners included).
    pub async fn member_list(&self) -> Result<Vec<Member>, Error> {
        let resp = self
            .call(Retry::Idempotent, |ch| async move {
                let req = MemberListRequest { linearizable: true };
                Ok(ClusterClient::new(ch).member_list(request(req)).await?.into_inner())
            })
            .await?;
        Ok(resp.members)
    }

    /// Adds a member with these peer URLs, as a learner or a voter.
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        learner: bool,
    ) -> Result<MemberAddResponse, Error> {
        let req = MemberAddRequest { peer_ur_ls: peer_urls, is_learner: learner };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { Ok(ClusterClient::new(ch).member_add(request(req)).await?.into_inner()) }
        })
        .await
    }

    /// Removes a member by id.
    pub async fn member_remove(&self, id: u64) -> Result<Vec<Member>, Error> {
        let resp = self
            .call(Retry::Write, |ch| async move {
                let req = MemberRemoveRequest { id };
                Ok(ClusterClient::new(ch).member_remove(request(req)).await?.into_inner())
            })
            .await?;
        Ok(resp.members)
    }

    /// Changes a member's peer URLs.
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<Vec<Member>, Error> {
        let req = MemberUpdateRequest { id, peer_ur_ls: peer_urls };
        let resp = self
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(ClusterClient::new(ch).member_update(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(resp.members)
    }

    /// Promotes a learner that has caught up to a voter.
    pub async fn member_promote(&self, id: u64) -> Result<Vec<Member>, Error> {
        let resp = self
            .call(Retry::Write, |ch| async move {
                let req = MemberPromoteRequest { id };
                Ok(ClusterClient::new(ch).member_promote(request(req)).await?.into_inner())
            })
            .await?;
        Ok(resp.members)
    }

    /// One endpoint's status (version, db size, leader, raft index and term).
    pub async fn status(&self, endpoint: &str) -> Result<StatusResponse, Error> {
        let ch = self.channel_to(endpoint).await?;
        let mut m = MaintenanceClient::new(ch);
        let fut = m.status(StatusRequest {});
        match tokio::time::timeout(self.inner.opts.request_timeout, fut).await {
            Ok(r) => r.map(|r| r.into_inner()).map_err(status_error),
            Err(_) => Err(Error::Timeout(self.inner.opts.request_timeout)),
        }
    }

    /// One endpoint's hash of the key-value store at `revision` (0: latest).
    pub async fn hash_kv(&self, endpoint: &str, revision: i64) -> Result<HashKvResponse, Error> {
        let ch = self.channel_to(endpoint).await?;
        let mut m = MaintenanceClient::new(ch);
        let fut = m.hash_kv(HashKvRequest { revision });
        match tokio::time::timeout(self.inner.opts.request_timeout, fut).await {
            Ok(r) => r.map(|r| r.into_inner()).map_err(status_error),
            Err(_) => Err(Error::Timeout(self.inner.opts.request_timeout)),
        }
    }

    /// Compacts one endpoint's storage files.
    pub async fn defragment(&self, endpoint: &str) -> Result<(), Error> {
        let ch = self.channel_to(endpoint).await?;
        // Defragmenting can take long on a large store: no time bound beyond the connection's.
        MaintenanceClient::new(ch).defragment(DefragmentRequest {}).await.map_err(status_error)?;
        Ok(())
    }

    /// Active alarms (NOSPACE, CORRUPT) across the cluster.
    pub async fn alarm_list(&self) -> Result<Vec<AlarmMember>, Error> {
        let resp = self
            .call(Retry::Idempotent, |ch| async move {
                let req = AlarmRequest { action: AlarmAction::Get as i32, member_id: 0, alarm: 0 };
                Ok(MaintenanceClient::new(ch).alarm(request(req)).await?.into_inner())
            })
            .await?;
        Ok(resp.alarms)
    }

    /// Transfers leadership to member `target`. Must reach the current leader; the client
    /// prefers it, and retries elsewhere only when a member answered that it is not leader.
    pub async fn move_leader(&self, target: u64) -> Result<(), Error> {
        self.call(Retry::Write, |ch| async move {
            let req = MoveLeaderRequest { target_id: target };
            MaintenanceClient::new(ch).move_leader(request(req)).await?;
            Ok(())
        })
        .await
    }

    /// Streams a consistent snapshot of one endpoint's store (etcd's format: the blob followed
    /// by its SHA-256). Write the chunks to a file in order.
    pub async fn snapshot(
        &self,
        endpoint: &str,
    ) -> Result<impl Stream<Item = Result<Vec<u8>, Error>> + Send + 'static, Error> {
        let ch = self.channel_to(endpoint).await?;
        let stream = MaintenanceClient::new(ch)
            .snapshot(SnapshotRequest {})
            .await
            .map_err(status_error)?
            .into_inner();
        Ok(stream.map(|r| r.map(|chunk| chunk.blob).map_err(status_error)))
    }

    /// Like [`Client::snapshot`], but each item also says how many bytes remain, so a caller
    /// can show progress (`picket snapshot save` does).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
    /// use futures::StreamExt;
    ///
    /// let mut stream = client.snapshot_with_progress("127.0.0.1:2379").await?;
    /// let mut file = Vec::new();
    /// while let Some(chunk) = stream.next().await {
    ///     let chunk = chunk?;
    ///     file.extend_from_slice(&chunk.blob);
    ///     eprintln!("{} bytes received, {} to go", file.len(), chunk.remaining_bytes);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn snapshot_with_progress(
        &self,
        endpoint: &str,
    ) -> Result<impl Stream<Item = Result<SnapshotChunk, Error>> + Send + 'static, Error> {
        let ch = self.channel_to(endpoint).await?;
        let stream = MaintenanceClient::new(ch)
            .snapshot(SnapshotRequest {})
            .await
            .map_err(status_error)?
            .into_inner();
        Ok(stream.map(|r| {
            r.map(|c| SnapshotChunk { blob: c.blob, remaining_bytes: c.remaining_bytes })
                .map_err(status_error)
        }))
    }
}
