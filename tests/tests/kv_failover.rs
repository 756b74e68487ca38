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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, GetOptions};
use picket_tests::util::{grpc_status, rev, POLL_INTERVAL};
use picket_tests::{eventually, kvs, Cluster, ClusterOptions, Kv};
use tonic::Code;
use tracing::info;

/// How long replication, an election or a restarted member's catch-up may take to show. Each
/// takes at most a few election timeouts (1-2 s each); 30 s covers a loaded 2-core machine.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the writer may take to make a given amount of progress: an election after the
/// kill, plus in-flight requests to the dead member failing (at most the 15 s client timeout).
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);

/// Hard cap on the writes one writer attempts, so even a misbehaving test cannot loop forever.
const MAX_WRITER_ATTEMPTS: u64 = 100_000;

/// Writes attempted while the cluster has no quorum. Each one waits for the server's request
/// timeout (7 s with the default election timeout), so a few are enough to show the pattern.
const MINORITY_WRITES: usize = 2;

fn wkey(seq: u64) -> String {
    format!("w/{seq:08}")
}

fn wvalue(seq: u64) -> String {
    format!("value-{seq}")
}

/// One acknowledged write.
#[derive(Debug, Clone, Copy)]
struct Ack {
    seq: u64,
    revision: i64,
}

/// A sequential background writer over the members not marked down, one fresh key per attempt.
struct Writer {
    acks: Arc<Mutex<Vec<Ack>>>,
    down: Arc<Vec<AtomicBool>>,
    /// Set by the writer when it found every member marked down, so no put is in flight.
    idle: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(clients: Vec<Client>) -> Writer {
        let acks = Arc::new(Mutex::new(Vec::new()));
        let down: Arc<Vec<AtomicBool>> =
            Arc::new(clients.iter().map(|_| AtomicBool::new(false)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let idle = Arc::new(AtomicBool::new(false));
        let (a, d, s, idle2) = (acks.clone(), down.clone(), stop.clone(), idle.clone());
        let mut clients = clients;
        let task = tokio::spawn(async move {
            let n = clients.len();
            for seq in 0..MAX_WRITER_ATTEMPTS {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Some(i) =
                    (0..n).map(|k| (seq as usize + k) % n).find(|&i| !d[i].load(Ordering::SeqCst))
                else {
                    idle2.store(true, Ordering::SeqCst);
                    tokio::time::sleep(POLL_INTERVAL).await;
                    continue;
                };
                idle2.store(false, Ordering::SeqCst);
                match clients[i].put(wkey(seq), wvalue(seq), None).await {
                    Ok(r) => a.lock().unwrap().push(Ack { seq, revision: rev(r.header()) }),
                    // Indeterminate; never retried. Pause so a leaderless cluster is not hammered.
                    Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
                }
            }
        });
        Writer { acks, down, idle, stop, task }
    }

    /// Marks every member down and waits until the writer has no put in flight, so that the
    /// acknowledgements counted afterwards all belong to puts started afterwards.
    async fn quiesce(&self) -> Result<()> {
        for d in self.down.iter() {
            d.store(true, Ordering::SeqCst);
        }
        self.idle.store(false, Ordering::SeqCst);
        // Bounded by the in-flight put's client timeout (15 s) plus one pause.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.idle.load(Ordering::SeqCst) {
            if Instant::now() >= deadline || self.task.is_finished() {
                bail!("writer did not go idle within 30 s");
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Ok(())
    }

    fn acked(&self) -> usize {
        self.acks.lock().unwrap().len()
    }

    fn set_down(&self, i: usize, down: bool) {
        self.down[i].store(down, Ordering::SeqCst);
    }

    async fn wait_progress(&self, more: usize, why: &str) -> Result<()> {
        let target = self.acked() + more;
        let deadline = Instant::now() + PROGRESS_TIMEOUT;
        while self.acked() < target {
            if Instant::now() >= deadline || self.task.is_finished() {
                bail!("writer stalled {why}: {} acked, wanted {target}", self.acked());
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Ok(())
    }

    /// Stops the writer (bounded by the in-flight put's client timeout) and returns its acks.
    async fn finish(self) -> Result<Vec<Ack>> {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .context("writer did not stop within 30 s")?
            .context("writer task panicked")?;
        let acks = self.acks.lock().unwrap().clone();
        Ok(acks)
    }
}

/// Every pair under `w/` on member `i`, linearizable, at revision `at` (0 = latest).
async fn read_w(cluster: &Cluster, i: usize, at: i64) -> Result<(i64, Vec<Kv>)> {
    let mut c = cluster.client(i).await?;
    let r = c.get("w/", Some(GetOptions::new().with_prefix().with_revision(at))).await?;
    Ok((rev(r.header()), kvs(&r)))
}

/// Checks, on every running member at one pinned revision: acknowledged writes are all present
/// with their value and revision, in acknowledgement order; nothing else is present but writes
/// the writer attempted, each with its own value, written once; and every member agrees.
async fn check_acked(cluster: &Cluster, members: &[usize], acks: &[Ack]) -> Result<Vec<Kv>> {
    for w in acks.windows(2) {
        ensure!(w[0].revision < w[1].revision, "acks out of order: {:?} then {:?}", w[0], w[1]);
    }
    let (at, first) = read_w(cluster, members[0], 0).await?;
    for &i in members {
        let got = eventually("a linearizable read of w/", CONVERGE_TIMEOUT, || async {
            Ok(read_w(cluster, i, at).await?.1)
        })
        .await?;
        ensure!(got == first, "member {} differs from {} at {at}", cluster.name(i), members[0]);
        let by_key: BTreeMap<&[u8], &Kv> = got.iter().map(|kv| (kv.key.as_slice(), kv)).collect();
        for a in acks {
            let key = wkey(a.seq);
            let kv = by_key
                .get(key.as_bytes())
                .with_context(|| format!("acknowledged write {a:?} lost on {}", cluster.name(i)))?;
            ensure!(
                **kv == Kv::new(&key, wvalue(a.seq), a.revision, a.revision, 1),
                "acknowledged write {a:?} reads back as {kv:?}"
            );
        }
        for kv in &got {
            let key = String::from_utf8_lossy(&kv.key);
            let seq: u64 = key.trim_start_matches("w/").parse().context("unexpected key")?;
            ensure!(kv.value == wvalue(seq).as_bytes() && kv.version == 1, "unexpected {kv:?}");
        }
    }
    Ok(first)
}

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
    let writer = Writer::start(cluster.clients().await?);
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
    let acks = writer.finish().await?;
    info!(acked = acks.len(), "phase: no acknowledged write is lost, on any member");
    check_acked(&cluster, &[0, 1, 2], &acks).await?;
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
    let writer = Writer::start(cluster.clients().await?);
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
    cluster.stop(leader).await?;
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
    let acks = writer.finish().await?;
    check_acked(&cluster, &[0, 1, 2], &acks).await?;
    check_refused(&mut cluster.client(0).await?, &refused).await?;
    cluster.finish();
    Ok(())
}
