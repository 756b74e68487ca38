//! Unit tests of the torn-tail recovery: a WAL cut inside its last (unsynced) record opens and
//! keeps every synced write; a flipped bit in an earlier record still refuses; the
//! acknowledged-position record survives a torn slot, is lowered before truncations and makes
//! `verify` refuse a log that lost acknowledged entries.

use std::path::PathBuf;

use super::*;
use crate::storage::engine::{Cf, Engine, ReadView, WriteBatch};

/// RocksDB's WAL format: 32 KiB blocks of records, each with a 7-byte header (CRC32C, length
/// as little-endian u16, type). Returns (start, total length) of every record.
fn wal_records(bytes: &[u8]) -> Vec<(usize, usize)> {
    const BLOCK: usize = 32 * 1024;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 7 <= bytes.len() {
        let left = BLOCK - pos % BLOCK;
        if left < 7 {
            pos += left;
            continue;
        }
        let len = u16::from_le_bytes([bytes[pos + 4], bytes[pos + 5]]) as usize;
        if bytes[pos + 6] == 0 && len == 0 {
            break;
        }
        out.push((pos, 7 + len));
        pos += 7 + len;
    }
    out
}

fn newest_wal(dir: &Path) -> PathBuf {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    logs.pop().expect("a WAL file")
}

fn put(e: &RocksEngine, key: &str, sync: bool) {
    let mut b = WriteBatch::new();
    b.put(Cf::Kv, key.as_bytes().to_vec(), vec![b'v'; 300]);
    e.write(b, sync).unwrap();
}

/// 100 synced writes followed by one unsynced write, as a member's WAL ends after an apply.
fn store_with_unsynced_tail(dir: &Path) -> PathBuf {
    let e = RocksEngine::open_verified(dir).unwrap();
    for i in 0..100 {
        put(&e, &format!("synced{i:03}"), true);
    }
    put(&e, "unsynced", false);
    drop(e);
    newest_wal(dir)
}

#[test]
fn a_wal_cut_inside_its_last_record_opens_with_every_synced_write() {
    let dir = tempfile::tempdir().unwrap();
    let wal = store_with_unsynced_tail(dir.path());
    let bytes = std::fs::read(&wal).unwrap();
    let &(start, len) = wal_records(&bytes).last().expect("records");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len((start + len / 2) as u64)
        .unwrap();
    assert!(
        matches!(RocksEngine::open_verified(dir.path()), Err(OpenError::Corrupt { .. })),
        "strict recovery refuses the torn tail"
    );
    let (e, tolerated) = RocksEngine::open_verified_tolerating_torn_tail(dir.path()).unwrap();
    assert!(tolerated);
    assert!(e.get(Cf::Kv, b"synced099").unwrap().is_some(), "the last synced write survives");
    assert!(e.get(Cf::Kv, b"unsynced").unwrap().is_none(), "the torn write is dropped");
    drop(e);
    // The recovery rewrote the store: the next start is a strict one again.
    drop(RocksEngine::open_verified(dir.path()).unwrap());
}

#[test]
fn a_flipped_bit_in_an_earlier_record_still_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let wal = store_with_unsynced_tail(dir.path());
    let mut bytes = std::fs::read(&wal).unwrap();
    let records = wal_records(&bytes);
    let (start, len) = records[records.len() / 2];
    bytes[start + len - 10] ^= 0x04;
    std::fs::write(&wal, &bytes).unwrap();
    for res in [
        RocksEngine::open_verified(dir.path()).map(|e| (e, false)),
        RocksEngine::open_verified_tolerating_torn_tail(dir.path()),
    ] {
        match res {
            Err(OpenError::Corrupt { detail, .. }) => {
                assert!(detail.starts_with("Corruption"), "{detail}")
            }
            Err(e) => panic!("expected corruption, got {e}"),
            Ok(_) => panic!("a WAL with a bad record in the middle opened"),
        }
    }
}

#[test]
fn the_record_keeps_a_torn_slot_apart_and_is_lowered_before_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(ACKED_FILE);
    let r = AckedRecord::open(&path).unwrap();
    assert_eq!(r.current(), Acked::default());
    r.acked_log(10);
    r.acked_vote(2);
    r.flush().unwrap();
    r.acked_log(7); // Never goes backwards on its own.
    r.acked_log(12);
    r.flush().unwrap();
    assert_eq!(read_record(&path).unwrap().1, Acked { log_index: 12, vote_term: 2 });
    verify(&r, Some(12), Some(2)).unwrap();
    verify(&r, Some(15), Some(3)).unwrap();
    let e = verify(&r, Some(11), Some(2)).unwrap_err();
    assert!(e.to_string().contains("ends at index 11"), "{e}");
    assert!(verify(&r, Some(12), Some(1)).is_err());
    assert!(verify(&r, None, Some(2)).is_err());

    r.before_truncate(8).unwrap();
    assert_eq!(read_record(&path).unwrap().1.log_index, 8, "durable before returning");
    verify(&r, Some(8), Some(2)).unwrap();
    drop(r);

    // Tear the newest slot: the other one (one write older) is used.
    let (seq, _) = read_record(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let newest = SLOTS[(seq % 2) as usize] as usize;
    bytes[newest + 13] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let (older, acked) = read_record(&path).unwrap();
    // The other slot is the write before the newest: the flush of 12, or, when the background
    // writer (poked by `acked_log(12)`) ran after `before_truncate`, its rewrite of the lowered
    // 8. Either is a value this record really held, one sequence number older (CI once saw 8).
    assert_eq!(older, seq - 1);
    assert!([8, 12].contains(&acked.log_index), "older slot holds {acked:?}");
    // A missing file records nothing.
    assert_eq!(read_record(&dir.path().join("none")).unwrap(), (0, Acked::default()));
}

#[test]
fn the_writer_thread_catches_up_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(ACKED_FILE);
    let r = AckedRecord::open(&path).unwrap();
    r.acked_log(42);
    // Bounded wait for the background write (no timing assertion: only an upper bound).
    for _ in 0..200 {
        if read_record(&path).unwrap().1.log_index == 42 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the writer thread never recorded index 42");
}

/// A poke while the writer paces itself (between two writes) does not wake it, and must not be
/// lost: the writer records it once its interval is over.
#[test]
fn a_poke_while_the_writer_paces_itself_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(ACKED_FILE);
    let r = AckedRecord::open(&path).unwrap();
    let recorded = |index: u64| {
        // Bounded wait for the background write (no timing assertion: only an upper bound).
        for _ in 0..200 {
            if read_record(&path).unwrap().1.log_index == index {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    };
    for index in [5, 9, 12] {
        // Right after a write the writer sleeps `RECORD_INTERVAL`, so each poke but the first
        // lands while it paces.
        r.acked_log(index);
        assert!(recorded(index), "the writer thread never recorded index {index}");
    }
}
