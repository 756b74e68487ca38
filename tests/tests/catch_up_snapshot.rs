//! A follower that catches up by snapshot while writes go on installs one snapshot, then takes
//! the rest from the log.
//!
//! After a build, a member purges its log up to the snapshot minus the catch-up entries it
//! keeps. openraft keeps the log a replication request is reading, but not the log a follower
//! in the middle of a snapshot transfer will ask for next: it installs snapshot S and then needs
//! S + 1. When the leader built and purged past that during the transfer, it sent another
//! snapshot, and with a large store under steady writes (transfer time x write rate above the
//! kept log) a follower could install snapshot after snapshot without ever catching up (seen
//! in session 29's long runs: a member installed 4-11 snapshots).
//!
//! A member that resumes after a pause must also keep its peer connections: the leader's calls
//! that timed out meanwhile each reset a stream, and past h2's default of 20 such streams the
//! resumed member closed the connection, and the transfer on it failed.
//!
//! Here the transfer is held open by SIGSTOPping the follower (its first chunk waits for the
//! window and an answer) while the leader writes through several snapshot intervals. The
//! election timeout is longer than the pause: a member resumed after one campaigns at once, and
//! its higher term in the answer to the chunk deposes the leader (the transfer is then refused,
//! and the new term's leader sends a snapshot of its own), which is another story than this
//! test's.

use std::time::Duration;

use anyhow::{Context, Result};
use etcd_client::GetOptions;
use picket_tests::{Cluster, ClusterOptions};
use tracing::info;

/// Heartbeat and election timeout (ms): the pause below lasts a few seconds; a follower
/// campaigns 1.25-1.5 election timeouts after its last heartbeat.
const TIMING: (u64, u64) = (100, 8_000);
/// Entries between snapshots; the writes below pass several.
const SNAPSHOT_COUNT: u64 = 50;
/// Bound on the rounds of writes (50 puts each) until the leader sends the paused member a
/// snapshot (it does after a few snapshot intervals).
const SEND_ROUNDS: usize = 40;
/// Writes while the transfer is held open: several snapshot intervals.
const WRITES_DURING_TRANSFER: u64 = 4 * SNAPSHOT_COUNT;
/// Liveness bound on the catch-up (the test fails instead of hanging). The transfer must still
/// be open when the member resumes: a chunk waits 10 s for its answer
/// (`install_snapshot_timeout`), and the writes in between take a second or two.
const CATCH_UP: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_installs_one_snapshot_while_writes_go_on() -> Result<()> {
    picket_tests::init_tracing();
    let opts = ClusterOptions::default().snapshot_count(SNAPSHOT_COUNT).timing(TIMING.0, TIMING.1);
    let mut cluster = Cluster::start(3, opts).await?;
    let leader = cluster.leader().await?;
    let lagger = (leader + 1) % 3;
    let peer = format!("peer={}", cluster.member_id(lagger).context("the follower's id")?);
    let mut c = cluster.client(leader).await?;
    c.put("catch-up/start", "1", None).await?;

    info!(member = cluster.name(lagger), "SIGSTOP a follower; write until it is sent a snapshot");
    // Without the full window, the pipeline's requests in the member's buffers can carry
    // entries past the snapshot the leader then sends: the member appends them on resuming and
    // skips the install as stale (`Cluster::pause_behind_a_full_window`).
    cluster.pause_behind_a_full_window(lagger, &mut c).await?;
    // The leader starts the transfer once it has purged its log past the paused member, a few
    // snapshot intervals in; the first chunk then waits for the member's answer.
    for round in 0..SEND_ROUNDS {
        if cluster.log_lines(leader, &["sending snapshot", &peer])? > 0 {
            break;
        }
        anyhow::ensure!(
            round + 1 < SEND_ROUNDS,
            "the leader never sent the paused member a snapshot"
        );
        for i in 0..50 {
            c.put(format!("catch-up/{i:02}"), format!("r{round}"), None).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    info!("the transfer is held open: write through several snapshot intervals");
    for i in 0..WRITES_DURING_TRANSFER {
        c.put(format!("catch-up/{:02}", i % 50), format!("t{i}"), None).await?;
    }
    c.put("catch-up/last", "done", None).await?;

    info!(member = cluster.name(lagger), "SIGCONT: it installs the snapshot and catches up");
    cluster.resume(lagger)?;
    let f = cluster.client(lagger).await?;
    picket_tests::eventually("the resumed member serves the last write", CATCH_UP, || {
        let mut f = f.clone();
        async move {
            let r = f.get("catch-up/last", Some(GetOptions::new().with_serializable())).await?;
            anyhow::ensure!(r.kvs().first().is_some_and(|kv| kv.value() == b"done"), "not yet");
            Ok(())
        }
    })
    .await?;

    let sends = cluster.log_lines(leader, &["sending snapshot", &peer])?;
    let installs = cluster.log_lines(lagger, &["installing snapshot"])?;
    assert_eq!(
        (sends, installs),
        (1, 1),
        "the leader sent {} {sends} snapshots and it installed {installs}: the leader purged \
         the log the first transfer was to continue from",
        cluster.name(lagger)
    );
    assert_eq!(
        cluster.log_lines(lagger, &["pending-accept streams reached limit"])?,
        0,
        "{} dropped its peer connection on resuming (h2's reset-stream guard)",
        cluster.name(lagger)
    );
    cluster.finish();
    Ok(())
}
