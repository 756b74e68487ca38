//! The client against three real members that are killed and paused under it: failover,
//! watch resumption, session loss and fenced locks.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use picket_client::{Client, Error, LostReason, Session, WatchOptions};
use picket_tests::{eventually, Cluster, ClusterOptions};

/// The index of the member whose client URL is `url`.
fn member_of(cluster: &Cluster, url: &str) -> Result<usize> {
    (0..cluster.len())
        .find(|&i| cluster.endpoint(i) == url)
        .with_context(|| format!("{url} is not a member's endpoint"))
}

/// Writes `w/<seq>` for seq in `range`, returning the acknowledged (key, revision) pairs and
/// how many outcomes were unknown. Never retries a write whose outcome is unknown.
async fn write_range(
    c: &Client,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> (Vec<(String, i64)>, usize) {
    let mut acked = Vec::new();
    let mut unknown = 0;
    for seq in range {
        let key = format!("{prefix}{seq:05}");
        match c.put(key.clone(), format!("v{seq}")).await {
            Ok(r) => acked.push((key, r.header.map(|h| h.revision).unwrap_or(0))),
            Err(e) if e.is_outcome_unknown() => unknown += 1,
            // Unavailable: certainly not applied.
            Err(_) => {}
        }
    }
    (acked, unknown)
}

#[tokio::test]
async fn failover_when_the_endpoint_in_use_is_killed() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = common::connect(cluster.endpoints()).await?;
    let (mut acked, _) = write_range(&c, "f/", 0..20).await;
    ensure!(acked.len() == 20, "all writes succeed before the fault");

    let victim = member_of(&cluster, &c.current_endpoint())?;
    cluster.kill(victim)?;
    // Writes go on: some may fail or be unknown around the kill, then they succeed again.
    let (more, unknown) = write_range(&c, "f/", 20..120).await;
    ensure!(
        more.len() >= 50,
        "only {} of 100 writes succeeded after the kill ({unknown} unknown)",
        more.len()
    );
    ensure!(c.current_endpoint() != cluster.endpoint(victim), "client moved off the dead member");
    acked.extend(more);

    // Reads fail over too, and see every acknowledged write.
    let kvs = c.get_prefix("f/").await?;
    let present: BTreeSet<(String, i64)> = kvs
        .into_iter()
        .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), kv.mod_revision))
        .collect();
    for w in &acked {
        ensure!(present.contains(w), "acknowledged write {w:?} lost");
    }
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn watch_resumes_across_a_kill_without_gap_or_duplicate() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let watcher = common::connect(cluster.endpoints()).await?;
    let mut watch = watcher.watch("wr/", WatchOptions::new().prefix()).await?;
    let victim = member_of(&cluster, &watcher.current_endpoint())?;
    let others: Vec<String> =
        (0..3).filter(|&i| i != victim).map(|i| cluster.endpoint(i)).collect();
    let writer = common::connect(others).await?;

    let (mut acked, _) = write_range(&writer, "wr/", 0..50).await;
    cluster.kill(victim)?;
    let (more, _) = write_range(&writer, "wr/", 50..150).await;
    acked.extend(more);
    ensure!(acked.len() >= 100, "writes continue on the majority");

    // The final state: every key written exactly once, so its mod revision is its only event.
    let want: Vec<i64> = {
        let mut revs: Vec<i64> =
            writer.get_prefix("wr/").await?.iter().map(|kv| kv.mod_revision).collect();
        revs.sort_unstable();
        revs
    };
    let mut got = Vec::new();
    while got.len() < want.len() {
        let batch = common::next_batch(&mut watch)
            .await
            .with_context(|| format!("after {} of {} events", got.len(), want.len()))?;
        got.extend(batch.events.iter().filter_map(|e| e.kv.as_ref().map(|kv| kv.mod_revision)));
    }
    ensure!(
        got == want,
        "events differ from history: got {} events, want {}",
        got.len(),
        want.len()
    );
    ensure!(watcher.current_endpoint() != cluster.endpoint(victim));
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn session_survives_its_endpoint_and_is_lost_when_the_cluster_is() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = common::connect(cluster.endpoints()).await?;
    let session = Session::new(&c, 10).await?;

    // Its endpoint freezes (SIGSTOP): keep-alives move to another member in time.
    let first = member_of(&cluster, &c.current_endpoint())?;
    cluster.pause(first)?;
    let survived = tokio::time::timeout(Duration::from_secs(15), session.lost()).await;
    ensure!(survived.is_err(), "session lost although two members were up: {survived:?}");
    let ttl = c.lease_time_to_live(session.lease_id(), false).await?;
    ensure!(ttl.ttl > 0, "lease alive on the cluster: {ttl:?}");

    // Every member freezes: no keep-alive can succeed, and the session says so before the
    // lease's earliest server-side expiry.
    for i in 0..3 {
        if i != first {
            cluster.pause(i)?;
        }
    }
    let reason = tokio::time::timeout(Duration::from_secs(20), session.lost())
        .await
        .context("session not lost with every member paused")?;
    ensure!(reason == LostReason::KeepAliveDeadline, "{reason:?}");
    for i in 0..3 {
        cluster.resume(i)?;
    }
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn with_lock_never_lets_two_holders_act_on_a_fenced_resource() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = common::connect(cluster.endpoints()).await?;
    c.put("bank/counter", "0").await?;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let c = c.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for round in 0..5 {
                let c2 = c.clone();
                // The lock's name must not prefix the data: every key under "<name>/" is a
                // contender, so the counter lives outside "bank-lock/".
                let attempt = c.with_lock("bank-lock", move |fence| async move {
                    let n: i64 = match c2.get("bank/counter").await? {
                        Some(kv) => String::from_utf8_lossy(&kv.value).parse().unwrap_or(-1),
                        None => bail!("counter missing"),
                    };
                    if worker == 0 && round == 2 {
                        // This holder "pauses past its lease": the lease is revoked before
                        // it writes, and the lock moves on.
                        let hex = String::from_utf8_lossy(&fence.key)
                            .rsplit('/')
                            .next()
                            .unwrap_or("")
                            .to_string();
                        let lease = i64::from_str_radix(&hex, 16)?;
                        c2.lease_revoke(lease).await?;
                    }
                    c2.fenced_put(&fence, "bank/counter", (n + 1).to_string()).await?;
                    Ok(())
                });
                // Bounded: 20 rounds of short critical sections finish in seconds; a hang is a bug.
                let r = tokio::time::timeout(Duration::from_secs(60), attempt)
                    .await
                    .context("with_lock did not finish within 60 s")?;
                match r {
                    Ok(Ok(())) => {
                        done.fetch_add(1, Ordering::SeqCst);
                        outcomes.push("ok");
                    }
                    Ok(Err(e)) => match e.downcast_ref::<Error>() {
                        Some(Error::Fenced(_)) => outcomes.push("fenced"),
                        _ => return Err(e),
                    },
                    Err(Error::LockLost { .. }) => outcomes.push("lost"),
                    Err(e) => return Err(e.into()),
                }
            }
            Ok::<_, anyhow::Error>(outcomes)
        }));
    }
    let mut refused = 0;
    for t in tasks {
        let outcomes = t.await??;
        refused += outcomes.iter().filter(|o| **o != "ok").count();
    }
    ensure!(refused == 1, "exactly the revoked holder is refused, got {refused}");
    let counter = eventually("read counter", Duration::from_secs(5), || async {
        c.get("bank/counter").await?.context("counter")
    })
    .await?;
    let n: usize = String::from_utf8_lossy(&counter.value).parse()?;
    ensure!(
        n == done.load(Ordering::SeqCst),
        "counter {n} != {} successful increments",
        done.load(Ordering::SeqCst)
    );
    ensure!(n == 19);
    cluster.finish();
    Ok(())
}
