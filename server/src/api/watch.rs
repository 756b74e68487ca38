//! `etcdserverpb.Watch`: one bidirectional stream carries many watchers.
//!
//! Each watcher is a task that first replays history from the MVCC changelog and then follows
//! the state machine's live event feed. It subscribes to the feed *before* reading the current
//! revision, so every revision after the replay is in the feed; revisions it has already sent
//! are skipped, and a gap (it fell behind and the feed dropped events) sends it back to the
//! changelog. Hence no event is skipped and none is repeated, across the seam and across lag.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use picket_proto::etcdserverpb::watch_request::RequestUnion;
use picket_proto::etcdserverpb::watch_server::Watch;
use picket_proto::etcdserverpb::{RangeRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use picket_proto::mvccpb::Event;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::status::mvcc_status;
use super::Ctx;
use crate::mvcc::MvccError;
use crate::storage::state_machine::FeedItem;
use crate::watch::{fragment, WatchSpec};

/// Revisions read from the changelog per step of a replay, so a watcher starting far in the
/// past does not load the whole history into memory at once.
const REPLAY_CHUNK: i64 = 1000;

/// Responses buffered per stream. A client that stops reading fills it; its watchers then wait,
/// fall behind the live feed and later catch up from the changelog, so nothing is lost and the
/// server's memory stays bounded.
const STREAM_BUFFER: usize = 1024;

/// `watch_id` of responses that concern the whole stream (progress requests), as in etcd.
const STREAM_WATCH_ID: i64 = -1;

pub struct WatchService {
    ctx: Arc<Ctx>,
    progress_interval: Duration,
}

impl WatchService {
    pub fn new(ctx: Arc<Ctx>, progress_interval: Duration) -> Self {
        Self { ctx, progress_interval }
    }
}

type Tx = mpsc::Sender<Result<WatchResponse, Status>>;
type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send>>;

struct Watcher {
    task: JoinHandle<()>,
    /// Highest revision whose events (if any) this watcher has handed to the stream.
    sent_through: Arc<tokio::sync::Mutex<i64>>,
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<WatchStream>, Status> {
        let (meta, _, incoming) = req.into_parts();
        // The stream's token is checked when it opens and again for every watch it creates.
        self.ctx.authorize(&meta, &[]).await?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(serve_stream(self.ctx.clone(), self.progress_interval, incoming, tx, meta));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

async fn serve_stream(
    ctx: Arc<Ctx>,
    progress_interval: Duration,
    mut incoming: Streaming<WatchRequest>,
    tx: Tx,
    meta: tonic::metadata::MetadataMap,
) {
    let mut watchers: HashMap<i64, Watcher> = HashMap::new();
    let mut next_id: i64 = 0;
    loop {
        let msg = tokio::select! {
            m = incoming.next() => m,
            _ = tx.closed() => None,
        };
        let Some(Ok(msg)) = msg else { break };
        watchers.retain(|_, w| !w.task.is_finished());
        match msg.request_union {
            Some(RequestUnion::CreateRequest(create)) => {
                // READ on the whole watched range (auth enabled), judged after a read barrier so
                // that "auth is off" or "the role may read this" is never decided from a store
                // older than the request (issue 19: a member that has not applied an acknowledged
                // AuthEnable would stream events to an anonymous client). It costs one ReadIndex
                // round per created watch, and a member that cannot reach the leader refuses to
                // create watches (as it refuses linearizable reads). Refused as etcd refuses: a
                // created-and-canceled response whose reason is the error.
                let needs = [crate::auth::Need::Read(crate::auth::KeyRange::new(
                    &create.key,
                    &create.range_end,
                ))];
                let judged = ctx.authorize_read(&meta, true, &needs).await;
                // After the barrier, so "from now" starts at a revision at least as new as the
                // request.
                let revision = ctx.sm.revision();
                let id = if create.watch_id != 0 {
                    create.watch_id
                } else {
                    while watchers.contains_key(&next_id) {
                        next_id += 1;
                    }
                    next_id
                };
                if create.watch_id != 0 && watchers.contains_key(&id) {
                    let resp = WatchResponse {
                        header: Some(ctx.header(revision)),
                        watch_id: STREAM_WATCH_ID,
                        created: true,
                        canceled: true,
                        cancel_reason: "mvcc: duplicate watch ID provided on the WatchStream"
                            .into(),
                        ..Default::default()
                    };
                    if tx.send(Ok(resp)).await.is_err() {
                        break;
                    }
                    continue;
                }
                if create.watch_id == 0 {
                    next_id += 1;
                }
                if let Err(denied) = judged {
                    let resp = WatchResponse {
                        header: Some(ctx.header(revision)),
                        watch_id: id,
                        created: true,
                        canceled: true,
                        cancel_reason: denied.message().to_string(),
                        ..Default::default()
                    };
                    if tx.send(Ok(resp)).await.is_err() {
                        break;
                    }
                    continue;
                }
                let start =
                    if create.start_revision > 0 { create.start_revision } else { revision + 1 };
                let created = WatchResponse {
                    header: Some(ctx.header(revision)),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                };
                if tx.send(Ok(created)).await.is_err() {
                    break;
                }
                let sent_through = Arc::new(tokio::sync::Mutex::new(start - 1));
                let task = tokio::spawn(run_watcher(
                    ctx.clone(),
                    id,
                    create,
                    start,
                    progress_interval,
                    tx.clone(),
                    sent_through.clone(),
                ));
                watchers.insert(id, Watcher { task, sent_through });
                tracing::debug!(watch_id = id, start_revision = start, "watch created");
            }
            Some(RequestUnion::CancelRequest(cancel)) => {
                if let Some(w) = watchers.remove(&cancel.watch_id) {
                    w.task.abort();
                    let resp = WatchResponse {
                        header: Some(ctx.header(ctx.sm.revision())),
                        watch_id: cancel.watch_id,
                        canceled: true,
                        ..Default::default()
                    };
                    if tx.send(Ok(resp)).await.is_err() {
                        break;
                    }
                }
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Every watcher on the stream has delivered everything up to the smallest
                // revision any of them has reached; claiming more could skip events. Holding
                // every watcher's send lock until the answer is queued keeps it in order with
                // their events: it is neither ahead of a later event nor behind an earlier one.
                let current = ctx.sm.revision();
                let mut guards = Vec::with_capacity(watchers.len());
                for w in watchers.values() {
                    guards.push(w.sent_through.lock().await);
                }
                let through = guards.iter().map(|g| **g).min().unwrap_or(current).min(current);
                let resp = WatchResponse {
                    header: Some(ctx.header(through)),
                    watch_id: STREAM_WATCH_ID,
                    ..Default::default()
                };
                let sent = tx.send(Ok(resp)).await;
                drop(guards);
                if sent.is_err() {
                    break;
                }
            }
            None => {}
        }
    }
    for (_, w) in watchers {
        w.task.abort();
    }
}

/// The previous version of an event's key, as etcd's `prev_kv` reports it.
fn prev_kv(ctx: &Ctx, event: &mut Event, revision: i64) {
    let Some(kv) = &event.kv else { return };
    let req = RangeRequest { key: kv.key.clone(), revision: revision - 1, ..Default::default() };
    // Below the compaction point the previous version is gone; etcd then omits prev_kv too.
    if let Ok(resp) = ctx.sm.reader().range(&req) {
        event.prev_kv = resp.kvs.into_iter().next();
    }
}

struct WatcherState {
    ctx: Arc<Ctx>,
    id: i64,
    spec: WatchSpec,
    tx: Tx,
    sent_through: Arc<tokio::sync::Mutex<i64>>,
    fragment_limit: usize,
}

impl WatcherState {
    /// The events of one revision this watcher wants, with `prev_kv` filled in if asked. Only
    /// wanted events are cloned: with many watchers on disjoint keys, a revision costs each
    /// uninterested watcher a key comparison, not a copy of the revision.
    fn select<'a>(&self, revision: i64, events: impl IntoIterator<Item = &'a Event>) -> Vec<Event> {
        let mut out = Vec::new();
        for e in events {
            if self.spec.wants(e) {
                let mut e = e.clone();
                if self.spec.prev_kv {
                    prev_kv(&self.ctx, &mut e, revision);
                }
                out.push(e);
            }
        }
        out
    }

    /// Sends the wanted events of revisions up to `through`. Returns false if the stream is gone.
    async fn deliver(&self, batch: Vec<(i64, Vec<Event>)>, through: i64) -> bool {
        let mut events = Vec::new();
        for (revision, evs) in &batch {
            events.extend(self.select(*revision, evs));
        }
        self.send(events, through).await
    }

    /// Queues `events` (already selected) as this watcher's responses for revisions up to
    /// `through`. Returns false if the stream is gone.
    async fn send(&self, events: Vec<Event>, through: i64) -> bool {
        // Held while this watcher's events are queued, so a progress answer is ordered with them.
        let mut sent_through = self.sent_through.lock().await;
        if !events.is_empty() {
            let groups = if self.spec.fragment {
                fragment(events, self.fragment_limit)
            } else {
                vec![events]
            };
            let last = groups.len() - 1;
            for (i, group) in groups.into_iter().enumerate() {
                let resp = WatchResponse {
                    header: Some(self.ctx.header(through)),
                    watch_id: self.id,
                    fragment: i < last,
                    events: group,
                    ..Default::default()
                };
                if self.tx.send(Ok(resp)).await.is_err() {
                    return false;
                }
            }
        }
        *sent_through = through;
        true
    }

    async fn cancel_compacted(&self, compact_revision: i64) {
        let resp = WatchResponse {
            header: Some(self.ctx.header(self.ctx.sm.revision())),
            watch_id: self.id,
            canceled: true,
            compact_revision,
            cancel_reason: mvcc_status(&MvccError::Compacted).message().to_string(),
            ..Default::default()
        };
        let _ = self.tx.send(Ok(resp)).await;
    }

    /// Replays `[next, current]` from the changelog. Returns the next revision to send, or
    /// `None` if the watcher must end (compacted or stream gone).
    async fn replay(&self, mut next: i64) -> Option<i64> {
        loop {
            let (current, compacted) = match self.ctx.sm.reader().revisions() {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(watch_id = self.id, error = %e, "watch replay failed");
                    let _ = self.tx.send(Err(mvcc_status(&e))).await;
                    return None;
                }
            };
            if next < compacted {
                self.cancel_compacted(compacted).await;
                return None;
            }
            if next > current {
                return Some(next);
            }
            let to = current.min(next + REPLAY_CHUNK - 1);
            match self.ctx.sm.reader().events(next, to) {
                Ok(batch) => {
                    if !self.deliver(batch, to).await {
                        return None;
                    }
                    next = to + 1;
                }
                Err(MvccError::Compacted) => {
                    let compacted = self.ctx.sm.reader().revisions().map(|r| r.1).unwrap_or(next);
                    self.cancel_compacted(compacted).await;
                    return None;
                }
                Err(e) => {
                    let _ = self.tx.send(Err(mvcc_status(&e))).await;
                    return None;
                }
            }
        }
    }
}

async fn run_watcher(
    ctx: Arc<Ctx>,
    id: i64,
    create: WatchCreateRequest,
    start: i64,
    progress_interval: Duration,
    tx: Tx,
    sent_through: Arc<tokio::sync::Mutex<i64>>,
) {
    let fragment_limit = ctx.max_request_bytes;
    let state = WatcherState {
        spec: WatchSpec::from_request(&create),
        ctx,
        id,
        tx,
        sent_through,
        fragment_limit,
    };
    // Subscribe before the first replay reads the current revision (see the module docs).
    let mut feed = state.ctx.sm.subscribe();
    // Metrics: counted while this task lives (an aborted task drops the guard too).
    let _watcher = state.ctx.metrics.watcher();
    let mut next = start;
    let mut progress = tokio::time::interval(progress_interval);
    progress.reset();
    'replay: loop {
        // A watcher replaying history is behind the live feed: a "slow" watcher in etcd's terms.
        let slow = state.ctx.metrics.slow_watcher();
        let replayed = state.replay(next).await;
        drop(slow);
        next = match replayed {
            Some(n) => n,
            None => return,
        };
        loop {
            tokio::select! {
                item = feed.recv() => match item {
                    Ok(FeedItem::Revision(rev)) if rev.revision < next => {}
                    Ok(FeedItem::Revision(rev)) if rev.revision == next => {
                        let events = state.select(rev.revision, rev.events.iter());
                        if !state.send(events, rev.revision).await {
                            return;
                        }
                        next += 1;
                        progress.reset();
                    }
                    // A gap (the feed skipped ahead), a snapshot install (the store jumped
                    // without events, possibly by exactly one revision, so it must never be
                    // taken for revision `next`) or lag: catch up from the changelog, then
                    // resume the feed.
                    Ok(FeedItem::Revision(_) | FeedItem::SnapshotInstalled { .. }) => {
                        continue 'replay
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(watch_id = state.id, next, missed, "watcher fell behind the live feed; catching up from history");
                        continue 'replay;
                    }
                    Err(RecvError::Closed) => return,
                },
                _ = progress.tick(), if state.spec.progress_notify => {
                    let through = state.sent_through.lock().await;
                    let resp = WatchResponse {
                        header: Some(state.ctx.header(*through)),
                        watch_id: state.id,
                        ..Default::default()
                    };
                    if state.tx.send(Ok(resp)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
