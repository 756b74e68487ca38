//! Snapshot install must block neither the async runtime nor response headers (issue 19,
//! Medium 9): it used to rewrite the store synchronously on a runtime worker thread while
//! holding the state-machine write lock, which every response header's revision needed.

use std::sync::mpsc;
use std::time::Duration;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use parking_lot::Mutex;
use picket_proto::etcdserverpb::PutRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;

use crate::storage::snapshot::{self, SnapshotFiles};
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

/// Building streams the store into the snapshot file (issue 20: it used to serialize the whole
/// store into memory first, on every member, every `--snapshot-count` entries). The file must be
/// byte for byte what the in-memory path wrote, so files of earlier builds and of this one read
/// the same, and what a lagging follower is sent is the store at the snapshot's entry.
#[tokio::test]
async fn a_built_snapshot_is_streamed_to_the_same_file_the_blob_path_wrote() {
    let mut m = Member::new();
    for i in 0..300 {
        m.apply(put(&format!("key-{i:04}"))).await;
    }
    let built = m.sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id.map(|l| l.index), Some(300));
    // The store has not moved since: the in-memory blob of it is what the file must hold.
    let blob = snapshot::build(m.sm.shared().engine.db()).unwrap();
    let streamed = std::fs::read(m.snapshot_dir().join("current.snap")).unwrap();
    let other = tempfile::TempDir::new().unwrap();
    SnapshotFiles::new(other.path()).unwrap().save(&built.meta, &blob).unwrap();
    let saved = std::fs::read(other.path().join("current.snap")).unwrap();
    assert!(streamed == saved, "streamed file differs from the blob path's");

    // What openraft sends: the data of the built snapshot and of the current one.
    let mut built_data = built.snapshot;
    assert!(built_data.read_all().await.unwrap() == blob);
    let mut sent = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(sent.meta, built.meta);
    assert!(sent.snapshot.read_all().await.unwrap() == blob);
    // Writes after the build are not in it.
    m.apply(put("later")).await;
    let mut again = m.sm.get_current_snapshot().await.unwrap().expect("a snapshot");
    assert_eq!(again.meta, built.meta);
    assert!(again.snapshot.read_all().await.unwrap() == blob);
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
