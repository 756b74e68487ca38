//! Workloads: concurrent clients that issue operations and record them in the history.
//!
//! - [`register`]: get/put/cas/delete over many independent keys (checked for linearizability
//!   and etcd revision invariants).
//!
//! A worker is one logical client bound to one node. It records each invocation just before
//! sending and each completion just after the response; after an `info` completion it continues
//! under a fresh process id, because the old process may still have an operation in flight.

pub mod register;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use thiserror::Error;

use crate::history::{EventType, HistoryError, HistoryWriter};

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WorkloadError {
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("cannot build a client for {endpoint}: {message}")]
    Client { endpoint: String, message: String },
}

/// What every worker shares.
#[derive(Clone)]
pub struct WorkerEnv {
    pub history: Arc<HistoryWriter>,
    next_process: Arc<AtomicU64>,
    /// Workers stop issuing operations at this instant.
    pub deadline: Instant,
    /// Set to stop workers early (the run is being aborted).
    pub stop: Arc<AtomicBool>,
}

impl WorkerEnv {
    pub fn new(history: Arc<HistoryWriter>, deadline: Instant) -> Self {
        WorkerEnv {
            history,
            next_process: Arc::new(AtomicU64::new(0)),
            deadline,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A process id never used before in this run.
    pub fn next_process(&self) -> u64 {
        self.next_process.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether workers should stop issuing operations.
    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline
    }
}

/// Operation counts of one worker (or, summed, of a run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpCounts {
    pub invoked: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

impl OpCounts {
    pub fn count(&mut self, kind: EventType) {
        match kind {
            EventType::Invoke => self.invoked += 1,
            EventType::Ok => self.ok += 1,
            EventType::Fail => self.fail += 1,
            EventType::Info => self.info += 1,
        }
    }

    pub fn add(&mut self, o: OpCounts) {
        self.invoked += o.invoked;
        self.ok += o.ok;
        self.fail += o.fail;
        self.info += o.info;
    }
}
