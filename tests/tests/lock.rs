//! `v3lockpb.Lock` and `v3electionpb.Election` through the `etcd-client` crate: fencing tokens,
//! FIFO hand-off, waiters whose lease dies, cancelled waiters, and elections.

use std::time::Duration;

use anyhow::{Context, Result};
use etcd_client::{Client, GetOptions, LockOptions, ResignOptions, SortOrder, SortTarget};
use picket_tests::{Cluster, ClusterOptions};
use tokio::time::timeout;
use tracing::info;

/// Generous bound for anything that should happen "promptly" on a shared, noisy machine. It is a
/// liveness bound (the test fails instead of hanging), not a performance target.
const PROMPT: Duration = Duration::from_secs(15);

fn token_of(key: &[u8], kvs: &[etcd_client::KeyValue]) -> Option<i64> {
    kvs.iter().find(|kv| kv.key() == key).map(|kv| kv.create_revision())
}

async fn lock_with_lease(c: &mut Client, name: &str, ttl: i64) -> Result<(i64, Vec<u8>)> {
    let lease = c.lease_grant(ttl, None).await?.id();
    let resp = c.lock(name, Some(LockOptions::new().with_lease(lease))).await?;
    Ok((lease, resp.key().to_vec()))
}

/// Waits (at most [`PROMPT`]) until `key` exists under `prefix`: a waiter or candidate is
/// observed to be queued, not assumed to be after a sleep.
async fn key_appears(c: &Client, prefix: &str, key: String) -> Result<()> {
    let what = format!("{key} queued");
    picket_tests::util::eventually(&what, PROMPT, || {
        let (mut c, want) = (c.clone(), key.clone());
        async move {
            let r = c.get(prefix, Some(GetOptions::new().with_prefix())).await?;
            anyhow::ensure!(r.kvs().iter().any(|kv| kv.key() == want.as_bytes()), "not yet");
            Ok(())
        }
    })
    .await
}

#[tokio::test]
async fn lock_grants_in_fifo_order_with_increasing_fencing_tokens() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut c0 = cluster.client(0).await?;
    info!("first holder takes the lock; its key's create revision is the fencing token");
    let (_, k0) = lock_with_lease(&mut c0, "fifo", 30).await?;
    assert!(k0.starts_with(b"fifo/"), "lock key {k0:?} is <name>/<lease hex>");

    info!("three waiters queue up through different members, one after the other");
    let mut waiters = Vec::new();
    for i in 0..3usize {
        let mut c = cluster.client((i + 1) % 3).await?;
        let lease = c.lease_grant(30, None).await?.id();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle = tokio::spawn(async move {
            let r = c.lock("fifo", Some(LockOptions::new().with_lease(lease))).await;
            let _ = tx.send(());
            r.map(|r| r.key().to_vec())
        });
        // Wait until the waiter's key exists, so the queue order is the spawn order.
        let want = format!("fifo/{lease:x}").into_bytes();
        picket_tests::util::eventually("waiter key created", PROMPT, || {
            let mut c = c0.clone();
            let want = want.clone();
            async move {
                let r = c.get("fifo/", Some(GetOptions::new().with_prefix())).await?;
                anyhow::ensure!(r.kvs().iter().any(|kv| kv.key() == want.as_slice()));
                Ok(())
            }
        })
        .await?;
        waiters.push((handle, rx, want));
    }
    let all = c0.get("fifo/", Some(GetOptions::new().with_prefix())).await?;
    let mut tokens: Vec<i64> = std::iter::once(&k0)
        .chain(waiters.iter().map(|w| &w.2))
        .map(|k| token_of(k, all.kvs()).expect("key present"))
        .collect();
    let sorted = {
        let mut t = tokens.clone();
        t.sort_unstable();
        t
    };
    assert_eq!(tokens, sorted, "tokens grow in arrival order");

    info!("each unlock hands the lock to exactly the next waiter");
    let mut holder = k0;
    for (handle, mut done, key) in waiters {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            done.try_recv().is_err(),
            "waiter {key:?} must not get the lock while {holder:?} holds it"
        );
        c0.unlock(holder.clone()).await?;
        let got = timeout(PROMPT, handle).await.context("hand-off")???;
        assert_eq!(got, key);
        holder = got;
    }
    c0.unlock(holder).await?;
    tokens.clear();
    let left = c0.get("fifo/", Some(GetOptions::new().with_prefix().with_count_only())).await?;
    assert_eq!(left.count(), 0, "every lock key is gone after the last unlock");
    cluster.finish();
    Ok(())
}

/// Linearizable read rounds (`picket_server_read_index_rounds_total`, both labels) the member
/// at `endpoint` has started.
async fn read_rounds(http: &picket_tests::http::Http, endpoint: &str) -> Result<u64> {
    let mut n = 0;
    for via in ["local", "leader"] {
        n += http.labelled(endpoint, "picket_server_read_index_rounds_total", ("via", via)).await?;
    }
    Ok(n)
}

/// Issue 20: a waiter queues with one transaction that also reads the holder and its own
/// predecessor, and is granted from its member's applied state when the predecessor's delete
/// applies there, so a contended hand-off costs no linearizable read (it cost three: the
/// holder, the waiter's own key and its predecessor, each a read-index round).
#[tokio::test]
async fn a_queued_waiter_is_granted_without_a_linearizable_read() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let http = picket_tests::http::Http::new();
    let leader = cluster.leader().await?;
    // The waiter on one follower, everything else through the other, so the waiter's member
    // starts no read round for anyone but the waiter.
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (waiter_at, other) = (followers[0], followers[1]);
    let mut c = cluster.client(other).await?;
    let (_, holder) = lock_with_lease(&mut c, "handoff", 30).await?;
    let before = read_rounds(&http, &cluster.endpoint(waiter_at)).await?;

    info!("a waiter queues behind the holder through member {waiter_at}");
    let mut w = cluster.client(waiter_at).await?;
    let lease = w.lease_grant(30, None).await?.id();
    let waiting =
        tokio::spawn(
            async move { w.lock("handoff", Some(LockOptions::new().with_lease(lease))).await },
        );
    key_appears(&c, "handoff/", format!("handoff/{lease:x}")).await?;

    info!("the holder unlocks; the waiter gets the lock with a later fencing token");
    let held = c.get(holder.clone(), None).await?;
    let holder_token = token_of(&holder, held.kvs()).context("holder's key is gone")?;
    c.unlock(holder.clone()).await?;
    let granted = timeout(PROMPT, waiting).await.context("waiter not granted")???;
    assert_eq!(granted.key(), format!("handoff/{lease:x}").as_bytes());
    let got = c.get(granted.key(), None).await?;
    let token = token_of(granted.key(), got.kvs()).context("granted key is gone")?;
    let granted_at = granted.header().map(|h| h.revision()).unwrap_or_default();
    assert!(token > holder_token, "waiter's token {token} after the holder's {holder_token}");
    assert!(granted_at > token, "granted at revision {granted_at}, after its key ({token})");

    let rounds = read_rounds(&http, &cluster.endpoint(waiter_at)).await? - before;
    assert_eq!(rounds, 0, "the waiter's member started {rounds} read rounds for its hand-off");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn waiter_whose_lease_expires_gets_an_error_never_the_lock() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mut c = cluster.client(0).await?;
    let (holder_lease, holder_key) = lock_with_lease(&mut c, "dead-waiter", 30).await?;
    info!("a waiter with a short lease that nobody keeps alive");
    let waiter_lease = c.lease_grant(2, None).await?.id();
    let mut w = c.clone();
    let waiting = tokio::spawn(async move {
        w.lock("dead-waiter", Some(LockOptions::new().with_lease(waiter_lease))).await
    });
    let res = timeout(PROMPT, waiting).await.context("waiter must finish")??;
    let err = res.expect_err("a waiter whose lease expired must not be granted the lock");
    info!(error = %err, "waiter failed as expected");
    assert!(err.to_string().contains("deleted while waiting"), "unexpected error: {err}");
    info!("the holder still holds the lock and its key is the only one left");
    let keys = c.get("dead-waiter/", Some(GetOptions::new().with_prefix())).await?;
    let names: Vec<&[u8]> = keys.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(names, vec![holder_key.as_slice()]);
    c.lease_revoke(holder_lease).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn cancelled_waiter_removes_its_key_and_revoke_hands_off() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mut c = cluster.client(0).await?;
    let (holder_lease, _) = lock_with_lease(&mut c, "cancel", 30).await?;
    let lease = c.lease_grant(30, None).await?.id();
    let mut w = c.clone();
    info!("a waiter gives up (the RPC is dropped)");
    let r = timeout(
        Duration::from_millis(500),
        w.lock("cancel", Some(LockOptions::new().with_lease(lease))),
    )
    .await;
    assert!(r.is_err(), "the waiter cannot get a held lock");
    picket_tests::util::eventually("abandoned waiter key removed", PROMPT, || {
        let mut c = c.clone();
        async move {
            let r =
                c.get("cancel/", Some(GetOptions::new().with_prefix().with_count_only())).await?;
            anyhow::ensure!(r.count() == 1, "{} keys under cancel/", r.count());
            Ok(())
        }
    })
    .await?;
    info!("a new waiter is granted as soon as the holder's lease is revoked");
    let mut w = c.clone();
    let lease2 = c.lease_grant(30, None).await?.id();
    let waiting =
        tokio::spawn(
            async move { w.lock("cancel", Some(LockOptions::new().with_lease(lease2))).await },
        );
    // Observed, not assumed: the new waiter's key exists behind the holder's before the revoke,
    // so the grant below is a hand-off to a queued waiter, not a lock taken when free.
    key_appears(&c, "cancel/", format!("cancel/{lease2:x}")).await?;
    anyhow::ensure!(!waiting.is_finished(), "the waiter was granted a held lock");
    c.lease_revoke(holder_lease).await?;
    let got = timeout(PROMPT, waiting).await??.context("lock after revoke")?;
    let owner = c
        .get(
            "cancel/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
        .await?;
    assert_eq!(owner.kvs()[0].key(), got.key(), "the new holder is the oldest key");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn election_campaign_proclaim_observe_resign() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut a = cluster.client(0).await?;
    let mut b = cluster.client(1).await?;
    let la = a.lease_grant(30, None).await?.id();
    let lb = b.lease_grant(30, None).await?.id();
    let won = a.campaign("elect", "alpha", la).await?;
    let leader_a = won.leader().expect("leader key").clone();
    assert_eq!(leader_a.lease(), la);
    let l = b.leader("elect").await?;
    assert_eq!(l.kv().expect("kv").value(), b"alpha");

    info!("observe from a follower sees proclaims and the next leader");
    let mut observer = cluster.client(2).await?.observe("elect").await?;
    let first = timeout(PROMPT, observer.message()).await??.expect("observe message");
    assert_eq!(first.kv().expect("kv").value(), b"alpha");
    a.proclaim("alpha-2", Some(etcd_client::ProclaimOptions::new().with_leader(leader_a.clone())))
        .await?;
    let second = timeout(PROMPT, observer.message()).await??.expect("observe message");
    assert_eq!(second.kv().expect("kv").value(), b"alpha-2");

    let mut b2 = b.clone();
    let campaign_b = tokio::spawn(async move { b2.campaign("elect", "beta", lb).await });
    // Observed, not assumed: b's candidate key exists (b is queued behind a) before we check
    // that b has not won.
    key_appears(&a, "elect/", format!("elect/{lb:x}")).await?;
    assert!(!campaign_b.is_finished(), "b must wait while a leads");
    a.resign(Some(ResignOptions::new().with_leader(leader_a.clone()))).await?;
    let won_b = timeout(PROMPT, campaign_b).await???;
    assert!(won_b.leader().expect("leader").rev() > leader_a.rev());
    let third = timeout(PROMPT, observer.message()).await??.expect("observe message");
    assert_eq!(third.kv().expect("kv").value(), b"beta");

    info!("the deposed leader can no longer proclaim");
    let err = a
        .proclaim("stale", Some(etcd_client::ProclaimOptions::new().with_leader(leader_a)))
        .await
        .expect_err("a resigned leader cannot proclaim");
    assert!(err.to_string().contains("election: not leader"), "{err}");
    cluster.finish();
    Ok(())
}
