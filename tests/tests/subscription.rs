//! Durable subscriptions (`picket.v1.Subscriptions`) against real `picketd` processes: consumer
//! processes (`picket sub consume`) that stop and resume exactly after their committed
//! revision, the compaction guard (held back by a group, released by delete or by the lag
//! bound, which makes the group lose history and its consumers get a typed error), and group
//! state across restarts and a leader kill.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use etcd_client::{CompactionOptions, GetOptions};
use picket_client::{Error as ClientError, GroupOptions};
use picket_tests::binary::picketd_bin;
use picket_tests::{eventually, Cluster, ClusterOptions};
use tokio_stream::StreamExt;
use tracing::info;

/// Bound on one `picket sub consume` run: it only has to replay a few events it is owed, which
/// takes well under a second; 60 s absorbs a loaded machine and still ends a wedged consumer.
const CONSUMER_TIMEOUT: Duration = Duration::from_secs(60);

/// The `picket` CLI, built next to `picketd` by `cargo build --workspace --bins`.
fn picket_bin() -> Result<PathBuf> {
    let bin = picketd_bin()?.with_file_name("picket");
    if !bin.is_file() {
        bail!("picket CLI not found at {}: run `cargo build --workspace --bins`", bin.display());
    }
    Ok(bin)
}

async fn client(cluster: &Cluster) -> Result<picket_client::Client> {
    Ok(picket_client::Client::connect(cluster.endpoints()).await?)
}

/// Runs the consumer process `picket sub consume NAME --max-events N` and returns the
/// (revision, key, value) of every event it printed, or the exit code and stderr if it failed.
async fn consume(cluster: &Cluster, name: &str, max: usize) -> Result<Vec<(i64, String, String)>> {
    let mut cmd = tokio::process::Command::new(picket_bin()?);
    cmd.args(["--endpoints", &cluster.endpoints().join(","), "-w", "json", "sub", "consume"])
        .args([name, "--max-events", &max.to_string()])
        .kill_on_drop(true);
    // kill_on_drop: a consumer past its timeout is killed (by its own handle) when dropped.
    let out = tokio::time::timeout(CONSUMER_TIMEOUT, cmd.output())
        .await
        .context("consumer did not finish in time")??;
    if !out.status.success() {
        bail!(
            "consumer exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut events = Vec::new();
    for line in String::from_utf8(out.stdout)?.lines() {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| line.to_string())?;
        let kv = &v["kv"];
        events.push((
            kv["mod_revision"].as_i64().context("mod_revision")?,
            kv["key"].as_str().context("key")?.to_string(),
            kv["value"].as_str().unwrap_or_default().to_string(),
        ));
    }
    Ok(events)
}

/// Puts `n` ledger entries (`prefix<i>` = `v<i>`) and returns their revisions.
async fn write(
    kv: &mut etcd_client::Client,
    prefix: &str,
    from: usize,
    n: usize,
) -> Result<Vec<i64>> {
    let mut revs = Vec::new();
    for i in from..from + n {
        let r = kv.put(format!("{prefix}{i:03}"), format!("v{i}"), None).await?;
        revs.push(r.header().context("header")?.revision());
    }
    Ok(revs)
}

fn grep_logs(cluster: &Cluster, needle: &str) -> bool {
    (0..cluster.len()).any(|i| {
        std::fs::read_to_string(cluster.stderr_log(i)).unwrap_or_default().contains(needle)
    })
}

#[tokio::test]
async fn consumer_process_resumes_exactly_after_its_committed_revision() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let mut kv = cluster.client(1).await?;
    info!("group over ledger/; unrelated keys and a two-event txn in between");
    let g = c.create_group("audit", "ledger/", GroupOptions::new().prefix()).await?;
    let mut revs = write(&mut kv, "ledger/", 0, 5).await?;
    kv.put("other/x", "noise", None).await?;
    let t = kv
        .txn(etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::put("ledger/t1", "a", None),
            etcd_client::TxnOp::put("ledger/t2", "b", None),
        ]))
        .await?;
    let txn_rev = t.header().context("header")?.revision();
    revs.extend(write(&mut kv, "ledger/", 5, 5).await?);

    info!("the history, as a full replay from the group's start shows it");
    let history = kv
        .get("ledger/", Some(GetOptions::new().with_prefix()))
        .await?
        .kvs()
        .iter()
        .map(|k| {
            let key = k.key_str().unwrap().to_string();
            ((k.mod_revision(), key), k.value_str().unwrap().to_string())
        })
        .collect::<BTreeMap<_, _>>();
    assert_eq!(history.len(), 12);

    info!("consumer 1 prints 4 events and exits; consumer 2 prints the 6th (splits the txn)");
    let mut seen = consume(&cluster, "audit", 4).await?;
    assert_eq!(c.group("audit").await?.unwrap().committed, revs[3]);
    let second = consume(&cluster, "audit", 2).await?;
    assert_eq!(second[1].0, txn_rev, "stopped in the middle of the txn's revision");
    assert_eq!(
        c.group("audit").await?.unwrap().committed,
        txn_rev - 1,
        "a half-printed revision is not committed"
    );
    let third = consume(&cluster, "audit", 7).await?;
    assert_eq!(third[0].0, txn_rev, "the whole txn revision is delivered again");
    seen.extend(second.into_iter().filter(|e| e.0 != txn_rev));
    seen.extend(third);
    let got: BTreeMap<_, _> = seen.iter().map(|(r, k, v)| ((*r, k.clone()), v.clone())).collect();
    let want = history;
    assert_eq!(seen.len(), want.len(), "no duplicate across restarts: {seen:?}");
    assert_eq!(got, want, "no gap across restarts");
    assert!(seen.iter().all(|e| e.0 > g.committed), "nothing from before the group existed");
    assert_eq!(c.group("audit").await?.unwrap().committed, *revs.last().unwrap());
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn compaction_is_held_back_by_groups_until_they_commit_or_are_deleted() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let mut kv = cluster.client(0).await?;
    info!("two groups on the same prefix; one commits half way");
    let slow = c.create_group("slow", "jobs/", GroupOptions::new().prefix()).await?;
    c.create_group("fast", "jobs/", GroupOptions::new().prefix()).await?;
    let revs = write(&mut kv, "jobs/", 0, 10).await?;
    assert_eq!(c.commit_group("fast", revs[4]).await?, revs[4]);
    assert_eq!(c.commit_group("fast", revs[2]).await?, revs[4], "a lower commit is ignored");
    assert_eq!(c.group("slow").await?.unwrap().committed, slow.committed, "groups independent");

    info!("compaction at the head succeeds but is clamped to slow's committed + 1");
    let head = *revs.last().unwrap();
    kv.compact(head, Some(CompactionOptions::new().with_physical())).await?;
    assert!(grep_logs(&cluster, "compaction held back by subscription group"));
    kv.get("jobs/", Some(GetOptions::new().with_prefix().with_revision(slow.committed + 1)))
        .await
        .context("slow's position is not compacted")?;
    let at = kv.get("jobs/000", Some(GetOptions::new().with_revision(revs[0]))).await?;
    assert_eq!(at.kvs().len(), 1, "history after slow's position is still readable");
    let mut sub = c.subscribe("slow").await?;
    let first = sub.next().await.context("stream ended")??;
    assert_eq!(first.events[0].kv.as_ref().unwrap().mod_revision, revs[0]);
    drop(sub);
    let s = c.group("slow").await?.unwrap();
    assert!(s.holding && !s.lost_history, "{s:?}");

    info!("deleting slow releases the hold: fast now holds at its own position");
    assert!(c.delete_group("slow").await?);
    assert!(!c.delete_group("slow").await?);
    kv.compact(head, None).await?;
    let r = kv.get("jobs/000", Some(GetOptions::new().with_revision(revs[5]))).await;
    assert!(r.is_ok(), "fast (committed {}) still holds its history: {r:?}", revs[4]);
    let r = kv.get("jobs/000", Some(GetOptions::new().with_revision(revs[4]))).await;
    assert!(r.is_err(), "history at and below fast's committed revision is compacted");
    let f = c.group("fast").await?.unwrap();
    assert_eq!((f.compact_revision, f.lost_history), (revs[4] + 1, false));

    info!("fast commits the head; compaction then goes all the way");
    c.commit_group("fast", head).await?;
    kv.compact(head, None).await?;
    assert_eq!(c.group("fast").await?.unwrap().compact_revision, head);
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn a_group_past_its_lag_bound_loses_history_and_its_consumer_is_told() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let mut kv = cluster.client(2).await?;
    let g =
        c.create_group("tiny", "feed/", GroupOptions::new().prefix().max_lag_revisions(5)).await?;
    let revs = write(&mut kv, "feed/", 0, 10).await?;
    let head = *revs.last().unwrap();
    info!("the group lags 10 revisions > its bound of 5: compaction passes it");
    kv.compact(head, None).await?;
    assert!(grep_logs(&cluster, "lost history to compaction"));
    let info = c.group("tiny").await?.unwrap();
    assert!(info.lost_history && !info.holding, "{info:?}");
    match c.subscribe("tiny").await {
        Err(ClientError::LostHistory { group, committed, compacted }) => {
            assert_eq!((group.as_str(), committed, compacted), ("tiny", g.committed, head));
        }
        other => panic!("expected LostHistory, got {other:?}"),
    }
    let err = consume(&cluster, "tiny", 1).await.expect_err("the consumer process must fail");
    let want = format!("lost history: committed {}, compacted through {head}", g.committed);
    assert!(format!("{err:#}").contains(&want), "{err:#}");

    info!("acknowledging the loss lets the group resume from the compaction point");
    assert_eq!(c.skip_lost_history("tiny").await?, head - 1);
    let mut sub = c.subscribe("tiny").await?;
    let batch = sub.next().await.context("stream ended")??;
    assert_eq!(batch.events[0].kv.as_ref().unwrap().mod_revision, head);
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn groups_survive_a_full_restart_and_a_leader_kill() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let mut kv = cluster.client(0).await?;
    c.create_group("durable", "state/", GroupOptions::new().prefix()).await?;
    let revs = write(&mut kv, "state/", 0, 6).await?;
    c.commit_group("durable", revs[2]).await?;
    drop(kv);
    drop(c);

    info!("stop and restart every member: the group and its position are still there");
    for i in 0..3 {
        cluster.stop(i).await?;
    }
    cluster.restart_all().await?;
    let c = client(&cluster).await?;
    let g = c.group("durable").await?.context("group gone after restart")?;
    assert_eq!(g.committed, revs[2]);

    info!("kill the leader; the survivors still clamp compaction at the group's position");
    let leader = cluster.leader().await?;
    cluster.kill(leader)?;
    let survivor = (leader + 1) % 3;
    let mut kv = cluster.client(survivor).await?;
    let head = *revs.last().unwrap();
    eventually("compaction after the leader kill", Duration::from_secs(30), || {
        let mut kv = kv.clone();
        async move { Ok(kv.compact(head, None).await?) }
    })
    .await?;
    let g = eventually("group read after the leader kill", Duration::from_secs(30), || {
        let c = c.clone();
        async move { c.group("durable").await?.context("group gone") }
    })
    .await?;
    assert_eq!((g.committed, g.compact_revision, g.holding), (revs[2], revs[2] + 1, true));
    let r = kv.get("state/003", Some(GetOptions::new().with_revision(revs[3]))).await?;
    assert_eq!(r.kvs().len(), 1);

    info!("the killed member comes back with the same clamped compaction point");
    cluster.restart(leader).await?;
    let mut back = cluster.client(leader).await?;
    let st = back
        .get("state/003", Some(GetOptions::new().with_revision(revs[3]).with_serializable()))
        .await?;
    assert_eq!(st.kvs().len(), 1, "the restarted member kept the held history too");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn bad_group_requests_get_clear_errors() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let invalid = |r: Result<picket_client::GroupInfo, ClientError>, want: &str| match r {
        Err(ClientError::InvalidArgument(m)) => assert!(m.contains(want), "{m}"),
        other => panic!("expected InvalidArgument({want}), got {other:?}"),
    };
    invalid(c.create_group("a/b", "k/", GroupOptions::new().prefix()).await, "invalid group name");
    invalid(c.create_group("g", "picket/", GroupOptions::new().prefix()).await, "picket/sub/");
    invalid(c.create_group("g", "k", GroupOptions::new().max_lag_revisions(-1)).await, "max_lag");
    invalid(c.create_group("g", "k", GroupOptions::new().start_revision(1000)).await, "future");
    c.create_group("g", "k", GroupOptions::new()).await?;
    match c.create_group("g", "k", GroupOptions::new()).await {
        Err(ClientError::Server { code: tonic::Code::AlreadyExists, .. }) => {}
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    match c.commit_group("g", 1_000_000).await {
        Err(ClientError::InvalidArgument(m)) => assert!(m.contains("past the current"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(c.group("nope").await?.is_none());
    match c.subscribe("nope").await {
        Err(ClientError::Server { code: tonic::Code::NotFound, .. }) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    cluster.finish();
    Ok(())
}
