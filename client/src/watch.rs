//! Watches as a `Stream` that survives endpoint failures without gaps or duplicates.
//!
//! The stream remembers the next revision it owes the caller. After a broken connection it
//! re-creates the watch on another endpoint from exactly that revision, so every event is
//! delivered once, in revision order. A watch started "from now" (revision 0) is pinned to the
//! revision at which the server created it, for the same reason. When the revision owed has
//! been compacted the stream yields [`Error::Compacted`] and ends: the caller must re-read the
//! state and start a new watch, since the events in between are gone.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use picket_proto::etcdserverpb::watch_client::WatchClient;
use picket_proto::etcdserverpb::watch_create_request::FilterType;
use picket_proto::etcdserverpb::watch_request::RequestUnion;
use picket_proto::etcdserverpb::{
    WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use picket_proto::mvccpb::Event;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{request, Client};
use crate::error::Error;
use crate::kv::{key_range_setters, KeyRange};

/// Options of a watch.
///
/// # Examples
/// ```
/// use picket_client::WatchOptions;
///
/// // Everything under "services/", replayed from revision 100, with previous values.
/// let opts = WatchOptions::new().prefix().start_revision(100).prev_kv();
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    range: KeyRange,
    start_revision: i64,
    prev_kv: bool,
    progress_notify: bool,
    no_put: bool,
    no_delete: bool,
}

key_range_setters!(WatchOptions);

impl WatchOptions {
    /// Watch one key from now.
    pub fn new() -> Self {
        Self::default()
    }
    /// Replay history from `rev` (inclusive) before going live; 0 means "from now".
    pub fn start_revision(mut self, rev: i64) -> Self {
        self.start_revision = rev;
        self
    }
    /// Include each key's previous value in delete and put events.
    pub fn prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }
    /// Yield progress batches (no events, a revision) when the watch is idle, and in answer to
    /// [`WatchStream::request_progress`].
    pub fn progress_notify(mut self) -> Self {
        self.progress_notify = true;
        self
    }
    /// Skip put events.
    pub fn no_put(mut self) -> Self {
        self.no_put = true;
        self
    }
    /// Skip delete events.
    pub fn no_delete(mut self) -> Self {
        self.no_delete = true;
        self
    }
}

/// What a watch yields: the events of one or more whole revisions, or a progress mark.
#[derive(Debug, Clone)]
pub struct WatchBatch {
    /// Events in revision order; every event of a revision is in the same batch. Empty for a
    /// progress mark.
    pub events: Vec<Event>,
    /// The store revision the server reported with the batch. For a progress mark: every event
    /// up to this revision has been delivered.
    pub revision: i64,
}

impl WatchBatch {
    /// Whether this is a progress mark rather than events.
    pub fn is_progress(&self) -> bool {
        self.events.is_empty()
    }
}

/// A live watch. Yields [`WatchBatch`]es; ends after yielding a final error (compaction, or a
/// cancel by the server such as a permission error). Dropping it cancels the watch.
///
/// # Examples
/// ```no_run
/// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
/// use futures::StreamExt;
/// use picket_client::WatchOptions;
///
/// let mut watch = client.watch("services/", WatchOptions::new().prefix()).await?;
/// while let Some(batch) = watch.next().await {
///     for ev in batch?.events {
///         let kv = ev.kv.unwrap_or_default();
///         println!("{} {:?} at {}", ev.r#type, String::from_utf8_lossy(&kv.key), kv.mod_revision);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct WatchStream {
    rx: ReceiverStream<Result<WatchBatch, Error>>,
    control: mpsc::Sender<Control>,
    task: JoinHandle<()>,
}

enum Control {
    Progress,
}

impl WatchStream {
    /// Asks the server for a progress mark (delivered if the watch was made with
    /// [`WatchOptions::progress_notify`]).
    pub async fn request_progress(&self) {
        // The task may have ended (the stream is finished); nothing to ask then.
        let _ = self.control.send(Control::Progress).await;
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchBatch, Error>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx)
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Backoff between attempts to re-create a broken watch: from the first to the cap, doubling.
/// Watches are long-lived and retried without end (the caller ends one by dropping it); the
/// cap keeps a dead cluster from being hammered.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_CAP: Duration = Duration::from_secs(1);

impl Client {
    /// Starts a watch on `key`. Returns once the server has created it (so events written after
    /// this returns are seen), or fails if no endpoint can create it within the request
    /// timeout.
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        opts: WatchOptions,
    ) -> Result<WatchStream, Error> {
        let key = key.into();
        let (tx, rx) = mpsc::channel(64);
        let (control, control_rx) = mpsc::channel(4);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let mut w = Watcher {
            client: self.clone(),
            create: WatchCreateRequest {
                range_end: opts.range.range_end(&key),
                key,
                start_revision: opts.start_revision,
                progress_notify: opts.progress_notify,
                filters: filters(&opts),
                prev_kv: opts.prev_kv,
                watch_id: 0,
                fragment: true,
            },
            next_rev: opts.start_revision,
            progress: opts.progress_notify,
            tx,
            control: control_rx,
            ready: Some(ready_tx),
        };
        let task = tokio::spawn(async move { w.run().await });
        let stream = WatchStream { rx: ReceiverStream::new(rx), control, task };
        // Bounded: the first creation gets the request timeout, like any request.
        match tokio::time::timeout(self.inner.opts.request_timeout, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(stream),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::Unavailable("watch task ended".into())),
            Err(_) => Err(Error::Timeout(self.inner.opts.request_timeout)),
        }
    }
}

fn filters(opts: &WatchOptions) -> Vec<i32> {
    let mut f = Vec::new();
    if opts.no_put {
        f.push(FilterType::Noput as i32);
    }
    if opts.no_delete {
        f.push(FilterType::Nodelete as i32);
    }
    f
}

struct Watcher {
    client: Client,
    create: WatchCreateRequest,
    /// The next revision owed to the caller (0 until the first creation pins "now").
    next_rev: i64,
    progress: bool,
    tx: mpsc::Sender<Result<WatchBatch, Error>>,
    control: mpsc::Receiver<Control>,
    ready: Option<tokio::sync::oneshot::Sender<Result<(), Error>>>,
}

/// How one connection's watch ended.
enum End {
    /// Broken connection or endpoint: try another.
    Retry,
    /// The caller dropped the stream, or a final error was delivered.
    Done,
}

impl Watcher {
    async fn run(&mut self) {
        let mut backoff = RETRY_FIRST;
        loop {
            for idx in self.client.inner.pool.order() {
                match self.attempt(idx).await {
                    End::Done => return,
                    End::Retry => {
                        self.client.inner.pool.avoid(idx);
                        tracing::debug!(
                            endpoint = self.client.inner.pool.url(idx),
                            next_rev = self.next_rev,
                            "watch broken; resuming elsewhere"
                        );
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_CAP);
        }
    }

    /// Delivers a final error (to the creator if creation is still pending).
    async fn fail(&mut self, e: Error) -> End {
        match self.ready.take() {
            Some(ready) => {
                let _ = ready.send(Err(e));
            }
            None => {
                let _ = self.tx.send(Err(e)).await;
            }
        }
        End::Done
    }

    async fn attempt(&mut self, idx: usize) -> End {
        let Ok(ch) = self.client.inner.pool.channel(idx).await else { return End::Retry };
        let (req_tx, req_rx) = mpsc::channel(4);
        let mut create = self.create.clone();
        create.start_revision = self.next_rev;
        let first = WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) };
        if req_tx.send(first).await.is_err() {
            return End::Retry;
        }
        // Bounded: a silent endpoint must not stall the watch's creation; the next one is tried.
        let opened = tokio::time::timeout(
            self.client.inner.opts.attempt_timeout,
            WatchClient::new(ch).watch(request(ReceiverStream::new(req_rx))),
        )
        .await;
        let mut responses = match opened {
            Ok(Ok(r)) => r.into_inner(),
            _ => return End::Retry,
        };
        let mut pending: Vec<Event> = Vec::new();
        let mut created = false;
        loop {
            let msg = tokio::select! {
                m = responses.message() => m,
                c = self.control.recv() => {
                    if let Some(Control::Progress) = c {
                        let req = WatchRequest { request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})) };
                        let _ = req_tx.send(req).await;
                    }
                    continue;
                }
                // Until created, the attempt timeout bounds the wait for the answer.
                _ = tokio::time::sleep(self.client.inner.opts.attempt_timeout), if !created => {
                    return End::Retry;
                }
            };
            let resp: WatchResponse = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => return End::Retry,
            };
            let revision = resp.header.map(|h| h.revision).unwrap_or(0);
            if resp.canceled {
                if resp.compact_revision > 0 {
                    return self
                        .fail(Error::Compacted { compact_revision: resp.compact_revision })
                        .await;
                }
                let reason = resp.cancel_reason;
                // etcd cancels watches made with `hasleader` when the member loses its
                // leader: that is this endpoint's problem, not the watch's; resume elsewhere.
                if reason.contains("no leader") {
                    return End::Retry;
                }
                return self
                    .fail(Error::Server {
                        code: tonic::Code::Cancelled,
                        message: format!("watch canceled: {reason}"),
                    })
                    .await;
            }
            if resp.created {
                created = true;
                if self.next_rev == 0 {
                    // "From now" means after the revision the server created the watch at.
                    self.next_rev = revision + 1;
                }
                if let Some(ready) = self.ready.take() {
                    let _ = ready.send(Ok(()));
                }
                if resp.events.is_empty() {
                    continue;
                }
            }
            pending.extend(resp.events);
            if resp.fragment {
                continue;
            }
            // Drop anything already delivered: a resumed watch starts at `next_rev`, so this
            // only guards against a server that replays too much.
            let next = self.next_rev;
            let events: Vec<Event> = std::mem::take(&mut pending)
                .into_iter()
                .filter(|e| e.kv.as_ref().map(|kv| kv.mod_revision >= next).unwrap_or(false))
                .collect();
            if let Some(last) = events.last().and_then(|e| e.kv.as_ref()) {
                self.next_rev = last.mod_revision + 1;
                if self.tx.send(Ok(WatchBatch { events, revision })).await.is_err() {
                    return End::Done;
                }
            } else if revision >= self.next_rev - 1 && revision > 0 {
                // A progress mark: everything up to `revision` has been delivered.
                self.next_rev = self.next_rev.max(revision + 1);
                if self.progress
                    && self.tx.send(Ok(WatchBatch { events: Vec::new(), revision })).await.is_err()
                {
                    return End::Done;
                }
            }
        }
    }
}
