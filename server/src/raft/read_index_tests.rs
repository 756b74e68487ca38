//! The batcher against a fake source whose "commit index" moves while reads are in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt;

use super::*;

/// A fake leader: `commit` is bumped by a concurrent writer; a round reads it when it starts
/// and answers after a short delay (the heartbeat round trip). `fail_round` makes one round
/// fail, to check that errors reach every caller of that round and only them.
#[derive(Default)]
struct Fake {
    commit: Arc<AtomicU64>,
    applied: Arc<AtomicU64>,
    started: Arc<AtomicU64>,
    fail_round: u64,
}

impl ReadIndexSource for Fake {
    fn confirm(&self) -> BoxFuture<'static, Result<u64, ProposeError>> {
        let round = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        // Read the commit index when the round starts, as openraft's leader does.
        let index = self.commit.load(Ordering::SeqCst);
        let fail = round == self.fail_round;
        async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            if fail {
                Err(ProposeError::NoLeader)
            } else {
                Ok(index)
            }
        }
        .boxed()
    }

    fn applied(&self, index: u64) -> bool {
        self.applied.load(Ordering::SeqCst) >= index
    }

    fn wait_applied(&self, index: u64) -> BoxFuture<'static, Result<(), ProposeError>> {
        let applied = self.applied.clone();
        async move {
            // Bounded: the test's applier reaches every index within a few milliseconds.
            for _ in 0..1000 {
                if applied.load(Ordering::SeqCst) >= index {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(ProposeError::Timeout)
        }
        .boxed()
    }
}

/// Every caller gets a read index at least the commit index it saw when it arrived (nothing
/// committed before a read arrived is missed), and concurrent callers share rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_never_serves_a_caller_that_arrived_after_it_started() {
    let fake = Fake::default();
    let commit = fake.commit.clone();
    let applied = fake.applied.clone();
    let batcher = ReadIndexBatcher::new(fake);
    // A writer that commits and (a little later) applies, concurrently with the readers.
    let writer = tokio::spawn(async move {
        for _ in 0..400 {
            let i = commit.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_micros(200)).await;
            applied.store(i, Ordering::SeqCst);
        }
    });
    let mut readers = Vec::new();
    for _ in 0..64 {
        let b = batcher.clone();
        let commit = batcher.shared.source.commit.clone();
        let applied = batcher.shared.source.applied.clone();
        readers.push(tokio::spawn(async move {
            for _ in 0..20 {
                let seen = commit.load(Ordering::SeqCst);
                let index = b.read_index().await.expect("no round fails in this test");
                assert!(index >= seen, "read index {index} below commit {seen} seen on arrival");
                assert!(applied.load(Ordering::SeqCst) >= index, "answered before apply");
            }
        }));
    }
    for r in readers {
        r.await.expect("reader panicked");
    }
    writer.await.expect("writer panicked");
    let rounds = batcher.rounds();
    assert!(rounds < 64 * 20, "{rounds} rounds for {} reads: nothing was batched", 64 * 20);
}

#[tokio::test]
async fn a_failed_round_fails_its_callers_and_the_next_round_recovers() {
    let batcher = ReadIndexBatcher::new(Fake { fail_round: 1, ..Fake::default() });
    let first: Vec<_> = (0..8)
        .map(|_| {
            let b = batcher.clone();
            tokio::spawn(async move { b.read_index().await })
        })
        .collect();
    let mut failed = 0;
    for f in first {
        match f.await.expect("caller panicked") {
            Err(ProposeError::NoLeader) => failed += 1,
            Ok(_) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    // The first caller certainly rode round 1; later ones may have ridden round 2.
    assert!(failed >= 1);
    assert_eq!(batcher.read_index().await.expect("round after the failed one"), 0);
}

#[tokio::test]
async fn a_caller_that_gives_up_does_not_cancel_the_round() {
    let batcher = ReadIndexBatcher::new(Fake::default());
    let impatient = batcher.clone();
    // Dropped right after it queued and started the driver.
    let _ = tokio::time::timeout(Duration::from_micros(1), impatient.read_index()).await;
    assert_eq!(batcher.read_index().await.expect("later caller"), 0);
}
