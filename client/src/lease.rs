//! Lease requests, and the keep-alive stream that sessions use.

use picket_proto::etcdserverpb::lease_client::LeaseClient;
use picket_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseLeasesRequest,
    LeaseRevokeRequest, LeaseRevokeResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::client::{request, Client, Retry};
use crate::error::Error;
use picket_proto::etcdserverpb::LeaseKeepAliveResponse;

impl Client {
    /// Grants a lease of `ttl` seconds (the server may raise it to its minimum). `id` 0 lets
    /// the server choose the id. Not retried once sent: a lost answer is
    /// [`Error::OutcomeUnknown`] (an orphan lease, if any, expires on its own).
    pub async fn lease_grant(&self, ttl: i64, id: i64) -> Result<LeaseGrantResponse, Error> {
        let req = LeaseGrantRequest { ttl, id };
        let resp = self
            .call(Retry::Write, |ch| async move {
                Ok(LeaseClient::new(ch).lease_grant(request(req)).await?.into_inner())
            })
            .await?;
        if !resp.error.is_empty() {
            return Err(Error::Server { code: tonic::Code::Unknown, message: resp.error });
        }
        Ok(resp)
    }

    /// Revokes a lease and deletes every key attached to it, at one revision.
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        let req = LeaseRevokeRequest { id };
        self.call(Retry::Write, |ch| async move {
            Ok(LeaseClient::new(ch).lease_revoke(request(req)).await?.into_inner())
        })
        .await
        .map_err(|e| with_lease(e, id))
    }

    /// The lease's remaining and granted TTL (and attached keys with `keys`). A lease that does
    /// not exist has `ttl == -1`, as in etcd.
    pub async fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<LeaseTimeToLiveResponse, Error> {
        let req = LeaseTimeToLiveRequest { id, keys };
        self.call(Retry::Idempotent, |ch| async move {
            Ok(LeaseClient::new(ch).lease_time_to_live(request(req)).await?.into_inner())
        })
        .await
        .map_err(|e| with_lease(e, id))
    }

    /// Every live lease id.
    pub async fn lease_list(&self) -> Result<Vec<i64>, Error> {
        let resp = self
            .call(Retry::Idempotent, |ch| async move {
                Ok(LeaseClient::new(ch)
                    .lease_leases(request(LeaseLeasesRequest {}))
                    .await?
                    .into_inner())
            })
            .await?;
        Ok(resp.leases.into_iter().map(|l| l.id).collect())
    }

    /// Renews a lease once. Returns the new TTL in seconds; [`Error::LeaseNotFound`] when the
    /// lease is gone. Retried on other endpoints (a keep-alive is idempotent).
    pub async fn lease_keep_alive_once(&self, id: i64) -> Result<i64, Error> {
        let ttl = self
            .call(Retry::Idempotent, |ch| async move {
                let (_stream, ttl) = KeepAliveStream::open(ch, id).await?;
                Ok(ttl)
            })
            .await?;
        if ttl <= 0 {
            return Err(Error::LeaseNotFound(id));
        }
        Ok(ttl)
    }
}

/// Puts the lease id into a lease-not-found error (the status text does not carry it).
fn with_lease(e: Error, id: i64) -> Error {
    match e {
        Error::LeaseNotFound(_) => Error::LeaseNotFound(id),
        e => e,
    }
}

/// One open `LeaseKeepAlive` stream on one endpoint: send a lease id, read its answer.
pub(crate) struct KeepAliveStream {
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    rx: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAliveStream {
    /// Opens a stream on `ch` and renews `id` on it. The first request is queued before the
    /// call: grpc-go servers (etcd) send no response headers until the first message arrives,
    /// so waiting for the call to open before sending would deadlock.
    pub(crate) async fn open(ch: crate::auth::Chan, id: i64) -> Result<(Self, i64), tonic::Status> {
        // One request in flight at a time: a channel of 1 is enough.
        let (tx, req_rx) = mpsc::channel(1);
        tx.send(LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| tonic::Status::unavailable("keep-alive stream closed"))?;
        let rx = LeaseClient::new(ch)
            .lease_keep_alive(request(ReceiverStream::new(req_rx)))
            .await?
            .into_inner();
        let mut s = Self { tx, rx };
        let ttl = s.answer(id).await?;
        Ok((s, ttl))
    }

    /// Renews `id`; the TTL answered (0 or less: the lease does not exist).
    pub(crate) async fn keep_alive(&mut self, id: i64) -> Result<i64, tonic::Status> {
        self.tx
            .send(LeaseKeepAliveRequest { id })
            .await
            .map_err(|_| tonic::Status::unavailable("keep-alive stream closed"))?;
        self.answer(id).await
    }

    async fn answer(&mut self, id: i64) -> Result<i64, tonic::Status> {
        loop {
            match self.rx.message().await? {
                // Answers come in request order, one per request; skip any other lease's.
                Some(resp) if resp.id == id => return Ok(resp.ttl),
                Some(_) => continue,
                None => return Err(tonic::Status::unavailable("keep-alive stream ended")),
            }
        }
    }
}
