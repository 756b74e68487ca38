//! Read-index batching: many concurrent linearizable reads (and lease keep-alives) share one
//! leadership confirmation instead of paying a quorum round each (etcd's `linearizableReadLoop`).
//!
//! A [`ReadIndexBatcher`] runs at most one *round* at a time. A round asks its
//! [`ReadIndexSource`] for a read index (on the leader: openraft's `get_read_log_id`, which sends
//! one heartbeat to every voter and returns once a quorum answers, or for keep-alives accepts a
//! recent enough quorum acknowledgement, `proposer::keep_alive_lease_age`; on a follower: one
//! ReadIndex RPC to the leader, which itself lands in the leader's batcher), then waits until
//! the local state machine has applied that index, then answers every caller the round serves.
//!
//! # The invariant that keeps reads linearizable
//!
//! **A round serves only callers that arrived before the round started.** Callers queue in
//! `waiting`; a round starts by taking the whole queue, and only then asks the source. A caller
//! that arrives while a round is in flight waits for the *next* round, even though the current
//! one will answer sooner.
//!
//! Why it matters: a read must observe every write that completed before the read arrived. The
//! read index a round obtains is the leader's commit index at a moment after the round started,
//! confirmed by a quorum that still accepts this leader after that moment. Every write that
//! completed before a queued caller arrived was committed before the round started, so its index
//! is at most the read index, and the caller's read (served after `applied >= read index`) sees
//! it. A round that had already started before the caller arrived may have read the commit
//! index before that caller's preceding write committed; letting it serve the caller could
//! return a stale value. The same argument gives keep-alives "this member was still leader at a
//! moment after the keep-alive arrived", which is what `api::lease` needs before it renews.
//!
//! Rounds run in a spawned task, not in any caller: a caller that gives up (its request deadline
//! passed, its client went away) must not cancel the round the other callers are waiting on.

use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::proposer::ProposeError;

/// Where a batcher's rounds get their read index from, and how they wait for apply.
pub trait ReadIndexSource: Send + Sync + 'static {
    /// Obtains a read index with a confirmation that starts when this is called: every index
    /// committed before the call is at most the returned index.
    fn confirm(&self) -> BoxFuture<'static, Result<u64, ProposeError>>;

    /// Whether the local state machine has applied `index` already (the common case, checked
    /// without waiting).
    fn applied(&self, index: u64) -> bool;

    /// Resolves once the local state machine has applied `index` (bounded by the source).
    fn wait_applied(&self, index: u64) -> BoxFuture<'static, Result<(), ProposeError>>;
}

type Reply = oneshot::Sender<Result<u64, ProposeError>>;

#[derive(Default)]
struct State {
    /// Callers that arrived after the in-flight round (if any) took its batch; the next round
    /// serves exactly these.
    waiting: Vec<Reply>,
    /// Whether a driver task is running rounds. Only the caller that flips it to true spawns
    /// one, so there is never more than one round in flight per batcher.
    running: bool,
    /// Rounds started so far, for tests and metrics.
    rounds: u64,
}

struct Shared<S> {
    source: S,
    state: Mutex<State>,
}

/// Batches read-index requests; cheap to clone (one shared state).
pub struct ReadIndexBatcher<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for ReadIndexBatcher<S> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<S: ReadIndexSource> ReadIndexBatcher<S> {
    pub fn new(source: S) -> Self {
        Self { shared: Arc::new(Shared { source, state: Mutex::new(State::default()) }) }
    }

    /// Joins the next round that starts after this call, and returns its read index once the
    /// local state machine has applied it. Reads served from the local state machine afterwards
    /// are linearizable (see the module docs).
    pub async fn read_index(&self) -> Result<u64, ProposeError> {
        let (tx, rx) = oneshot::channel();
        let start_driver = {
            let mut s = self.shared.state.lock();
            s.waiting.push(tx);
            !std::mem::replace(&mut s.running, true)
        };
        if start_driver {
            tokio::spawn(drive(self.shared.clone()));
        }
        // The driver answers every caller it takes; the sender is only dropped unanswered if
        // the runtime is shutting down and aborted the driver.
        rx.await.unwrap_or(Err(ProposeError::Stopped))
    }

    /// Rounds started so far.
    pub fn rounds(&self) -> u64 {
        self.shared.state.lock().rounds
    }
}

/// Runs rounds back to back while callers are waiting, then stops; the next caller starts a new
/// driver.
async fn drive<S: ReadIndexSource>(shared: Arc<Shared<S>>) {
    loop {
        let batch = {
            let mut s = shared.state.lock();
            if s.waiting.is_empty() {
                s.running = false;
                return;
            }
            s.rounds += 1;
            std::mem::take(&mut s.waiting)
        };
        // The round starts here, after every caller in `batch` arrived (they were queued
        // before we took them): the invariant in the module docs.
        let result = shared.source.confirm().await;
        match result {
            Ok(index) if !shared.source.applied(index) => {
                // Wait for apply off the driver, so the next round's confirmation overlaps
                // with this round's apply instead of queueing behind it.
                let wait = shared.source.wait_applied(index);
                tokio::spawn(async move {
                    let r = wait.await.map(|()| index);
                    answer(batch, r);
                });
            }
            r => answer(batch, r),
        }
    }
}

fn answer(batch: Vec<Reply>, result: Result<u64, ProposeError>) {
    for tx in batch {
        // A caller that gave up dropped its receiver; nothing to do for it.
        let _ = tx.send(result.clone());
    }
}

#[cfg(test)]
#[path = "read_index_tests.rs"]
mod tests;
