//! Snapshot save and restore with real processes: a snapshot taken through
//! `Maintenance.Snapshot` (etcd-client, or `etcdctl snapshot save` when installed) is restored
//! with `picket_server::restore` into fresh data directories, and `picketd` started on them must
//! serve the same data (same HashKV at the same revision, same keys, history, leases and
//! compaction point) as a working new cluster that continues at the next revision.
//!
//! An etcd 3.4 snapshot (bbolt, saved by `etcdctl snapshot save` from a real etcd started by the
//! same harness) restores the same way: the restored Picket cluster serves etcd's keys, history,
//! leases, compaction point, watches from old revisions and users, roles and permissions.
//!
//! This test file links server code: restore is an offline library function, which `picket
//! snapshot restore` wraps. Everything is checked over the wire.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp,
};
use picket_server::restore::{restore_snapshot, RestoreOptions, RestoreReport};
use picket_tests::cluster::connect_as;
use picket_tests::etcdctl::Etcdctl;
use picket_tests::util::rev;
use picket_tests::{assert_status, eventually, kvs, Cluster, ClusterOptions, Kv};
use tonic::Code;
use tracing::info;

/// How long a restored member may take to apply a write made through another member. Loopback
/// replication takes milliseconds; 30 s covers a loaded 2-core machine.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// A lease TTL far longer than the test, so the lease cannot expire between save and restore.
const LEASE_TTL: i64 = 600;

/// What the source cluster looked like when the snapshot was taken.
struct Source {
    revision: i64,
    compact_revision: i64,
    /// HashKV at `revision`; `None` for an etcd source (etcd hashes its own layout).
    hash: Option<u32>,
    all: Vec<Kv>,
    /// Revision and contents of an older, uncompacted point in history.
    old_revision: i64,
    old: Vec<Kv>,
    lease: i64,
}

async fn all_keys(c: &mut Client, at: i64) -> Result<(i64, Vec<Kv>)> {
    let r = c.get(vec![0u8], Some(GetOptions::new().with_from_key().with_revision(at))).await?;
    Ok((rev(r.header()), kvs(&r)))
}

/// Writes history with overwrites, a delete, a txn, a leased key and a compaction through `c`,
/// and records what a restore must reproduce.
async fn populate(c: &mut Client) -> Result<Source> {
    for i in 0..30 {
        c.put(format!("key/{:02}", i % 10), format!("value {i}"), None).await?;
    }
    c.delete("key/03", None).await?;
    let txn = Txn::new()
        .when([Compare::version("key/04", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("txn/a", "1", None), TxnOp::delete("key/05", None)]);
    ensure!(c.txn(txn).await?.succeeded(), "txn guard should hold");
    let lease = c.lease_grant(LEASE_TTL, None).await?.id();
    c.put("leased/x", "held", Some(PutOptions::new().with_lease(lease))).await?;
    let compact_at = rev(c.put("key/00", "before compaction", None).await?.header());
    c.compact(compact_at, None).await?;
    let (old_revision, old) = {
        let r = rev(c.put("key/01", "after compaction", None).await?.header());
        all_keys(c, r).await?
    };
    c.put("key/02", "last", None).await?;
    let (revision, all) = all_keys(c, 0).await?;
    let h = c.hash_kv(revision).await?;
    ensure!(h.compact_version() == compact_at, "compaction point {}", h.compact_version());
    Ok(Source {
        revision,
        compact_revision: compact_at,
        hash: Some(h.hash()),
        all,
        old_revision,
        old,
        lease,
    })
}

/// Streams a snapshot from `c` into one buffer (`etcdctl snapshot save` does the same).
async fn save_snapshot(c: &mut Client) -> Result<Vec<u8>> {
    let mut stream = c.snapshot().await?;
    let mut out = Vec::new();
    // Bounded: each message is at least one byte of a finite file, and the stream ends after
    // the message whose `remaining_bytes` is 0; the cap only guards against a server bug.
    for _ in 0..1_000_000 {
        let Some(msg) = stream.message().await? else { break };
        out.extend_from_slice(msg.blob());
        if msg.remaining_bytes() == 0 {
            break;
        }
    }
    Ok(out)
}

/// Restores `snapshot` into every member's data directory of the not yet started `dst`.
fn restore_into(dst: &Cluster, snapshot: &std::path::Path) -> Result<Vec<RestoreReport>> {
    (0..dst.len())
        .map(|i| {
            let mut o = RestoreOptions::new(snapshot);
            o.name = dst.name(i).to_string();
            o.data_dir = Some(dst.data_dir(i).to_path_buf());
            o.initial_cluster = Some(dst.initial_cluster().to_string());
            o.initial_advertise_peer_urls = dst.peer_url(i);
            restore_snapshot(&o).with_context(|| format!("restoring {}", dst.name(i)))
        })
        .collect()
}

/// Checks that member `i` of `dst` serves exactly the source's state at the source's revision.
async fn assert_same_state(dst: &Cluster, i: usize, src: &Source) -> Result<()> {
    let mut c = dst.client(i).await?;
    let what = format!("member {}", dst.name(i));
    let h = eventually(&format!("HashKV on {what}"), CONVERGE_TIMEOUT, || {
        let mut c = c.clone();
        async move { Ok(c.hash_kv(src.revision).await?) }
    })
    .await?;
    assert_eq!(
        (src.hash.map(|_| h.hash()), h.compact_version()),
        (src.hash, src.compact_revision),
        "{what}: HashKV at {} (hash, compaction point)",
        src.revision
    );
    let r = c.get(vec![0u8], Some(GetOptions::new().with_from_key().with_revision(src.revision)));
    assert_eq!(kvs(&r.await?), src.all, "{what}: keys at revision {}", src.revision);
    let (_, old) = all_keys(&mut c, src.old_revision).await?;
    assert_eq!(old, src.old, "{what}: history at revision {}", src.old_revision);
    assert_status(
        c.get("key/00", Some(GetOptions::new().with_revision(src.compact_revision - 1))).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    let ttl =
        c.lease_time_to_live(src.lease, Some(LeaseTimeToLiveOptions::new().with_keys())).await?;
    assert_eq!(ttl.granted_ttl(), LEASE_TTL, "{what}: lease granted TTL");
    assert!(ttl.ttl() > 0, "{what}: the lease is alive ({} s left)", ttl.ttl());
    assert_eq!(ttl.keys(), [b"leased/x".to_vec()], "{what}: keys attached to the lease");
    let leases: Vec<i64> = c.leases().await?.leases().iter().map(|l| l.id()).collect();
    assert_eq!(leases, [src.lease], "{what}: lease list");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_restores_into_a_fresh_single_member_cluster() -> Result<()> {
    info!("phase: build history on a source member and save a snapshot through the API");
    let src_cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mut c = src_cluster.client(0).await?;
    let src = populate(&mut c).await?;
    let file = save_snapshot(&mut c).await?;
    let path = src_cluster.root().join("backup.db");
    std::fs::write(&path, &file)?;

    info!("phase: restore into a new data dir and start picketd on it");
    let mut dst = Cluster::create(1, ClusterOptions::default())?;
    let reports = restore_into(&dst, &path)?;
    let report = &reports[0];
    assert_eq!((report.revision, Some(report.hash)), (src.revision, src.hash), "{report:?}");
    assert_eq!(report.compact_revision, src.compact_revision);
    assert_eq!(report.keys, src.all.len() as i64);
    assert_eq!(report.leases, 1);
    // Restoring twice into the same directory is refused: it now holds a data dir.
    let again = restore_into(&dst, &path).err().context("a second restore must be refused")?;
    ensure!(format!("{again:#}").contains("not empty"), "{again:#}");
    dst.restart_all().await?;

    info!("phase: the restored member serves the same state as the source did");
    assert_same_state(&dst, 0, &src).await?;
    src_cluster.finish();

    info!("phase: it is a new cluster of one, with the restored identity");
    let mut d = dst.client(0).await?;
    let status = d.status().await?;
    let header = status.header().context("status header")?;
    assert_eq!(header.member_id(), report.member_id);
    assert_eq!(header.cluster_id(), report.cluster_id);
    assert_eq!(status.leader(), report.member_id);
    let members = d.member_list().await?;
    let names: Vec<(&str, u64)> = members.members().iter().map(|m| (m.name(), m.id())).collect();
    assert_eq!(names, [("n1", report.member_id)]);

    info!("phase: writes continue with the next revision, and survive a restart");
    let next = rev(d.put("after-restore", "x", None).await?.header());
    assert_eq!(next, src.revision + 1);
    let r = c_get_value(&mut d, "key/02").await?;
    assert_eq!(r, "last");
    dst.stop(0).await?;
    dst.restart(0).await?;
    let mut d = dst.client(0).await?;
    assert_eq!(c_get_value(&mut d, "after-restore").await?, "x");
    assert_eq!(rev(d.put("after-restart", "y", None).await?.header()), src.revision + 2);
    dst.finish();
    Ok(())
}

async fn c_get_value(c: &mut Client, key: &str) -> Result<String> {
    let r = c.get(key, None).await?;
    let kv = r.kvs().first().with_context(|| format!("{key} is missing"))?;
    Ok(String::from_utf8_lossy(kv.value()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_of_a_new_three_member_cluster_restores_from_one_file() -> Result<()> {
    info!("phase: build history on a source member and save a snapshot");
    let src_cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mut c = src_cluster.client(0).await?;
    let src = populate(&mut c).await?;
    let path = src_cluster.root().join("backup.db");
    {
        info!("saving with etcdctl snapshot save");
        let path_str = path.display().to_string();
        Etcdctl::new(&src_cluster.endpoints()[..1])
            .run(&["snapshot", "save", &path_str], None)
            .await?
            .ok()?;
    }

    let status = picket_status(&path).await?;
    assert_eq!(
        (status["format"].as_str(), status["revision"].as_i64()),
        (Some("picket"), Some(src.revision)),
        "{status}"
    );

    info!("phase: restore all three members from the same file and start them");
    let mut dst = Cluster::create(3, ClusterOptions::default())?;
    let reports = restore_into(&dst, &path)?;
    ensure!(reports.iter().all(|r| r.cluster_id == reports[0].cluster_id), "{reports:?}");
    dst.restart_all().await?;
    src_cluster.finish();

    info!("phase: every member serves the source's state");
    for i in 0..3 {
        assert_same_state(&dst, i, &src).await?;
    }
    let members = dst.client(0).await?.member_list().await?;
    let mut ids: Vec<u64> = members.members().iter().map(|m| m.id()).collect();
    ids.sort_unstable();
    let mut want: Vec<u64> = reports.iter().map(|r| r.member_id).collect();
    want.sort_unstable();
    assert_eq!(ids, want);
    assert!(members.members().iter().all(|m| !m.is_learner()));

    info!("phase: writes through every member continue the revision sequence and replicate");
    let mut last = src.revision;
    for i in 0..3 {
        let mut ci = dst.client(i).await?;
        let r = rev(ci.put(format!("after/{i}"), "x", None).await?.header());
        assert_eq!(r, last + 1, "write through {}", dst.name(i));
        last = r;
    }
    let mut hashes = Vec::new();
    for i in 0..3 {
        let ci = dst.client(i).await?;
        let h = eventually("HashKV at the last write", CONVERGE_TIMEOUT, || {
            let mut ci = ci.clone();
            async move { Ok(ci.hash_kv(last).await?.hash()) }
        })
        .await?;
        hashes.push(h);
    }
    assert!(hashes.iter().all(|h| *h == hashes[0]), "HashKV differs at {last}: {hashes:?}");

    info!("phase: the restored cluster survives losing its leader");
    let leader = dst.leader().await?;
    dst.kill(leader)?;
    let survivor = (leader + 1) % 3;
    let r = eventually("a write after killing the leader", CONVERGE_TIMEOUT, || async {
        let mut c = dst.client(survivor).await?;
        Ok(rev(c.put("after-kill", "z", None).await?.header()))
    })
    .await?;
    ensure!(r > last, "revision {r} after the kill, {last} before");
    dst.restart(leader).await?;
    dst.finish();
    Ok(())
}

/// Every watch event from `start` on, up to `last`, for all keys.
async fn events_since(
    c: &mut Client,
    start: i64,
    last: i64,
) -> Result<Vec<picket_tests::watch::Ev>> {
    use picket_tests::watch::{created, events_of, reached, read_until, WATCH_TIMEOUT};
    let opts = etcd_client::WatchOptions::new().with_from_key().with_start_revision(start);
    let mut stream = c.watch(vec![0u8], Some(opts)).await?;
    let id = created(&mut stream).await?;
    let resps = read_until(&mut stream, WATCH_TIMEOUT, |r| reached(r, id, last)).await?;
    Ok(events_of(&resps, id))
}

/// `picket -w json snapshot status FILE`, parsed.
async fn picket_status(file: &std::path::Path) -> Result<serde_json::Value> {
    let bin = picket_tests::binary::picketd_bin()?.with_file_name("picket");
    let out = tokio::process::Command::new(bin)
        .args(["-w", "json", "snapshot", "status"])
        .arg(file)
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "picket snapshot status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Issue 21: a team moving from etcd restores its etcd backup into Picket. The source is a real
/// etcd 3.4 (this test fails, naming the package, when it is missing) with history, a txn, a
/// leased key, a compaction and auth on (root, and alice with READWRITE on `key/`); the snapshot
/// is `etcdctl snapshot save`'s file. Every member of a new three-member Picket cluster restores
/// from it and must serve what etcd served: the keys at the last revision, the history after
/// the compaction, the compaction point, the lease with its key, the same watch events from the
/// compaction point on, and the same users and permissions (etcd's bcrypt hashes unchanged; a
/// token issued by one member works on another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_snapshot_restores_into_a_three_member_picket_cluster() -> Result<()> {
    info!("phase: history on etcd 3.4, auth on, etcdctl snapshot save");
    let etcd = picket_procs::tools::etcd()?;
    let etcd_opts = ClusterOptions { binary: Some(etcd), ..ClusterOptions::default() };
    let etcd_cluster = Cluster::start(1, etcd_opts).await?;
    let mut c = etcd_cluster.client(0).await?;
    let src = populate(&mut c).await?;
    let etcd_events = events_since(&mut c, src.compact_revision, src.revision).await?;
    c.user_add("root", "rootpw", None).await?;
    c.user_grant_role("root", "root").await?;
    c.role_add("app").await?;
    let perm = etcd_client::Permission::read_write("key/").with_prefix();
    c.role_grant_permission("app", perm).await?;
    c.user_add("alice", "alicepw", None).await?;
    c.user_grant_role("alice", "app").await?;
    c.auth_enable().await?;
    let path = etcd_cluster.root().join("etcd-backup.db");
    let path_str = path.display().to_string();
    Etcdctl::new(&etcd_cluster.endpoints()[..1])
        .run(&["--user", "root:rootpw", "snapshot", "save", &path_str], None)
        .await?
        .ok()?;
    let src = Source { hash: None, ..src };
    ensure!(etcd_events.len() >= 3, "too few events to compare: {etcd_events:?}");

    info!("phase: picket snapshot status reads the etcd file as etcdctl does");
    let etcdctl = Etcdctl::new(&etcd_cluster.endpoints()[..1])
        .run(&["-w", "json", "snapshot", "status", &path_str], None)
        .await?
        .ok()?;
    let want: serde_json::Value = serde_json::from_str(&etcdctl.stdout)?;
    let got = picket_status(&path).await?;
    for field in ["hash", "revision", "totalKey", "totalSize"] {
        assert_eq!(got[field], want[field], "{field}: picket {got}, etcdctl {want}");
    }
    assert_eq!(got["format"], "etcd");

    info!("phase: restore all three members from the etcd file and start them");
    let mut dst = Cluster::create(3, ClusterOptions::default())?;
    let reports = restore_into(&dst, &path)?;
    etcd_cluster.finish();
    for r in &reports {
        ensure!(r.from_etcd, "{r:?}");
        ensure!(r.revision == src.revision, "restored revision {} vs {}", r.revision, src.revision);
        ensure!(r.compact_revision == src.compact_revision, "{r:?}");
        ensure!(r.leases == 1 && r.keys == src.all.len() as i64, "{r:?}");
    }
    dst.restart_all().await?;

    info!("phase: every member serves etcd's state, as root");
    for i in 0..3 {
        let ep = dst.endpoint(i);
        let mut root = eventually("root authenticates", CONVERGE_TIMEOUT, || {
            let ep = ep.clone();
            async move { connect_as(&ep, "root", "rootpw").await }
        })
        .await?;
        let r = root
            .get(vec![0u8], Some(GetOptions::new().with_from_key().with_revision(src.revision)));
        assert_eq!(kvs(&r.await?), src.all, "member {i}: keys at revision {}", src.revision);
        let (_, old) = all_keys(&mut root, src.old_revision).await?;
        assert_eq!(old, src.old, "member {i}: history at revision {}", src.old_revision);
        assert_status(
            root.get("key/00", Some(GetOptions::new().with_revision(src.compact_revision - 1)))
                .await,
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        let ttl = root
            .lease_time_to_live(src.lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await?;
        assert_eq!(ttl.granted_ttl(), LEASE_TTL, "member {i}: lease granted TTL");
        assert_eq!(ttl.keys(), [b"leased/x".to_vec()], "member {i}: keys attached to the lease");
        let got = events_since(&mut root, src.compact_revision, src.revision).await?;
        assert_eq!(got, etcd_events, "member {i}: watch events from the compaction point");
    }

    info!("phase: etcd's users and permissions hold; a token works on every member");
    let mut alice = connect_as(&dst.endpoint(0), "alice", "alicepw").await?;
    let token_rev = rev(alice.put("key/alice", "mine", None).await?.header());
    assert_eq!(token_rev, src.revision + 1, "the first write continues etcd's revisions");
    assert_status(
        alice.put("elsewhere", "no", None).await,
        Code::PermissionDenied,
        "etcdserver: permission denied",
    );
    for i in 1..3 {
        let mut a = connect_as(&dst.endpoint(i), "alice", "alicepw").await?;
        let r = a.get("key/alice", None).await?;
        assert_eq!(r.kvs().first().map(|kv| kv.value().to_vec()), Some(b"mine".to_vec()));
    }
    assert!(connect_as(&dst.endpoint(1), "alice", "wrong").await.is_err(), "a wrong password");
    dst.finish();
    Ok(())
}
