//! Failover with real processes: SIGKILL of the *leader* under write load (kv_cluster.rs kills
//! each member in turn, which only sometimes hits the leader, and never checks who leads next),
//! and a cluster reduced to a minority, which must refuse writes rather than acknowledge them,
//! and take writes again once a quorum is back.
//!
//! Every write uses a fresh key and is never retried, so an acknowledged write is identified by
//! its key and must be present with its exact value and revision afterwards. A write that
//! failed is treated by what its error says: `etcdserver: no leader` means it was never
//! proposed, so it must never appear; `etcdserver: request timed out` means the outcome is
//! unknown (the surviving leader may have appended it and commits it once a peer returns), so it
//! may appear, but only with its own value.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, GetOptions};
use picket_tests::util::{grpc_status, rev};
use picket_tests::writer::{check_writes, Writer};
use picket_tests::{eventually, Cluster, ClusterOptions, Kv};
use tonic::Code;
use tracing::info;

/// How long replication, an election or a restarted member's catch-up may take to show. Each
/// takes at most a few election timeouts (1-2 s each); 30 s covers a loaded 2-core machine.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes attempted while the cluster has no quorum. Each one waits for the server's request
/// timeout (7 s with the default election timeout), so a few are enough to show the pattern.
const MINORITY_WRITES: usize = 2;

/// Asks each listed member for its leader; succeeds once all name the same, non-zero leader
/// other than `not`. Returns that leader's member id.
async fn agreed_leader_other_than(cluster: &Cluster, members: &[usize], not: u64) -> Result<u64> {
    let mut seen = Vec::new();
    for &i in members {
        seen.push(cluster.client(i).await?.status().await?.leader());
    }
    ensure!(seen.iter().all(|&l| l == seen[0]), "members disagree on the leader: {seen:x?}");
    ensure!(seen[0] != 0, "no leader yet");
    ensure!(seen[0] != not, "still led by the killed member {not:#x}");
    Ok(seen[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_under_writes_elects_a_new_leader_and_loses_nothing() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let writer = Writer::start(cluster.clients().await?, "w/");
    writer.wait_progress(20, "before any kill").await?;

    // Two rounds: the second kills the leader elected after the first kill, which has only
    // been leading for a short while and took over an uncommitted tail.
    for round in 1..=2 {
        let leader = cluster.leader().await?;
        let old_id = cluster.member_id(leader).context("leader id")?;
        info!(round, member = cluster.name(leader), "phase: SIGKILL the leader under writes");
        writer.set_down(leader, true);
        cluster.kill(leader)?;
        let rest: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        let new_id = eventually("the survivors elect a new leader", CONVERGE_TIMEOUT, || {
            agreed_leader_other_than(&cluster, &rest, old_id)
        })
        .await?;
        ensure!(
            rest.iter().any(|&i| cluster.member_id(i) == Some(new_id)),
            "new leader {new_id:#x} is not a survivor"
        );
        writer.wait_progress(20, &format!("after killing the leader in round {round}")).await?;

        info!(round, "phase: the old leader restarts as a follower and catches up");
        cluster.restart(leader).await?;
        writer.set_down(leader, false);
        writer.wait_progress(20, &format!("after restarting in round {round}")).await?;
        let status = cluster.client(leader).await?.status().await?;
        ensure!(status.leader() != 0, "restarted member knows no leader");
    }
    let log = writer.finish().await?;
    info!(acked = log.acks.len(), "phase: no acknowledged write is lost, on any member");
    check_writes(&cluster, &[0, 1, 2], &log).await?;
    cluster.finish();
    Ok(())
}

/// How a write refused without quorum failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    /// Never proposed: must never appear.
    NotApplied,
    /// Outcome unknown: may appear later with its own value.
    Unknown,
}

/// Attempts `MINORITY_WRITES` fresh writes through `c`, each of which must fail with an error
/// that says whether it was applied. Returns `(key, value, refusal)` per attempt.
async fn refused_writes(c: &mut Client, tag: &str) -> Result<Vec<(String, String, Refusal)>> {
    let mut out = Vec::new();
    for k in 0..MINORITY_WRITES {
        let (key, value) = (format!("minority/{tag}/{k}"), format!("refused-{tag}-{k}"));
        let started = Instant::now();
        let res = c.put(key.clone(), value.clone(), None).await;
        let err = match res {
            Ok(r) => {
                bail!("a write without quorum was acknowledged at revision {}", rev(r.header()))
            }
            Err(e) => e,
        };
        let status = grpc_status(&err).with_context(|| format!("not a gRPC status: {err}"))?;
        info!(key, took = ?started.elapsed(), code = ?status.code(), message = status.message(), "write refused");
        ensure!(status.code() == Code::Unavailable, "unexpected status {status:?}");
        let refusal = match status.message() {
            "etcdserver: no leader" => Refusal::NotApplied,
            "etcdserver: request timed out" | "etcdserver: leader changed" => Refusal::Unknown,
            other => bail!("unexpected refusal message {other:?}"),
        };
        out.push((key, value, refusal));
    }
    Ok(out)
}

/// After quorum is back: refused writes that were never proposed are absent; the others are
/// absent or present with their own value.
async fn check_refused(c: &mut Client, refused: &[(String, String, Refusal)]) -> Result<()> {
    for (key, value, refusal) in refused {
        let r = c.get(key.as_str(), None).await?;
        match (r.kvs().first(), refusal) {
            (None, _) => {}
            (Some(kv), Refusal::Unknown) => {
                ensure!(kv.value() == value.as_bytes(), "{key} has a foreign value")
            }
            (Some(kv), Refusal::NotApplied) => {
                bail!("{key} was refused with `no leader` but is present: {:?}", Kv::from(kv))
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_refuses_writes_and_resumes_when_a_member_returns() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let writer = Writer::start(cluster.clients().await?, "w/");
    writer.wait_progress(20, "with all members up").await?;

    info!("phase: stop both followers; the leader is alone and must not acknowledge writes");
    let leader = cluster.leader().await?;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    writer.quiesce().await?;
    for &f in &followers {
        cluster.stop(f).await?;
    }
    // The writer keeps trying through the lone leader; none of its attempts may be acked.
    let acked_at_stop = writer.acked();
    writer.set_down(leader, false);
    let mut c = cluster.client(leader).await?;
    let mut refused = refused_writes(&mut c, "leader-alone").await?;
    ensure!(
        writer.acked() == acked_at_stop,
        "{} writes were acknowledged without quorum",
        writer.acked() - acked_at_stop
    );
    // A linearizable read needs a quorum too.
    let read = c.get("w/", Some(GetOptions::new().with_prefix().with_count_only())).await;
    ensure!(read.is_err(), "a linearizable read without quorum succeeded");

    info!("phase: one follower returns; writes resume");
    cluster.restart(followers[0]).await?;
    writer.set_down(followers[0], false);
    writer.wait_progress(20, "after a follower returned").await?;
    check_refused(&mut c, &refused).await?;

    info!("phase: stop the leader and the other follower; the survivor is a follower alone");
    let leader = cluster.leader().await?;
    let survivor = (0..3).find(|&i| i != leader && i != followers[1]).context("survivor")?;
    // followers[1] is still down; stopping the leader leaves `survivor` alone.
    writer.quiesce().await?;
    // SIGKILL, not SIGTERM: a gracefully stopping leader hands leadership over first, which
    // would make the survivor the (lone) leader instead of a lone follower.
    cluster.kill(leader)?;
    let acked_at_stop = writer.acked();
    writer.set_down(survivor, false);
    let mut s = cluster.client(survivor).await?;
    refused.extend(refused_writes(&mut s, "follower-alone").await?);
    ensure!(writer.acked() == acked_at_stop, "writes were acknowledged without quorum");

    info!("phase: everyone returns; acknowledged writes are all there, refused ones are not");
    cluster.restart_all().await?;
    for i in 0..3 {
        writer.set_down(i, false);
    }
    writer.wait_progress(20, "with all members back").await?;
    let log = writer.finish().await?;
    check_writes(&cluster, &[0, 1, 2], &log).await?;
    check_refused(&mut cluster.client(0).await?, &refused).await?;
    cluster.finish();
    Ok(())
}

/// Election timeout for the vote-hold test: members campaign 2-3 s after their start
/// (`election_timeout_min`) and hold their votes for the leader lease, 3 s
/// (`election_timeout_max`); long next to a member's ~0.2 s start-up, so the two are told apart.
const HOLD_ELECTION_MS: u64 = 4_000;
const HOLD_HEARTBEAT_MS: u64 = 200;
const HOLD_LEASE: Duration = Duration::from_millis(HOLD_ELECTION_MS * 3 / 4);

/// How often the vote-hold test asks the restarted members whether they name a leader.
const LEADER_POLL: Duration = Duration::from_millis(20);

/// Whether any of `members` names a leader now (members still starting, or with no leader,
/// count as no).
async fn any_names_a_leader(cluster: &Cluster, members: &[usize]) -> bool {
    for &i in members {
        if let Ok(mut c) = cluster.client(i).await {
            if c.status().await.is_ok_and(|s| s.leader() != 0) {
                return true;
            }
        }
    }
    false
}

/// A member restarted under an established leader refuses votes for one leader lease after its
/// start (`raft::vote_hold`): the leader counts on its followers' promise not to vote for anyone
/// else within a lease when it confirms a keep-alive by a recent acknowledgement, and openraft
/// keeps that promise in memory only. So when every member dies and the two followers come back
/// without the leader, they elect one of themselves only after the hold. Without it, their
/// leases gone with their processes, they elect one after their first election timeout (2-3 s
/// here, against a 3 s hold). (A restarted leader resumes its own term at once, with no
/// election, so it is left down until the end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_restarted_together_elect_no_leader_within_a_leader_lease() -> Result<()> {
    let opts = ClusterOptions::default().timing(HOLD_HEARTBEAT_MS, HOLD_ELECTION_MS);
    let mut cluster = Cluster::start(3, opts).await?;
    let leader = cluster.leader().await?;
    cluster.client(leader).await?.put("before", "1", None).await?;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();

    info!("phase: SIGKILL every member, start the followers again, and time their election");
    for i in 0..3 {
        cluster.kill(i)?;
    }
    let spawned = Instant::now();
    for &i in &followers {
        cluster.spawn(i)?;
    }
    let elected = loop {
        if any_names_a_leader(&cluster, &followers).await {
            break spawned.elapsed();
        }
        ensure!(
            spawned.elapsed() < CONVERGE_TIMEOUT,
            "no leader {CONVERGE_TIMEOUT:?} after the restart"
        );
        tokio::time::sleep(LEADER_POLL).await;
    };
    info!(?elected, "a restarted follower names a leader");
    ensure!(
        elected >= HOLD_LEASE,
        "the restarted followers elected a leader {elected:?} after they were started, before \
         their vote hold of one leader lease ({HOLD_LEASE:?}) ended"
    );
    for &i in &followers {
        let held = cluster.log_lines(i, &["refusing votes for one leader lease"])?;
        ensure!(
            held == 1,
            "member {i} logged the vote hold {held} times, not once (at its restart)"
        );
    }

    cluster.spawn(leader)?;
    cluster.wait_all_ready(CONVERGE_TIMEOUT).await?;
    let got = cluster.client(leader).await?.get("before", None).await?;
    ensure!(
        got.kvs().first().map(|kv| kv.value()) == Some(&b"1"[..]),
        "lost the write before the restart"
    );
    cluster.finish();
    Ok(())
}
