//! Upgrading in place: `picketd` started on a data directory that an older build wrote must
//! serve what that build stored and go on writing. The fixture (`tests/fixtures/openraft-0.9`,
//! see its README) was written by the last build on openraft 0.9; this build runs openraft
//! 0.10, whose log, vote, membership and snapshot formats must read the old bytes
//! (`raft::types` golden tests pin the encodings; this test pins a whole directory: RocksDB's
//! files, the Raft log and state, the lease table, `raft-acked` and `identity.json`).

use std::path::Path;

use anyhow::{ensure, Context, Result};
use etcd_client::GetOptions;
use picket_tests::cluster::READY_TIMEOUT;
use picket_tests::{Cluster, ClusterOptions};

/// Copies the directory tree at `from` into `to` (created if missing).
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_data_dir_written_on_openraft_09_opens_and_serves() -> Result<()> {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/openraft-0.9/n1.data");
    let mut cluster = Cluster::create(1, ClusterOptions::default())?;
    copy_dir(&fixture, cluster.data_dir(0))?;
    cluster.spawn(0)?;
    cluster.wait_ready(0, READY_TIMEOUT).await?;
    let mut client = cluster.client(0).await?;

    let keys = client.get("key", Some(GetOptions::new().with_prefix())).await?;
    ensure!(keys.kvs().len() == 19, "want key1..key20 without key2, got {}", keys.kvs().len());
    ensure!(keys.kvs().iter().all(|kv| kv.key() != b"key2"), "key2 was deleted");
    let key1 = client.get("key1", None).await?;
    let kv = key1.kvs().first().context("key1 missing")?;
    ensure!(kv.value() == b"overwritten", "key1 = {:?}", kv.value_str());
    ensure!(
        (kv.create_revision(), kv.mod_revision(), kv.version()) == (2, 23, 2),
        "key1's history changed: {kv:?}"
    );
    let key7 = client.get("key7", None).await?;
    let v = key7.kvs().first().context("key7 missing")?.value_str()?.to_string();
    ensure!(v == "value from openraft 0.9 #7", "key7 = {v:?}");
    ensure!(key1.header().map(|h| h.revision()) == Some(24), "revision {:?}", key1.header());

    let leased = client.get("leased", None).await?;
    let lease = leased.kvs().first().context("leased missing")?.lease();
    ensure!(lease != 0, "the key lost its lease");
    let ttl = client.lease_time_to_live(lease, None).await?;
    ensure!(ttl.ttl() > 0, "the lease is gone: {ttl:?}");

    // And it writes on: the next revision, readable back.
    let put = client.put("after-upgrade", "yes", None).await?;
    ensure!(put.header().map(|h| h.revision()) == Some(25), "put at {:?}", put.header());
    let back = client.get("after-upgrade", None).await?;
    ensure!(back.kvs().first().map(|kv| kv.value()) == Some(&b"yes"[..]), "write lost");
    Ok(())
}
