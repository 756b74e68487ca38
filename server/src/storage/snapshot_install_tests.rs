//! Installing a received snapshot (`storage::snapshot_install`): what reaches the disk, what a
//! restart finds after a crash at each step, what a damaged blob does, and what readers see
//! meanwhile.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use parking_lot::Mutex;
use picket_proto::etcdserverpb::PutRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;

use super::{install_received, INSTALLING};
use crate::storage::rocks::RocksEngine;
use crate::storage::snapshot::{self, SnapshotError};
use crate::storage::test_member::Member;

/// The points of an install where a test can stop it (a crash) or pause it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The blob is checked and renamed to `INSTALLING`; the store is untouched.
    Committed,
    /// The old contents are deleted and one column family's files are ingested.
    Ingested,
}

type Hook = Box<dyn FnOnce() -> Result<(), SnapshotError> + Send>;

/// What the install does at a step. Each nextest test runs in its own process, so the static
/// is this test's alone.
static HOOK: Mutex<Option<(Step, Hook)>> = Mutex::new(None);

/// Called by the install at `step`: runs the hook set for it, once.
pub(super) fn crash_point(step: Step) -> Result<(), SnapshotError> {
    let hook = {
        let mut slot = HOOK.lock();
        match slot.take() {
            Some((at, hook)) if at == step => hook,
            other => {
                *slot = other;
                return Ok(());
            }
        }
    };
    hook()
}

/// The install stops at `step` as if the process died there: it returns at once, leaving
/// everything as it is.
fn crash_at(step: Step) {
    *HOOK.lock() = Some((step, Box::new(|| Err(SnapshotError::Malformed("simulated crash")))));
}

fn put(key: &str, value: Vec<u8>) -> Cmd {
    Cmd::Put(PutRequest { key: key.into(), value, ..Default::default() })
}

/// The bytes of the write-ahead log files in a RocksDB directory.
fn wal_bytes(db_dir: &Path) -> u64 {
    std::fs::read_dir(db_dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// A member with `n` keys named `prefix-i` of `size` bytes each, its snapshot built.
async fn member(prefix: &str, n: usize, size: usize) -> Member {
    let mut m = Member::new();
    for i in 0..n {
        m.apply(put(&format!("{prefix}-{i:05}"), vec![(i % 251) as u8; size])).await;
    }
    m.sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    m
}

fn engine(m: &Member) -> RocksEngine {
    m.sm.shared().engine.clone()
}

fn blob_of(m: &Member) -> Vec<u8> {
    snapshot::build(&engine(m)).unwrap()
}

/// Writes `blob` where a received snapshot would be, in `m`'s snapshot directory.
fn received(m: &Member, blob: &[u8]) -> PathBuf {
    let path = m.sm.shared().snapshots.receiving_path();
    std::fs::write(&path, blob).unwrap();
    path
}

fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Session 32's `set` long run: a member that had installed a 1.65 GB snapshot took 16 s to
/// reopen its store, because the install wrote the whole snapshot as one batch through the
/// write-ahead log, which a restart replays into memtables. The install must write table files
/// instead, so the log holds only a few small records and a restart right after it is as
/// cheap as any other. Seen failing on 10f0e35 (the one-batch install): "the install wrote
/// 16561164 bytes to the write-ahead log for a 16573674 byte snapshot".
#[tokio::test]
async fn an_install_does_not_go_through_the_write_ahead_log_and_survives_a_restart() {
    let src = member("key", 2000, 4096).await;
    let blob = blob_of(&src);
    let snap = src.sm.clone().get_current_snapshot().await.unwrap().expect("a snapshot");

    let mut target = member("old", 50, 100).await;
    let before = wal_bytes(&target.db_dir());
    target.sm.install_snapshot(&snap.meta, snap.snapshot).await.expect("install");
    let logged = wal_bytes(&target.db_dir()) - before;
    assert!(
        logged < blob.len() as u64 / 20,
        "the install wrote {logged} bytes to the write-ahead log for a {} byte snapshot",
        blob.len()
    );
    assert!(blob_of(&target) == blob);

    // A restart right after the install finds the snapshot, and nothing left in the snapshot
    // directory.
    let target = target.restart();
    assert!(blob_of(&target) == blob);
    assert_eq!(target.sm.shared().revision(), src.sm.shared().revision());
    assert_eq!(names(&target.snapshot_dir()), Vec::<String>::new());
}

/// A crash after the commit point (the checked blob renamed to `INSTALLING`), before the store
/// changed or halfway through replacing it: the next start finishes the install before
/// anything reads the store.
#[tokio::test]
async fn a_crash_after_the_commit_point_is_finished_at_the_next_start() {
    let src = member("new", 300, 1000).await;
    let blob = blob_of(&src);
    for step in [Step::Committed, Step::Ingested] {
        let target = member("old", 200, 100).await;
        let old = blob_of(&target);
        let path = received(&target, &blob);
        crash_at(step);
        let dir = target.snapshot_dir();
        let err = install_received(&engine(&target), &dir, &path).expect_err("stopped");
        assert!(err.to_string().contains("simulated crash"), "{step:?}: {err}");
        assert!(dir.join(INSTALLING).exists(), "{step:?}: the commit point was reached");
        let now = blob_of(&target);
        match step {
            Step::Committed => assert!(now == old, "the store is untouched at the commit point"),
            // The crash overlapped the replace: the store is neither the old one nor the new.
            Step::Ingested => assert!(now != old && now != blob, "{step:?}: half replaced"),
        }

        let target = target.restart();
        assert!(blob_of(&target) == blob, "{step:?}: the start finished the install");
        assert_eq!(target.sm.shared().revision(), src.sm.shared().revision(), "{step:?}");
        assert_eq!(names(&dir), Vec::<String>::new(), "{step:?}");
    }
}

/// A crash before the commit point (while the table files were being written) leaves the old
/// store, and the next start removes the leftovers.
#[tokio::test]
async fn a_crash_before_the_commit_point_leaves_the_store_as_it_was() {
    let src = member("new", 100, 1000).await;
    let target = member("old", 100, 100).await;
    let old = blob_of(&target);
    let path = received(&target, &blob_of(&src));
    let dir = target.snapshot_dir();
    // The table files of an install, and its blob still under its receiving name: what a
    // crash while the tables were written leaves.
    super::write_tables(std::fs::File::open(&path).unwrap(), &dir.join(super::TABLES)).unwrap();
    assert_eq!(names(&dir).len(), 2, "{:?}", names(&dir));
    let target = target.restart();
    assert!(blob_of(&target) == old);
    assert_eq!(names(&dir), Vec::<String>::new());
}

/// A damaged blob is refused before anything of the store changes, with its files removed.
#[tokio::test]
async fn a_damaged_blob_is_refused_before_the_store_changes() {
    let src = member("new", 100, 1000).await;
    let good = blob_of(&src);
    let target = member("old", 100, 100).await;
    let old = blob_of(&target);
    let dir = target.snapshot_dir();

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 1;
    let out_of_order = snapshot::encode_records(&[(0, b"b", b"1"), (0, b"a", b"2")]);
    let families_back = snapshot::encode_records(&[(1, b"a", b"1"), (0, b"b", b"2")]);
    let cases: [(&str, &[u8], &str); 5] = [
        ("a flipped bit", &flipped, "checksum mismatch"),
        ("cut short", &good[..good.len() - 40], "truncated"),
        ("keys out of order", &out_of_order, "records out of order"),
        ("families out of order", &families_back, "records out of order"),
        ("not a snapshot", b"PICKETSNAX\x01", "bad header"),
    ];
    for (what, blob, want) in cases {
        let path = received(&target, blob);
        let err = install_received(&engine(&target), &dir, &path).expect_err(what);
        assert!(err.to_string().contains(want), "{what}: {err}");
        assert!(blob_of(&target) == old, "{what}: the store changed");
        assert_eq!(names(&dir), Vec::<String>::new(), "{what}");
    }
}

/// Ingestion replaces one column family at a time: a view taken meanwhile would see some
/// families of the snapshot and some of the old store. Views are held off until the replace
/// is done, and one taken before the install keeps showing the old store whole.
#[tokio::test]
async fn views_show_an_install_wholly_or_not_at_all() {
    let src = member("new", 300, 1000).await;
    let blob = blob_of(&src);
    let target = member("old", 200, 100).await;
    let old = blob_of(&target);
    let engine = engine(&target);
    let db = std::sync::Arc::clone(engine.db());
    let before = engine.whole(|| db.snapshot());

    let (paused_tx, paused_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let hook: Hook = Box::new(move || {
        paused_tx.send(()).unwrap();
        // Bounded: the test releases it at once or has already failed.
        let _ = release_rx.recv_timeout(Duration::from_secs(60));
        Ok(())
    });
    *HOOK.lock() = Some((Step::Ingested, hook));
    let path = received(&target, &blob);
    let dir = target.snapshot_dir();
    let installer = {
        let engine = engine.clone();
        std::thread::spawn(move || install_received(&engine, &dir, &path))
    };
    paused_rx.recv_timeout(Duration::from_secs(60)).expect("the install reached the pause");

    // A reader during the replace: it must wait for the replace to finish.
    let (read_tx, read_rx) = mpsc::channel();
    let reader = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let db = engine.db();
            let view = engine.whole(|| db.snapshot());
            let mut out = Vec::new();
            snapshot::write_blob(db, &view, &mut out).unwrap();
            read_tx.send(out).unwrap();
        })
    };
    // Passes wrongly only if the reader thread is not scheduled within the wait; never fails
    // wrongly.
    assert!(
        read_rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a view was taken while the column families were half replaced"
    );
    release_tx.send(()).unwrap();
    installer.join().unwrap().expect("install");
    let seen = read_rx.recv_timeout(Duration::from_secs(60)).expect("the reader went on");
    reader.join().unwrap();
    assert!(seen == blob, "the held-off view shows the whole snapshot");

    let mut out = Vec::new();
    snapshot::write_blob(&db, &before, &mut out).unwrap();
    assert!(out == old, "a view from before the install shows the old store whole");
}
