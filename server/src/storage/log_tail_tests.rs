use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader};
use picket_proto::etcdserverpb::PutRequest;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RaftCommand;

use super::TAIL_BYTES;
use crate::raft::types::{log_id, Command, Entry};
use crate::storage::log_store::LogStore;
use crate::storage::rocks::RocksEngine;
use crate::test_rng::XorShift;

fn store() -> (tempfile::TempDir, RocksEngine, LogStore) {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
    let store = LogStore::new(engine.db().clone()).expect("log store");
    (dir, engine, store)
}

fn entry(term: u64, index: u64, value_len: usize) -> Entry {
    Entry {
        log_id: log_id(term, 1, index),
        payload: EntryPayload::Normal(Command::new(RaftCommand {
            cmd: Some(Cmd::Put(PutRequest {
                key: format!("k{index}").into_bytes(),
                value: vec![u8::try_from(term % 251).unwrap(); value_len],
                ..Default::default()
            })),
            forwarded: None,
        })),
    }
}

async fn append(store: &mut LogStore, entries: Vec<Entry>) {
    store.append(entries, IOFlushed::noop()).await.expect("append");
}

fn indexes(entries: &[Entry]) -> Vec<(u64, u64)> {
    entries.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect()
}

/// Entries just appended are read back from memory: with their rows deleted from RocksDB
/// behind the store's back, the reader still returns them, sharing the appended commands.
#[tokio::test]
async fn a_read_after_an_append_does_not_touch_rocksdb() {
    let (_dir, engine, mut store) = store();
    let appended: Vec<Entry> = (1..=5).map(|i| entry(1, i, 10)).collect();
    append(&mut store, appended.clone()).await;
    let cf = engine.db().cf_handle("raft_log").expect("cf");
    engine.db().delete_range_cf(cf, 0u64.to_be_bytes(), u64::MAX.to_be_bytes()).expect("delete");

    let mut reader = store.get_log_reader().await;
    let read = reader.try_get_log_entries(2..5).await.expect("read");
    assert_eq!(indexes(&read), vec![(1, 2), (1, 3), (1, 4)]);
    assert_eq!(read, appended[1..4].to_vec());
    let EntryPayload::Normal(cmd) = &read[0].payload else { panic!("a normal entry") };
    assert!(cmd.is_encoded(), "the append's encoding is reused, not made again");
    assert!(store.read_stored(2, &(2..5), usize::MAX).expect("disk").is_empty());
}

/// Whatever openraft does to the log (appends, truncations, purges, appends after a gap as
/// after a snapshot install, entries large enough to overflow the tail's budget), every read
/// answers exactly what RocksDB holds, with the same byte limit.
#[tokio::test]
async fn reads_through_the_tail_equal_reads_of_rocksdb() {
    let (_dir, _engine, mut store) = store();
    let mut g = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut first, mut next, mut term) = (1u64, 1u64, 1u64);
    let mut from_memory = 0;
    for step in 0..400 {
        match g.below(10) {
            0 if next > first => {
                // Truncation (a new leader overwrote the tail of this member's log).
                let keep = first + g.below(next - first);
                store.truncate_after(Some(log_id(term, 1, keep - 1))).await.expect("truncate");
                next = keep;
                term += 1;
            }
            1 if next > first => {
                let upto = first + g.below(next - first);
                store.purge(log_id(term, 1, upto)).await.expect("purge");
                first = upto + 1;
            }
            2 => {
                // A snapshot install: purge everything, continue after a gap.
                let last = next + g.below(5);
                store.purge(log_id(term, 1, last)).await.expect("purge");
                first = last + 1;
                next = last + 1;
            }
            _ => {
                let count = 1 + g.below(4);
                // Mostly small entries, sometimes ones that push older entries out of the tail.
                let len = if g.below(8) == 0 { TAIL_BYTES / 3 } else { 100 };
                append(&mut store, (next..next + count).map(|i| entry(term, i, len)).collect())
                    .await;
                next += count;
            }
        }
        for _ in 0..4 {
            let start = first.saturating_sub(1) + g.below(next - first + 3);
            let end = start + g.below(6);
            let max = if g.below(2) == 0 { usize::MAX } else { 1 + g.below(500) as usize };
            let read = store.read_entries(start..end, max).expect("read");
            let stored = store.read_stored(start, &(start..end), max).expect("disk");
            assert_eq!(indexes(&read), indexes(&stored), "step {step}: {start}..{end}, max {max}");
            assert_eq!(read, stored, "step {step}");
            from_memory += usize::from(store.tail_holds(start));
        }
        let (bytes, held) = store.tail_held();
        assert!(bytes <= TAIL_BYTES || held == 1, "step {step}: {bytes} bytes in {held} entries");
    }
    assert!(from_memory > 400, "most reads came from memory: {from_memory} of 1600");
}
