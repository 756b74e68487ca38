//! The client against a one-member Picket cluster: every API family once.

mod common;

use anyhow::Result;
use picket_tests::{Cluster, ClusterOptions};

async fn single() -> Result<(Cluster, picket_client::Client)> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let client = common::connect(cluster.endpoints()).await?;
    Ok((cluster, client))
}

#[tokio::test]
async fn kv_and_txn() -> Result<()> {
    let (cluster, c) = single().await?;
    common::kv_and_txn(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn leases_and_sessions() -> Result<()> {
    let (cluster, c) = single().await?;
    common::leases(&c).await?;
    common::session_lost_on_revoke(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn watches() -> Result<()> {
    let (cluster, c) = single().await?;
    common::watch_basics(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn locks_and_fencing() -> Result<()> {
    let (cluster, c) = single().await?;
    common::locks(&c).await?;
    // Picket's own token checks.
    let g = c.lock("own").await?;
    anyhow::ensure!(c.check_token("own", g.token()).await?);
    anyhow::ensure!(!c.check_token("own", g.token() - 1).await?);
    let gate = picket_client::FenceGate::new();
    gate.admit_checked(&c, &g.fence()).await?;
    let stale = picket_client::Fence { token: g.token() - 1, ..g.fence() };
    anyhow::ensure!(gate.admit_checked(&c, &stale).await.is_err());
    let txn = picket_client::Txn::new().and_then([picket_client::TxnOp::put("own-res", "1")]);
    c.fenced_txn(&g.fence(), txn.clone()).await?;
    g.unlock().await?;
    match c.fenced_txn(&stale, txn).await {
        Err(picket_client::Error::Fenced(m)) => anyhow::ensure!(m.contains("stale"), "{m}"),
        other => anyhow::bail!("stale fenced txn: {other:?}"),
    }
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn elections() -> Result<()> {
    let (cluster, c) = single().await?;
    common::election(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn connect_fails_clearly_without_any_endpoint() -> Result<()> {
    // A port nobody listens on: bind, take the port, drop the listener.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let opts = picket_client::ConnectOptions::default();
    match picket_client::Client::connect_with([format!("127.0.0.1:{port}")], opts).await {
        Err(picket_client::Error::Unavailable(m)) => anyhow::ensure!(m.contains(&port.to_string())),
        other => anyhow::bail!("connect to nothing: {other:?}"),
    }
    match picket_client::Client::connect(Vec::<String>::new()).await {
        Err(picket_client::Error::InvalidEndpoint { .. }) => {}
        other => anyhow::bail!("no endpoints: {other:?}"),
    }
    Ok(())
}
