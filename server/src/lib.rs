//! Picket server library: a Raft-replicated MVCC key-value store speaking the etcd v3 API.
//!
//! Layers, from the wire down:
//! - [`api`]: tonic services; validation; errors to statuses in one place.
//! - [`raft`]: openraft types, peer network and service, proposal forwarding, bootstrap.
//! - [`storage`]: RocksDB engine, the Raft log store, the state machine (decode and dispatch
//!   only) and snapshots.
//! - [`watch`]: event selection for watchers, fed from apply.
//! - [`metrics`]: Prometheus metrics and the HTTP health endpoints (`--listen-metrics-urls`).
//! - [`restore`]: offline restore of a snapshot file into a data dir for a new cluster.
//! - [`auth`]: users, roles, key-range permissions and tokens (etcd's Auth), replicated.
//! - [`mvcc`], [`lease`]: the replicated data model. They never import openraft and never read
//!   clocks, so apply is deterministic.

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
