//! `etcdserverpb.Watch`: one bidirectional stream carries many watchers.
//!
//! Each watcher is a task that first replays history from the MVCC changelog and then joins the
//! member's hub (`api::watch_hub`), which follows the state machine's live event feed and hands
//! every revision to all caught-up watchers in one pass. The hub delivers to a watcher only the
//! revision it owes next, skips revisions it has already sent, and hands it back to its task on
//! a gap (the feed dropped events, a snapshot was installed) or a full stream buffer; the task
//! replays from the changelog and joins again. Hence no event is skipped and none is repeated,
//! across the seam and across lag, and a slow stream never holds up the others.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use picket_proto::etcdserverpb::watch_request::RequestUnion;
use picket_proto::etcdserverpb::watch_server::Watch;
use picket_proto::etcdserverpb::{RangeRequest, ResponseHeader, WatchRequest, WatchResponse};
use picket_proto::mvccpb::Event;
use prost::Message;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::status::mvcc_status;
use super::watch_hub::{Hub, Member};
use super::Ctx;
use crate::mvcc::MvccError;
use crate::storage::state_machine::RevisionEvents;
use crate::watch::{fragment, WatchSpec};

/// Revisions read from the changelog per step of a replay (etcd's `watchBatchMaxRevs`), so a
/// watcher starting far in the past does not load the whole history into memory at once. A step
/// also stops at `--max-request-bytes` of events (at least one revision), so one response of a
/// replay is about that size rather than up to 1,000 revisions of any size (issue 19).
const REPLAY_CHUNK: i64 = 1000;

/// Responses buffered per stream. A client that stops reading fills it; its watchers then wait,
/// fall behind the live feed and later catch up from the changelog, so nothing is lost and the
/// server's memory stays bounded.
const STREAM_BUFFER: usize = 1024;

/// Encoded bytes of responses buffered per stream and not yet taken by the transport. The count
/// above alone let 1,024 large responses pile up for a client that stopped reading (issue 19).
/// A response larger than this waits until the buffer is empty, then goes alone.
const STREAM_BYTES: usize = 4 << 20;

/// `watch_id` of responses that concern the whole stream (progress requests), as in etcd.
const STREAM_WATCH_ID: i64 = -1;

/// The watch service's settings (`--watch-progress-notify-interval`,
/// `--max-watchers-per-stream`, `--max-watch-streams`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub progress_interval: Duration,
    pub watchers_per_stream: usize,
    pub streams: usize,
}

pub struct WatchService {
    ctx: Arc<Ctx>,
    limits: Limits,
    /// One permit per stream that may be open.
    streams: Arc<Semaphore>,
    /// The member's live fan-out, shared by every stream.
    hub: Hub,
}

impl WatchService {
    /// Starts the member's watch hub task (it needs a Tokio runtime).
    pub fn new(ctx: Arc<Ctx>, limits: Limits) -> Self {
        let hub = Hub::start(ctx.clone());
        Self { ctx, limits, streams: Arc::new(Semaphore::new(limits.streams)), hub }
    }
}

type Item = Result<WatchResponse, Status>;
type WatchStream = Pin<Box<dyn Stream<Item = Item> + Send>>;

/// The sending side of one watch stream: a bounded queue whose items also hold their share of
/// the stream's [`STREAM_BYTES`], released when the transport takes them.
#[derive(Clone)]
struct Tx {
    queue: mpsc::Sender<(Item, OwnedSemaphorePermit)>,
    bytes: Arc<Semaphore>,
}

impl Tx {
    /// Queues `item`, waiting while the stream's buffer is full. `Err` if the stream is gone.
    /// The share of [`STREAM_BYTES`] that `item` holds while queued: its encoded size, at least
    /// one byte and at most the whole buffer (so an oversized response goes alone).
    fn cost(item: &Item) -> u32 {
        let len = item.as_ref().map_or(0, |r| r.encoded_len());
        u32::try_from(len.clamp(1, STREAM_BYTES)).unwrap_or(u32::MAX)
    }

    async fn send(&self, item: Item) -> Result<(), ()> {
        let cost = Self::cost(&item);
        // Bounded by the client: permits come back as it reads, or all at once when the stream
        // ends (dropping the receiver drops every queued item and its permit).
        let permit = tokio::select! {
            p = self.bytes.clone().acquire_many_owned(cost) => p.map_err(|_| ())?,
            _ = self.queue.closed() => return Err(()),
        };
        self.queue.send((item, permit)).await.map_err(|_| ())
    }

    /// Queues all of `items` at once, or none of them, without waiting: `Ok(false)` if the
    /// stream's buffer has no room for all of them now, `Err` if the stream is gone.
    fn try_send_all(&self, items: Vec<Item>) -> Result<bool, ()> {
        let mut held = Vec::with_capacity(items.len());
        for item in &items {
            match self.bytes.clone().try_acquire_many_owned(Self::cost(item)) {
                Ok(p) => held.push(p),
                // Dropping `held` returns what was taken.
                Err(TryAcquireError::NoPermits) => return Ok(false),
                Err(TryAcquireError::Closed) => return Err(()),
            }
        }
        let slots = match self.queue.try_reserve_many(items.len()) {
            Ok(slots) => slots,
            Err(TrySendError::Full(())) => return Ok(false),
            Err(TrySendError::Closed(())) => return Err(()),
        };
        for ((slot, item), permit) in slots.zip(items).zip(held) {
            slot.send((item, permit));
        }
        Ok(true)
    }

    async fn closed(&self) {
        self.queue.closed().await
    }
}

/// What a watcher has handed to its stream, under the lock that orders its responses with the
/// stream's progress answers and its cancellation.
#[derive(Debug)]
pub(super) struct Sent {
    /// Highest revision whose events (if any) this watcher has handed to the stream.
    through: i64,
    /// Canceled: nothing more may be sent for it (set before the canceled response is queued).
    closed: bool,
}

type SentLock = Arc<tokio::sync::Mutex<Sent>>;

struct Watcher {
    task: JoinHandle<()>,
    sent: SentLock,
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
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.ctx.metrics.watch_refused("streams");
            return Err(Status::resource_exhausted(format!(
                "picket: too many watch streams on this member (--max-watch-streams {}); \
                 retry later or use another member",
                self.limits.streams
            )));
        };
        let (queue, rx) = mpsc::channel(STREAM_BUFFER);
        let tx = Tx { queue, bytes: Arc::new(Semaphore::new(STREAM_BYTES)) };
        let (ctx, limits, hub) = (self.ctx.clone(), self.limits, self.hub.clone());
        tokio::spawn(async move {
            serve_stream(ctx, hub, limits, incoming, tx, meta).await;
            drop(permit);
        });
        // The permit of an item is dropped as the transport takes it.
        let out = ReceiverStream::new(rx).map(|(item, _permit)| item);
        Ok(Response::new(Box::pin(out)))
    }
}

async fn serve_stream(
    ctx: Arc<Ctx>,
    hub: Hub,
    limits: Limits,
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
                // Over the per-stream limit it is refused without the barrier's round.
                let judged = if watchers.len() >= limits.watchers_per_stream {
                    ctx.metrics.watch_refused("watchers_per_stream");
                    Err(Status::resource_exhausted(format!(
                        "picket: too many watchers on this stream (--max-watchers-per-stream {}); \
                         cancel some or open another stream",
                        limits.watchers_per_stream
                    )))
                } else {
                    ctx.authorize_read(&meta, true, &needs).await
                };
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
                let sent =
                    Arc::new(tokio::sync::Mutex::new(Sent { through: start - 1, closed: false }));
                let state = WatcherState {
                    spec: WatchSpec::from_request(&create),
                    ctx: ctx.clone(),
                    id,
                    tx: tx.clone(),
                    sent: sent.clone(),
                    fragment_limit: ctx.max_request_bytes,
                };
                let task = tokio::spawn(run_watcher(
                    Arc::new(state),
                    hub.clone(),
                    start,
                    limits.progress_interval,
                ));
                watchers.insert(id, Watcher { task, sent });
                tracing::debug!(watch_id = id, start_revision = start, "watch created");
            }
            Some(RequestUnion::CancelRequest(cancel)) => {
                if let Some(w) = watchers.remove(&cancel.watch_id) {
                    w.task.abort();
                    // Under the watcher's lock, so no response of it (from its task or the hub,
                    // which may hold it right now) can follow the canceled one.
                    w.sent.lock().await.closed = true;
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
                    guards.push(w.sent.lock().await);
                }
                let through =
                    guards.iter().map(|g| g.through).min().unwrap_or(current).min(current);
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

pub(super) struct WatcherState {
    ctx: Arc<Ctx>,
    id: i64,
    spec: WatchSpec,
    tx: Tx,
    sent: SentLock,
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

    /// This watcher's responses carrying `events` (already selected, not empty), fragmented if
    /// it asked for that.
    fn responses(&self, events: Vec<Event>, header: &ResponseHeader) -> Vec<Item> {
        let groups =
            if self.spec.fragment { fragment(events, self.fragment_limit) } else { vec![events] };
        let last = groups.len() - 1;
        let responses = groups.into_iter().enumerate().map(|(i, group)| WatchResponse {
            header: Some(*header),
            watch_id: self.id,
            fragment: i < last,
            events: group,
            ..Default::default()
        });
        responses.map(Ok).collect()
    }

    /// Queues `events` (already selected) as this watcher's responses for revisions up to
    /// `through`. Returns false if the stream is gone or the watch canceled.
    async fn send(&self, events: Vec<Event>, through: i64) -> bool {
        // Held while this watcher's events are queued, so a progress answer is ordered with them.
        let mut sent = self.sent.lock().await;
        if sent.closed {
            return false;
        }
        if !events.is_empty() {
            for resp in self.responses(events, &self.ctx.header(through)) {
                if self.tx.send(resp).await.is_err() {
                    return false;
                }
            }
        }
        sent.through = through;
        true
    }

    /// The hub's delivery of one live revision (the one this watcher owes), all or nothing and
    /// without waiting: `Ok(false)` if it cannot be queued now (the stream's buffer is full, or
    /// a progress answer holds the lock), `Err` if the stream is gone or the watch canceled.
    pub(super) fn try_send_revision(
        &self,
        rev: &RevisionEvents,
        header: &ResponseHeader,
    ) -> Result<bool, ()> {
        let events = self.select(rev.revision, rev.events.iter());
        let Ok(mut sent) = self.sent.try_lock() else { return Ok(false) };
        if sent.closed {
            return Err(());
        }
        if !events.is_empty() && !self.tx.try_send_all(self.responses(events, header))? {
            return Ok(false);
        }
        sent.through = rev.revision;
        Ok(true)
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
            match self.ctx.sm.reader().events_bounded(next, to, self.fragment_limit) {
                Ok((batch, through)) => {
                    if !self.deliver(batch, through).await {
                        return None;
                    }
                    next = through + 1;
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

async fn run_watcher(state: Arc<WatcherState>, hub: Hub, start: i64, progress_interval: Duration) {
    // Metrics: counted while this task lives (an aborted task drops the guard too).
    let _watcher = state.ctx.metrics.watcher();
    let mut next = start;
    let mut progress = tokio::time::interval(progress_interval);
    progress.reset();
    // The revision sent through at the last progress tick: a notification goes out only after a
    // whole interval in which no revision was sent (etcd skips watchers it has just sent to).
    let mut at_last_tick = start - 1;
    'replay: loop {
        // A watcher replaying history is behind the live feed: a "slow" watcher in etcd's terms.
        let slow = state.ctx.metrics.slow_watcher();
        let replayed = state.replay(next).await;
        drop(slow);
        next = match replayed {
            Some(n) => n,
            None => return,
        };
        // Caught up: the hub delivers from here, until it hands the watcher back.
        let (back, mut back_rx) = oneshot::channel();
        if hub.join(Member { state: state.clone(), next, back }).is_err() {
            // The hub has ended: the state machine's feed is closed (the member is stopping).
            return;
        }
        loop {
            tokio::select! {
                resume = &mut back_rx => match resume {
                    Ok(from) => {
                        next = from;
                        continue 'replay;
                    }
                    // The hub dropped the watcher: its feed closed (the member is stopping).
                    Err(_) => return,
                },
                _ = progress.tick(), if state.spec.progress_notify => {
                    let sent = state.sent.lock().await;
                    if sent.closed {
                        return;
                    }
                    if sent.through != at_last_tick {
                        at_last_tick = sent.through;
                        continue;
                    }
                    let resp = WatchResponse {
                        header: Some(state.ctx.header(sent.through)),
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

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use picket_proto::mvccpb::KeyValue;

    use super::*;

    fn response(value_len: usize) -> Item {
        let kv = KeyValue { key: b"k".to_vec(), value: vec![7; value_len], ..Default::default() };
        Ok(WatchResponse {
            events: vec![Event { kv: Some(kv), ..Default::default() }],
            ..Default::default()
        })
    }

    /// Issue 19, Medium 10: a client that stops reading holds at most about `STREAM_BYTES` of
    /// responses on the server, not `STREAM_BUFFER` responses of any size. Seen failing with the
    /// byte bound lifted (`STREAM_BYTES = 1 << 30`, the old count-only buffer): all 100
    /// responses of 100 KiB (10 MB) were queued.
    #[tokio::test]
    async fn a_stream_that_is_not_read_buffers_a_bounded_number_of_bytes() {
        let (queue, mut rx) = mpsc::channel(STREAM_BUFFER);
        let tx = Tx { queue, bytes: Arc::new(Semaphore::new(STREAM_BYTES)) };
        let size = response(100 * 1024).unwrap().encoded_len();
        // A send that cannot complete at once is Pending on its first poll: the buffer is full.
        // Unconstrained: tokio's cooperative budget would otherwise make a long run of ready
        // sends in one task return Pending too.
        let mut queued = 0;
        while queued < 100
            && tokio::task::unconstrained(tx.send(response(100 * 1024))).now_or_never().is_some()
        {
            queued += 1;
        }
        assert!(queued < 100, "all 100 responses of {size} bytes were queued for an idle client");
        assert!(queued * size <= STREAM_BYTES, "{queued} responses of {size} bytes queued");
        assert!(queued > 0, "a stream with an empty buffer must take a response");
        // The transport takes one: its bytes come back and the next send goes through.
        let (first, permit) = rx.recv().await.unwrap();
        assert!(first.is_ok());
        drop(permit);
        assert!(tx.send(response(100 * 1024)).now_or_never().is_some());
        // A response larger than the whole buffer waits for an empty buffer, then goes alone.
        while rx.try_recv().is_ok() {}
        assert!(tx.send(response(STREAM_BYTES + 1)).now_or_never().is_some());
        // The client is gone: a waiting sender learns it instead of waiting forever.
        let blocked = tx.send(response(100));
        drop(rx);
        assert_eq!(blocked.await, Err(()));
    }
}
