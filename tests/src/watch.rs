//! Reading watch streams in tests: bounded waits for the next response, and responses and events
//! in a form that compares and prints well.
//!
//! Responses are summarised as [`WatchResp`] whether they come from the `etcd-client` crate or
//! from the raw generated client ([`raw_watch`]), which the tests use only for the one wire field
//! the crate hides (`fragment`).

use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{EventType, WatchStream};
use picket_proto::etcdserverpb::watch_client::WatchClient as RawWatchClient;
use picket_proto::etcdserverpb::watch_request::RequestUnion;
use picket_proto::etcdserverpb::{WatchCreateRequest, WatchRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::util::Kv;

/// How long a test waits for one watch response it expects. Events are pushed as soon as the
/// revision is applied (milliseconds on loopback); 15 s covers a loaded 2-core machine while a
/// lost event still fails the test in bounded time.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(15);

/// The kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Put,
    Delete,
}

/// One watch event with every field.
#[derive(Clone, PartialEq, Eq)]
pub struct Ev {
    pub kind: Kind,
    pub kv: Kv,
    pub prev: Option<Kv>,
}

impl Ev {
    /// A put event for `kv`, without a previous pair.
    pub fn put(kv: Kv) -> Ev {
        Ev { kind: Kind::Put, kv, prev: None }
    }

    /// A delete event as etcd reports it: the key and the deleting revision; every other field
    /// is zero or empty.
    pub fn delete(key: impl AsRef<[u8]>, revision: i64) -> Ev {
        Ev { kind: Kind::Delete, kv: Kv::new(key, "", 0, revision, 0), prev: None }
    }

    pub fn with_prev(mut self, prev: Kv) -> Ev {
        self.prev = Some(prev);
        self
    }

    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

impl fmt::Debug for Ev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} {:?}", self.kind, self.kv)?;
        if let Some(p) = &self.prev {
            write!(f, " prev {p:?}")?;
        }
        Ok(())
    }
}

impl From<&etcd_client::Event> for Ev {
    fn from(e: &etcd_client::Event) -> Ev {
        let kind = match e.event_type() {
            EventType::Put => Kind::Put,
            EventType::Delete => Kind::Delete,
        };
        Ev {
            kind,
            kv: e.kv().map(Kv::from).unwrap_or_else(|| Kv::new("<no kv>", "", 0, 0, 0)),
            prev: e.prev_kv().map(Kv::from),
        }
    }
}

fn raw_kv(kv: &picket_proto::mvccpb::KeyValue) -> Kv {
    Kv {
        key: kv.key.clone(),
        value: kv.value.clone(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    }
}

impl From<&picket_proto::mvccpb::Event> for Ev {
    fn from(e: &picket_proto::mvccpb::Event) -> Ev {
        let kind = if e.r#type == picket_proto::mvccpb::event::EventType::Delete as i32 {
            Kind::Delete
        } else {
            Kind::Put
        };
        Ev {
            kind,
            kv: e.kv.as_ref().map(raw_kv).unwrap_or_else(|| Kv::new("<no kv>", "", 0, 0, 0)),
            prev: e.prev_kv.as_ref().map(raw_kv),
        }
    }
}

/// One watch response, summarised.
#[derive(Clone, PartialEq, Eq)]
pub struct WatchResp {
    pub watch_id: i64,
    /// `header.revision` (0 when the header is missing, which no response should do).
    pub revision: i64,
    pub created: bool,
    pub canceled: bool,
    pub compact_revision: i64,
    pub cancel_reason: String,
    /// `None` when read through `etcd-client`, which does not expose the flag.
    pub fragment: Option<bool>,
    pub events: Vec<Ev>,
    /// The encoded size of the response (raw client only).
    pub encoded_len: usize,
}

impl WatchResp {
    /// A response that only reports progress: no events and no create or cancel.
    pub fn is_progress(&self) -> bool {
        self.events.is_empty() && !self.created && !self.canceled
    }
}

impl fmt::Debug for WatchResp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[watch {} rev {}", self.watch_id, self.revision)?;
        if self.created {
            write!(f, " created")?;
        }
        if self.canceled {
            write!(f, " canceled (compact {}, {:?})", self.compact_revision, self.cancel_reason)?;
        }
        if self.fragment == Some(true) {
            write!(f, " fragment")?;
        }
        write!(f, " {:?}]", self.events)
    }
}

impl From<&etcd_client::WatchResponse> for WatchResp {
    fn from(r: &etcd_client::WatchResponse) -> WatchResp {
        WatchResp {
            watch_id: r.watch_id(),
            revision: r.header().map_or(0, |h| h.revision()),
            created: r.created(),
            canceled: r.canceled(),
            compact_revision: r.compact_revision(),
            cancel_reason: r.cancel_reason().to_string(),
            fragment: None,
            events: r.events().iter().map(Ev::from).collect(),
            encoded_len: 0,
        }
    }
}

impl From<&picket_proto::etcdserverpb::WatchResponse> for WatchResp {
    fn from(r: &picket_proto::etcdserverpb::WatchResponse) -> WatchResp {
        use prost::Message;
        WatchResp {
            watch_id: r.watch_id,
            revision: r.header.as_ref().map_or(0, |h| h.revision),
            created: r.created,
            canceled: r.canceled,
            compact_revision: r.compact_revision,
            cancel_reason: r.cancel_reason.clone(),
            fragment: Some(r.fragment),
            events: r.events.iter().map(Ev::from).collect(),
            encoded_len: r.encoded_len(),
        }
    }
}

/// The next response on `stream`, waiting at most `timeout`. A closed stream or a gRPC error
/// is an error.
pub async fn next(stream: &mut WatchStream, timeout: Duration) -> Result<WatchResp> {
    match tokio::time::timeout(timeout, stream.message()).await {
        Err(_) => bail!("no watch response within {timeout:?}"),
        Ok(Err(e)) => Err(e).context("watch stream failed"),
        Ok(Ok(None)) => bail!("watch stream closed by the server"),
        Ok(Ok(Some(r))) => Ok(WatchResp::from(&r)),
    }
}

/// Reads the next response, which must confirm a create, and returns the watch id.
pub async fn created(stream: &mut WatchStream) -> Result<i64> {
    let r = next(stream, WATCH_TIMEOUT).await.context("waiting for the create response")?;
    if !r.created || r.canceled || !r.events.is_empty() {
        bail!("expected a plain create response, got {r:?}");
    }
    Ok(r.watch_id)
}

/// Reads responses until `done(all responses so far)` holds, for at most `timeout` in total.
/// The error names what was received, so a missing event is easy to diagnose.
pub async fn read_until(
    stream: &mut WatchStream,
    timeout: Duration,
    mut done: impl FnMut(&[WatchResp]) -> bool,
) -> Result<Vec<WatchResp>> {
    let deadline = Instant::now() + timeout;
    let mut out: Vec<WatchResp> = Vec::new();
    while !done(&out) {
        let left = deadline.saturating_duration_since(Instant::now());
        match next(stream, left).await {
            Ok(r) => out.push(r),
            Err(e) => bail!("{e:#}; received so far ({} responses): {out:?}", out.len()),
        }
    }
    Ok(out)
}

/// All events of watch `id` in `resps`, in arrival order.
pub fn events_of(resps: &[WatchResp], id: i64) -> Vec<Ev> {
    resps.iter().filter(|r| r.watch_id == id).flat_map(|r| r.events.iter().cloned()).collect()
}

/// Whether `resps` contain an event of watch `id` at `revision` or later.
pub fn reached(resps: &[WatchResp], id: i64, revision: i64) -> bool {
    resps.iter().any(|r| r.watch_id == id && r.events.iter().any(|e| e.revision() >= revision))
}

/// A watch stream opened with the raw generated client: requests go in through `tx`, responses
/// come out of `rx`.
pub struct RawWatch {
    pub tx: mpsc::Sender<WatchRequest>,
    pub rx: tonic::Streaming<picket_proto::etcdserverpb::WatchResponse>,
}

/// Opens a raw watch stream on `endpoint` and sends `create` on it.
pub async fn raw_watch(endpoint: &str, create: WatchCreateRequest) -> Result<RawWatch> {
    let mut client =
        tokio::time::timeout(WATCH_TIMEOUT, RawWatchClient::connect(endpoint.to_string()))
            .await
            .with_context(|| format!("connecting to {endpoint} timed out"))?
            .with_context(|| format!("connecting to {endpoint}"))?;
    let (tx, rx) = mpsc::channel(16);
    tx.send(WatchRequest { request_union: Some(RequestUnion::CreateRequest(create)) })
        .await
        .context("queueing the create request")?;
    let rx = tokio::time::timeout(WATCH_TIMEOUT, client.watch(ReceiverStream::new(rx)))
        .await
        .context("opening the watch stream timed out")?
        .context("opening the watch stream")?
        .into_inner();
    Ok(RawWatch { tx, rx })
}

impl RawWatch {
    /// The next response, waiting at most `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Result<WatchResp> {
        match tokio::time::timeout(timeout, self.rx.message()).await {
            Err(_) => bail!("no watch response within {timeout:?}"),
            Ok(Err(e)) => Err(e).context("watch stream failed"),
            Ok(Ok(None)) => bail!("watch stream closed by the server"),
            Ok(Ok(Some(r))) => Ok(WatchResp::from(&r)),
        }
    }
}

/// Every response that arrives within `window`. For observing a period on purpose (progress
/// notifications in a quiet spell), not for waiting for something expected: use [`read_until`].
pub async fn read_for(stream: &mut WatchStream, window: Duration) -> Result<Vec<WatchResp>> {
    let deadline = Instant::now() + window;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(out);
        }
        match tokio::time::timeout(left, stream.message()).await {
            Err(_) => return Ok(out),
            Ok(Err(e)) => return Err(e).context("watch stream failed"),
            Ok(Ok(None)) => bail!("watch stream closed by the server; received: {out:?}"),
            Ok(Ok(Some(r))) => out.push(WatchResp::from(&r)),
        }
    }
}
