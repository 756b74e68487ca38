//! Durable subscriptions: consumer groups whose committed position lives in Picket.
//!
//! A group (`picket.v1.Subscriptions`) names a key range and a committed revision. A
//! [`Subscription`] is one consumer of a group: it watches the range from `committed + 1` with
//! the client's resuming watch (so member failures cause neither gap nor duplicate), and the
//! consumer calls [`Subscription::commit`] once it has durably handled what it received. After a
//! crash or restart, the next [`Client::subscribe`] resumes right after the last commit: events
//! after it are delivered again (at-least-once), none before it are.
//!
//! Picket's compaction never removes history a group has not committed past, up to the group's
//! lag bound (in revisions). A group that falls further behind is passed by compaction, and
//! its consumers get [`Error::LostHistory`] instead of silently missing events; they
//! re-read the range's current state and call [`Client::skip_lost_history`] to go on.
//!
//! Lag is counted in store revisions, not events in the range: a group on a quiet range lags
//! while other keys change. Commit after progress marks too ([`Subscription::commit_position`]
//! does), so a quiet group stays within its bound. Needs Picket; etcd has no such service.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use picket_proto::picket::v1::subscriptions_client::SubscriptionsClient;
use picket_proto::picket::v1::{
    CreateGroupRequest, DeleteGroupRequest, GetGroupRequest, GroupCommitRequest, GroupState,
    ListGroupsRequest,
};
use tonic::Code;

use crate::client::{request, Client, Retry};
use crate::error::Error;
use crate::kv::KeyRange;
use crate::watch::{WatchBatch, WatchOptions, WatchStream};

/// How to create a group: which keys it covers, where it starts and its lag bound.
#[derive(Debug, Clone, Default)]
pub struct GroupOptions {
    range: KeyRange,
    start_revision: i64,
    max_lag_revisions: i64,
}

impl GroupOptions {
    /// The group covers its key alone, starts after the current revision and takes the
    /// server's default lag bound.
    pub fn new() -> Self {
        Self::default()
    }

    /// Selects the keys the group covers.
    pub fn range(mut self, range: KeyRange) -> Self {
        self.range = range;
        self
    }

    /// Every key starting with the group's key.
    pub fn prefix(self) -> Self {
        self.range(KeyRange::Prefix)
    }

    /// The first revision the group's consumers see (at or above the compaction point).
    /// Default: the revision after the current one (changes from now on).
    pub fn start_revision(mut self, rev: i64) -> Self {
        self.start_revision = rev;
        self
    }

    /// The group holds compaction back only while it is at most this many revisions behind
    /// the store. Default: the server's `--sub-max-lag-revisions`.
    pub fn max_lag_revisions(mut self, n: i64) -> Self {
        self.max_lag_revisions = n;
        self
    }
}

/// A group's state as the server reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupInfo {
    /// The group name.
    pub name: String,
    /// The first key of the group's range.
    pub key: Vec<u8>,
    /// The end of the range, etcd-style (empty: the key alone; `\0`: every key from `key`).
    pub range_end: Vec<u8>,
    /// Every event at or below this revision has been consumed.
    pub committed: i64,
    /// The group's lag bound, in revisions.
    pub max_lag_revisions: i64,
    /// Store revision minus `committed`.
    pub lag: i64,
    /// The store's compaction point when the server answered.
    pub compact_revision: i64,
    /// Whether compaction removed history the group had not committed past.
    pub lost_history: bool,
    /// Whether the group holds compaction back now (not lost, within its bound).
    pub holding: bool,
    /// The store revision the answer was served at.
    pub revision: i64,
}

impl GroupInfo {
    fn from_state(g: GroupState, revision: i64) -> Self {
        Self {
            name: g.name,
            key: g.key,
            range_end: g.range_end,
            committed: g.committed,
            max_lag_revisions: g.max_lag_revisions,
            lag: g.lag,
            compact_revision: g.compact_revision,
            lost_history: g.lost_history,
            holding: g.holding,
            revision,
        }
    }

    fn lost(&self) -> Error {
        Error::LostHistory {
            group: self.name.clone(),
            committed: self.committed,
            compacted: self.compact_revision,
        }
    }
}

fn missing_group() -> Error {
    Error::Server { code: Code::Internal, message: "picket: response without a group".into() }
}

impl Client {
    /// Creates consumer group `name` over `key` (and the range `opts` selects). Fails with
    /// [`Error::Server`] code `AlreadyExists` if the name is taken; with
    /// [`Error::InvalidArgument`] for a bad name or a range overlapping `picket/sub/`.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
    /// use picket_client::GroupOptions;
    ///
    /// let g = client.create_group("audit", "ledger/", GroupOptions::new().prefix()).await?;
    /// println!("group {} starts after revision {}", g.name, g.committed);
    /// # Ok(()) }
    /// ```
    pub async fn create_group(
        &self,
        name: &str,
        key: impl Into<Vec<u8>>,
        opts: GroupOptions,
    ) -> Result<GroupInfo, Error> {
        let key = key.into();
        let req = CreateGroupRequest {
            name: name.to_string(),
            range_end: opts.range.range_end(&key),
            key,
            start_revision: opts.start_revision,
            max_lag_revisions: opts.max_lag_revisions,
        };
        // Not idempotent: a retry after an unknown outcome would see "already exists".
        let resp = self
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move {
                    Ok(SubscriptionsClient::new(ch).create_group(request(req)).await?.into_inner())
                }
            })
            .await?;
        let rev = resp.header.map(|h| h.revision).unwrap_or(0);
        Ok(GroupInfo::from_state(resp.group.ok_or_else(missing_group)?, rev))
    }

    /// Deletes group `name`, releasing its hold on compaction. `Ok(false)` if there was no
    /// such group.
    pub async fn delete_group(&self, name: &str) -> Result<bool, Error> {
        let req = DeleteGroupRequest { name: name.to_string() };
        // Idempotent in effect: deleting twice leaves no group either way (the second answer
        // says "not found", which is why this returns a bool rather than failing).
        let resp = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move {
                    Ok(SubscriptionsClient::new(ch).delete_group(request(req)).await?.into_inner())
                }
            })
            .await;
        match resp {
            Ok(_) => Ok(true),
            Err(Error::Server { code: Code::NotFound, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Group `name`'s state (linearizable), or `None` if there is no such group.
    pub async fn group(&self, name: &str) -> Result<Option<GroupInfo>, Error> {
        let req = GetGroupRequest { name: name.to_string() };
        let resp = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move {
                    Ok(SubscriptionsClient::new(ch).get_group(request(req)).await?.into_inner())
                }
            })
            .await;
        match resp {
            Ok(r) => {
                let rev = r.header.map(|h| h.revision).unwrap_or(0);
                Ok(Some(GroupInfo::from_state(r.group.ok_or_else(missing_group)?, rev)))
            }
            Err(Error::Server { code: Code::NotFound, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every group, in name order.
    pub async fn list_groups(&self) -> Result<Vec<GroupInfo>, Error> {
        let resp = self
            .call(Retry::Idempotent, |ch| async move {
                Ok(SubscriptionsClient::new(ch)
                    .list_groups(request(ListGroupsRequest {}))
                    .await?
                    .into_inner())
            })
            .await?;
        let rev = resp.header.map(|h| h.revision).unwrap_or(0);
        Ok(resp.groups.into_iter().map(|g| GroupInfo::from_state(g, rev)).collect())
    }

    /// Commits `revision` for group `name` and returns the committed position afterwards. A
    /// revision at or below the current position is ignored (the position never moves back),
    /// which makes this safe to retry.
    pub async fn commit_group(&self, name: &str, revision: i64) -> Result<i64, Error> {
        let req = GroupCommitRequest { name: name.to_string(), revision };
        // Idempotent: the server ignores a commit at or below the current position.
        let resp = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move {
                    Ok(SubscriptionsClient::new(ch).commit(request(req)).await?.into_inner())
                }
            })
            .await?;
        Ok(resp.committed)
    }

    /// After [`Error::LostHistory`]: commits up to the compaction point so the group can
    /// resume from the oldest history left. Returns the new committed position. Call it only
    /// once the application has caught up some other way (for instance by re-reading the
    /// range), since the events in between are gone.
    pub async fn skip_lost_history(&self, name: &str) -> Result<i64, Error> {
        let info = self.group(name).await?.ok_or_else(|| no_such_group(name))?;
        if !info.lost_history {
            return Ok(info.committed);
        }
        self.commit_group(name, info.compact_revision - 1).await
    }

    /// Starts consuming group `name` from right after its committed position.
    /// [`Error::LostHistory`] if compaction already removed part of what the group owes.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
    /// use futures::StreamExt;
    ///
    /// let mut sub = client.subscribe("audit").await?;
    /// while let Some(batch) = sub.next().await {
    ///     for ev in batch?.events {
    ///         let kv = ev.kv.unwrap_or_default();
    ///         println!("{} at {}", String::from_utf8_lossy(&kv.key), kv.mod_revision);
    ///     }
    ///     sub.commit_position().await?; // after handling the batch
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn subscribe(&self, name: &str) -> Result<Subscription, Error> {
        let info = self.group(name).await?.ok_or_else(|| no_such_group(name))?;
        if info.lost_history {
            return Err(info.lost());
        }
        let opts = WatchOptions::new()
            .range(KeyRange::End(info.range_end.clone()))
            .start_revision(info.committed + 1)
            .progress_notify();
        let watch = match self.watch(info.key.clone(), opts).await {
            Ok(w) => w,
            // Compacted between the state read and the watch: the group lost history.
            Err(Error::Compacted { compact_revision }) => {
                return Err(Error::LostHistory {
                    group: info.name,
                    committed: info.committed,
                    compacted: compact_revision,
                })
            }
            Err(e) => return Err(e),
        };
        Ok(Subscription {
            client: self.clone(),
            name: name.to_string(),
            position: info.committed,
            committed: info.committed,
            watch,
            ended: false,
        })
    }
}

fn no_such_group(name: &str) -> Error {
    Error::Server {
        code: Code::NotFound,
        message: format!("picket: subscription group {name:?} not found"),
    }
}

/// One consumer of a group: a stream of [`WatchBatch`]es over the group's range, starting
/// right after the committed position, plus the means to commit. Progress marks (empty
/// batches) say every event up to their revision has been delivered. Ends after yielding
/// [`Error::LostHistory`] (or another final watch error). Made by [`Client::subscribe`].
pub struct Subscription {
    client: Client,
    name: String,
    position: i64,
    committed: i64,
    watch: WatchStream,
    ended: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("position", &self.position)
            .field("committed", &self.committed)
            .finish()
    }
}

impl Subscription {
    /// The group name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The highest revision through which every event has been delivered by this stream
    /// (events or progress marks); what [`Subscription::commit_position`] commits.
    pub fn position(&self) -> i64 {
        self.position
    }

    /// The committed position as this consumer last learned it.
    pub fn committed(&self) -> i64 {
        self.committed
    }

    /// Commits `revision` (ignored by the server if at or below the group's position) and
    /// returns the group's committed position afterwards.
    pub async fn commit(&mut self, revision: i64) -> Result<i64, Error> {
        let committed = self.client.commit_group(&self.name, revision).await?;
        self.committed = committed;
        Ok(committed)
    }

    /// Commits everything delivered so far ([`Subscription::position`]); does nothing when
    /// that is already committed.
    pub async fn commit_position(&mut self) -> Result<i64, Error> {
        if self.position <= self.committed {
            return Ok(self.committed);
        }
        self.commit(self.position).await
    }

    /// The group's lag in revisions as the server sees it now.
    pub async fn lag(&self) -> Result<i64, Error> {
        let info = self.client.group(&self.name).await?.ok_or_else(|| no_such_group(&self.name))?;
        Ok(info.lag)
    }

    /// Asks the server for a progress mark, so a quiet range's position can move forward.
    pub async fn request_progress(&self) {
        self.watch.request_progress().await;
    }
}

impl Stream for Subscription {
    type Item = Result<WatchBatch, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let item = match Pin::new(&mut self.watch).poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(item) => item,
        };
        match item {
            None => {
                self.ended = true;
                Poll::Ready(None)
            }
            Some(Ok(batch)) => {
                let top = if batch.is_progress() {
                    batch.revision
                } else {
                    batch
                        .events
                        .iter()
                        .filter_map(|e| e.kv.as_ref())
                        .map(|kv| kv.mod_revision)
                        .max()
                        .unwrap_or(0)
                };
                self.position = self.position.max(top);
                Poll::Ready(Some(Ok(batch)))
            }
            Some(Err(Error::Compacted { compact_revision })) => {
                self.ended = true;
                Poll::Ready(Some(Err(Error::LostHistory {
                    group: self.name.clone(),
                    committed: self.committed,
                    compacted: compact_revision,
                })))
            }
            Some(Err(e)) => {
                self.ended = true;
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}
