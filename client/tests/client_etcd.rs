//! The etcd-API subset of the client against etcd 3.4 (Debian `etcd-server`), with the same test
//! bodies as the Picket runs. Skipped, saying so, when `/usr/bin/etcd` is not installed.

mod common;

use std::path::PathBuf;

use anyhow::Result;
use picket_tests::{Cluster, ClusterOptions};

const ETCD: &str = "/usr/bin/etcd";

async fn etcd() -> Result<Option<(Cluster, picket_client::Client)>> {
    if !std::path::Path::new(ETCD).is_file() {
        eprintln!("SKIP: {ETCD} not installed (apt-get install etcd-server)");
        return Ok(None);
    }
    let opts = ClusterOptions { binary: Some(PathBuf::from(ETCD)), ..Default::default() };
    let cluster = Cluster::start(1, opts).await?;
    let client = common::connect(cluster.endpoints()).await?;
    Ok(Some((cluster, client)))
}

#[tokio::test]
async fn etcd_kv_and_txn() -> Result<()> {
    let Some((cluster, c)) = etcd().await? else { return Ok(()) };
    common::kv_and_txn(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_leases_and_sessions() -> Result<()> {
    let Some((cluster, c)) = etcd().await? else { return Ok(()) };
    common::leases(&c).await?;
    common::session_lost_on_revoke(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_watches() -> Result<()> {
    let Some((cluster, c)) = etcd().await? else { return Ok(()) };
    common::watch_basics(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_locks_and_fencing() -> Result<()> {
    let Some((cluster, c)) = etcd().await? else { return Ok(()) };
    common::locks(&c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn etcd_elections() -> Result<()> {
    let Some((cluster, c)) = etcd().await? else { return Ok(()) };
    common::election(&c).await?;
    cluster.finish();
    Ok(())
}
