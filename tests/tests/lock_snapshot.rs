//! A lock waiter on a member that catches up by snapshot is granted the lock (issue 19, High #2).
//!
//! The waiter's call runs inside its member's server and waits on that member's applied-event
//! feed for its predecessor's delete. If the member was behind when the holder released, and the
//! leader purged the log past the release, the member installs a snapshot and never applies (or
//! publishes) the delete. Before the fix the waiter then waited until its own lease ran out.
//! The in-process reproduction is `server/tests/wake_after_snapshot.rs`; this runs the same story
//! on real processes, with a member SIGSTOPped as in a long GC pause.

use std::time::Duration;

use anyhow::{Context, Result};
use etcd_client::{GetOptions, LockOptions};
use picket_tests::{Cluster, ClusterOptions};
use tokio::time::timeout;
use tracing::info;

/// Liveness bound for the hand-off after the member resumes (the test fails instead of hanging).
const PROMPT: Duration = Duration::from_secs(15);

/// Entries between snapshots: the writes below pass several, so the leader purges its log past
/// the release and the paused member can only catch up by installing a snapshot.
const SNAPSHOT_COUNT: u64 = 50;
const WRITES_WHILE_PAUSED: usize = 300;
/// Bound on the extra rounds of writes (50 puts each) until the leader sends the paused member
/// a snapshot.
const SEND_ROUNDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_on_a_member_that_installs_a_snapshot_is_granted() -> Result<()> {
    picket_tests::init_tracing();
    let mut cluster =
        Cluster::start(3, ClusterOptions::default().snapshot_count(SNAPSHOT_COUNT)).await?;
    let leader = cluster.leader().await?;
    let lagger = (leader + 1) % 3;
    let mut c = cluster.client(leader).await?;

    info!("a holder takes the lock through the leader");
    let holder_lease = c.lease_grant(60, None).await?.id();
    let held = c.lock("snap-lk", Some(LockOptions::new().with_lease(holder_lease))).await?;
    let held_key = held.key().to_vec();

    info!(member = cluster.name(lagger), "a waiter queues through the member that will lag");
    // The waiter's call stays open across the pause, so its client allows much longer than the
    // harness default; the test's own bound is PROMPT after the resume. Its lease outlives the
    // whole test without keep-alives, so only a missed wake-up can keep it waiting.
    let mut w =
        picket_tests::cluster::connect(&cluster.endpoint(lagger), Duration::from_secs(120)).await?;
    let waiter_lease = w.lease_grant(120, None).await?.id();
    let waiter_key = format!("snap-lk/{waiter_lease:x}");
    let waiting = tokio::spawn(async move {
        w.lock("snap-lk", Some(LockOptions::new().with_lease(waiter_lease))).await
    });
    picket_tests::eventually("waiter queued", PROMPT, || {
        let (mut c, want) = (c.clone(), waiter_key.clone());
        async move {
            let r = c.get("snap-lk/", Some(GetOptions::new().with_prefix())).await?;
            anyhow::ensure!(r.kvs().iter().any(|kv| kv.key() == want.as_bytes()), "not yet");
            Ok(())
        }
    })
    .await?;
    // After its key commits, the waiter makes three reads on its member and then waits on the
    // feed; they take milliseconds. Should they not have run before the pause, the waiter reads
    // the caught-up state after the resume: the test can then pass on broken code, never fail
    // on correct code.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "the waiter must be queued behind the holder");

    info!(member = cluster.name(lagger), "SIGSTOP the waiter's member; release and write on");
    // The release must not reach the member before it resumes, or it applies the release from
    // its log and the test would not exercise the install. Before this guard the waiter was
    // granted before "installing snapshot" was logged: 4 runs in 16 when the release followed
    // SIGSTOP at once, and after a small write before the release (a session that times out is
    // opened again, and its first request carries the release) 5 runs of 11 on f394965. With
    // the full window, 15 runs of 15 took the install path (5 of them beside three busy loops).
    cluster.pause_behind_a_full_window(lagger, &mut c).await?;
    c.unlock(held_key).await.context("unlock")?;
    for i in 0..WRITES_WHILE_PAUSED {
        c.put(format!("filler/{:03}", i % 100), format!("v{i}"), None)
            .await
            .with_context(|| format!("put #{i}"))?;
    }
    // The member can only catch up by snapshot once the leader has purged its log past it,
    // and the leader then starts sending it one. The writes above usually get there, but
    // openraft postpones a purge while a replication request covers the entries (one to the
    // paused member can be in flight), so write on, bounded, until the send shows in the
    // leader's log. (A purge past a fixed index was the signal before; since builds wait for
    // a send in flight, `raft::snapshot_pace`, the purge can stop short of it for a whole
    // chunk timeout.)
    let peer = format!("peer={}", cluster.member_id(lagger).context("the member's id")?);
    for round in 0..SEND_ROUNDS {
        if cluster.log_lines(leader, &["sending snapshot", &peer])? > 0 {
            break;
        }
        anyhow::ensure!(round + 1 < SEND_ROUNDS, "the leader never sent the member a snapshot");
        for i in 0..50 {
            c.put(format!("filler/{:03}", i), format!("r{round}"), None).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    info!(member = cluster.name(lagger), "SIGCONT: it must install a snapshot and wake the waiter");
    cluster.resume(lagger)?;
    let granted = timeout(PROMPT, waiting)
        .await
        .context("the waiter was not granted after its member caught up by snapshot")?
        .context("waiter task")?
        .context("lock")?;
    assert_eq!(granted.key(), format!("snap-lk/{waiter_lease:x}").as_bytes());
    assert!(
        cluster.log_lines(lagger, &["installing snapshot"])? > 0,
        "{} caught up without a snapshot: the test did not exercise the install",
        cluster.name(lagger)
    );
    c.lease_revoke(holder_lease).await?;
    c.lease_revoke(waiter_lease).await?;
    cluster.finish();
    Ok(())
}
