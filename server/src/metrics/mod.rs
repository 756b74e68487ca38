//! Observability: Prometheus metrics and the HTTP health endpoints (`--listen-metrics-urls`).
//!
//! - [`Metrics`]: one registry per member, every family prefixed `picket_`. Names follow etcd's
//!   where an equivalent exists (`etcd_server_has_leader` is `picket_server_has_leader`), so
//!   dashboards and alert rules written for etcd carry over by changing the prefix.
//! - [`grpc`]: a tower layer on the client-facing gRPC server that counts and times every call
//!   per method (go-grpc-prometheus's `grpc_server_*` families, as etcd exports them).
//! - [`raft`]: follows openraft's metrics watch channel (term, leader, log indexes).
//! - `crate::api::http` serves `/metrics`, `/health`, `/readyz` and `/livez` (it reads through
//!   the API layer's `Ctx`, so it lives there).
//! - [`disk`]: WAL fsync and backend commit histograms the storage layer observes, and the
//!   watcher gauges (`picket_debugging_mvcc_watcher_total`, `_slow_watcher_total`).
//!
//! Gauges that describe the store (size, revision, leases) are read when scraped, not kept up to
//! date by apply: apply stays free of metrics code, and a scrape costs a few RocksDB property
//! reads. Proposal latency is observed by `api::Ctx::propose`, the one path client writes take.
//!
//! The registry is per member rather than global so in-process multi-member tests keep their
//! members' numbers apart; `picketd` runs one member per process, as etcd does.

pub mod disk;
pub mod grpc;
pub mod raft;

use std::collections::HashSet;
use std::time::Instant;

use parking_lot::RwLock;
use prometheus::{
    exponential_buckets, Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use thiserror::Error;

use crate::storage::state_machine::Shared;

/// Every family's name starts with `picket_` (etcd: `etcd_`).
const NAMESPACE: &str = "picket";

/// Distinct `(grpc_service, grpc_method)` label pairs kept before further ones are reported as
/// `unknown`. The path of a gRPC call is chosen by the client, so without a cap a client calling
/// made-up methods could grow the registry without bound. The etcd API has about 60 methods.
const MAX_GRPC_LABEL_PAIRS: usize = 256;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// A family could not be registered (a duplicate name: a bug in this module).
    #[error("metrics registry: {0}")]
    Registry(#[from] prometheus::Error),
    #[error("encoding metrics: {0}")]
    Encode(String),
}

/// The metric families of one member.
pub struct Metrics {
    registry: Registry,
    grpc_labels: RwLock<HashSet<(String, String)>>,

    pub(crate) grpc_started: IntCounterVec,
    pub(crate) grpc_handled: IntCounterVec,
    pub(crate) grpc_handling_seconds: HistogramVec,
    /// Open `Watch/Watch` streams (etcd: `etcd_debugging_mvcc_watch_stream_total`).
    pub(crate) watch_streams: IntGauge,

    pub(crate) has_leader: IntGauge,
    pub(crate) is_leader: IntGauge,
    pub(crate) leader_changes: IntCounter,
    pub(crate) raft_term: IntGauge,
    pub(crate) applied_index: IntGauge,
    pub(crate) last_log_index: IntGauge,
    pub(crate) snapshot_index: IntGauge,

    proposals_pending: IntGauge,
    oldest_in_flight: Gauge,
    proposals_failed: IntCounter,
    proposal_seconds: Histogram,

    lease_active: IntGauge,
    db_total_size: IntGauge,
    db_in_use_size: IntGauge,
    current_revision: IntGauge,
    compact_revision: IntGauge,
    compact_physical: IntGauge,

    quota_backend_bytes: IntGauge,
    max_request_bytes: IntGauge,
    max_txn_ops: IntGauge,
    runtime_workers: IntGauge,
    disk: disk::DiskMetrics,
    watchers: IntGauge,
    slow_watchers: IntGauge,
    watch_refused: IntCounterVec,
    watch_handbacks: IntCounterVec,
    read_index_rounds: IntCounterVec,
    relay_calls: IntCounterVec,
    forwarded_answers: IntCounterVec,
    local_answers: IntCounterVec,
}

fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    c: C,
) -> Result<C, MetricsError> {
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

impl Metrics {
    /// Creates the families for member `member_id` (exported as `picket_server_id`).
    pub fn new(member_id: u64) -> Result<Self, MetricsError> {
        let registry = Registry::new_custom(Some(NAMESPACE.to_string()), None)?;
        let r = &registry;
        let gauge = |name: &str, help: &str| register(r, IntGauge::new(name, help)?);
        let counter = |name: &str, help: &str| register(r, IntCounter::new(name, help)?);

        // Constant "info" gauges, as etcd exports its id and version.
        let id = register(
            r,
            IntGaugeVec::new(
                Opts::new("server_id", "Member id of this server (hex), always 1."),
                &["server_id"],
            )?,
        )?;
        id.with_label_values(&[&format!("{member_id:x}")]).set(1);
        let version = register(
            r,
            IntGaugeVec::new(
                Opts::new("server_version", "Version of this server, always 1."),
                &["server_version"],
            )?,
        )?;
        version.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);

        let grpc = ["grpc_service", "grpc_method"];
        let metrics = Metrics {
            grpc_labels: RwLock::new(HashSet::new()),
            grpc_started: register(
                r,
                IntCounterVec::new(
                    Opts::new("grpc_server_started_total", "gRPC calls started on the server."),
                    &grpc,
                )?,
            )?,
            grpc_handled: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "grpc_server_handled_total",
                        "gRPC calls completed on the server, by status code.",
                    ),
                    &["grpc_service", "grpc_method", "grpc_code"],
                )?,
            )?,
            // Prometheus's default buckets (5 ms to 10 s), as go-grpc-prometheus uses.
            grpc_handling_seconds: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "grpc_server_handling_seconds",
                        "Time from receiving a gRPC call to its status (the whole stream for \
                         streaming calls).",
                    ),
                    &grpc,
                )?,
            )?,
            watch_streams: gauge("mvcc_watch_stream_total", "Open watch streams.")?,
            has_leader: gauge(
                "server_has_leader",
                "1 if this member knows a leader (itself or another member), else 0.",
            )?,
            is_leader: gauge("server_is_leader", "1 if this member is the leader, else 0.")?,
            leader_changes: counter(
                "server_leader_changes_seen_total",
                "Number of times this member saw a new leader.",
            )?,
            raft_term: gauge("server_raft_term", "Current Raft term of this member.")?,
            applied_index: gauge(
                "server_proposals_applied_total",
                "Index of the last Raft entry applied to the state machine.",
            )?,
            last_log_index: gauge(
                "server_raft_last_log_index",
                "Index of the last entry in this member's Raft log (appended, maybe uncommitted).",
            )?,
            snapshot_index: gauge(
                "server_snapshot_index",
                "Last log index covered by this member's latest snapshot.",
            )?,
            proposals_pending: gauge(
                "server_proposals_pending",
                "Client proposals waiting to be committed and applied.",
            )?,
            oldest_in_flight: register(
                r,
                Gauge::new(
                    "server_proposal_oldest_in_flight_seconds",
                    "Age of the oldest group-commit entry on this member still waiting for its \
                     outcome (0 when none). Bounded by the request timeout; a value near it means \
                     writes on this member are stalling.",
                )?,
            )?,
            proposals_failed: counter(
                "server_proposals_failed_total",
                "Client proposals that failed (not leader, timeout, stopped).",
            )?,
            // 0.5 ms to 8 s: a proposal costs an fsync and a quorum round trip at best, and a
            // leader election (seconds) at worst.
            proposal_seconds: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "server_proposal_duration_seconds",
                        "Time from proposing a client write to its applied result.",
                    )
                    .buckets(exponential_buckets(0.0005, 2.0, 15)?),
                )?,
            )?,
            lease_active: gauge("lease_active", "Leases currently granted.")?,
            db_total_size: gauge(
                "mvcc_db_total_size_in_bytes",
                "Estimated size of the store on disk (SST files and memtables).",
            )?,
            db_in_use_size: gauge(
                "mvcc_db_total_size_in_use_in_bytes",
                "Estimated bytes of live data in the store.",
            )?,
            current_revision: gauge("mvcc_current_revision", "Current store revision.")?,
            compact_revision: gauge(
                "mvcc_compact_revision",
                "Revision up to which the store was compacted.",
            )?,
            compact_physical: gauge(
                "mvcc_compact_physical_revision",
                "Revision up to which compacted history has been removed from disk; below \
                 picket_mvcc_compact_revision while the leader's bounded compaction steps run.",
            )?,
            quota_backend_bytes: gauge(
                "server_quota_backend_bytes",
                "The backend quota in effect (--quota-backend-bytes; 0 means 2 GiB).",
            )?,
            max_request_bytes: gauge(
                "server_max_request_bytes",
                "The largest client request accepted (--max-request-bytes).",
            )?,
            max_txn_ops: gauge(
                "server_max_txn_ops",
                "The most operations in one transaction (--max-txn-ops).",
            )?,
            runtime_workers: gauge(
                "server_runtime_workers",
                "Runtime worker threads serving this member (--runtime-threads; 0 means one \
                 per core).",
            )?,
            disk: disk::DiskMetrics {
                wal_fsync: register(
                    r,
                    Histogram::with_opts(
                        HistogramOpts::new(
                            "disk_wal_fsync_duration_seconds",
                            "Latency of synced Raft log writes (WAL write and fsync).",
                        )
                        .buckets(exponential_buckets(
                            disk::DISK_BUCKETS.0,
                            disk::DISK_BUCKETS.1,
                            disk::DISK_BUCKETS.2,
                        )?),
                    )?,
                )?,
                backend_commit: register(
                    r,
                    Histogram::with_opts(
                        HistogramOpts::new(
                            "disk_backend_commit_duration_seconds",
                            "Latency of state-machine batch commits (one per apply call).",
                        )
                        .buckets(exponential_buckets(
                            disk::DISK_BUCKETS.0,
                            disk::DISK_BUCKETS.1,
                            disk::DISK_BUCKETS.2,
                        )?),
                    )?,
                )?,
            },
            watchers: gauge("debugging_mvcc_watcher_total", "Watchers open on this member.")?,
            slow_watchers: gauge(
                "debugging_mvcc_slow_watcher_total",
                "Watchers catching up from history (behind the live feed or started in the past).",
            )?,
            watch_refused: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "watch_refused_total",
                        "Watch streams and watch creates refused by a limit \
                         (--max-watch-streams, --max-watchers-per-stream).",
                    ),
                    &["limit"],
                )?,
            )?,
            watch_handbacks: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "watch_hub_handbacks_total",
                        "Watchers the member's live watch fan-out handed back to catch up from \
                         history: gap (the feed skipped revisions, a snapshot was installed, or \
                         the watcher joined behind them), full (its stream's buffer had no room, \
                         or a progress answer held it).",
                    ),
                    &["reason"],
                )?,
            )?,
            read_index_rounds: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "server_read_index_rounds_total",
                        "Read-index rounds started on this member (each serves every linearizable \
                         read, keep-alive and TimeToLive queued before it): via=\"local\" asks this \
                         member's own Raft core (the leader's quorum check), via=\"leader\" asks \
                         the leader.",
                    ),
                    &["via"],
                )?,
            )?,
            relay_calls: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "server_relay_calls_total",
                        "A follower's calls to the leader (forwarded write groups, read indexes, \
                         keep-alives): via=\"stream\" on its one relay stream, via=\"unary\" \
                         as one RPC each (a leader without the stream).",
                    ),
                    &["via"],
                )?,
            )?,
            forwarded_answers: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "server_forwarded_answers_total",
                        "Writes this member forwarded to the leader and answered: by=\"apply\" \
                         with the result its own apply handed over, by=\"leader\" with the \
                         leader's result once its own apply showed in the Raft metrics.",
                    ),
                    &["by"],
                )?,
            )?,
            local_answers: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "server_local_answers_total",
                        "Writes proposed on this member while it led and answered: \
                         by=\"apply\" with the result its own apply handed over, by=\"raft\" \
                         with openraft's answer to the entry.",
                    ),
                    &["by"],
                )?,
            )?,
            registry,
        };
        Ok(metrics)
    }

    /// The label pair for a gRPC call to `path` (`/etcdserverpb.KV/Range`), or
    /// `("unknown", "unknown")` for a malformed path or once [`MAX_GRPC_LABEL_PAIRS`] is reached.
    pub(crate) fn grpc_labels(&self, path: &str) -> (String, String) {
        let unknown = || ("unknown".to_string(), "unknown".to_string());
        let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
            return unknown();
        };
        let pair = (service.to_string(), method.to_string());
        if self.grpc_labels.read().contains(&pair) {
            return pair;
        }
        let mut seen = self.grpc_labels.write();
        if seen.len() >= MAX_GRPC_LABEL_PAIRS {
            return unknown();
        }
        seen.insert(pair.clone());
        pair
    }

    /// Starts timing a client proposal; see [`ProposalTimer`].
    pub fn start_proposal(&self) -> ProposalTimer<'_> {
        self.proposals_pending.inc();
        ProposalTimer { metrics: self, start: Instant::now() }
    }

    /// The histograms the storage layer observes (see [`disk`]).
    pub fn disk(&self) -> disk::DiskMetrics {
        self.disk.clone()
    }

    /// Records the request limits in effect (`picket_server_max_request_bytes`,
    /// `picket_server_max_txn_ops`), so operators see them beside the quota.
    pub fn set_request_limits(&self, max_request_bytes: usize, max_txn_ops: usize) {
        self.max_request_bytes.set(i64::try_from(max_request_bytes).unwrap_or(i64::MAX));
        self.max_txn_ops.set(i64::try_from(max_txn_ops).unwrap_or(i64::MAX));
    }

    /// Records how many runtime workers serve this member (`picket_server_runtime_workers`),
    /// so an operator can see what `--runtime-threads` (or its default) gave.
    pub fn set_runtime_workers(&self, workers: usize) {
        self.runtime_workers.set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    /// Records the quota in effect (`picket_server_quota_backend_bytes`).
    pub fn set_quota(&self, bytes: u64) {
        self.quota_backend_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Counts one open watcher while the guard lives.
    pub fn watcher(&self) -> disk::GaugeGuard {
        disk::GaugeGuard::new(&self.watchers)
    }

    /// Counts a watch stream (`limit = "streams"`) or a watch create
    /// (`"watchers_per_stream"`) refused by a limit.
    pub fn watch_refused(&self, limit: &str) {
        self.watch_refused.with_label_values(&[limit]).inc();
    }

    /// Counts a watcher the watch hub handed back to its task (`reason`: `gap` or `full`).
    pub fn watch_handback(&self, reason: &str) {
        self.watch_handbacks.with_label_values(&[reason]).inc();
    }

    /// Counts one watcher catching up from history while the guard lives.
    pub fn slow_watcher(&self) -> disk::GaugeGuard {
        disk::GaugeGuard::new(&self.slow_watchers)
    }

    /// Records the age of the oldest proposal entry in flight (`None`: none), at scrape time.
    pub fn observe_in_flight(&self, oldest: Option<std::time::Duration>) {
        self.oldest_in_flight.set(oldest.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// Brings the read-index round counters up to the proposer's counts (`local`, `leader`), at
    /// scrape time.
    pub fn observe_read_index_rounds(&self, local: u64, leader: u64) {
        for (via, now) in [("local", local), ("leader", leader)] {
            let c = self.read_index_rounds.with_label_values(&[via]);
            c.inc_by(now.saturating_sub(c.get()));
        }
    }

    /// Brings the relay call counters up to the proposer's counts, at scrape time.
    pub fn observe_relay_calls(&self, stream: u64, unary: u64) {
        for (via, now) in [("stream", stream), ("unary", unary)] {
            let c = self.relay_calls.with_label_values(&[via]);
            c.inc_by(now.saturating_sub(c.get()));
        }
    }

    /// Brings the forwarded-answer counters up to the proposer's counts, at scrape time.
    pub fn observe_forwarded_answers(&self, by_apply: u64, by_leader: u64) {
        for (by, now) in [("apply", by_apply), ("leader", by_leader)] {
            let c = self.forwarded_answers.with_label_values(&[by]);
            c.inc_by(now.saturating_sub(c.get()));
        }
    }

    /// Brings the local-answer counters up to the proposer's counts, at scrape time.
    pub fn observe_local_answers(&self, by_apply: u64, by_raft: u64) {
        for (by, now) in [("apply", by_apply), ("raft", by_raft)] {
            let c = self.local_answers.with_label_values(&[by]);
            c.inc_by(now.saturating_sub(c.get()));
        }
    }

    /// Refreshes the gauges that are read from the store at scrape time.
    pub fn observe_store(&self, sm: &Shared) {
        let (total, in_use) = crate::quota::db_sizes(sm.engine());
        self.db_total_size.set(total);
        self.db_in_use_size.set(in_use);
        self.lease_active.set(i64::try_from(sm.with_leases(|l| l.len())).unwrap_or(i64::MAX));
        let (rev, compact, physical) =
            sm.with_store(|s| (s.revision(), s.compact_revision(), s.compact_physical()));
        self.current_revision.set(rev);
        self.compact_revision.set(compact);
        self.compact_physical.set(physical);
    }

    /// Every family in Prometheus's text exposition format.
    pub fn render(&self) -> Result<String, MetricsError> {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .map_err(|e| MetricsError::Encode(e.to_string()))?;
        String::from_utf8(buf).map_err(|e| MetricsError::Encode(e.to_string()))
    }
}

/// Measures one client proposal: counted as pending until [`ProposalTimer::finish`], which
/// records its latency or its failure. A timer dropped unfinished (the caller gave up, e.g. the
/// client disconnected) only stops counting as pending: the proposal may still commit, so it is
/// neither a success nor a failure.
pub struct ProposalTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
}

impl ProposalTimer<'_> {
    pub fn finish(self, ok: bool) {
        if ok {
            self.metrics.proposal_seconds.observe(self.start.elapsed().as_secs_f64());
        } else {
            self.metrics.proposals_failed.inc();
        }
    }
}

impl Drop for ProposalTimer<'_> {
    fn drop(&mut self) {
        self.metrics.proposals_pending.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_prefixed_and_labels_capped() {
        let m = Metrics::new(0xabc).expect("registry");
        assert_eq!(
            m.grpc_labels("/etcdserverpb.KV/Range"),
            ("etcdserverpb.KV".into(), "Range".into())
        );
        assert_eq!(m.grpc_labels("nonsense"), ("unknown".into(), "unknown".into()));
        for i in 0..2 * MAX_GRPC_LABEL_PAIRS {
            m.grpc_labels(&format!("/s/m{i}"));
        }
        assert_eq!(m.grpc_labels("/s/new"), ("unknown".into(), "unknown".into()));
        // Already-seen pairs keep their labels after the cap.
        assert_eq!(m.grpc_labels("/etcdserverpb.KV/Range").1, "Range");
        m.start_proposal().finish(true);
        m.start_proposal().finish(false);
        let text = m.render().expect("render");
        assert!(text.contains("picket_server_id{server_id=\"abc\"} 1"), "{text}");
        assert!(text.contains("picket_server_proposals_failed_total 1"), "{text}");
        assert!(text.contains("picket_server_proposals_pending 0"), "{text}");
        assert!(text.contains("picket_server_proposal_duration_seconds_count 1"), "{text}");
    }

    #[test]
    fn disk_histograms_quota_and_watcher_guards() {
        let m = Metrics::new(1).expect("registry");
        m.set_quota(1 << 20);
        m.set_request_limits(1536 * 1024, 128);
        let disk = m.disk();
        assert_eq!(disk.time_wal_fsync(|| 7), 7);
        disk.time_backend_commit(|| ());
        let w = m.watcher();
        let slow = m.slow_watcher();
        m.observe_read_index_rounds(3, 0);
        m.observe_read_index_rounds(5, 2);
        m.observe_relay_calls(4, 1);
        m.observe_forwarded_answers(6, 2);
        m.observe_local_answers(9, 1);
        let text = m.render().expect("render");
        assert!(text.contains("picket_server_quota_backend_bytes 1048576"), "{text}");
        assert!(text.contains("picket_server_max_request_bytes 1572864"), "{text}");
        assert!(text.contains("picket_server_max_txn_ops 128"), "{text}");
        assert!(text.contains("picket_disk_wal_fsync_duration_seconds_count 1"), "{text}");
        assert!(text.contains("picket_disk_backend_commit_duration_seconds_count 1"), "{text}");
        assert!(text.contains("picket_debugging_mvcc_watcher_total 1"), "{text}");
        assert!(text.contains("picket_debugging_mvcc_slow_watcher_total 1"), "{text}");
        assert!(text.contains("picket_server_read_index_rounds_total{via=\"local\"} 5"), "{text}");
        assert!(text.contains("picket_server_read_index_rounds_total{via=\"leader\"} 2"), "{text}");
        assert!(text.contains("picket_server_relay_calls_total{via=\"stream\"} 4"), "{text}");
        assert!(text.contains("picket_server_relay_calls_total{via=\"unary\"} 1"), "{text}");
        assert!(text.contains("picket_server_forwarded_answers_total{by=\"apply\"} 6"), "{text}");
        assert!(text.contains("picket_server_forwarded_answers_total{by=\"leader\"} 2"), "{text}");
        assert!(text.contains("picket_server_local_answers_total{by=\"apply\"} 9"), "{text}");
        assert!(text.contains("picket_server_local_answers_total{by=\"raft\"} 1"), "{text}");
        drop((w, slow));
        let text = m.render().expect("render");
        assert!(text.contains("picket_debugging_mvcc_watcher_total 0"), "{text}");
        assert!(text.contains("picket_debugging_mvcc_slow_watcher_total 0"), "{text}");
    }
}
