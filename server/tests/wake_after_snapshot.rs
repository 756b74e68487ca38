//! Lock waiters, lock-loss watchers and election observers learn of a change that reached their
//! member inside a snapshot (issue 19, High #2).
//!
//! A lagging member catches up by installing a snapshot instead of applying the entries it
//! missed, so no events are published for them. The concurrency recipes wait on this member's
//! applied-event feed for one particular delete; when that delete arrives inside a snapshot they
//! must still wake and re-read, or a waiter is never told it holds the lock (and everyone behind
//! it waits as long as its client keeps the lease alive).
//!
//! The tier: two real state machines (`ahead`, the leader's, and `lag`, the waiter's member) over
//! RocksDB, fed the same entries until `lag` is paused, then caught up with a snapshot built by
//! `ahead`, exactly what openraft does for a follower whose log was purged. The concurrency code
//! runs unchanged against `lag` through the same `Backend` trait the gRPC services use.

use std::sync::Arc;
use std::time::Duration;

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use picket_proto::etcdserverpb::range_request::SortOrder;
use picket_proto::etcdserverpb::{
    LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RaftCommand;
use picket_proto::v3electionpb::LeaderKey;
use picket_server::concurrency::{contender_key, election, mutex, Backend, StoreError};
use picket_server::raft::types::log_id;
use picket_server::raft::types::{Command, Entry};
use picket_server::storage::rocks::RocksEngine;
use picket_server::storage::state_machine::{FeedItem, StateMachine};
use tokio::sync::{broadcast, watch, Mutex};
use tokio::time::timeout;

/// How long a wake-up may take. Everything is in memory and in process, so this is a liveness
/// bound (the test fails instead of hanging), not a performance target.
const PROMPT: Duration = Duration::from_secs(5);

const HOLDER: i64 = 0x11;
const WAITER: i64 = 0x22;

struct Members {
    ahead: StateMachine,
    lag: StateMachine,
    /// The last log index handed to `ahead` (and, while not paused, to `lag`).
    index: u64,
    paused: bool,
}

/// The store as the concurrency code on the lagging member sees it: writes are "replicated" to
/// both state machines (only to `ahead` while `lag` is paused); reads and the event feed are
/// `lag`'s own, as on a real member whose reads have caught up to what it applied.
#[derive(Clone)]
struct TwoMembers {
    members: Arc<Mutex<Members>>,
    lag: StateMachine,
    /// Counts reads served, so a test knows a waiter has read and is now waiting on its feed.
    reads: Arc<watch::Sender<u64>>,
    _dirs: Arc<[tempfile::TempDir; 2]>,
}

fn open(dir: &tempfile::TempDir) -> StateMachine {
    let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
    StateMachine::open(engine, dir.path().join("snapshots")).expect("open state machine")
}

impl TwoMembers {
    fn new() -> Self {
        let dirs = [tempfile::TempDir::new().expect("dir"), tempfile::TempDir::new().expect("dir")];
        let (ahead, lag) = (open(&dirs[0]), open(&dirs[1]));
        Self {
            members: Arc::new(Mutex::new(Members {
                ahead,
                lag: lag.clone(),
                index: 0,
                paused: false,
            })),
            lag,
            reads: Arc::new(watch::channel(0).0),
            _dirs: Arc::new(dirs),
        }
    }

    /// Commits `cmd` as the next entry; returns `lag`'s result, or `ahead`'s while paused.
    async fn apply(&self, cmd: Cmd) -> CmdResult {
        let mut m = self.members.lock().await;
        m.index += 1;
        let entry = Entry {
            log_id: log_id(1, 1, m.index),
            payload: EntryPayload::Normal(Command::new(RaftCommand {
                cmd: Some(cmd),
                forwarded: None,
            })),
        };
        let mut out = m.ahead.apply_entries(vec![entry.clone()]).expect("apply on ahead");
        if !m.paused {
            out = m.lag.apply_entries(vec![entry]).expect("apply on lag");
        }
        out.pop().and_then(|a| a.0.result).expect("one result")
    }

    /// From now on `lag` misses entries (a member stopped or cut off).
    async fn pause(&self) {
        self.members.lock().await.paused = true;
    }

    /// Catches `lag` up by installing a snapshot of `ahead`, as openraft does for a follower
    /// behind the leader's purged log.
    async fn install_snapshot(&self) {
        let mut m = self.members.lock().await;
        let mut builder = m.ahead.get_snapshot_builder().await;
        let snap = builder.build_snapshot().await.expect("build snapshot");
        let mut lag = m.lag.clone();
        lag.install_snapshot(&snap.meta, snap.snapshot).await.expect("install snapshot");
        m.paused = false;
    }

    async fn grant(&self, id: i64) {
        let r = self.apply(Cmd::LeaseGrant(LeaseGrantRequest { ttl: 60, id })).await;
        assert!(matches!(r, CmdResult::LeaseGrant(_)), "{r:?}");
    }

    async fn put(&self, key: &[u8], lease: i64) {
        let req =
            PutRequest { key: key.to_vec(), value: b"v".to_vec(), lease, ..Default::default() };
        let r = self.apply(Cmd::Put(req)).await;
        assert!(matches!(r, CmdResult::Put(_)), "{r:?}");
    }

    /// Waits until at least `n` reads have been served.
    async fn reads_reach(&self, n: u64) {
        let mut rx = self.reads.subscribe();
        timeout(PROMPT, rx.wait_for(|r| *r >= n)).await.expect("reads").expect("reads");
    }

    /// Waits (at most [`PROMPT`]) until `key` is in `lag`'s applied state, without counting
    /// as a read.
    async fn key_applied(&self, key: &[u8]) {
        let req = RangeRequest { key: key.to_vec(), ..Default::default() };
        let found = async {
            // Bounded by the timeout around it; each pass is an in-memory read.
            loop {
                let r = self.lag.shared().with_store(|s| s.range(&req)).expect("range");
                if !r.kvs.is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        timeout(PROMPT, found).await.expect("the key was never applied");
    }

    fn reads(&self) -> u64 {
        *self.reads.borrow()
    }
}

impl Backend for TwoMembers {
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, StoreError> {
        match self.apply(Cmd::Txn(req)).await {
            CmdResult::Txn(r) => Ok(r),
            other => Err(StoreError::Backend(format!("txn: {other:?}").into())),
        }
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse, StoreError> {
        let r = self
            .lag
            .shared()
            .with_store(|s| s.range(&req))
            .map_err(|e| StoreError::Backend(Box::new(e)));
        self.reads.send_modify(|n| *n += 1);
        r
    }

    fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        self.lag.shared().subscribe()
    }
}

#[tokio::test]
async fn lock_waiter_is_granted_when_the_release_arrives_in_a_snapshot() {
    let b = TwoMembers::new();
    b.grant(HOLDER).await;
    b.grant(WAITER).await;
    let held = mutex::lock(&b, b"lk", HOLDER).await.expect("first lock");

    // The waiter subscribes to the feed before its queueing transaction, which also reads its
    // predecessor, so once its key is applied it is waiting (or about to, with every later
    // revision and the snapshot install in its feed) without another read.
    let before = b.reads();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { mutex::lock(&b, b"lk", WAITER).await }
    });
    b.key_applied(&contender_key(b"lk", WAITER)).await;
    assert!(!waiter.is_finished(), "the waiter must queue behind the holder");
    assert_eq!(b.reads(), before, "the waiter waits on what its transaction read");

    // The member falls behind; the holder releases and the member learns of it only through a
    // snapshot.
    b.pause().await;
    mutex::unlock(&b, &held.key).await.expect("unlock");
    b.put(b"unrelated", 0).await;
    b.install_snapshot().await;

    let grant = timeout(PROMPT, waiter)
        .await
        .expect("the waiter was not granted after the release arrived in a snapshot install")
        .expect("task")
        .expect("lock");
    assert_eq!(grant.key, contender_key(b"lk", WAITER));
    assert!(grant.token > held.token, "tokens grow: {} after {}", grant.token, held.token);
}

#[tokio::test]
async fn holder_learns_of_its_loss_when_the_delete_arrives_in_a_snapshot() {
    let b = TwoMembers::new();
    b.grant(HOLDER).await;
    let held = mutex::lock(&b, b"lk", HOLDER).await.expect("lock");

    let before = b.reads();
    let lost = tokio::spawn({
        let b = b.clone();
        async move { mutex::wait_lost(&b, b"lk", held.token).await }
    });
    // One read (the holder) and it waits on the feed.
    b.reads_reach(before + 1).await;
    assert!(!lost.is_finished(), "still the holder");

    b.pause().await;
    mutex::unlock(&b, &held.key).await.expect("unlock");
    b.install_snapshot().await;

    let (holder, _) = timeout(PROMPT, lost)
        .await
        .expect("the holder was not told it lost the lock after a snapshot install")
        .expect("task")
        .expect("wait_lost");
    assert_eq!(holder, None, "nobody holds the lock now");
}

#[tokio::test]
async fn observer_sees_the_new_leader_when_the_change_arrives_in_a_snapshot() {
    let b = TwoMembers::new();
    b.grant(HOLDER).await;
    b.grant(WAITER).await;
    let (leader, _) = election::campaign(&b, b"el", HOLDER, b"a").await.expect("campaign");
    // A second candidate's key, queued behind the leader.
    b.put(&contender_key(b"el", WAITER), WAITER).await;

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<KeyValue>();
    let observer = tokio::spawn({
        let b = b.clone();
        async move { election::observe(&b, b"el", move |kv, _| tx.send(kv).is_ok()).await }
    });
    let first = timeout(PROMPT, rx.recv()).await.expect("first leader").expect("observer ended");
    assert_eq!(first.key, leader.key);

    b.pause().await;
    resign(&b, &leader).await;
    b.install_snapshot().await;

    let next = timeout(PROMPT, rx.recv())
        .await
        .expect("the observer kept the old leader after a snapshot install")
        .expect("observer ended");
    assert_eq!(next.key, contender_key(b"el", WAITER));
    observer.abort();
}

async fn resign(b: &TwoMembers, leader: &LeaderKey) {
    election::resign(b, leader).await.expect("resign");
    // The resign went only to `ahead`: the lagging member still shows the old leader.
    let mut req = RangeRequest { key: leader.key.clone(), ..Default::default() };
    req.sort_order = SortOrder::None as i32;
    let still = b.lag.shared().with_store(|s| s.range(&req)).expect("local read");
    assert_eq!(still.kvs.len(), 1, "the lagging member has not applied the resign");
}
