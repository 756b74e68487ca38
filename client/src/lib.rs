//! The Picket client: key-value, watches, leases, sessions, and locks that come with their
//! fencing token.
//!
//! Everything in the etcd v3 API subset (KV, watch, lease, lock, election, cluster,
//! maintenance) works against etcd 3.4+ as well; [`Client::fenced_txn`] and
//! [`Client::check_token`] need Picket.
//!
//! # The lock pattern, fenced
//!
//! A lock alone cannot protect a resource: a holder can be paused (GC, swap, SIGSTOP) past its
//! lease, lose the lock to someone else, wake up, and write. The fencing token closes that
//! hole: every grant carries a larger token, and the resource refuses writes whose token is not
//! the current holder's. With Picket as the resource, [`Client::fenced_put`] checks the token
//! in the same transaction as the write:
//!
//! ```no_run
//! # async fn demo() -> Result<(), picket_client::Error> {
//! use picket_client::Client;
//!
//! let client = Client::connect(["127.0.0.1:2379", "127.0.0.1:22379", "127.0.0.1:32379"]).await?;
//! let guard = client.lock("orders/42").await?;
//! // ... decide what to write ...
//! match client.fenced_put(&guard.fence(), "orders/42/status", "shipped").await {
//!     Ok(_) => println!("written under token {}", guard.token()),
//!     Err(picket_client::Error::Fenced(why)) => println!("lost the lock meanwhile: {why}"),
//!     Err(e) => return Err(e),
//! }
//! guard.unlock().await?;
//! # Ok(()) }
//! ```
//!
//! For resources outside Picket, keep a [`FenceGate`] next to the resource. To stop work the
//! moment the lock goes, select on [`LockGuard::lost`], or use [`Client::with_lock`].
//!
//! # Failures
//!
//! The client fails over between endpoints, preferring the leader. Reads, keep-alives and other
//! idempotent requests are retried on another endpoint until the request timeout; a write that
//! may have reached a server is never sent twice, and fails with [`Error::OutcomeUnknown`]
//! instead. Watches resume on another endpoint from the next revision owed, without gap or
//! duplicate. A [`Session`] declares itself lost before the server can expire its lease.

#![warn(missing_docs)]

mod auth;
mod client;
mod election;
mod error;
mod fence;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod options;
mod pool;
pub mod queue;
pub use queue::{ClaimOptions, ClaimedJob, EnqueueOptions, Queue};
mod session;
mod subscription;
mod txn;
mod watch;

pub use auth::Credentials;
pub use client::Client;
pub use election::Leadership;
pub use error::Error;
pub use fence::{FenceGate, StaleToken};
pub use kv::{prefix_end, DeleteOptions, GetOptions, KeyRange, PutOptions, SortBy};
pub use lock::{Fence, LockGuard, LockOptions, DEFAULT_LOCK_TTL};
pub use maintenance::SnapshotChunk;
pub use options::{ConnectOptions, TlsOptions};
pub use session::{LostReason, Session, SessionOptions};
pub use subscription::{GroupInfo, GroupOptions, Subscription};
pub use txn::{Compare, CompareOp, Txn, TxnOp};
pub use watch::{WatchBatch, WatchOptions, WatchStream};

/// The etcd wire types responses are made of (`KeyValue`, `Event`, `ResponseHeader`, ...).
pub mod proto {
    /// A role's key-range permission (`role_get`).
    pub use picket_proto::authpb::Permission;
    pub use picket_proto::etcdserverpb::{
        AlarmMember, CompactionResponse, DeleteRangeResponse, HashKvResponse, LeaseGrantResponse,
        LeaseRevokeResponse, LeaseTimeToLiveResponse, Member, MemberAddResponse, PutResponse,
        RangeResponse, ResponseHeader, ResponseOp, StatusResponse, TxnResponse,
    };
    pub use picket_proto::mvccpb::{event::EventType, Event, KeyValue};
}
