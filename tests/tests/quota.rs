//! The storage quota with real processes (issue 10): `--quota-backend-bytes` with an 8 MiB quota,
//! the replicated NOSPACE alarm, what it refuses and what it still allows, reclaiming space, and
//! an alarm surviving a restart of the whole cluster.
//!
//! Values are pseudo-random bytes, so RocksDB's compression cannot shrink them when it flushes;
//! the store then really stays over the quota until the history is compacted and defragmented.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, Txn, TxnOp};
use picket_tests::etcdctl::{self, Etcdctl};
use picket_tests::{eventually, Cluster, ClusterOptions};
use tracing::info;

/// A quota small enough to reach in a few seconds of writes. Not smaller: the size counts
/// memtables by the memory RocksDB allocated for them, in 1 MiB arena blocks per column family,
/// so a store with a few keys already measures about 3 MiB.
const QUOTA: u64 = 8 * 1024 * 1024;
/// Four keys of 32 KiB overwritten again and again: 64 KiB per put (the value is in the `kv`
/// family and in the changelog), and only 4 live values once history is compacted.
const VALUE_LEN: usize = 32 * 1024;
const KEYS: usize = 4;
/// Upper bound on the puts of the fill phase: 8 times the quota, far more than needed even if
/// the alarm took several monitor ticks to commit.
const MAX_FILL_PUTS: usize = 1_000;
/// How long an alarm change may take to show everywhere: a monitor tick (500 ms) and a commit,
/// on a loaded 2-core machine.
const CONVERGE: Duration = Duration::from_secs(30);
/// etcd's message, verbatim.
const NOSPACE: &str = "etcdserver: mvcc: database space exceeded";
/// A member id that no member has, for an operator-raised alarm no monitor clears.
const FOREIGN_MEMBER: u64 = 0x00c0_ffee;

fn value(seed: u64) -> Vec<u8> {
    // xorshift64*: incompressible enough for LZ4, deterministic, no dependency.
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..VALUE_LEN)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

fn is_nospace(e: &etcd_client::Error) -> bool {
    match picket_tests::util::grpc_status(e) {
        Some(s) => s.code() == tonic::Code::ResourceExhausted && s.message() == NOSPACE,
        None => false,
    }
}

/// The alarms member `i` lists, as `etcdctl alarm list` prints them.
async fn alarm_list(cluster: &Cluster, i: usize) -> Result<String> {
    let out = Etcdctl::new(&[cluster.endpoint(i)]).run(&["alarm", "list"], None).await?.ok()?;
    Ok(out.stdout)
}

/// Waits until every member's `etcdctl alarm list` satisfies `pred`.
async fn every_member_lists(cluster: &Cluster, what: &str, pred: fn(&str) -> bool) -> Result<()> {
    for i in 0..cluster.len() {
        eventually(&format!("{}: {what}", cluster.name(i)), CONVERGE, || async {
            let list = alarm_list(cluster, i).await?;
            ensure!(pred(&list), "alarm list is {list:?}");
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// Waits until a put through `client` succeeds (the alarm cleared and the change applied).
async fn put_works_again(client: &Client) -> Result<()> {
    eventually("a put succeeds again", CONVERGE, || async {
        let mut kv = client.kv_client();
        kv.put("quota/probe", "ok", None).await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_alarm_refuses_growth_until_space_is_reclaimed() -> Result<()> {
    etcdctl::path()?;
    let opts = ClusterOptions {
        extra_args: vec!["--quota-backend-bytes".into(), QUOTA.to_string()],
        ..Default::default()
    };
    let mut cluster = Cluster::start(3, opts).await?;
    let mut client = cluster.client(0).await?;

    info!("phase: write until the NOSPACE alarm refuses a put");
    let mut refused_at = None;
    for n in 0..MAX_FILL_PUTS {
        match client.put(format!("quota/{}", n % KEYS), value(n as u64), None).await {
            Ok(_) => {}
            Err(e) if is_nospace(&e) => {
                refused_at = Some(n);
                break;
            }
            Err(e) => return Err(e).context("an unexpected error while filling"),
        }
    }
    let n = refused_at.context("no put was refused: the quota is not enforced")?;
    info!(puts = n, "refused with etcd's NOSPACE error");
    ensure!(n as u64 * VALUE_LEN as u64 >= QUOTA / 8, "refused after only {n} puts");

    info!("phase: the alarm is replicated: every member lists it");
    every_member_lists(&cluster, "NOSPACE listed", |l| l.contains("alarm:NOSPACE")).await?;
    let status = client.status().await?;
    info!(db_size = status.db_size(), in_use = status.raft_used_db_size(), "status");
    ensure!(
        status.db_size() as u64 > QUOTA * 9 / 10,
        "db_size {} under the quota",
        status.db_size()
    );
    ensure!(
        status.db_size_quota() as u64 == QUOTA,
        "Status reports quota {}",
        status.db_size_quota()
    );

    info!("phase: every member refuses growth; reads, deletes and read-only txns still work");
    for i in 0..cluster.len() {
        let mut c = cluster.client(i).await?;
        let e = c.put("quota/new", "v", None).await.expect_err("put during NOSPACE");
        ensure!(is_nospace(&e), "{}: put refused with {e}", cluster.name(i));
        let e = c.lease_grant(30, None).await.expect_err("lease grant during NOSPACE");
        ensure!(is_nospace(&e), "{}: lease grant refused with {e}", cluster.name(i));
        let got = c.get("quota/0", None).await?;
        ensure!(got.kvs().len() == 1, "{}: read failed during NOSPACE", cluster.name(i));
        let read_only = Txn::new().and_then([TxnOp::get("quota/1", None)]);
        ensure!(c.txn(read_only).await?.succeeded(), "{}: read-only txn", cluster.name(i));
        let writes = Txn::new().and_then([TxnOp::put("quota/txn", "v", None)]);
        let e = c.txn(writes).await.expect_err("txn with a put during NOSPACE");
        ensure!(is_nospace(&e), "{}: txn with a put refused with {e}", cluster.name(i));
    }
    let ctl = Etcdctl::new(&cluster.endpoints());
    let out = ctl.run(&["put", "quota/ctl", "v"], None).await?;
    ensure!(!out.success && out.stderr.contains("database space exceeded"), "etcdctl put: {out:?}");
    let deleted = client.delete("quota/3", None).await?;
    ensure!(deleted.deleted() == 1, "delete during NOSPACE deleted {}", deleted.deleted());

    info!("phase: compact and defragment every member: the alarm clears itself");
    let revision = client.get("quota/0", None).await?.header().context("header")?.revision();
    client.compact(revision, None).await?;
    for i in 0..cluster.len() {
        cluster.client(i).await?.defragment().await?;
    }
    every_member_lists(&cluster, "no alarm", |l| l.trim().is_empty()).await?;
    put_works_again(&client).await?;
    let status = client.status().await?;
    info!(db_size = status.db_size(), "status after compact + defrag");
    ensure!(
        (status.db_size() as u64) < QUOTA * 9 / 10,
        "db_size {} did not fall after compact + defrag",
        status.db_size()
    );
    // etcd's procedure ends with a disarm; with nothing left to disarm it still succeeds.
    ctl.run(&["alarm", "disarm"], None).await?.ok()?;

    info!("phase: an operator-raised alarm survives a restart of every member; disarm clears it");
    let mut opts = AlarmOptions::new();
    opts.with_member(FOREIGN_MEMBER);
    client.alarm(AlarmAction::Activate, AlarmType::Nospace, Some(opts)).await?;
    every_member_lists(&cluster, "foreign NOSPACE listed", |l| l.contains("alarm:NOSPACE")).await?;
    drop(client);
    cluster.restart_all().await?;
    every_member_lists(&cluster, "NOSPACE after restart", |l| {
        l.contains(&format!("memberID:{FOREIGN_MEMBER}")) && l.contains("alarm:NOSPACE")
    })
    .await?;
    let mut client = cluster.client(1).await?;
    let e = client.put("quota/after-restart", "v", None).await.expect_err("put after restart");
    ensure!(is_nospace(&e), "put after restart refused with {e}");
    ctl.run(&["alarm", "disarm"], None).await?.ok()?;
    every_member_lists(&cluster, "no alarm after disarm", |l| l.trim().is_empty()).await?;
    put_works_again(&client).await?;
    client.put("quota/after-disarm", "v", None).await?;
    cluster.finish();
    Ok(())
}

/// Issue 19, Medium 8: compaction removes the compacted history in bounded steps after the
/// Compact answered. With no client writes to carry the steps (an idle cluster, or NOSPACE
/// refusing writes), the leader must drive them: a `physical` Compact, which answers only once
/// the answering member removed the history, succeeds on every member with no write in between.
/// Seen failing on 8f5235b plus this change without the leader's driver (its spawn removed):
/// "request timed out, compaction at ... is applied but its history is still being removed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn physical_compaction_finishes_without_further_writes() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut client = cluster.client(0).await?;
    info!("phase: 30 txns of 100 puts each over the same 100 keys: 3,000 versions");
    for round in 0..30 {
        let puts: Vec<TxnOp> = (0..100)
            .map(|k| TxnOp::put(format!("steps/{k:03}"), format!("v{round}"), None))
            .collect();
        client.txn(Txn::new().and_then(puts)).await?;
    }
    let head = client.get("steps/000", None).await?.header().context("header")?.revision();

    info!(head, "phase: a physical Compact through each member, no write in between");
    for i in 0..cluster.len() {
        let at = head - 2 + i as i64;
        let opts = etcd_client::CompactionOptions::new().with_physical();
        cluster
            .client(i)
            .await?
            .compact(at, Some(opts))
            .await
            .with_context(|| format!("physical compact at {at} through {}", cluster.name(i)))?;
    }
    let got = client.get("steps/", Some(etcd_client::GetOptions::new().with_prefix())).await?;
    ensure!(got.kvs().len() == 100, "{} keys after compaction", got.kvs().len());
    ensure!(got.kvs().iter().all(|kv| kv.value() == b"v29"), "a key lost its last value");
    cluster.finish();
    Ok(())
}

/// Issue 21, gap 2: the alarm list is linearizable, as in etcd (where every Alarm action, GET
/// included, goes through Raft). An alarm raised through one member is listed by every other
/// member at once, and a disarm is too: a member must not answer from state that has not yet
/// applied a change acknowledged before the list was asked. Each ordered pair of members, a few
/// rounds each, so some list lands on a follower that applies the change after the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alarm_list_sees_every_acknowledged_change() -> Result<()> {
    const ROUNDS: usize = 5;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let clients = cluster.clients().await?;
    // (member id, alarm type) of each listed alarm, for the failure message.
    let shown = |r: &etcd_client::AlarmResponse| {
        r.alarms().iter().map(|a| (a.member_id(), a.alarm() as i32)).collect::<Vec<_>>()
    };
    let listed = |r: &etcd_client::AlarmResponse| {
        r.alarms()
            .iter()
            .any(|a| a.member_id() == FOREIGN_MEMBER && a.alarm() == AlarmType::Nospace)
    };
    info!("phase: raise through one member, list through another at once; then disarm");
    for round in 0..ROUNDS {
        for (a, b) in [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)] {
            let (mut raiser, mut lister) = (clients[a].clone(), clients[b].clone());
            let mut opts = AlarmOptions::new();
            opts.with_member(FOREIGN_MEMBER);
            raiser.alarm(AlarmAction::Activate, AlarmType::Nospace, Some(opts.clone())).await?;
            let got = lister.alarm(AlarmAction::Get, AlarmType::None, None).await?;
            ensure!(listed(&got), "round {round}: raised via {a}, {b} lists {:?}", shown(&got));
            raiser.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(opts)).await?;
            let got = lister.alarm(AlarmAction::Get, AlarmType::None, None).await?;
            ensure!(!listed(&got), "round {round}: disarmed via {a}, {b} lists {:?}", shown(&got));
        }
    }
    cluster.finish();
    Ok(())
}
