//! A follower that fell behind by many large entries catches up from the log (issue 19).
//!
//! openraft sends a lagging follower up to 300 entries per AppendEntries and gives each one a
//! heartbeat interval. With entries of about 1 MiB, 300 of them never fit, every retry resends
//! the same payload, and the follower never catches up. The leader must send payloads that fit.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::GetOptions;
use picket_tests::{eventually, Cluster, ClusterOptions};
use tracing::info;

/// Entries written while the follower is stopped: most of one 300-entry payload.
const ENTRIES: usize = 200;
/// About 1 MiB per value, inside the default 1.5 MiB request limit.
const VALUE_BYTES: usize = 1000 * 1024;
/// How long the resumed follower may take to catch up: 200 MiB over loopback and through one
/// fsync per payload takes a few seconds; 60 s covers a loaded 2-core machine. Without the fix
/// it never catches up at all.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_by_hundreds_of_large_entries_catches_up_by_log() -> Result<()> {
    info!("three members; a snapshot count so large that catch-up must come from the log");
    let mut cluster =
        Cluster::start(3, ClusterOptions::default().snapshot_count(1_000_000)).await?;
    let leader = cluster.leader().await?;
    let follower = (0..3).find(|&i| i != leader).context("no follower")?;
    let mut c = cluster.client(leader).await?;
    c.put("warm-up", "1", None).await?;

    info!(follower, "stop a follower and write {ENTRIES} values of about 1 MiB each");
    cluster.pause(follower)?;
    for i in 0..ENTRIES {
        let value = vec![b'a' + (i % 26) as u8; VALUE_BYTES];
        c.put(format!("big/{i:04}"), value, None).await.with_context(|| format!("put {i}"))?;
    }
    let last = format!("big/{:04}", ENTRIES - 1);

    info!("resume it: it must catch up from the log within {CATCH_UP_TIMEOUT:?}");
    cluster.resume(follower)?;
    let f = cluster.client(follower).await?;
    eventually("the follower has the last value", CATCH_UP_TIMEOUT, || {
        let mut f = f.clone();
        let last = last.clone();
        async move {
            let got = f.get(last, Some(GetOptions::new().with_serializable())).await?;
            ensure!(got.kvs().len() == 1, "not there yet");
            Ok(())
        }
    })
    .await
    .with_context(|| format!("follower log tail:\n{}", cluster.log_tail(follower)))?;
    let log = std::fs::read_to_string(cluster.stderr_log(follower))?;
    ensure!(!log.contains("installing snapshot"), "the follower caught up by snapshot");
    cluster.finish();
    Ok(())
}
