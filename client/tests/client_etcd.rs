//! The etcd-API subset of the client against etcd 3.4 (Debian `etcd-server`), with the same test
//! bodies as the Picket runs. Without etcd on `PATH` every test here fails, naming the package.

mod common;

use anyhow::Result;
use picket_tests::{Cluster, ClusterOptions};

async fn etcd() -> Result<(Cluster, picket_client::Client)> {
    let opts = ClusterOptions { binary: Some(picket_procs::tools::etcd()?), ..Default::default() };
    let cluster = Cluster::start(1, opts).await?;
    let client = common::connect(cluster.endpoints()).await?;
    Ok((cluster, client))
}

#[tokio::test]
async fn etcd_kv_and_txn() -> Result<()> {
    let (cluster, c) = etcd().await?;
    common::kv_and_txn(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_leases_and_sessions() -> Result<()> {
    let (cluster, c) = etcd().await?;
    common::leases(&c).await?;
    common::session_lost_on_revoke(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_watches() -> Result<()> {
    let (cluster, c) = etcd().await?;
    common::watch_basics(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_locks_and_fencing() -> Result<()> {
    let (cluster, c) = etcd().await?;
    common::locks(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_elections() -> Result<()> {
    let (cluster, c) = etcd().await?;
    common::election(&c).await?;
    cluster.finish();
    Ok(())
}
