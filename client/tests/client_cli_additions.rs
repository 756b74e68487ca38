//! `Client::snapshot_with_progress` and `Client::try_lock_with`, added for the `picket` CLI.

mod common;

use anyhow::{ensure, Context, Result};
use futures::StreamExt;
use picket_client::{LockOptions, Session};
use picket_tests::{Cluster, ClusterOptions};

#[tokio::test]
async fn snapshot_chunks_count_down_to_zero() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = common::connect(cluster.endpoints()).await?;
    c.put("k", vec![7u8; 64 * 1024]).await?;
    let mut stream = c.snapshot_with_progress(&cluster.endpoint(0)).await?;
    let (mut received, mut last_remaining) = (0u64, u64::MAX);
    let mut total = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        received += chunk.blob.len() as u64;
        ensure!(chunk.remaining_bytes < last_remaining, "remaining bytes only shrink");
        last_remaining = chunk.remaining_bytes;
        let t = *total.get_or_insert(received + chunk.remaining_bytes);
        ensure!(received + chunk.remaining_bytes == t, "received + remaining is the total");
    }
    ensure!(last_remaining == 0 && Some(received) == total, "ends at zero remaining");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn try_lock_with_ttl_and_session() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = common::connect(cluster.endpoints()).await?;
    let g = c.try_lock_with("t", LockOptions::new().ttl(30)).await?.context("free lock")?;
    ensure!(g.session().ttl() >= 30, "the TTL option is used");
    // Held: a second try with a caller's session fails, and leaves the session usable.
    let s = Session::new(&c, 20).await?;
    ensure!(c.try_lock_with("t", LockOptions::new().session(s.clone())).await?.is_none(), "held");
    ensure!(!s.is_lost(), "the caller's session is not closed by a failed try");
    ensure!(c.get_prefix("t/").await?.len() == 1, "the failed try left no contender key");
    g.unlock().await?;
    let g2 =
        c.try_lock_with("t", LockOptions::new().session(s.clone())).await?.context("now free")?;
    ensure!(g2.session().lease_id() == s.lease_id(), "held under the caller's session");
    g2.unlock().await?;
    ensure!(!s.is_lost(), "unlock does not close a caller's session");
    s.close().await?;
    cluster.finish();
    Ok(())
}
