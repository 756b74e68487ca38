//! `picket.v1.Locks`: try-lock, bounded waits, inspection, CheckToken and fenced writes — the
//! safety net for a holder that was paused past its lease and wakes up believing it still holds
//! the lock.

use std::time::Duration;

use anyhow::Result;
use etcd_client::LockOptions;
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{PutRequest, RequestOp, TxnRequest};
use picket_proto::picket::v1::locks_client::LocksClient;
use picket_proto::picket::v1::{
    CheckTokenRequest, FencedTxnRequest, InspectRequest, LockRequest, TryLockRequest,
    WatchHoldRequest,
};
use picket_tests::{Cluster, ClusterOptions};
use tonic::transport::Channel;
use tonic::Code;
use tracing::info;

async fn locks(cluster: &Cluster, i: usize) -> Result<LocksClient<Channel>> {
    Ok(LocksClient::connect(cluster.endpoint(i)).await?)
}

fn put_txn(key: &str, value: &str) -> TxnRequest {
    TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestPut(PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn stale_holder_is_fenced_out_after_its_lease_expires() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut kv = cluster.client(0).await?;
    let mut l1 = locks(&cluster, 1).await?;
    info!("holder A takes the lock with a short lease and then 'pauses' (stops keeping it alive)");
    let lease_a = kv.lease_grant(2, None).await?.id();
    let a =
        l1.try_lock(TryLockRequest { name: b"acct".to_vec(), lease: lease_a }).await?.into_inner();
    assert!(a.acquired);
    let token_a = a.token;
    l1.fenced_txn(FencedTxnRequest {
        name: b"acct".to_vec(),
        token: token_a,
        txn: Some(put_txn("balance", "100")),
    })
    .await?;

    info!("B waits; A's lease expires; B is granted with a larger token");
    let lease_b = kv.lease_grant(30, None).await?.id();
    let b = kv.lock("acct", Some(LockOptions::new().with_lease(lease_b))).await?;
    let token_b = kv.get(b.key(), None).await?.kvs()[0].create_revision();
    assert!(token_b > token_a);

    info!("A wakes up and writes with its old token: rejected, naming the current token");
    let err = l1
        .fenced_txn(FencedTxnRequest {
            name: b"acct".to_vec(),
            token: token_a,
            txn: Some(put_txn("balance", "0")),
        })
        .await
        .expect_err("a stale token must be refused");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains(&format!("held with token {token_b}")), "{}", err.message());
    let balance = kv.get("balance", None).await?;
    assert_eq!(balance.kvs()[0].value(), b"100", "the stale write left no trace");

    info!("CheckToken agrees, from any member");
    let mut l2 = locks(&cluster, 2).await?;
    let old = l2
        .check_token(CheckTokenRequest { name: b"acct".to_vec(), token: token_a })
        .await?
        .into_inner();
    assert!(!old.current);
    assert_eq!(old.holder.as_ref().map(|h| h.token), Some(token_b));
    let cur = l2
        .check_token(CheckTokenRequest { name: b"acct".to_vec(), token: token_b })
        .await?
        .into_inner();
    assert!(cur.current);
    let ok = l2
        .fenced_txn(FencedTxnRequest {
            name: b"acct".to_vec(),
            token: token_b,
            txn: Some(put_txn("balance", "90")),
        })
        .await?
        .into_inner();
    assert!(ok.txn.expect("txn response").succeeded);

    info!("after release, even the last holder's token is refused");
    kv.unlock(b.key()).await?;
    let err = l2
        .fenced_txn(FencedTxnRequest {
            name: b"acct".to_vec(),
            token: token_b,
            txn: Some(put_txn("balance", "1")),
        })
        .await
        .expect_err("no holder");
    assert!(err.message().contains("is not held"), "{}", err.message());
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn try_lock_inspect_and_bounded_wait() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mut kv = cluster.client(0).await?;
    let mut l = locks(&cluster, 0).await?;
    let la = kv.lease_grant(30, None).await?.id();
    let lb = kv.lease_grant(30, None).await?.id();
    let lc = kv.lease_grant(30, None).await?.id();
    let a = l.try_lock(TryLockRequest { name: b"q".to_vec(), lease: la }).await?.into_inner();
    assert!(a.acquired);
    let b = l.try_lock(TryLockRequest { name: b"q".to_vec(), lease: lb }).await?.into_inner();
    assert!(!b.acquired, "held by A");
    let holder = b.holder.expect("holder reported");
    assert_eq!((holder.token, holder.lease), (a.token, la));
    assert!(holder.ttl > 0 && holder.ttl <= 30, "remaining ttl {}", holder.ttl);

    info!("a bounded wait times out and leaves nothing queued");
    let err = l
        .lock(LockRequest { name: b"q".to_vec(), lease: lb, wait_timeout_ms: 300 })
        .await
        .expect_err("held");
    assert_eq!(err.code(), Code::DeadlineExceeded);
    picket_tests::util::eventually("timed-out waiter removed", Duration::from_secs(10), || {
        let mut l = l.clone();
        async move {
            let i = l.inspect(InspectRequest { name: b"q".to_vec() }).await?.into_inner();
            anyhow::ensure!(i.waiters.is_empty(), "waiters: {:?}", i.waiters);
            Ok(())
        }
    })
    .await?;

    info!("two queued waiters are listed in grant order");
    let mut lb_client = l.clone();
    let wb = tokio::spawn(async move {
        lb_client.lock(LockRequest { name: b"q".to_vec(), lease: lb, wait_timeout_ms: 0 }).await
    });
    picket_tests::util::eventually("b queued", Duration::from_secs(10), || {
        let mut l = l.clone();
        async move {
            let i = l.inspect(InspectRequest { name: b"q".to_vec() }).await?.into_inner();
            anyhow::ensure!(i.waiters.len() == 1);
            Ok(())
        }
    })
    .await?;
    let mut lc_client = l.clone();
    let wc = tokio::spawn(async move {
        lc_client.lock(LockRequest { name: b"q".to_vec(), lease: lc, wait_timeout_ms: 0 }).await
    });
    let inspected = picket_tests::util::eventually("c queued", Duration::from_secs(10), || {
        let mut l = l.clone();
        async move {
            let i = l.inspect(InspectRequest { name: b"q".to_vec() }).await?.into_inner();
            anyhow::ensure!(i.waiters.len() == 2);
            Ok(i)
        }
    })
    .await?;
    assert_eq!(inspected.holder.as_ref().map(|h| h.lease), Some(la));
    let order: Vec<i64> = inspected.waiters.iter().map(|w| w.lease).collect();
    assert_eq!(order, vec![lb, lc]);
    assert!(inspected.waiters[0].token < inspected.waiters[1].token);
    kv.lease_revoke(la).await?;
    let got_b = tokio::time::timeout(Duration::from_secs(15), wb).await???.into_inner();
    assert_eq!(got_b.token, inspected.waiters[0].token);
    kv.lease_revoke(lb).await?;
    let got_c = tokio::time::timeout(Duration::from_secs(15), wc).await???.into_inner();
    assert_eq!(got_c.token, inspected.waiters[1].token);
    let err = l
        .try_lock(TryLockRequest { name: b"q".to_vec(), lease: 0 })
        .await
        .expect_err("lease required");
    assert_eq!(err.code(), Code::InvalidArgument);
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn holder_is_told_at_once_when_its_lease_expires() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut kv = cluster.client(0).await?;
    let mut l = locks(&cluster, 2).await?;
    let lease = kv.lease_grant(2, None).await?.id();
    let got = l.try_lock(TryLockRequest { name: b"hold".to_vec(), lease }).await?.into_inner();
    assert!(got.acquired);
    let mut states = l
        .watch_hold(WatchHoldRequest { name: b"hold".to_vec(), token: got.token })
        .await?
        .into_inner();
    let first = states.message().await?.expect("first state");
    assert!(first.held);
    info!("nobody keeps the lease alive: the holder hears it lost the lock");
    // Liveness bound: a 2 s lease expires within 2 s plus one expiry tick and a commit; 20 s
    // only keeps a broken server from hanging the test.
    let lost = tokio::time::timeout(Duration::from_secs(20), states.message())
        .await??
        .expect("lost state");
    assert!(!lost.held);
    let keys = kv
        .get("hold/", Some(etcd_client::GetOptions::new().with_prefix().with_count_only()))
        .await?;
    assert_eq!(keys.count(), 0, "the lock key is gone once the holder is told");
    assert!(states.message().await?.is_none(), "the stream ends after the loss");
    cluster.finish();
    Ok(())
}

/// One hold of the lock, timed on the test's monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Hold {
    token: i64,
    /// When the lock's answer reached the holder.
    granted: tokio::time::Instant,
    /// When the holder sent its unlock.
    release_sent: tokio::time::Instant,
    /// When the unlock's answer reached the holder.
    released: tokio::time::Instant,
}

/// Holds in token order, checked for overlap: each hold must begin (its grant answered) no
/// earlier than the previous holder sent its unlock. The whole critical section is covered, from
/// the grant's answer through the unlock's answer: a later grant may be answered while the
/// previous unlock's answer is still on its way (both follow the same applied delete), but never
/// before that unlock was sent. Tokens must increase in that order too.
fn check_holds(mut holds: Vec<Hold>) -> std::result::Result<(), String> {
    holds.sort_by_key(|h| h.token);
    for w in holds.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.token == b.token {
            return Err(format!("token {} granted twice", a.token));
        }
        if b.granted < a.release_sent {
            return Err(format!(
                "two holders at once: token {} granted {:?} before token {} sent its unlock",
                b.token,
                a.release_sent - b.granted,
                a.token
            ));
        }
        if b.granted < a.granted {
            return Err(format!("token {} granted before the smaller {}", b.token, a.token));
        }
        debug_assert!(a.released >= a.release_sent);
    }
    Ok(())
}

#[test]
fn the_overlap_checker_catches_overlapping_holds() {
    let t0 = tokio::time::Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let hold =
        |token, g, s, r| Hold { token, granted: ms(g), release_sent: ms(s), released: ms(r) };
    // Back to back, and a grant answered before the previous unlock's answer: fine.
    assert!(check_holds(vec![hold(5, 0, 10, 12), hold(7, 11, 20, 21)]).is_ok());
    // Granted while the previous holder was still inside its critical section.
    assert!(check_holds(vec![hold(5, 0, 10, 12), hold(7, 9, 20, 21)]).is_err());
    // A larger token granted first.
    assert!(check_holds(vec![hold(7, 0, 10, 12), hold(5, 11, 20, 21)]).is_err());
}

#[tokio::test]
async fn contenders_never_overlap_and_tokens_increase() -> Result<()> {
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let holds = Arc::new(Mutex::new(Vec::<Hold>::new()));
    let mut tasks = Vec::new();
    for i in 0..4usize {
        let mut c = cluster.client(i % 3).await?;
        let holds = holds.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let lease = c.lease_grant(30, None).await?.id();
                let held = c.lock("shared", Some(LockOptions::new().with_lease(lease))).await?;
                let granted = Instant::now();
                // The critical section: a read of the token, a short stay, then the unlock.
                let token = c.get(held.key(), None).await?.kvs()[0].create_revision();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let release_sent = Instant::now();
                c.unlock(held.key()).await?;
                let released = Instant::now();
                holds.lock().expect("holds").push(Hold { token, granted, release_sent, released });
                c.lease_revoke(lease).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await???;
    }
    let holds = holds.lock().expect("holds").clone();
    assert_eq!(holds.len(), 20);
    if let Err(e) = check_holds(holds.clone()) {
        panic!("{e}: {holds:#?}");
    }
    cluster.finish();
    Ok(())
}
