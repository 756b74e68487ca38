//! Disk and watcher metrics fed from outside the metrics module: the Raft log store times its
//! synced writes, the state machine times its batch commits, watchers count themselves.
//!
//! [`DiskMetrics`] is a cheap clone of two histograms handed to the storage layer at start (the
//! log store and state machine exist before the registry is wired to anything else); storage
//! code that has none (offline tools, tests) simply records nothing.

use std::time::Instant;

use prometheus::{Histogram, IntGauge};

/// etcd's buckets for `etcd_disk_wal_fsync_duration_seconds` and
/// `etcd_disk_backend_commit_duration_seconds`: 1 ms doubling to about 8 s.
pub(crate) const DISK_BUCKETS: (f64, f64, usize) = (0.001, 2.0, 14);

/// Histograms the storage layer observes; see the module docs.
#[derive(Clone)]
pub struct DiskMetrics {
    /// `picket_disk_wal_fsync_duration_seconds`: one synced RocksDB write of the Raft log
    /// (append, vote, truncate, purge), i.e. the WAL write and its fsync.
    pub(crate) wal_fsync: Histogram,
    /// `picket_disk_backend_commit_duration_seconds`: one state-machine batch commit.
    pub(crate) backend_commit: Histogram,
}

impl DiskMetrics {
    /// Times `f` as one WAL fsync.
    pub fn time_wal_fsync<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.wal_fsync.observe(start.elapsed().as_secs_f64());
        out
    }

    /// Times `f` as one backend commit.
    pub fn time_backend_commit<T>(&self, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        self.backend_commit.observe(start.elapsed().as_secs_f64());
        out
    }
}

/// Counts one value of a gauge for as long as it lives (a watcher, a slow watcher). Dropping
/// it, including when the owning task is aborted, takes the count back.
pub struct GaugeGuard(IntGauge);

impl GaugeGuard {
    pub(crate) fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
