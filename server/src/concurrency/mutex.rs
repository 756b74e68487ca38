//! The distributed mutex (etcd `concurrency.Mutex`, run in the server).

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::response_op::Response as OpResp;
use picket_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest,
    TxnResponse,
};
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::KeyValue;
use picket_proto::prefix_end;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::{contender_key, contender_prefix, Backend, ConcurrencyError, StoreError};
use crate::storage::state_machine::FeedItem;

/// A granted lock.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The ownership key, `<name>/<lease hex>`.
    pub key: Vec<u8>,
    /// The key's create revision: the fencing token.
    pub token: i64,
    /// The header of the read that proved ownership.
    pub header: Option<ResponseHeader>,
}

/// Range over the contenders of `prefix`, oldest (or newest) first, one key.
pub(crate) fn first_by_create(prefix: &[u8], order: SortOrder, max_create: i64) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision: max_create,
        ..Default::default()
    }
}

fn range_op(r: RangeRequest) -> RequestOp {
    RequestOp { request: Some(Op::RequestRange(r)) }
}

fn first_kv(resp: &TxnResponse, i: usize) -> Option<KeyValue> {
    match resp.responses.get(i)?.response.as_ref()? {
        OpResp::ResponseRange(r) => r.kvs.first().cloned(),
        _ => None,
    }
}

/// What the queueing transaction reads besides the contender's own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// The holder (the oldest contender), whole: what TryLock answers with.
    Holder,
    /// The two newest contenders, keys only: whether this one is the oldest, and if not, its
    /// predecessor, which a waiter waits on (see [`Queued::known_wait`]).
    Predecessor,
}

/// What the queueing transaction found, all at its revision (`header`).
pub(crate) struct Queued {
    /// This contender's key, `<name>/<lease hex>`, and its create revision.
    pub key: Vec<u8>,
    pub rev: i64,
    /// Whether the transaction created the key (false: this lease already had one).
    pub created: bool,
    /// The holder, when the transaction read it ([`Reads::Holder`], or a key that existed).
    pub owner: Option<KeyValue>,
    /// Whether this contender is the oldest: it holds the lock.
    pub holds: bool,
    /// The contender created just before this one (keys only), when the transaction created
    /// the key and read [`Reads::Predecessor`].
    pub pred: Option<KeyValue>,
    pub header: Option<ResponseHeader>,
}

impl Queued {
    /// Where a waiter can start waiting without reading again: its predecessor and the revision
    /// at which the transaction saw it, when known (see [`wait_turn`]).
    pub(crate) fn known_wait(&self) -> Option<(KeyValue, i64)> {
        let seen = self.header.map(|h| h.revision)?;
        self.pred.clone().map(|p| (p, seen))
    }
}

/// Creates (or finds) this contender's key: etcd's `If(CreateRevision(key) == 0)
/// Then(Put(key, value, lease), GetOwner) Else(Get(key), GetOwner)`. With
/// [`Reads::Predecessor`] the Then branch reads the two newest contenders instead of the owner
/// (one range either way): the newest is the key just created, so one alone means it is the
/// oldest too, and otherwise the second is its predecessor. A waiter then starts waiting from
/// this committed transaction's reads instead of the three linearizable reads (holder, own key,
/// predecessor) [`wait_turn`] would otherwise make.
pub(crate) async fn enqueue<B: Backend>(
    b: &B,
    name: &[u8],
    lease: i64,
    value: &[u8],
    reads: Reads,
) -> Result<Queued, ConcurrencyError> {
    let prefix = contender_prefix(name);
    let key = contender_key(name, lease);
    let owner = range_op(first_by_create(&prefix, SortOrder::Ascend, 0));
    let then_read = match reads {
        Reads::Holder => owner.clone(),
        Reads::Predecessor => {
            let mut newest_two = first_by_create(&prefix, SortOrder::Descend, 0);
            newest_two.limit = 2;
            newest_two.keys_only = true;
            range_op(newest_two)
        }
    };
    let txn = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: key.clone(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::CreateRevision(0)),
        }],
        success: vec![
            RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key: key.clone(),
                    value: value.to_vec(),
                    lease,
                    ..Default::default()
                })),
            },
            then_read,
        ],
        failure: vec![range_op(RangeRequest { key: key.clone(), ..Default::default() }), owner],
    };
    let resp = b.txn(txn).await?;
    let header = resp.header;
    let created = resp.succeeded;
    let rev = if created {
        header.map(|h| h.revision).unwrap_or_default()
    } else {
        first_kv(&resp, 0).map(|kv| kv.create_revision).unwrap_or_default()
    };
    let mut queued = Queued { key, rev, created, owner: None, holds: false, pred: None, header };
    if created && reads == Reads::Predecessor {
        let newest = match resp.responses.get(1).and_then(|r| r.response.as_ref()) {
            Some(OpResp::ResponseRange(r)) => r.kvs.as_slice(),
            _ => &[],
        };
        let mine = |kv: &KeyValue| kv.key == queued.key && kv.create_revision == rev;
        match newest {
            [only] if mine(only) => queued.holds = true,
            [first, pred] if mine(first) => queued.pred = Some(pred.clone()),
            // Never expected (the put created the newest key): neither holding nor a known
            // predecessor, so the waiter reads linearizably, as it always did.
            _ => {}
        }
    } else {
        queued.owner = first_kv(&resp, 1);
        queued.holds = queued.owner.as_ref().is_some_and(|o| o.create_revision == rev);
    }
    Ok(queued)
}

/// Where a waiting contender stands, by [`position`].
enum Position {
    /// It is the oldest contender: granted, with the header of the read that proved it.
    Holds(Option<ResponseHeader>),
    /// An older contender exists: its predecessor, and the revision at which it was read.
    Behind(KeyValue, i64),
    /// Not the oldest, yet nothing older was found by the next read (it went meanwhile): read
    /// again.
    NoPredecessor,
}

/// One read pass of [`wait_turn`]: whether `key` (created at `rev`) holds the lock, and if not,
/// its predecessor. Fails if the key is gone. `woken`: this member's applied feed just showed
/// the predecessor's (or our key's) delete.
async fn position<B: Backend>(
    b: &B,
    prefix: &[u8],
    key: &[u8],
    lease: i64,
    rev: i64,
    woken: bool,
) -> Result<Position, ConcurrencyError> {
    // Our key is the oldest contender in `owner` (a read of the first key by create revision).
    let holds = |owner: &picket_proto::etcdserverpb::RangeResponse| {
        owner.kvs.first().is_some_and(|kv| kv.key == key && kv.create_revision == rev)
    };
    if woken {
        // The hand-off fast path: read this member's own applied state, which includes the
        // delete that woke us (events are published after their batch is applied). If our key
        // is the oldest there, it was the oldest, and live, at a committed revision reached
        // after this call began, so granting at that revision is linearizable (the grant takes
        // effect then) and the response header names it, as the linearizable read's would. It
        // saves the ReadIndex round on every contended hand-off. Anything else (an older key
        // still there, ours gone) falls through to the linearizable reads below, which decide.
        let mut local = first_by_create(prefix, SortOrder::Ascend, 0);
        local.serializable = true;
        let owner = b.range(local).await?;
        if holds(&owner) {
            return Ok(Position::Holds(owner.header));
        }
    }
    let owner = b.range(first_by_create(prefix, SortOrder::Ascend, 0)).await?;
    // Ownership is proven by a linearizable read that still sees our key: its lease was alive
    // at that revision, so the grant cannot go to a dead waiter.
    if holds(&owner) {
        return Ok(Position::Holds(owner.header));
    }
    let mine = b.range(RangeRequest { key: key.to_vec(), ..Default::default() }).await?;
    if mine.kvs.first().map(|kv| kv.create_revision) != Some(rev) {
        return Err(ConcurrencyError::KeyLost {
            key: String::from_utf8_lossy(key).into_owned(),
            lease,
        });
    }
    let pred = b.range(first_by_create(prefix, SortOrder::Descend, rev - 1)).await?;
    Ok(match pred.kvs.into_iter().next() {
        Some(kv) => Position::Behind(kv, pred.header.map(|h| h.revision).unwrap_or_default()),
        None => Position::NoPredecessor,
    })
}

/// Waits until `key` (created at `rev`) is the oldest contender under `name/`, then returns.
/// Fails if the key disappears while waiting. Watches only the predecessor, so each release
/// wakes exactly one waiter.
///
/// `feed` must have been subscribed before whatever established `known` (or, without it,
/// before this call), so that every revision after it arrives in the feed. `known` is the
/// predecessor and the revision at which a committed read saw it, with `key` live and not the
/// oldest there ([`Queued::known_wait`]): the first wait starts from it instead of reading.
pub(crate) async fn wait_turn<B: Backend>(
    b: &B,
    name: &[u8],
    key: &[u8],
    lease: i64,
    rev: i64,
    mut feed: broadcast::Receiver<FeedItem>,
    mut known: Option<(KeyValue, i64)>,
) -> Result<Option<ResponseHeader>, ConcurrencyError> {
    let prefix = contender_prefix(name);
    // Set when this member's applied feed just showed the predecessor's (or our key's) delete.
    let mut woken = false;
    loop {
        // The queueing transaction already read what `position` establishes (the holder is
        // another key, ours is live, and its predecessor), at its own committed revision: wait
        // from there. Used once; every later pass reads.
        let (pred_kv, seen) = match known.take() {
            Some(start) => start,
            None => {
                match position(b, &prefix, key, lease, rev, std::mem::take(&mut woken)).await? {
                    Position::Holds(header) => return Ok(header),
                    Position::Behind(pred, seen) => (pred, seen),
                    Position::NoPredecessor => continue,
                }
            }
        };
        'wait: loop {
            match feed.recv().await {
                // A snapshot install: the predecessor's delete may be inside it, and no event will
                // ever say so. Re-read.
                Ok(FeedItem::SnapshotInstalled { .. }) => break 'wait,
                Ok(FeedItem::Revision(batch)) if batch.revision <= seen => {}
                Ok(FeedItem::Revision(batch)) => {
                    for ev in batch.events.iter() {
                        if ev.r#type != EventType::Delete as i32 {
                            continue;
                        }
                        let Some(kv) = &ev.kv else { continue };
                        if kv.key == pred_kv.key || kv.key == key {
                            woken = true;
                            break 'wait;
                        }
                    }
                }
                // Fell behind the feed: re-read instead of trusting it.
                Err(RecvError::Lagged(_)) => break 'wait,
                Err(RecvError::Closed) => {
                    return Err(ConcurrencyError::Store(StoreError::Stopped));
                }
            }
        }
    }
}

/// Acquires the lock `name` for `lease`, waiting in FIFO order.
pub async fn lock<B: Backend>(b: &B, name: &[u8], lease: i64) -> Result<Grant, ConcurrencyError> {
    if name.is_empty() {
        return Err(ConcurrencyError::InvalidArgument("etcdserver: key is not provided".into()));
    }
    // Subscribed before queueing, so every revision after the queueing transaction's is in
    // the feed and the wait can start from what that transaction read (`wait_turn`).
    let feed = b.subscribe();
    let queued = enqueue(b, name, lease, b"", Reads::Predecessor).await?;
    let known = queued.known_wait();
    let Queued { key, rev, created, holds, header, .. } = queued;
    if holds {
        return Ok(Grant { key, token: rev, header });
    }
    // Remove our key if we created it and this call ends without the lock (error or the client
    // gave up and the future was dropped), as etcd's Mutex does.
    let mut cleanup = Cleanup { backend: b.clone(), key: Some(key.clone()).filter(|_| created) };
    let header = wait_turn(b, name, &key, lease, rev, feed, known).await?;
    cleanup.key = None;
    Ok(Grant { key, token: rev, header })
}

/// Releases a lock by deleting its key (etcd's Unlock).
pub async fn unlock<B: Backend>(
    b: &B,
    key: &[u8],
) -> Result<Option<ResponseHeader>, ConcurrencyError> {
    let txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    Ok(b.txn(txn).await?.header)
}

/// Deletes a waiter's key when the waiting call ends without the lock.
struct Cleanup<B: Backend> {
    backend: B,
    key: Option<Vec<u8>>,
}

impl<B: Backend> Drop for Cleanup<B> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let backend = self.backend.clone();
            // Drop cannot await, so the delete runs as its own task. It is judged again first
            // (`Backend::for_cleanup`): auth may have changed while the call waited. If it fails
            // (no leader, node stopping, the caller may no longer write the key, auth changed
            // again before it applied), the key still goes away when its lease expires; until
            // then it only delays later waiters, it can never be granted, because nobody waits
            // on it.
            tokio::spawn(async move {
                let removed = async {
                    let backend = backend.for_cleanup(&key).await?;
                    unlock(&backend, &key).await
                };
                if let Err(e) = removed.await {
                    tracing::warn!(error = %e, "could not remove an abandoned lock waiter's key");
                }
            });
        }
    }
}

/// The outcome of [`try_lock`].
#[derive(Debug, Clone, PartialEq)]
pub enum TryLock {
    Acquired(Grant),
    /// Someone else holds the lock; nothing was left behind.
    Held {
        holder: KeyValue,
        header: Option<ResponseHeader>,
    },
}

/// Takes the lock only if it is free (or already ours); never waits and never queues.
pub async fn try_lock<B: Backend>(
    b: &B,
    name: &[u8],
    lease: i64,
) -> Result<TryLock, ConcurrencyError> {
    if name.is_empty() {
        return Err(ConcurrencyError::InvalidArgument("etcdserver: key is not provided".into()));
    }
    let queued = enqueue(b, name, lease, b"", Reads::Holder).await?;
    let Queued { key, rev, created, owner, header, .. } = queued;
    match owner {
        Some(o) if o.create_revision == rev => {
            Ok(TryLock::Acquired(Grant { key, token: rev, header }))
        }
        Some(o) => {
            // Not ours: withdraw the key we just queued, as etcd's Mutex.TryLock does. A key this
            // lease already had (a waiting Lock call) is left alone.
            if created {
                unlock(b, &key).await?;
            }
            Ok(TryLock::Held { holder: o, header })
        }
        None => Err(ConcurrencyError::KeyLost {
            key: String::from_utf8_lossy(&key).into_owned(),
            lease,
        }),
    }
}

/// Every contender of lock `name`, oldest (the holder) first, read linearizably.
pub async fn contenders<B: Backend>(
    b: &B,
    name: &[u8],
) -> Result<(Vec<KeyValue>, Option<ResponseHeader>), ConcurrencyError> {
    let prefix = contender_prefix(name);
    let mut req = first_by_create(&prefix, SortOrder::Ascend, 0);
    req.limit = 0;
    let resp = b.range(req).await?;
    Ok((resp.kvs, resp.header))
}

/// Waits until the holder with `token` no longer holds lock `name` and returns the revision at
/// which that was observed. Returns at once if it does not hold it now.
pub async fn wait_lost<B: Backend>(
    b: &B,
    name: &[u8],
    token: i64,
) -> Result<(Option<KeyValue>, Option<ResponseHeader>), ConcurrencyError> {
    let prefix = contender_prefix(name);
    // Subscribe before reading: every revision after the read is in the feed.
    let mut feed = b.subscribe();
    loop {
        let resp = b.range(first_by_create(&prefix, SortOrder::Ascend, 0)).await?;
        let holder = resp.kvs.into_iter().next();
        if holder.as_ref().map(|kv| kv.create_revision) != Some(token) {
            return Ok((holder, resp.header));
        }
        let key = holder.map(|kv| kv.key).unwrap_or_default();
        let seen = resp.header.map(|h| h.revision).unwrap_or_default();
        'wait: loop {
            match feed.recv().await {
                // A snapshot install: the holder's delete may be inside it. Re-read.
                Ok(FeedItem::SnapshotInstalled { .. }) => break 'wait,
                Ok(FeedItem::Revision(batch)) if batch.revision <= seen => {}
                Ok(FeedItem::Revision(batch)) => {
                    let deleted = batch.events.iter().any(|e| {
                        e.r#type == EventType::Delete as i32
                            && e.kv.as_ref().is_some_and(|kv| kv.key == key)
                    });
                    if deleted {
                        break 'wait;
                    }
                }
                Err(RecvError::Lagged(_)) => break 'wait,
                Err(RecvError::Closed) => {
                    return Err(ConcurrencyError::Store(StoreError::Stopped));
                }
            }
        }
    }
}
