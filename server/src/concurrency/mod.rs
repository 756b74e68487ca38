//! Locks and elections, built in process on KV + lease + watch (etcd's `v3lock` and
//! `v3election`, which run `clientv3/concurrency` inside the server).
//!
//! The recipe is etcd's: a lock named `n` is held by the oldest key under `n/`; each contender
//! creates `n/<lease id in hex>` attached to its lease, and the key's create revision is its
//! **fencing token**. A waiter watches only its predecessor (the newest older key) and re-checks
//! when it is deleted, so hand-off is FIFO and happens as soon as the releasing delete is applied
//! (no polling timer). What Picket adds: a waiter whose key vanished (its lease expired or was
//! revoked while it waited) gets an error, never the lock, and cancelling a waiting call removes
//! its key. A hand-off is decided from the waiter's member's applied state (see
//! `mutex::wait_turn`), so "vanished" means vanished at a revision that member had applied: a
//! grant names the revision at which the key was the oldest live one. A key that died in an
//! entry the member had not applied yet can still be granted (at that earlier revision, which
//! is linearizable); its holder's keep-alive then fails and `mutex::wait_lost` reports the loss
//! at once, and fenced writes with its token are refused.
//!
//! Every wait here (a waiter for its predecessor's delete, a holder for its own, an observer for
//! any change) listens to the member's applied-event feed and also wakes on
//! [`FeedItem::SnapshotInstalled`]: a member that catches up by snapshot never publishes the
//! events inside it, so on that item the waiter re-reads instead of waiting on (issue 19).
//!
//! The module talks to the store only through [`Backend`], so it knows nothing of Raft or gRPC
//! services.

pub mod election;
pub mod mutex;

use std::future::Future;

use picket_proto::etcdserverpb::{RangeRequest, RangeResponse, TxnRequest, TxnResponse};
use thiserror::Error;
use tokio::sync::broadcast;

use crate::storage::state_machine::FeedItem;

/// What locks and elections need from the store.
pub trait Backend: Clone + Send + Sync + 'static {
    /// A replicated transaction.
    fn txn(&self, req: TxnRequest) -> impl Future<Output = Result<TxnResponse, StoreError>> + Send;
    /// A linearizable range read.
    fn range(
        &self,
        req: RangeRequest,
    ) -> impl Future<Output = Result<RangeResponse, StoreError>> + Send;
    /// The feed of applied revisions on this member. A [`FeedItem::SnapshotInstalled`] item means
    /// the state jumped without events: every waiter re-reads on it.
    fn subscribe(&self) -> broadcast::Receiver<FeedItem>;
    /// The backend for a clean-up write of `key` (a waiter that ends without the lock, or a
    /// candidate that ends without leadership, deleting its own key), judged again now. The
    /// request's own writes carry the auth revision they were checked at, and apply refuses them
    /// once auth has changed since; a waiter may have waited through such a change, and its
    /// clean-up must not be refused for it (the key would block everyone behind it until its
    /// lease expires). The default (no auth to judge) is this backend.
    fn for_cleanup(&self, key: &[u8]) -> impl Future<Output = Result<Self, StoreError>> + Send {
        let _ = key;
        let me = self.clone();
        async move { Ok(me) }
    }
}

/// A failure of the store behind a [`Backend`], passed on untouched: the layer that implements
/// the backend (the API layer) put its own error inside and its error table takes it out again,
/// so nothing here decides what a client sees.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// This member is stopping: its feed of applied revisions closed under a waiter.
    #[error("etcdserver: server stopped")]
    Stopped,
    /// What the backend failed with.
    #[error("{0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConcurrencyError {
    /// The store refused or failed a request.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The waiter's key disappeared while it waited: its lease expired or was revoked.
    #[error(
        "picket: lock key {key:?} was deleted while waiting (lease {lease:x} expired or revoked)"
    )]
    KeyLost { key: String, lease: i64 },
    /// etcd's `ErrElectionNotLeader`.
    #[error("election: not leader")]
    NotLeader,
    /// etcd's `ErrElectionNoLeader`.
    #[error("election: no leader")]
    NoLeader,
    /// The request was malformed.
    #[error("{0}")]
    InvalidArgument(String),
}

/// The range that finds the holder of lock `name`: the oldest key under `name/`. Used by the
/// lock recipe and by fenced writes inside apply.
pub fn holder_range(name: &[u8]) -> RangeRequest {
    mutex::first_by_create(
        &contender_prefix(name),
        picket_proto::etcdserverpb::range_request::SortOrder::Ascend,
        0,
    )
}

/// `<name>/`, the prefix under which contenders' keys live.
pub fn contender_prefix(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(b'/');
    p
}

/// `<name>/<lease hex>`, etcd's contender key.
pub fn contender_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut k = contender_prefix(name);
    k.extend_from_slice(format!("{lease:x}").as_bytes());
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_etcd() {
        use picket_proto::prefix_end;
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
        assert_eq!(contender_key(b"lk", 0x1f), b"lk/1f".to_vec());
    }
}
