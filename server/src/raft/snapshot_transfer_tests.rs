//! Unit tests of the snapshot chunk receiver's reassembly: chunks in order make the snapshot;
//! a chunk that does not continue the transfer is refused and ends it; a chunk at offset 0
//! starts over; no partial file is left behind.

use std::path::Path;

use super::*;
use crate::raft::types::log_id;

struct Dir {
    dir: tempfile::TempDir,
    n: std::cell::Cell<u32>,
}

impl Dir {
    fn new() -> Self {
        Self { dir: tempfile::TempDir::new().expect("temp dir"), n: std::cell::Cell::new(0) }
    }

    /// A new temp path per transfer, as `SnapshotFiles::receiving_path` gives.
    fn next(&self) -> PathBuf {
        self.n.set(self.n.get() + 1);
        self.dir.path().join(format!("receiving-{}.tmp", self.n.get()))
    }

    fn files(&self) -> usize {
        std::fs::read_dir(self.dir.path()).expect("read dir").count()
    }
}

fn chunk(id: &str, offset: u64, data: &[u8], done: bool) -> Chunk {
    Chunk {
        vote: Vote::new_committed(2, 1),
        meta: ChunkMeta {
            last_log_id: Some(log_id(2, 1, 42)),
            last_membership: StoredMembership::default(),
            snapshot_id: id.into(),
        },
        offset,
        data: data.to_vec(),
        done,
    }
}

async fn contents(snapshot: Snapshot) -> Vec<u8> {
    let mut data = snapshot.snapshot;
    data.read_all().await.expect("read snapshot data")
}

fn exists(p: &Path) -> bool {
    p.exists()
}

#[tokio::test]
async fn chunks_in_order_make_the_snapshot() {
    let dir = Dir::new();
    let rx = Receiver::default();
    assert!(rx.accept(chunk("a", 0, b"hello ", false), || dir.next()).await.unwrap().is_none());
    assert!(rx.accept(chunk("a", 6, b"snap", false), || dir.next()).await.unwrap().is_none());
    let snap = rx.accept(chunk("a", 10, b"shot", true), || dir.next()).await.unwrap();
    let snap = snap.expect("the last chunk completes the snapshot");
    assert_eq!(snap.meta.last_log_id, Some(log_id(2, 1, 42)));
    assert_eq!(contents(snap).await, b"hello snapshot");
    assert_eq!(dir.files(), 0, "the received file goes with its data");
}

#[tokio::test]
async fn a_chunk_that_does_not_continue_the_transfer_is_refused_and_ends_it() {
    let dir = Dir::new();
    let rx = Receiver::default();
    rx.accept(chunk("a", 0, b"0123", false), || dir.next()).await.unwrap();
    let gap = rx.accept(chunk("a", 8, b"89", false), || dir.next()).await;
    assert_eq!(gap.err().map(|s| s.code()), Some(tonic::Code::FailedPrecondition));
    assert_eq!(dir.files(), 0, "the partial file is removed with the transfer");
    // The transfer is over: even the chunk that would have continued it is refused now.
    let next = rx.accept(chunk("a", 4, b"4567", false), || dir.next()).await;
    assert!(next.is_err(), "a chunk after a refused one must not resume the transfer");
    // Another transfer's chunk in the middle of this one is refused too.
    rx.accept(chunk("b", 0, b"xx", false), || dir.next()).await.unwrap();
    assert!(rx.accept(chunk("c", 2, b"yy", true), || dir.next()).await.is_err());
}

#[tokio::test]
async fn a_chunk_at_offset_zero_starts_over() {
    let dir = Dir::new();
    let rx = Receiver::default();
    rx.accept(chunk("old", 0, b"stale bytes", false), || dir.next()).await.unwrap();
    let first = dir.dir.path().join("receiving-1.tmp");
    assert!(exists(&first));
    rx.accept(chunk("new", 0, b"fresh ", false), || dir.next()).await.unwrap();
    assert!(!exists(&first), "the abandoned transfer's file is removed");
    let snap = rx.accept(chunk("new", 6, b"data", true), || dir.next()).await.unwrap();
    assert_eq!(contents(snap.expect("complete")).await, b"fresh data");
}
