//! The Raft log's fsync, off openraft's core task (issue 20, docs/openraft-0.10-migration.md).
//!
//! openraft 0.10 lets `append` return once the entries are written and readable, and takes the
//! flush as a later callback (`IOFlushed`): the leader replicates while its own fsync runs, and
//! counts itself towards the commit quorum only when the callback fires. `LogStore::append`
//! writes the entries without syncing and queues the callback here; one thread takes everything
//! queued, syncs the WAL once for all of it (`DB::flush_wal(true)`: group commit), records the
//! acknowledgement (`wal_tail`) and completes the callbacks in queue order.
//!
//! Why one sync covers a group: RocksDB has one WAL for every column family, written in order;
//! every batch taken was written before it was taken, and syncing the WAL makes everything
//! written to it before the sync durable. A recovered WAL is a prefix of what was written
//! (`wal_tail`), so anything written after a queued append (the committed index, state-machine
//! batches) can never survive a crash that loses the append.
//!
//! A failed sync completes every queued callback with the error and poisons the flusher: every
//! later append fails at once, and openraft stops the member (a storage failure is fatal, as a
//! failed synced write always was).
//!
//! Waking the thread is a system call that, on a virtual machine whose other CPU sleeps, costs
//! the waker some 20 us (hop trace, docs/benchmarks.md "Session 50"). So nobody is woken who is
//! not waiting: an append wakes the thread only if it waits for work, a finished group wakes
//! `drain` only if one waits. And the leader's own entries wake it only after the runtime has run
//! what is ready now ([`LogFlusher::push_after_sends`]): the leader's own sync is not what its
//! commit waits for (the followers' are slower), but the AppendEntries the same tick sends are.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use openraft::storage::IOFlushed;
use rocksdb::DB;

use super::wal_tail::AckedRecord;
use crate::metrics::disk::DiskMetrics;
use crate::raft::types::TypeConfig;

/// How long `drain` waits for the flusher to finish what is queued. One WAL sync takes
/// milliseconds on a working disk; a disk that does not finish one in this time is failing, and
/// the truncation or purge waiting on it fails (openraft then stops the member) rather than
/// wait forever.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long dropping the last handle waits for the thread to exit (it finishes the sync in
/// progress, if any, and completes its callbacks). Past this the thread is left to end on its
/// own; it holds the database open until then.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    /// Appends written but not yet synced: each one's last index (none for an empty append)
    /// and its callback, in append order.
    queue: Vec<(Option<u64>, IOFlushed<TypeConfig>)>,
    /// The thread has taken a group and not yet completed its callbacks.
    flushing: bool,
    /// The thread waits for work: a push must wake it (otherwise it looks at the queue anyway
    /// before it waits again).
    waiting: bool,
    /// A deferred wake is scheduled on the runtime (`push_after_sends`).
    kick_scheduled: bool,
    /// Callers of `drain` waiting for the queue to empty.
    drainers: usize,
    /// Set by the last handle's drop: finish what is queued, then exit.
    stop: bool,
    /// The first failed sync: every later append fails with it.
    poisoned: Option<String>,
}

struct Inner {
    db: Arc<DB>,
    state: Mutex<State>,
    /// Wakes the thread: something was queued, or stop was set.
    work: Condvar,
    /// Wakes `drain`: the queue emptied and no group is in flight.
    idle: Condvar,
    acked: OnceLock<AckedRecord>,
    disk: OnceLock<DiskMetrics>,
}

/// The flusher: a handle shared by every clone of one `LogStore`.
pub struct LogFlusher {
    inner: Arc<Inner>,
    exited: Mutex<std::sync::mpsc::Receiver<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LogFlusher {
    /// Starts the flusher thread for `db`.
    pub fn start(db: Arc<DB>) -> std::io::Result<Self> {
        Self::start_with(db, || {})
    }

    /// [`LogFlusher::start`], running `on_thread` first on the new thread (tests give the
    /// thread state of its own there).
    pub(crate) fn start_with(
        db: Arc<DB>,
        on_thread: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            db,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
            acked: OnceLock::new(),
            disk: OnceLock::new(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_inner = inner.clone();
        let thread =
            std::thread::Builder::new().name("raft-log-flush".into()).spawn(move || {
                on_thread();
                run(&thread_inner);
                // Its handle of the database goes before the thread says it is done, so the
                // database is closed (if this was its last handle) before the drop returns.
                drop(thread_inner);
                let _ = tx.send(());
            })?;
        Ok(Self { inner, exited: Mutex::new(rx), thread: Some(thread) })
    }

    /// Records every synced append in `record` from now on (`wal_tail`; the first call wins).
    pub fn set_acked_record(&self, record: AckedRecord) {
        let _ = self.inner.acked.set(record);
    }

    /// Times every WAL sync in `disk` from now on (the first call wins).
    pub fn set_metrics(&self, disk: DiskMetrics) {
        let _ = self.inner.disk.set(disk);
    }

    /// Queues the callback of an append whose entries (up to `last_index`) were just written
    /// without a sync; it fires after the next sync. Fails, without queueing, once a sync
    /// failed.
    pub fn push(
        &self,
        last_index: Option<u64>,
        callback: IOFlushed<TypeConfig>,
    ) -> std::io::Result<()> {
        let state = self.enqueue(last_index, callback)?;
        let wake = state.waiting;
        drop(state);
        if wake {
            self.inner.work.notify_one();
        }
        Ok(())
    }

    /// [`LogFlusher::push`] for entries this member appended as the leader: the thread is woken
    /// only once the runtime has run the tasks that are ready now, which include the replication
    /// sessions sending these entries to the followers. The wake costs the waking thread some
    /// 20 us (module docs); paid before the sends, it delayed the AppendEntries by that much.
    ///
    /// Bounded: the wake is a task that yields once, and a yielded task runs at the runtime's
    /// next poll of its I/O driver, which comes when it has nothing else ready or after a fixed
    /// number of task polls (tokio's `event_interval`). Outside a runtime the thread is woken at
    /// once.
    pub fn push_after_sends(
        &self,
        last_index: Option<u64>,
        callback: IOFlushed<TypeConfig>,
    ) -> std::io::Result<()> {
        let mut state = self.enqueue(last_index, callback)?;
        // A thread that is syncing takes this append when it looks at the queue next; one wake
        // already scheduled covers this append too.
        let schedule = state.waiting && !state.kick_scheduled;
        state.kick_scheduled |= schedule;
        drop(state);
        if schedule {
            // The wake is the guard's drop, so it also happens if the task is dropped unpolled
            // (a runtime shutting down): `kick_scheduled` never stays set with no wake coming.
            let kick = Kick(self.inner.clone());
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        tokio::task::yield_now().await;
                        drop(kick);
                    });
                }
                Err(_) => drop(kick),
            }
        }
        Ok(())
    }

    /// Queues an append's callback and returns the state, still locked, to decide on the wake;
    /// fails, completing the callback with the error, once a sync failed.
    fn enqueue(
        &self,
        last_index: Option<u64>,
        callback: IOFlushed<TypeConfig>,
    ) -> std::io::Result<std::sync::MutexGuard<'_, State>> {
        let mut state = lock(&self.inner.state);
        if let Some(e) = &state.poisoned {
            let e = std::io::Error::other(format!("raft log sync failed earlier: {e}"));
            drop(state);
            callback.io_completed(Err(std::io::Error::other(e.to_string())));
            return Err(e);
        }
        state.queue.push((last_index, callback));
        Ok(state)
    }

    /// Waits until every queued callback has completed, bounded by [`DRAIN_TIMEOUT`]. Called
    /// before a truncation, so a late acknowledgement cannot raise the `wal_tail` record above
    /// the truncated log.
    pub fn drain(&self) -> std::io::Result<()> {
        let mut state = lock(&self.inner.state);
        // A deferred wake may not have run yet (and cannot, if the runtime is blocked on this
        // call): the thread must see the queue now.
        if state.waiting && !state.queue.is_empty() {
            self.inner.work.notify_one();
        }
        state.drainers += 1;
        let (mut state, waited) = self
            .inner
            .idle
            .wait_timeout_while(state, DRAIN_TIMEOUT, |s| !s.queue.is_empty() || s.flushing)
            .unwrap_or_else(|p| p.into_inner());
        state.drainers -= 1;
        if waited.timed_out() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "raft log sync did not finish within 30 s",
            ));
        }
        match &state.poisoned {
            Some(e) => Err(std::io::Error::other(format!("raft log sync failed: {e}"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
impl LogFlusher {
    /// Marks the flusher as if a sync had failed with `e`.
    pub(crate) fn poison_for_test(&self, e: &str) {
        lock(&self.inner.state).poisoned = Some(e.to_string());
    }

    /// Waits (bounded) until the thread waits for work.
    pub(crate) fn wait_until_idle_for_test(&self) {
        for _ in 0..1000 {
            if lock(&self.inner.state).waiting {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the flusher thread never waited for work");
    }
}

impl Drop for LogFlusher {
    fn drop(&mut self) {
        lock(&self.inner.state).stop = true;
        self.inner.work.notify_one();
        // Bounded: see STOP_TIMEOUT. Until the thread exits it holds the database open, so a
        // restart in the same process waits for it here rather than find the database locked.
        let exited = self.exited.get_mut().unwrap_or_else(|p| p.into_inner());
        match exited.recv_timeout(STOP_TIMEOUT) {
            // The thread is past its last sync and has let go of the database (or it
            // panicked): join it, which waits only for its return and its thread-local
            // destructors, so it is bounded too. Without the join the thread could still be
            // running when main returned, and when its handle was the database's last, the
            // database closed on it while the exiting process destroyed RocksDB's C++ statics
            // (the default Env and its thread pools, whose mutexes closing locks): picketd
            // aborted on SIGTERM after a load ("pthread lock: Invalid argument"), about one
            // member in twenty.
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if let Some(thread) = self.thread.take() {
                    let _ = thread.join();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!("the raft log flusher did not stop within 5 s; left to end alone");
            }
        }
    }
}

/// The deferred wake of `push_after_sends`, done when dropped.
struct Kick(Arc<Inner>);

impl Drop for Kick {
    fn drop(&mut self) {
        self.0.kick();
    }
}

impl Inner {
    /// The deferred wake of `push_after_sends`.
    fn kick(&self) {
        let mut state = lock(&self.state);
        state.kick_scheduled = false;
        let wake = state.waiting && !state.queue.is_empty();
        drop(state);
        if wake {
            self.work.notify_one();
        }
    }
}

/// A poisoned lock only means a panic elsewhere while it was held; the state stays usable.
fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(inner: &Inner) {
    loop {
        let group = {
            let mut state = lock(&inner.state);
            while state.queue.is_empty() && !state.stop {
                state.waiting = true;
                state = inner.work.wait(state).unwrap_or_else(|p| p.into_inner());
                state.waiting = false;
            }
            if state.queue.is_empty() {
                return; // stop, and nothing left to sync
            }
            state.flushing = true;
            std::mem::take(&mut state.queue)
        };
        // Durability: every append in `group` was written to the WAL before it was queued, and
        // this syncs the WAL up to at least its end, so each entry is on stable storage before
        // its callback tells openraft it is (module docs).
        let synced = match inner.disk.get() {
            Some(d) => d.time_wal_fsync(|| inner.db.flush_wal(true)),
            None => inner.db.flush_wal(true),
        };
        let failure = synced.err().map(|e| e.to_string());
        let last = group.iter().filter_map(|(i, _)| *i).max();
        // The callbacks first: they are what a commit waits for. The record may lag what was
        // acknowledged (`wal_tail`, point 3), so updating it after them is as safe as before.
        for (_, callback) in group {
            match &failure {
                None => callback.io_completed(Ok(())),
                Some(e) => callback.io_completed(Err(std::io::Error::other(e.clone()))),
            }
        }
        if failure.is_none() {
            if let (Some(acked), Some(last)) = (inner.acked.get(), last) {
                acked.acked_log(last);
            }
        }
        let mut state = lock(&inner.state);
        state.flushing = false;
        if let Some(e) = failure {
            tracing::error!(error = %e, "raft log sync failed; the member stops");
            state.poisoned.get_or_insert(e);
        }
        let drainers = state.drainers > 0;
        drop(state);
        if drainers {
            inner.idle.notify_all();
        }
    }
}

#[cfg(test)]
#[path = "log_flusher_tests.rs"]
mod tests;
