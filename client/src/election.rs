//! Leader election (etcd's `v3electionpb.Election`).

use std::time::Duration;

use futures::Stream;
use picket_proto::mvccpb::KeyValue;
use picket_proto::v3electionpb::election_client::ElectionClient;
use picket_proto::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest, ResignRequest,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{request, Client, Retry};
use crate::error::{classify, Error, Failure};
use crate::session::Session;

/// Pause before retrying a campaign or an observation on another endpoint.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Having won an election: the key that proves it. Pass it to proclaim and resign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// The election name.
    pub name: Vec<u8>,
    /// The leader's key, `<name>/<lease hex>`.
    pub key: Vec<u8>,
    /// The key's create revision: like a fencing token, larger for later leaders.
    pub revision: i64,
    /// The session's lease.
    pub lease: i64,
}

impl Leadership {
    fn to_pb(&self) -> LeaderKey {
        LeaderKey {
            name: self.name.clone(),
            key: self.key.clone(),
            rev: self.revision,
            lease: self.lease,
        }
    }
}

impl Client {
    /// Campaigns for leadership of `name` with `value`, under `session`; returns once elected
    /// (candidates are elected in arrival order). Fails with [`Error::SessionLost`] if the
    /// session is lost while waiting. Retried after a broken connection: the campaign key is
    /// named by the lease, so a retry resumes the same candidacy.
    pub async fn campaign(
        &self,
        name: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        session: &Session,
    ) -> Result<Leadership, Error> {
        let req =
            CampaignRequest { name: name.into(), lease: session.lease_id(), value: value.into() };
        loop {
            for idx in self.inner.pool.order() {
                session.check()?;
                let Ok(ch) = self.inner.pool.channel(idx).await else {
                    self.inner.pool.avoid(idx);
                    continue;
                };
                // Unbounded wait for the incumbent to go; the session ends it if lost.
                let mut election = ElectionClient::new(ch);
                let result = tokio::select! {
                    r = election.campaign(request(req.clone())) => r,
                    _ = session.lost() => return Err(Error::SessionLost(session.lease_id())),
                };
                match result {
                    Ok(resp) => {
                        let l = resp.into_inner().leader.unwrap_or_default();
                        return Ok(Leadership {
                            name: l.name,
                            key: l.key,
                            revision: l.rev,
                            lease: l.lease,
                        });
                    }
                    Err(status) => match classify(&status) {
                        Failure::Final(e) => return Err(e),
                        Failure::NotApplied(_) | Failure::MaybeApplied(_) => {
                            self.inner.pool.avoid(idx)
                        }
                    },
                }
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// Publishes a new value as the current leader. [`Error::NotLeader`] if `leadership` is no
    /// longer the leader's.
    pub async fn proclaim(
        &self,
        leadership: &Leadership,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), Error> {
        let req = ProclaimRequest { leader: Some(leadership.to_pb()), value: value.into() };
        // Proclaiming the same value twice has the effect of proclaiming it once (the leader
        // key is rewritten only while it is still ours).
        self.call(Retry::Idempotent, |ch| {
            let req = req.clone();
            async move {
                ElectionClient::new(ch).proclaim(request(req)).await?;
                Ok(())
            }
        })
        .await
    }

    /// Gives up leadership (deletes the leader key); the next candidate is elected.
    pub async fn resign(&self, leadership: &Leadership) -> Result<(), Error> {
        let req = ResignRequest { leader: Some(leadership.to_pb()) };
        // Deleting our own leader key twice equals deleting it once.
        self.call(Retry::Idempotent, |ch| {
            let req = req.clone();
            async move {
                ElectionClient::new(ch).resign(request(req)).await?;
                Ok(())
            }
        })
        .await
    }

    /// The current leader's key-value (value = what it proclaimed), or `None` without a leader.
    pub async fn leader(&self, name: impl Into<Vec<u8>>) -> Result<Option<KeyValue>, Error> {
        let req = LeaderRequest { name: name.into() };
        let resp = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move { Ok(ElectionClient::new(ch).leader(request(req)).await?.into_inner()) }
            })
            .await;
        match resp {
            Ok(r) => Ok(r.kv),
            Err(Error::NotLeader(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A stream of the election's leaders as they change (each leader's key-value, also after
    /// each proclaim). Survives endpoint failures; a change is never reported twice in a row.
    pub fn observe(
        &self,
        name: impl Into<Vec<u8>>,
    ) -> impl Stream<Item = KeyValue> + Send + 'static {
        let (tx, rx) = mpsc::channel(16);
        let client = self.clone();
        let name = name.into();
        let task = tokio::spawn(async move {
            let mut last: Option<(i64, i64)> = None;
            loop {
                for idx in client.inner.pool.order() {
                    let Ok(ch) = client.inner.pool.channel(idx).await else {
                        client.inner.pool.avoid(idx);
                        continue;
                    };
                    let Ok(resp) = ElectionClient::new(ch)
                        .observe(request(LeaderRequest { name: name.clone() }))
                        .await
                    else {
                        client.inner.pool.avoid(idx);
                        continue;
                    };
                    let mut stream = resp.into_inner();
                    while let Ok(Some(r)) = stream.message().await {
                        let Some(kv) = r.kv else { continue };
                        let id = (kv.create_revision, kv.mod_revision);
                        if last == Some(id) {
                            continue;
                        }
                        last = Some(id);
                        if tx.send(kv).await.is_err() {
                            return;
                        }
                    }
                    client.inner.pool.avoid(idx);
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        });
        AbortOnDrop { inner: ReceiverStream::new(rx), task }
    }
}

/// A stream that stops its producer task when dropped.
struct AbortOnDrop<S> {
    inner: S,
    task: tokio::task::JoinHandle<()>,
}

impl<S: Stream + Unpin> Stream for AbortOnDrop<S> {
    type Item = S::Item;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl<S> Drop for AbortOnDrop<S> {
    fn drop(&mut self) {
        self.task.abort();
    }
}
