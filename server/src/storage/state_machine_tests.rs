//! Snapshot install must block neither the async runtime nor response headers (issue 19,
//! Medium 9): it used to rewrite the store synchronously on a runtime worker thread while
//! holding the state-machine write lock, which every response header's revision needed.

use std::sync::mpsc;
use std::time::Duration;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use parking_lot::Mutex;
use picket_proto::etcdserverpb::PutRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;

use crate::storage::snapshot;
use crate::storage::test_member::Member;

/// How long the test waits for the runtime to run its probe while an install is in progress.
/// The probe needs microseconds; a blocked runtime never runs it.
const WATCHDOG: Duration = Duration::from_secs(60);

/// What an install in progress does at its pause point: tell the test it is there, then wait
/// until the test lets it go on.
struct Pause {
    entered: tokio::sync::oneshot::Sender<()>,
    release: mpsc::Receiver<()>,
}

static PAUSE: Mutex<Option<Pause>> = Mutex::new(None);

/// Called by `install_snapshot` after it rewrote the store and before it swaps the new state
/// in. Each nextest test runs in its own process, so the static is this test's alone.
pub(super) fn pause_in_install() {
    let Some(p) = PAUSE.lock().take() else { return };
    let _ = p.entered.send(());
    // Bounded: the test releases it at once or has already failed.
    let _ = p.release.recv_timeout(WATCHDOG);
}

fn put(key: &str) -> Cmd {
    Cmd::Put(PutRequest { key: key.into(), value: b"v".to_vec(), ..Default::default() })
}

/// Seen failing on 5c13469 with `pause_in_install()` placed after its `snapshot::install` call
/// (under the write lock, on the runtime thread): the probe never ran and the watchdog fired.
#[test]
fn snapshot_install_blocks_neither_the_runtime_nor_response_headers() {
    let (done_tx, done_rx) = mpsc::channel();
    let runner = std::thread::spawn(move || {
        // One runtime thread, as a worker of a busy member would be: a synchronous install on it
        // would starve every other task.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let mut source = Member::new();
            for i in 0..10 {
                source.apply(put(&format!("k{i}"))).await;
            }
            let want = source.sm.shared().revision();
            source.sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
            let snap = source.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
            let target = Member::new();
            let before = target.sm.shared().revision();

            let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
            let (release_tx, release_rx) = mpsc::channel();
            *PAUSE.lock() = Some(Pause { entered: entered_tx, release: release_rx });
            let mut sm = target.sm.clone();
            let install =
                tokio::spawn(async move { sm.install_snapshot(&snap.meta, snap.snapshot).await });

            entered_rx.await.expect("the install reached its pause point");
            // The probe: this task runs while the install is in progress, and a header's
            // revision is served (the old one) without waiting for the install.
            let during = target.sm.shared().revision();
            release_tx.send(()).unwrap();
            install.await.unwrap().expect("install");
            let after = target.sm.shared().revision();
            done_tx.send((before, during, after, want)).unwrap();
        });
    });
    let (before, during, after, want) = done_rx
        .recv_timeout(WATCHDOG)
        .expect("the runtime did not run the probe while a snapshot install was in progress");
    // The runner still drops the runtime and both members' RocksDB instances; exiting the test
    // process meanwhile aborted once inside RocksDB's teardown ("pthread lock: Invalid
    // argument"). Bounded: the probe ran, so nothing is blocked any more.
    runner.join().expect("the runner thread panicked");
    assert_eq!(during, before, "before the swap, headers show the old state");
    assert_eq!(after, want, "after the install, the snapshot's revision");
    assert_ne!(want, before);
}

/// The names in a member's snapshot directory.
fn files(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Building a snapshot copies nothing (issue 20, session 29: every build used to write the
/// whole store to `snapshots/current.snap`, which this test's first check sees on the old
/// code). It pins a view, and what a follower is sent is the store as that view saw it,
/// however much is applied after.
#[tokio::test]
async fn a_built_snapshot_writes_nothing_and_sends_the_store_as_it_was_at_the_build() {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};

    let mut m = Member::new();
    for i in 0..300 {
        m.apply(put(&format!("key-{i:04}"))).await;
    }
    // Only the metadata is kept, as openraft does: the data would hold the snapshot in use.
    let built = m.sm.get_snapshot_builder().await.build_snapshot().await.unwrap().meta;
    assert_eq!(files(&m.snapshot_dir()), Vec::<String>::new(), "a build writes no file");
    assert_eq!(built.last_log_id.map(|l| l.index), Some(300));
    // The store has not moved since the build: its blob now is what the snapshot must hold.
    let blob = snapshot::build(&m.sm.shared().engine).unwrap();

    m.apply(put("later")).await;
    let mut current = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(current.meta, built);
    assert!(current.snapshot.read_all().await.unwrap() == blob, "later writes are not in it");

    // As the transfer reads it: written out to a file once, then sought and read; a second
    // transfer of the same snapshot (another follower, a retry) reads the same file.
    let mut data = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot").snapshot;
    data.spill().await.unwrap();
    let sending = files(&m.snapshot_dir());
    assert_eq!(sending.len(), 1, "{sending:?}");
    assert_eq!(data.seek(std::io::SeekFrom::End(0)).await.unwrap(), blob.len() as u64);
    data.seek(std::io::SeekFrom::Start(0)).await.unwrap();
    let mut read = Vec::new();
    data.read_to_end(&mut read).await.unwrap();
    assert!(read == blob);
    let mut again = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot").snapshot;
    again.spill().await.unwrap();
    assert_eq!(files(&m.snapshot_dir()), sending, "written once");
    drop(again);

    // A follower installs it: its store is the source's at the build, metadata and all (the
    // install checks the data's applied id against the metadata).
    let mut target = Member::new();
    target.sm.install_snapshot(&current.meta, data).await.expect("install");
    assert!(snapshot::build(&target.sm.shared().engine).unwrap() == blob);
    let installed = target.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(installed.meta, built, "the installed snapshot is the target's current one");

    // The file goes with the snapshot: once a newer one is built and no transfer reads it.
    drop(current);
    m.sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(files(&m.snapshot_dir()), Vec::<String>::new());
}

/// After a restart no snapshot file is needed: the current snapshot is the store as recovered
/// (whatever was purged is covered by it, see `storage::pinned`). A snapshot file left by an
/// older version is removed.
#[tokio::test]
async fn after_a_restart_the_current_snapshot_is_the_store_as_recovered() {
    let mut m = Member::new();
    for i in 0..20 {
        m.apply(put(&format!("k{i}"))).await;
    }
    m.sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    m.apply(put("after-the-build")).await;
    std::fs::write(m.snapshot_dir().join("current.snap"), b"an older version's file").unwrap();
    let mut m = m.restart();
    assert_eq!(files(&m.snapshot_dir()), Vec::<String>::new(), "the old file is gone");
    let blob = snapshot::build(&m.sm.shared().engine).unwrap();
    let mut current = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(current.meta.last_log_id.map(|l| l.index), Some(21));
    assert!(current.snapshot.read_all().await.unwrap() == blob);

    // A member that never applied anything has no snapshot.
    let mut fresh = Member::new();
    assert!(fresh.sm.get_current_snapshot().await.unwrap().is_none());
}

fn alarm(action: picket_proto::etcdserverpb::alarm_request::AlarmAction) -> Cmd {
    Cmd::Alarm(picket_proto::etcdserverpb::AlarmRequest {
        action: action as i32,
        member_id: 7,
        alarm: picket_proto::etcdserverpb::AlarmType::Nospace as i32,
    })
}

/// The propose-time NOSPACE check reads an in-memory copy of the applied alarm set
/// (`quota::AlarmCache`): it must follow every applied change, one arriving inside a
/// group-committed batch included, and a snapshot install.
#[tokio::test]
async fn the_propose_time_alarm_copy_follows_applies_and_installs() {
    use picket_proto::etcdserverpb::alarm_request::AlarmAction;
    use picket_proto::picket::raft::v1::{CommandBatch, RaftCommand};

    let mut m = Member::new();
    assert!(!m.sm.shared().alarms().nospace());
    m.apply(alarm(AlarmAction::Activate)).await;
    assert!(m.sm.shared().alarms().nospace(), "an applied activation");
    m.apply(put("k")).await;
    assert!(m.sm.shared().alarms().nospace(), "a later batch without alarms keeps it");

    // A snapshot taken now carries the alarm to a member that installs it.
    m.sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let snap = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    let mut target = Member::new();
    target.sm.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    assert!(target.sm.shared().alarms().nospace(), "a snapshot install");

    let batch = |c: Cmd| {
        Cmd::Batch(CommandBatch {
            commands: vec![
                RaftCommand { cmd: Some(put("b")), forwarded: None },
                RaftCommand { cmd: Some(c), forwarded: None },
            ],
        })
    };
    m.apply(batch(alarm(AlarmAction::Deactivate))).await;
    assert!(!m.sm.shared().alarms().nospace(), "a deactivation inside a batch");
    m.apply(batch(alarm(AlarmAction::Activate))).await;
    assert!(m.sm.shared().alarms().nospace(), "an activation inside a batch");
}

/// A member that did not propose an entry (a follower: openraft hands an entry's responder only
/// to the member that proposed it) applies it at once, even when another member tagged its
/// command (`storage::forwarded`: a follower's forward, or since session 38 every command of
/// the leader's own clients). The yield before apply lets a leader send the commit first; a
/// follower sends none, and yielding there put its apply, and the lock hand-offs and answers
/// waiting on it, behind whatever else its runtime had queued. Seen failing before the yield
/// was limited to entries with a responder: the apply was still pending after one poll.
#[test]
fn a_member_that_did_not_propose_an_entry_applies_it_without_yielding() {
    use futures::FutureExt;
    use openraft::EntryPayload;

    use crate::raft::types::{log_id, Command, Entry};
    use crate::storage::forwarded::ForwardedResults;

    let mut m = Member::new();
    let elsewhere = std::sync::Arc::new(ForwardedResults::new());
    let (tagged, _waiter) = elsewhere.tag(picket_proto::picket::raft::v1::RaftCommand {
        cmd: Some(put("from-the-leader")),
        forwarded: None,
    });
    assert!(m.sm.shared().forwarded().forwarded_elsewhere(&tagged), "tagged by another member");
    let entry =
        Entry { log_id: log_id(1, 1, 1), payload: EntryPayload::Normal(Command::new(tagged)) };
    let entries = futures::stream::iter(vec![Ok((entry, None))]);
    let applied = m.sm.apply(entries).now_or_never();
    assert!(applied.is_some(), "the apply yielded on a member without the entry's responder");
    applied.unwrap().expect("applied");
    let read =
        m.sm.shared()
            .reader()
            .range(&picket_proto::etcdserverpb::RangeRequest {
                key: b"from-the-leader".to_vec(),
                ..Default::default()
            })
            .expect("read");
    assert_eq!(read.kvs.len(), 1, "the entry was applied");
}
