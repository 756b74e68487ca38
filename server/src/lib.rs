//! Picket server library: a Raft-replicated MVCC key-value store speaking the etcd v3 API.
//! `docs/architecture.md` draws the layers and follows each RPC through the files.
//!
//! Layers, from the wire down:
//! - [`node`]: starts a member: storage, Raft, the services and the background tasks.
//! - [`config`], [`config_file`]: flags (etcd's names) and etcd's YAML config file.
//! - [`api`]: tonic services and etcd's HTTP/JSON gateway beside them (`api::gateway`, the same
//!   services behind JSON); validation; `api::status`, the one table from typed errors to
//!   statuses.
//! - [`net`], [`tls`]: the client listener's transport (the `:authority` repair) and TLS.
//! - [`raft`]: openraft types, proposals and group commit, forwarding, peer network and service,
//!   membership, bootstrap.
//! - [`storage`]: RocksDB engine, the Raft log store, the state machine (openraft glue only),
//!   the state it shares with the API layer, and snapshots.
//! - [`apply`]: the apply rules, in etcd's order (quota, auth revision, fence and term checks,
//!   then dispatch).
//! - [`mvcc`], [`lease`], [`auth`], [`quota`]: the replicated data model, users and roles, the
//!   storage quota. They never import openraft and never read clocks, so apply is deterministic.
//! - [`watch`]: event selection for watchers, fed from apply.
//! - [`concurrency`], [`queue`], [`subscription`]: locks and elections, work queues and consumer
//!   groups, recipes on KV + lease + watch.
//! - [`metrics`]: Prometheus metrics and the HTTP health endpoints (`--listen-metrics-urls`).
//! - [`restore`]: offline restore of a snapshot file (Picket's or etcd's) into a data dir for a
//!   new cluster, and `snapshot status`.

pub mod api;
pub mod apply;
pub mod auth;
pub mod concurrency;
pub mod config;
pub mod config_file;
pub mod lease;
pub mod metrics;
pub mod mvcc;
pub mod net;
pub mod node;
pub mod queue;
pub mod quota;
pub mod raft;
pub mod restore;
pub mod storage;
pub mod subscription;
pub mod tls;
pub mod watch;

#[cfg(test)]
mod test_rng;
