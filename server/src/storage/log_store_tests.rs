use std::time::{Duration, Instant};

use openraft::storage::RaftLogStorage;

use super::{LogStore, SAVE_COMMITTED_EVERY};
use crate::raft::types::log_id;
use crate::storage::rocks::RocksEngine;

fn store() -> (tempfile::TempDir, LogStore) {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
    let store = LogStore::new(engine.db().clone()).expect("log store");
    (dir, store)
}

/// The committed log id is written at most every `SAVE_COMMITTED_EVERY` (a write per commit sat
/// on openraft's core task between the commit and the apply): a call inside the interval leaves
/// the older id stored, which start-up treats like a lost one; the first call, and the first
/// after the interval, write.
#[tokio::test]
async fn the_committed_id_is_written_at_most_once_per_interval() {
    let (_dir, mut store) = store();
    store.save_committed(Some(log_id(1, 1, 4))).await.unwrap();
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 4)), "first call writes");

    // Inside the interval (pinned, so a slow test machine cannot make it pass).
    store.committed_saved_at = Some(Instant::now() + Duration::from_secs(3600));
    store.save_committed(Some(log_id(1, 1, 9))).await.unwrap();
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 4)), "skipped");

    store.committed_saved_at = Some(Instant::now() - 2 * SAVE_COMMITTED_EVERY);
    store.save_committed(Some(log_id(1, 1, 12))).await.unwrap();
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 1, 12)), "written again");
}
