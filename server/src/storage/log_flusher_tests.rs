//! Unit tests of the log flusher through `LogStore`: appends are readable at once and
//! acknowledged after a sync, in order; a truncation waits for pending acknowledgements so the
//! `wal_tail` record never claims more than the log holds; a failed sync refuses later appends.

use openraft::alias::OneshotOf;
use openraft::async_runtime::Oneshot;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader};

use super::*;
use crate::raft::types::{log_id, Entry, TypeConfig};
use crate::storage::log_store::LogStore;
use crate::storage::rocks::RocksEngine;
use crate::storage::wal_tail::AckedRecord;

type Done = tokio::sync::oneshot::Receiver<Result<(), std::io::Error>>;

fn callback() -> (IOFlushed<TypeConfig>, Done) {
    let (tx, rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
    (IOFlushed::signal(tx), rx)
}

fn blank(index: u64) -> Entry {
    Entry { log_id: log_id(1, 1, index), payload: EntryPayload::Blank }
}

struct Log {
    _dir: tempfile::TempDir,
    store: LogStore,
    acked: AckedRecord,
}

fn open() -> Log {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
    let acked = AckedRecord::open(dir.path().join("raft-acked")).expect("acked record");
    let store =
        LogStore::new(engine.db().clone()).expect("log store").with_acked_record(acked.clone());
    Log { _dir: dir, store, acked }
}

/// A log on member 1, which wrote `blank`'s entries as the leader.
fn open_member_1() -> Log {
    let log = open();
    Log { store: log.store.with_own_id(1), ..log }
}

/// Blocks the runtime's thread (no task runs meanwhile) until `rx` is answered, at most 10 s.
fn block_until_answered(rx: &mut Done) -> bool {
    for _ in 0..1000 {
        if rx.try_recv().is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[tokio::test]
async fn appends_are_readable_at_once_and_acknowledged_in_order() {
    let mut log = open();
    let mut waits = Vec::new();
    for i in 1..=20 {
        let (cb, rx) = callback();
        log.store.append([blank(i)], cb).await.expect("append");
        // openraft 0.10 replicates right after `append` returns: the entry must be readable.
        let got = log.store.try_get_log_entries(i..=i).await.expect("read");
        assert_eq!(got.len(), 1, "entry {i} readable before its sync");
        waits.push(rx);
    }
    for (i, rx) in waits.into_iter().enumerate() {
        let done = tokio::time::timeout(Duration::from_secs(10), rx).await;
        assert!(matches!(done, Ok(Ok(Ok(())))), "append {} acknowledged", i + 1);
    }
    log.store.flusher().drain().expect("drain");
    assert_eq!(log.acked.current().log_index, 20, "the record covers every synced append");
}

#[tokio::test]
async fn a_truncation_waits_for_pending_acknowledgements() {
    // Without the drain in `truncate_after`, the flusher could acknowledge entry 50 after the
    // truncation lowered the record to 10, and the next start would refuse a log that is fine.
    for round in 0..20 {
        let mut log = open();
        let (cb, _rx) = callback();
        log.store.append((1..=50).map(blank), cb).await.expect("append");
        log.store.truncate_after(Some(log_id(1, 1, 10))).await.expect("truncate");
        // Whatever the flusher still does, it does nothing for the truncated entries.
        log.store.flusher().drain().expect("drain");
        assert_eq!(log.acked.current().log_index, 10, "round {round}: record above the log");
        let last = log.store.get_log_state().await.expect("state").last_log_id;
        assert_eq!(last.map(|l| l.index), Some(10));
    }
}

#[tokio::test]
async fn a_failed_sync_refuses_every_later_append() {
    let mut log = open();
    log.store.flusher().poison_for_test("disk on fire");
    let (cb, rx) = callback();
    let refused = log.store.append([blank(1)], cb).await;
    assert!(refused.is_err(), "append after a failed sync must fail");
    assert!(matches!(rx.await, Ok(Err(_))), "its callback reports the failure");
    assert!(log.store.flusher().drain().is_err(), "drain reports the failure too");
}

/// Sets its flag when dropped, 200 ms late: a thread-local destructor that is slow to run, as
/// RocksDB's may be when the machine is busy.
struct SlowExit(Arc<std::sync::atomic::AtomicBool>);

impl Drop for SlowExit {
    fn drop(&mut self) {
        std::thread::sleep(Duration::from_millis(200));
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

thread_local! {
    static EXIT_GUARD: std::cell::RefCell<Option<SlowExit>> = const { std::cell::RefCell::new(None) };
}

/// Dropping the last handle returns only once the flusher thread has ended, its thread-local
/// destructors included, and has let go of the database. The drop used to return when the
/// thread said it was done, before it had ended and before it dropped its handle of the
/// database; when that was the last handle the database closed on the thread, and in picketd
/// that could overlap the process's exit, which destroys RocksDB's C++ statics: members
/// aborted on SIGTERM after a load ("pthread lock: Invalid argument", about one in twenty).
#[test]
fn dropping_the_flusher_waits_until_its_thread_has_ended() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let path = dir.path().join("db");
    let engine = RocksEngine::open(&path).expect("open rocksdb");
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ended.clone();
    let flusher = LogFlusher::start_with(engine.db().clone(), move || {
        EXIT_GUARD.with(|g| *g.borrow_mut() = Some(SlowExit(flag)));
    })
    .expect("start the flusher");
    // The flusher holds the last handle of the database from here on.
    drop(engine);
    drop(flusher);
    assert!(
        ended.load(std::sync::atomic::Ordering::SeqCst),
        "the flusher thread was still ending after its last handle was dropped"
    );
    // And the database is closed: the same process opens it again at once.
    RocksEngine::open(&path).expect("reopen the database after the flusher stopped");
}

/// The leader's own append wakes the flusher only once the runtime has run what was ready (the
/// replication sends, in a member): while the runtime's thread stays busy it is not synced, and
/// once the runtime can poll again it is. A follower's append (another leader's entries) wakes
/// the flusher at once. Before `push_after_sends`, the own append was synced while the thread
/// was still blocked (the first assertion failed).
#[tokio::test(flavor = "current_thread")]
async fn the_leaders_own_append_is_synced_after_the_runtime_ran_its_ready_tasks() {
    let mut log = open_member_1();
    log.store.flusher().wait_until_idle_for_test();
    let (cb, mut rx) = callback();
    log.store.append([blank(1)], cb).await.expect("append");
    // No task runs while this thread sleeps; a sync takes milliseconds.
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "the leader's own append was synced before the runtime polled");
    let done = tokio::time::timeout(Duration::from_secs(10), rx).await;
    assert!(matches!(done, Ok(Ok(Ok(())))), "synced once the runtime ran the deferred wake");

    log.store.flusher().wait_until_idle_for_test();
    let (cb, mut rx) = callback();
    let theirs = Entry { log_id: log_id(2, 2, 2), payload: EntryPayload::Blank };
    log.store.append([theirs], cb).await.expect("append");
    assert!(block_until_answered(&mut rx), "another leader's entries are synced at once");
}

/// A truncation drains the flusher on the runtime's thread, which then cannot run a deferred
/// wake: the drain must wake the flusher itself, or it waits out its 30 s bound and fails.
#[tokio::test(flavor = "current_thread")]
async fn a_drain_does_not_wait_for_a_deferred_wake() {
    let mut log = open_member_1();
    log.store.flusher().wait_until_idle_for_test();
    let (cb, rx) = callback();
    log.store.append([blank(1), blank(2), blank(3)], cb).await.expect("append");
    let started = std::time::Instant::now();
    log.store.truncate_after(Some(log_id(1, 1, 2))).await.expect("truncate");
    assert!(started.elapsed() < Duration::from_secs(10), "the drain waited for the runtime");
    assert!(matches!(rx.await, Ok(Ok(()))), "the append was synced by the drain's wake");
    assert_eq!(log.acked.current().log_index, 2, "record lowered to the truncation");
}

/// The deferred wake is a task; a runtime that shuts down before polling it drops it, and the
/// drop must still wake the flusher, or the append (and every later own append, which finds a
/// wake already scheduled) would never be synced.
#[test]
fn a_deferred_wake_dropped_unpolled_still_wakes_the_flusher() {
    let mut log = open_member_1();
    log.store.flusher().wait_until_idle_for_test();
    let (cb, mut rx) = callback();
    let runtime =
        tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime");
    // The append completes without yielding, so `block_on` returns before the runtime polls
    // the wake it spawned; dropping the runtime drops that task.
    runtime.block_on(log.store.append([blank(1)], cb)).expect("append");
    drop(runtime);
    assert!(block_until_answered(&mut rx), "the append was never synced");
}
