//! `picket.v1.Queue` against real `picketd` processes: claim order, exclusive and fenced claims,
//! claims that end with the worker's lease, backoff, dead letters, dedup, and no acknowledged
//! enqueue lost when the leader is SIGKILLed under traffic.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use picket_client::queue::JobState;
use picket_client::{ClaimOptions, Client, ConnectOptions, EnqueueOptions, Error, Queue};
use picket_proto::picket::v1::queue_client::QueueClient;
use picket_proto::picket::v1::{AckJobRequest, ClaimRequest};
use picket_tests::{Cluster, ClusterOptions};
use tokio::sync::Mutex;
use tracing::info;

async fn client(cluster: &Cluster) -> Result<Client> {
    let opts = ConnectOptions::default().with_request_timeout(Duration::from_secs(10));
    Ok(Client::connect_with(&cluster.endpoints(), opts).await?)
}

#[allow(clippy::disallowed_methods)] // The test's own clock, compared with the server's stamps.
fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

#[tokio::test]
async fn enqueue_claim_ack_in_priority_then_fifo_order() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("orders");
    let lease = c.lease_grant(30, 0).await?.id;

    info!("three jobs: two at priority 0 (FIFO between them), one at priority 5 (first)");
    let a = q.enqueue("a").await?;
    let b = q.enqueue("b").await?;
    let hi = q.enqueue_with("hi", EnqueueOptions::new().priority(5)).await?;
    assert!(a.revision < b.revision && b.revision < hi.revision);
    let stats = q.inspect(10).await?;
    assert_eq!((stats.ready, stats.delayed, stats.in_flight, stats.dead), (3, 0, 0, 0));
    assert_eq!(
        stats.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [hi.id.as_str(), a.id.as_str(), b.id.as_str()]
    );

    let mut tokens = Vec::new();
    for want in [("hi", &hi.id), ("a", &a.id), ("b", &b.id)] {
        let job = q.claim(lease, Some(Duration::ZERO)).await?.context("a job is ready")?;
        assert_eq!((job.payload.as_slice(), &job.id), (want.0.as_bytes(), want.1));
        assert_eq!(job.attempt, 1);
        tokens.push(job.token);
        if want.0 == "hi" {
            let s = q.inspect(10).await?;
            assert_eq!((s.ready, s.in_flight), (2, 1));
            assert_eq!(s.jobs[0].state, JobState::Claimed);
            assert_eq!(s.jobs[0].token, Some(job.token));
            assert_eq!(s.jobs[0].lease, Some(lease));
        }
        job.ack().await?;
        info!(token = job.token, "acked; a second ack of the same claim is refused");
        match job.ack().await {
            Err(Error::Fenced(m)) => assert!(m.contains("no longer in the queue"), "{m}"),
            other => bail!("second ack: {other:?}"),
        }
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens grow: {tokens:?}");
    assert!(q.claim(lease, Some(Duration::ZERO)).await?.is_none(), "the queue is empty");
    let s = q.inspect(10).await?;
    assert_eq!((s.ready, s.delayed, s.in_flight, s.dead), (0, 0, 0, 0));

    info!("bad input gets a clear error, not a crash");
    match c.queue("a/b").enqueue("x").await {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("queue name"), "{m}"),
        other => bail!("bad name: {other:?}"),
    }
    match q.claim(0, Some(Duration::ZERO)).await {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("lease"), "{m}"),
        other => bail!("no lease: {other:?}"),
    }
    // An unknown lease is refused even on an empty queue: a worker whose lease ended learns it
    // at once instead of waiting for a job it could never hold.
    for _ in 0..2 {
        match q.claim(0x7777, Some(Duration::ZERO)).await {
            Err(Error::LeaseNotFound(id)) => assert_eq!(id, 0x7777),
            other => bail!("unknown lease: {other:?}"),
        }
        q.enqueue("z").await?;
    }
    cluster.finish();
    Ok(())
}

/// Two workers, one per lease, claim and ack until the queue is empty, acking with a plain Ack
/// or (`ack_and_claim`) taking the next job in the ack's write. Returns the job ids acked, in
/// the order the acks answered.
async fn drain(q: &Queue, leases: [i64; 2], ack_and_claim: bool) -> Result<Vec<String>> {
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for lease in leases {
        let (q, acked) = (q.clone(), acked.clone());
        workers.push(tokio::spawn(async move {
            let mut job = q.claim(lease, Some(Duration::ZERO)).await?;
            while let Some(j) = job {
                job = if ack_and_claim {
                    j.ack_and_claim(lease, ClaimOptions::new().wait(Duration::ZERO)).await?
                } else {
                    j.ack().await?;
                    q.claim(lease, Some(Duration::ZERO)).await?
                };
                acked.lock().await.push(j.id);
            }
            Ok::<_, Error>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    let acked = acked.lock().await.clone();
    Ok(acked)
}

#[tokio::test]
async fn a_waiting_claim_wakes_on_enqueue_and_two_workers_never_share_a_job() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("work");
    let l1 = c.lease_grant(30, 0).await?.id;
    let l2 = c.lease_grant(30, 0).await?.id;

    info!("two workers wait on an empty queue; one job arrives; exactly one gets it");
    let (q1, q2) = (q.clone(), q.clone());
    let w1 = tokio::spawn(async move { q1.claim(l1, Some(Duration::from_secs(3))).await });
    let w2 = tokio::spawn(async move { q2.claim(l2, Some(Duration::from_secs(3))).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let job = q.enqueue("only").await?;
    let (r1, r2) = (w1.await??, w2.await??);
    let got: Vec<_> = [r1, r2].into_iter().flatten().collect();
    assert_eq!(got.len(), 1, "exactly one worker holds the job");
    assert_eq!(got[0].id, job.id);
    got[0].ack().await?;

    info!("two workers drain 20 jobs concurrently: every job acked exactly once");
    let mut ids = BTreeSet::new();
    for i in 0..20 {
        ids.insert(q.enqueue(format!("job-{i}")).await?.id);
    }
    let acked = drain(&q, [l1, l2], false).await?;
    assert_eq!(acked.len(), 20, "no job acked twice: {acked:?}");
    assert_eq!(acked.into_iter().collect::<BTreeSet<_>>(), ids);
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn ack_and_claim_takes_the_next_job_in_the_acks_write() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("pipeline");
    let l1 = c.lease_grant(30, 0).await?.id;
    let l2 = c.lease_grant(30, 0).await?.id;
    let zero = || ClaimOptions::new().wait(Duration::ZERO);

    info!("two workers drain 30 jobs, each acking and claiming in one call: each job once");
    let mut ids = BTreeSet::new();
    for i in 0..30 {
        ids.insert(q.enqueue(format!("job-{i}")).await?.id);
    }
    let acked = drain(&q, [l1, l2], true).await?;
    assert_eq!(acked.len(), 30, "no job acked twice: {acked:?}");
    assert_eq!(acked.into_iter().collect::<BTreeSet<_>>(), ids);
    let s = q.inspect(10).await?;
    assert_eq!((s.ready, s.in_flight), (0, 0));

    info!("with nothing ready the call acks, then waits server-side for the next enqueue");
    // The raw RPC with one long wait, through a follower (forwarded): the client crate would
    // continue a short server-side wait with claims of its own and hide a server that did not
    // wait.
    q.enqueue("first").await?;
    let first = q.claim(l1, Some(Duration::ZERO)).await?.context("ready")?;
    let leader = cluster.leader().await?;
    let follower = (leader + 1) % 3;
    let mut raw = QueueClient::connect(cluster.endpoint(follower)).await?;
    let req = AckJobRequest {
        queue: "pipeline".into(),
        job_id: first.id.clone(),
        token: first.token,
        claim_next: Some(ClaimRequest {
            lease: l1,
            wait_timeout_ms: Some(10_000),
            ..Default::default()
        }),
    };
    let waiting = {
        let mut raw = raw.clone();
        let req = req.clone();
        tokio::spawn(async move { raw.ack(req).await })
    };
    // Bounded: 200 x 50 ms until the ack shows (the claim then waits server-side).
    let mut acked = false;
    for _ in 0..200 {
        if q.inspect(10).await?.in_flight == 0 {
            acked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(acked, "the ack did not apply while its claim waited");
    ensure!(!waiting.is_finished(), "the claim waits for a job");
    let second = q.enqueue("second").await?;
    let resp = waiting.await??.into_inner();
    let got = resp.next.clone().context("the waiting claim gets the new job")?;
    assert_eq!(got.job_id, second.id);
    assert!(resp.ack_revision > 0 && resp.ack_revision < got.token, "{resp:?}");
    assert_eq!(resp.header.map(|h| h.revision), Some(got.token));
    let got = q.claim(l1, Some(Duration::ZERO)).await?;
    assert!(got.is_none(), "second is held: {got:?}");
    let got = q.inspect(10).await?;
    assert_eq!((got.ready, got.in_flight), (0, 1));
    info!("a claim_next on another queue is refused before anything is written");
    let other = AckJobRequest {
        claim_next: Some(ClaimRequest {
            queue: "elsewhere".into(),
            lease: l1,
            ..Default::default()
        }),
        ..req
    };
    let code = raw.ack(other).await.err().map(|s| s.code());
    assert_eq!(code, Some(tonic::Code::InvalidArgument));
    // Done with second, by its token as Inspect shows it.
    let held = q.inspect(10).await?.jobs.into_iter().find(|j| j.id == second.id);
    q.ack(&second.id, held.and_then(|j| j.token).context("second's claim token")?).await?;

    info!("a stale claim's ack_and_claim is fenced and claims nothing");
    q.enqueue("third").await?;
    let stale = q.claim(l1, Some(Duration::ZERO)).await?.context("ready")?;
    stale.ack().await?;
    q.enqueue("fourth").await?;
    match stale.ack_and_claim(l2, zero()).await {
        Err(Error::Fenced(_)) => {}
        other => bail!("a stale ack_and_claim: {other:?}"),
    }
    let s = q.inspect(10).await?;
    assert_eq!((s.ready, s.in_flight), (1, 0), "fourth still unclaimed");
    info!("and a missing lease refuses it whole: the job stays claimed");
    let fourth = q.claim(l2, Some(Duration::ZERO)).await?.context("ready")?;
    c.lease_revoke(l1).await?;
    match fourth.ack_and_claim(l1, zero()).await {
        Err(Error::LeaseNotFound(id)) => assert_eq!(id, l1),
        other => bail!("ack_and_claim on a revoked lease: {other:?}"),
    }
    let s = q.inspect(10).await?;
    assert_eq!((s.ready, s.in_flight), (0, 1), "fourth still held by l2");
    fourth.ack().await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn a_claim_ends_with_its_lease_and_the_late_ack_is_refused() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("emails");
    let job = q.enqueue("send").await?;
    let la = c.lease_grant(30, 0).await?.id;
    let lb = c.lease_grant(30, 0).await?.id;
    let a = q.claim(la, Some(Duration::ZERO)).await?.context("ready")?;
    assert!(q.claim(lb, Some(Duration::ZERO)).await?.is_none(), "held by A");

    info!("A's lease is revoked: its claim goes with it and B claims the job");
    c.lease_revoke(la).await?;
    let b = q.claim(lb, Some(Duration::from_secs(5))).await?.context("claimable again")?;
    assert_eq!((b.id.as_str(), b.attempt), (job.id.as_str(), 2));
    assert!(b.token > a.token);

    info!("A wakes up: its ack and nack are refused, naming B's token");
    for r in [a.ack().await.err(), a.nack(None, "x").await.err()] {
        match r {
            Some(Error::Fenced(m)) => assert!(m.contains(&format!("token {}", b.token)), "{m}"),
            other => bail!("stale claim: {other:?}"),
        }
    }
    assert!(a.extend(None).await.is_err());
    info!("B extends with a visibility deadline and acks");
    let deadline = b.extend(Some(Duration::from_secs(60))).await?.context("deadline set")?;
    assert!(deadline > wall_ms());
    b.ack().await?;
    let s = q.inspect(10).await?;
    assert_eq!((s.ready, s.in_flight, s.dead), (0, 0, 0));
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn visibility_deadline_lets_another_worker_take_over() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("stuck");
    q.enqueue("x").await?;
    let la = c.lease_grant(60, 0).await?.id;
    let lb = c.lease_grant(60, 0).await?.id;
    let opts = picket_client::ClaimOptions::new().visibility(Duration::from_millis(300));
    let a = q.claim_with(la, opts.wait(Duration::ZERO)).await?.context("ready")?;
    info!("A's lease lives but A hangs past its visibility deadline: B takes the job over");
    let b = q.claim(lb, Some(Duration::from_secs(10))).await?.context("taken over")?;
    assert_eq!((b.id.as_str(), b.attempt), (a.id.as_str(), 2));
    assert!(matches!(a.ack().await, Err(Error::Fenced(_))));
    b.ack().await?;
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn nack_backs_off_exponentially_then_dead_letters_and_requeues() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("flaky");
    let lease = c.lease_grant(60, 0).await?.id;
    let opts = EnqueueOptions::new().max_attempts(3).backoff(Duration::from_millis(200));
    let job = q.enqueue_with("p", opts).await?;

    let mut last_gap = 0;
    for attempt in 1..=2u32 {
        let j = q.claim(lease, Some(Duration::from_secs(10))).await?.context("due")?;
        assert_eq!((j.id.as_str(), j.attempt), (job.id.as_str(), attempt));
        let before = wall_ms();
        assert!(!j.nack(None, &format!("boom {attempt}")).await?, "not yet dead");
        let s = q.inspect(10).await?;
        let ready_at = s.jobs[0].ready_at_ms;
        let gap = ready_at.saturating_sub(before);
        info!(attempt, gap, "nacked without a delay: exponential backoff");
        // Lower bounds only: the server stamped ready_at after `before` plus the backoff.
        assert!(gap >= 200 * (1 << (attempt - 1)), "backoff {gap} ms after attempt {attempt}");
        assert!(gap > last_gap);
        last_gap = gap;
        assert_eq!(s.jobs[0].last_error, format!("boom {attempt}"));
        assert_eq!(s.jobs[0].attempts, attempt);
    }
    info!("the third claim is the last attempt; its nack dead-letters the job");
    let j = q.claim(lease, Some(Duration::from_secs(10))).await?.context("due")?;
    assert_eq!(j.attempt, 3);
    assert!(j.nack(Some(Duration::ZERO), "final").await?, "dead-lettered");
    let s = q.inspect(10).await?;
    assert_eq!((s.ready, s.delayed, s.in_flight, s.dead), (0, 0, 0, 1));
    let (dead, count) = q.dead_letters(10).await?;
    assert_eq!(count, 1);
    assert_eq!(dead[0].job.id, job.id);
    assert_eq!(dead[0].payload, b"p");
    assert_eq!(dead[0].job.last_error, "final");
    assert!(dead[0].reason.contains("last attempt"), "{}", dead[0].reason);

    info!("requeue: back with its attempts reset");
    q.requeue(&job.id).await?;
    assert!(q.requeue(&job.id).await.is_err(), "no longer dead");
    let j = q.claim(lease, Some(Duration::ZERO)).await?.context("requeued")?;
    assert_eq!((j.id.as_str(), j.attempt), (job.id.as_str(), 1));
    j.ack().await?;

    info!("a job whose claimants' leases keep dying is dead-lettered by the next claimer");
    let once = q.enqueue_with("dies", EnqueueOptions::new().max_attempts(1)).await?;
    let short = c.lease_grant(60, 0).await?.id;
    q.claim(short, Some(Duration::ZERO)).await?.context("ready")?;
    c.lease_revoke(short).await?;
    assert!(q.claim(lease, Some(Duration::ZERO)).await?.is_none(), "moved, not handed out");
    let (dead, _) = q.dead_letters(10).await?;
    let d = dead.iter().find(|d| d.job.id == once.id).context("dead-lettered")?;
    assert!(d.reason.contains("lease ended"), "{}", d.reason);
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn dedup_id_makes_enqueue_idempotent_and_delay_holds_a_job_back() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("dedup");
    let first = q.enqueue_with("x", EnqueueOptions::new().dedup_id("order-7")).await?;
    let again = q.enqueue_with("y", EnqueueOptions::new().dedup_id("order-7")).await?;
    assert!(!first.duplicate && again.duplicate);
    assert_eq!((again.id.as_str(), again.revision), (first.id.as_str(), first.revision));
    let s = q.inspect(10).await?;
    assert_eq!(s.ready, 1);

    info!("a delayed job is not claimable before its time");
    let later = c.queue("later");
    later.enqueue_with("z", EnqueueOptions::new().delay(Duration::from_secs(3600))).await?;
    let lease = c.lease_grant(60, 0).await?.id;
    assert!(later.claim(lease, Some(Duration::from_millis(200))).await?.is_none());
    let s = later.inspect(10).await?;
    assert_eq!((s.ready, s.delayed), (0, 1));
    assert_eq!(s.jobs[0].state, JobState::Delayed);
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn leader_sigkill_under_traffic_loses_no_acknowledged_enqueue() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let c = client(&cluster).await?;
    let q = c.queue("durable");
    // An upper bound on the producer; it normally stops earlier, once enough enqueues were
    // acknowledged after the kill.
    const JOBS: usize = 400;
    // Enqueues acknowledged before the kill, and again after it, before the producer stops. The
    // kill then lands in the middle of the traffic by construction, not by timing luck.
    const AROUND_KILL: usize = 10;

    info!("a producer enqueues with dedup ids (so it may retry), two workers claim and ack");
    let enqueued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let producer_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (q, enqueued, producer_stop) = (q.clone(), enqueued.clone(), producer_stop.clone());
        tokio::spawn(async move {
            let mut acknowledged = BTreeMap::new();
            for i in 0..JOBS {
                if producer_stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let opts = EnqueueOptions::new().dedup_id(format!("job-{i}"));
                // Bounded retries: the dedup id makes a retried enqueue return the first one.
                for _ in 0..20 {
                    match q.enqueue_with(format!("{i}"), opts.clone()).await {
                        Ok(e) => {
                            acknowledged.insert(e.id, i);
                            enqueued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            break;
                        }
                        Err(e) => {
                            info!(error = %e, i, "enqueue failed; retrying with the same dedup id");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
            acknowledged
        })
    };
    let acked = Arc::new(Mutex::new(BTreeMap::<String, Vec<i64>>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let (c, q, acked, stop) = (c.clone(), q.clone(), acked.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut leases = Vec::new();
            // Bounded in count; the test also stops the workers once the producer is done.
            for _ in 0..2000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let Some(&l) = leases.last() else {
                    match c.lease_grant(60, 0).await {
                        Ok(r) => leases.push(r.id),
                        Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                    continue;
                };
                match q.claim(l, Some(Duration::from_millis(500))).await {
                    Ok(Some(job)) => {
                        match job.ack().await {
                            Ok(()) => acked.lock().await.entry(job.id).or_default().push(job.token),
                            // Maybe applied: the drain must not count the job as lost.
                            Err(Error::OutcomeUnknown(_)) => {
                                acked.lock().await.entry(job.id).or_default().push(-job.token)
                            }
                            Err(_) => {}
                        }
                    }
                    Ok(None) => {}
                    Err(Error::LeaseNotFound(_)) => leases.clear(),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            leases
        }));
    }
    let count = || enqueued.load(std::sync::atomic::Ordering::Relaxed);
    wait_until("enqueues acknowledged before the kill", || count() >= AROUND_KILL).await?;
    let leader = cluster.leader().await?;
    let before = count();
    ensure!(!producer.is_finished(), "the producer finished before the kill: nothing in flight");
    info!(leader, before, "SIGKILL the leader mid-traffic");
    cluster.kill(leader)?;
    let new_leader = cluster.new_leader(leader).await?;
    info!(new_leader, "a new leader was elected while the old one is down");
    cluster.restart(leader).await?;
    wait_until("enqueues acknowledged after the kill", || count() >= before + AROUND_KILL).await?;
    producer_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acknowledged = producer.await?;
    // The traffic spanned the kill: enqueues were acknowledged before it by the old leader and
    // after it by the cluster under a new leader, from one producer that never stopped between.
    ensure!(acknowledged.len() >= before + AROUND_KILL, "{} <= {before}", acknowledged.len());
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut worker_leases = Vec::new();
    for w in workers {
        worker_leases.extend(w.await?);
    }

    info!("revoke the workers' leases (claims whose ack was lost come back), then drain");
    for l in worker_leases {
        let _ = c.lease_revoke(l).await;
    }
    let lease = c.lease_grant(60, 0).await?.id;
    let mut leftovers = Vec::new();
    while let Some(job) = q.claim(lease, Some(Duration::from_secs(2))).await? {
        job.ack().await?;
        leftovers.push(job.id);
        assert!(leftovers.len() <= JOBS, "drain is bounded");
    }
    let s = q.inspect(0).await?;
    assert_eq!((s.ready, s.delayed, s.in_flight, s.dead), (0, 0, 0, 0));
    let acked = acked.lock().await.clone();
    for (id, tokens) in &acked {
        // Negative tokens are acks with an unknown outcome; at most one ack can have applied
        // (the second would be refused), so two confirmed ones would be a double delivery.
        let confirmed = tokens.iter().filter(|t| **t > 0).count();
        assert!(confirmed <= 1, "job {id} acked by two claims: {tokens:?}");
    }
    for id in &leftovers {
        let confirmed = acked.get(id).is_some_and(|t| t.iter().any(|t| *t > 0));
        assert!(!confirmed, "job {id} acked by a worker and again by the drain");
    }
    let done: BTreeSet<&String> = acked.keys().chain(leftovers.iter()).collect();
    for (id, i) in &acknowledged {
        assert!(done.contains(id), "acknowledged enqueue {i} (job {id}) was lost");
    }
    info!(
        acknowledged = acknowledged.len(),
        acked = acked.len(),
        leftovers = leftovers.len(),
        "done"
    );
    cluster.finish();
    Ok(())
}

/// Polls `done` until it holds, for at most 60 s (a 3-member cluster re-elects and catches up in
/// a few seconds even on a loaded 2-core machine; past that the cluster is stuck and the test
/// fails naming `what`).
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        ensure!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Runs `picket` against `endpoints` and returns (exit code, stdout, stderr).
async fn picket(endpoints: &[String], args: &[&str]) -> Result<(i32, String, String)> {
    let bin = picket_tests::binary::picketd_bin()?.with_file_name("picket");
    let out = tokio::process::Command::new(bin)
        .arg("--endpoints")
        .arg(endpoints.join(","))
        .args(args)
        .output()
        .await?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn the_cli_bench_runs_its_cycles_and_leaves_the_queue_empty() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();
    let args = ["queue", "bench", "b", "--count", "40", "--concurrency", "4", "-w", "json"];
    let (code, out, err) = picket(&eps, &args).await?;
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(r["cycles"], 40, "{out}");
    // Every job enqueued was acked: the cycles' ack-and-claims and each worker's last ack.
    let s = client(&cluster).await?.queue("b").inspect(10).await?;
    assert_eq!((s.ready, s.delayed, s.in_flight, s.dead), (0, 0, 0, 0), "{s:?}");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn the_cli_enqueues_claims_acks_and_reports_stale_tokens() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();
    let (code, out, err) =
        picket(&eps, &["queue", "enqueue", "cli", "hello", "-w", "json"]).await?;
    assert_eq!(code, 0, "{err}");
    let enq: serde_json::Value = serde_json::from_str(out.trim())?;
    let (code, out, err) =
        picket(&eps, &["queue", "claim", "cli", "--ttl", "30", "-w", "json"]).await?;
    assert_eq!(code, 0, "{err}");
    let claim: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(claim["id"], enq["id"]);
    assert_eq!(claim["payload"], "hello");
    let (id, token) = (claim["id"].as_str().unwrap().to_string(), claim["token"].to_string());

    info!("nothing left: claim exits 3; a wrong token exits 7 naming the live one");
    let (code, _, _) = picket(&eps, &["queue", "claim", "cli"]).await?;
    assert_eq!(code, 3);
    let (code, _, err) = picket(&eps, &["queue", "ack", "cli", &id, "1"]).await?;
    assert_eq!(code, 7, "{err}");
    assert!(err.contains(&format!("token {token}")), "{err}");
    let (code, out, err) = picket(&eps, &["queue", "inspect", "cli"]).await?;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 in flight"), "{out}");
    let (code, _, err) = picket(&eps, &["queue", "ack", "cli", &id, &token]).await?;
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = picket(&eps, &["queue", "dlq", "cli"]).await?;
    assert_eq!(code, 0);
    assert!(out.contains("0 dead letters"), "{out}");
    let (code, _, err) = picket(&eps, &["queue", "enqueue", "bad/name", "x"]).await?;
    assert_eq!(code, 2, "{err}");
    cluster.finish();
    Ok(())
}
