//! Leases through the `etcd-client` crate against real `picketd` processes: grant (server- and
//! client-chosen ids, the 2 s TTL floor), revoke and expiry deleting every attached key at one
//! revision, keep-alive streams (many leases on one stream, through followers), etcd's answers
//! for unknown leases, leases across a leader kill, and the lease of a client that goes silent.
//!
//! Timing assertions are semantic bounds, never latency targets:
//! - a lease never expires before its TTL has passed since it was granted or last kept alive
//!   (checked soundly: a read that sees the lease gone must have been answered after that point);
//! - a lease is gone at most its TTL plus [`EXPIRY_SLACK`] after its grant or its last
//!   keep-alive answer; across a leader change the bound starts when the cluster serves writes
//!   again (see `leader_kill_keeps_kept_lease_and_expires_abandoned_one`).
//!
//! The raw generated client (`picket-proto`) is used where `etcd-client` hides the wire answer:
//! the crate turns a keep-alive answer with `TTL=0` into an error, and its keepers carry one
//! lease per stream.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{
    Client, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use picket_proto::etcdserverpb::lease_client::LeaseClient as RawLeaseClient;
use picket_proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use picket_tests::util::{keys, rev, POLL_INTERVAL};
use picket_tests::watch::{self, Ev, Kind, WATCH_TIMEOUT};
use picket_tests::{assert_status, kvs, Cluster, ClusterOptions, Kv};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tracing::info;

const LEASE_NOT_FOUND: &str = "etcdserver: requested lease not found";

/// How long after its deadline a lease may still be visible: the leader checks deadlines every
/// 100 ms, the revoke takes one Raft commit, and the test polls every 100 ms with reads that
/// can be slow on a loaded 2-core machine. 3 s covers all of that with a wide margin.
const EXPIRY_SLACK: Duration = Duration::from_secs(3);

/// Interval between keep-alives sent by the tests: a quarter of the 2 s minimum TTL, like
/// clients that renew at a fraction of the TTL.
const KEEPALIVE_EVERY: Duration = Duration::from_millis(500);

async fn single() -> Result<(Cluster, Client)> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let client = cluster.client(0).await?;
    Ok((cluster, client))
}

fn with_lease(id: i64) -> Option<PutOptions> {
    Some(PutOptions::new().with_lease(id))
}

/// `TimeToLive(id)`'s remaining TTL: -1 for an unknown (revoked or expired) lease.
async fn ttl_of(c: &mut Client, id: i64) -> Result<i64> {
    Ok(c.lease_time_to_live(id, None).await.with_context(|| format!("TimeToLive {id:x}"))?.ttl())
}

/// Asserts a TimeToLive answer shows a live lease: `0 <= TTL <= granted`. etcd truncates the
/// remaining time to whole seconds, so a live lease in its last second reports 0; only -1 means
/// gone.
#[track_caller]
fn assert_live_ttl(ttl: i64, granted: i64, what: &str) {
    assert!((0..=granted).contains(&ttl), "{what}: remaining TTL {ttl}, granted {granted}");
}

/// Polls (linearizable reads) until `key` is absent, and returns when the read that first saw it
/// absent was answered. Fails if it is still present at `deadline`. Reads that fail (no leader
/// during an election) are retried.
async fn wait_gone(c: &mut Client, key: &str, deadline: Instant, what: &str) -> Result<Instant> {
    let mut last = String::from("no read attempted");
    // Bounded in count too: each attempt sleeps POLL_INTERVAL.
    let attempts = deadline.saturating_duration_since(Instant::now()).as_millis()
        / POLL_INTERVAL.as_millis()
        + 2;
    for _ in 0..attempts {
        match c.get(key, None).await {
            Ok(r) if r.kvs().is_empty() => return Ok(Instant::now()),
            Ok(r) => last = format!("still present: {:?}", kvs(&r)),
            Err(e) => last = format!("read failed: {e}"),
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!("{what}: {key:?} not gone by the deadline; last read: {last}")
}

/// Waits until `until`, for at least zero time.
async fn sleep_until(until: Instant) {
    tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
}

/// What a background keep-alive loop saw.
#[derive(Debug, Default, Clone)]
struct KeepStats {
    /// Keep-alive answers with a positive TTL.
    answers: u64,
    /// Every TTL answered (deduplicated).
    ttls: BTreeSet<i64>,
    /// Stream errors (each reopened the stream).
    errors: Vec<String>,
    /// The lease was reported gone (TTL 0 or "lease not found"): it expired while kept alive.
    lost: Option<String>,
    /// When the last positive answer arrived.
    last_ok: Option<Instant>,
}

/// A background task keeping one lease alive through one client, as an application would: one
/// keep-alive every [`KEEPALIVE_EVERY`], reopening the stream after any error (there is no
/// leader during an election, and picketd ends a keep-alive stream after an error).
struct KeepAlive {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<KeepStats>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeepAlive {
    fn start(client: Client, id: i64) -> KeepAlive {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(KeepStats::default()));
        let task = {
            let (stop, stats) = (stop.clone(), stats.clone());
            tokio::spawn(async move {
                // Bounded: at most ten minutes of keep-alives, far longer than any test.
                let give_up = Instant::now() + Duration::from_secs(600);
                let mut lease = client.lease_client();
                'reopen: while !stop.load(Ordering::SeqCst) && Instant::now() < give_up {
                    let opened =
                        tokio::time::timeout(Duration::from_secs(15), lease.keep_alive(id)).await;
                    let (mut keeper, mut answers) = match opened {
                        Ok(Ok(pair)) => pair,
                        Ok(Err(etcd_client::Error::LeaseKeepAliveError(m)))
                            if m.contains("not found") =>
                        {
                            stats.lock().unwrap().lost = Some(format!("on (re)open: {m}"));
                            return;
                        }
                        Ok(Err(e)) => {
                            stats.lock().unwrap().errors.push(format!("open: {e}"));
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            continue;
                        }
                        Err(_) => {
                            stats.lock().unwrap().errors.push("open timed out".into());
                            continue;
                        }
                    };
                    // Opening the stream sent one keep-alive and read its answer.
                    {
                        let mut s = stats.lock().unwrap();
                        s.answers += 1;
                        s.last_ok = Some(Instant::now());
                    }
                    while !stop.load(Ordering::SeqCst) && Instant::now() < give_up {
                        tokio::time::sleep(KEEPALIVE_EVERY).await;
                        if let Err(e) = keeper.keep_alive().await {
                            stats.lock().unwrap().errors.push(format!("send: {e}"));
                            continue 'reopen;
                        }
                        match tokio::time::timeout(Duration::from_secs(15), answers.message()).await
                        {
                            Ok(Ok(Some(r))) if r.ttl() > 0 => {
                                let mut s = stats.lock().unwrap();
                                s.answers += 1;
                                s.ttls.insert(r.ttl());
                                s.last_ok = Some(Instant::now());
                            }
                            Ok(Ok(Some(r))) => {
                                stats.lock().unwrap().lost =
                                    Some(format!("answer TTL {}", r.ttl()));
                                return;
                            }
                            Ok(Ok(None)) => {
                                stats.lock().unwrap().errors.push("stream ended".into());
                                continue 'reopen;
                            }
                            Ok(Err(e)) => {
                                stats.lock().unwrap().errors.push(format!("answer: {e}"));
                                continue 'reopen;
                            }
                            Err(_) => {
                                stats.lock().unwrap().errors.push("answer timed out".into());
                                continue 'reopen;
                            }
                        }
                    }
                }
            })
        };
        KeepAlive { stop, stats, task }
    }

    fn stats(&self) -> KeepStats {
        self.stats.lock().unwrap().clone()
    }

    /// Stops the loop (within one keep-alive round trip) and returns what it saw.
    async fn stop(self) -> Result<KeepStats> {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .context("keep-alive loop did not stop within 30 s")?
            .context("keep-alive loop panicked")?;
        let stats = self.stats.lock().unwrap().clone();
        Ok(stats)
    }
}

/// Asserts a lease's keep-alive loop never lost it and was answered with its full TTL.
#[track_caller]
fn assert_kept(stats: &KeepStats, ttl: i64, what: &str) {
    assert!(stats.lost.is_none(), "{what}: lease lost while kept alive: {stats:?}");
    assert!(stats.answers >= 2, "{what}: too few keep-alive answers: {stats:?}");
    assert!(
        stats.ttls.iter().all(|&t| t == ttl),
        "{what}: a keep-alive answer must carry the full TTL {ttl}: {stats:?}"
    );
}

/// A raw `LeaseKeepAlive` stream: many ids on one stream, and the wire answer for unknown ids.
///
/// The call is started only after the first requests are queued: a Go gRPC server (etcd) sends
/// the response headers with its first answer, so awaiting the call before sending anything
/// would wait forever.
struct RawKeepAlive {
    client: RawLeaseClient<tonic::transport::Channel>,
    tx: mpsc::Sender<LeaseKeepAliveRequest>,
    pending: Option<mpsc::Receiver<LeaseKeepAliveRequest>>,
    rx: Option<tonic::Streaming<LeaseKeepAliveResponse>>,
}

impl RawKeepAlive {
    async fn open(endpoint: &str) -> Result<RawKeepAlive> {
        let client = tokio::time::timeout(
            Duration::from_secs(15),
            RawLeaseClient::connect(endpoint.to_string()),
        )
        .await
        .context("connect timed out")?
        .context("connect")?;
        let (tx, rx) = mpsc::channel(256);
        Ok(RawKeepAlive { client, tx, pending: Some(rx), rx: None })
    }

    /// Sends keep-alives for `ids` (in order) and returns the answers, which must come back in
    /// the same order, one per request.
    async fn round(&mut self, ids: &[i64]) -> Result<Vec<LeaseKeepAliveResponse>> {
        for &id in ids {
            self.tx.send(LeaseKeepAliveRequest { id }).await.context("stream closed")?;
        }
        if let Some(requests) = self.pending.take() {
            let call = self.client.lease_keep_alive(ReceiverStream::new(requests));
            let stream = tokio::time::timeout(Duration::from_secs(15), call)
                .await
                .context("opening LeaseKeepAlive timed out")?
                .context("opening LeaseKeepAlive")?
                .into_inner();
            self.rx = Some(stream);
        }
        let rx = self.rx.as_mut().context("stream not open")?;
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let r = tokio::time::timeout(Duration::from_secs(15), rx.message())
                .await
                .with_context(|| format!("no keep-alive answer for {id:x} within 15 s"))?
                .context("keep-alive stream failed")?
                .context("keep-alive stream ended")?;
            ensure!(r.id == id, "answers out of order: asked {id:x}, got {r:?}");
            ensure!(r.header.is_some(), "keep-alive answer without a header: {r:?}");
            out.push(r);
        }
        Ok(out)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_ids_ttl_floor_and_list() -> Result<()> {
    let (cluster, mut c) = single().await?;
    assert_eq!(rev(c.put("before", "x", None).await?.header()), 2);

    info!("server-chosen id: positive, with the TTL asked for; a grant takes no revision");
    let g = c.lease_grant(60, None).await?;
    assert!(g.id() > 0, "server-chosen lease id {:#x}", g.id());
    assert_eq!(g.ttl(), 60);
    assert!(g.error().is_empty(), "grant error field: {:?}", g.error());
    assert_eq!(rev(g.header()), 2, "a grant changes no key, so the header stays at revision 2");
    let server_id = g.id();

    info!("client-chosen id, then the same id again");
    let g = c.lease_grant(60, Some(LeaseGrantOptions::new().with_id(0x1234))).await?;
    assert_eq!((g.id(), g.ttl()), (0x1234, 60));
    assert_status(
        c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234))).await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    let t = c.lease_time_to_live(0x1234, None).await?;
    assert_eq!(t.granted_ttl(), 60, "the failed duplicate grant must not change the lease");

    info!("TTL floor: 1 s and 0 s are raised to the 2 s minimum");
    let one = c.lease_grant(1, None).await?;
    assert_eq!(one.ttl(), 2, "TTL 1 raised to the minimum");
    let zero = c.lease_grant(0, Some(LeaseGrantOptions::new().with_id(0x5678))).await?;
    assert_eq!((zero.id(), zero.ttl()), (0x5678, 2), "TTL 0 raised to the minimum");
    let t = c.lease_time_to_live(one.id(), None).await?;
    assert_eq!((t.id(), t.granted_ttl()), (one.id(), 2));
    assert_live_ttl(t.ttl(), 2, "fresh 2 s lease");

    info!("too large a TTL");
    assert_status(
        c.lease_grant(9_000_000_001, None).await,
        Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );

    info!("TimeToLive of a fresh lease without keys");
    let t =
        c.lease_time_to_live(server_id, Some(LeaseTimeToLiveOptions::new().with_keys())).await?;
    assert_eq!((t.id(), t.granted_ttl()), (server_id, 60));
    assert_live_ttl(t.ttl(), 60, "fresh 60 s lease");
    assert!(t.keys().is_empty(), "keys of a lease with none attached: {:?}", t.keys());

    info!("Leases lists exactly the live leases");
    let listed = |r: &etcd_client::LeaseLeasesResponse| -> BTreeSet<i64> {
        r.leases().iter().map(|l| l.id()).collect()
    };
    let all = BTreeSet::from([server_id, 0x1234, one.id(), 0x5678]);
    assert_eq!(listed(&c.leases().await?), all);
    c.lease_revoke(0x1234).await?;
    let mut left = all.clone();
    left.remove(&0x1234);
    assert_eq!(listed(&c.leases().await?), left);
    info!("a revoked id can be granted again");
    let g = c.lease_grant(5, Some(LeaseGrantOptions::new().with_id(0x1234))).await?;
    assert_eq!((g.id(), g.ttl()), (0x1234, 5));
    assert_eq!(listed(&c.leases().await?), all);

    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_revoked_leases_get_etcds_answers() -> Result<()> {
    let (cluster, mut c) = single().await?;
    let unknown = 0x0bad_cafe_i64;

    info!("unknown lease: TimeToLive answers TTL -1, Revoke and puts fail with NotFound");
    let t = c.lease_time_to_live(unknown, Some(LeaseTimeToLiveOptions::new().with_keys())).await?;
    assert_eq!((t.id(), t.ttl()), (unknown, -1), "TimeToLive of an unknown lease");
    assert!(t.keys().is_empty());
    assert_status(c.lease_revoke(unknown).await, Code::NotFound, LEASE_NOT_FOUND);
    assert_status(c.put("k", "v", with_lease(unknown)).await, Code::NotFound, LEASE_NOT_FOUND);
    let txn = Txn::new().and_then([TxnOp::put("k", "v", with_lease(unknown))]);
    assert_status(c.txn(txn).await, Code::NotFound, LEASE_NOT_FOUND);
    assert!(c.get("k", None).await?.kvs().is_empty(), "a failed put must not write");
    assert_eq!(rev(c.get("k", None).await?.header()), 1, "failed puts take no revision");

    info!("unknown lease: KeepAlive answers TTL 0 (no error) and the stream stays usable");
    let live = c.lease_grant(30, None).await?.id();
    let mut raw = RawKeepAlive::open(&cluster.endpoint(0)).await?;
    let answers = raw.round(&[unknown, live, unknown]).await?;
    assert_eq!(answers[0].ttl, 0, "KeepAlive of an unknown lease: {:?}", answers[0]);
    assert_eq!(answers[1].ttl, 30, "KeepAlive of a live lease: {:?}", answers[1]);
    assert_eq!(answers[2].ttl, 0, "{:?}", answers[2]);
    info!("etcd-client reports that TTL 0 as an error when opening a keeper");
    assert!(
        c.lease_keep_alive(unknown).await.is_err(),
        "etcd-client must refuse to keep an unknown lease alive"
    );

    info!("a revoked lease behaves like an unknown one");
    c.put("kept", "v", with_lease(live)).await?;
    let revoked = c.lease_revoke(live).await?;
    assert_eq!(rev(revoked.header()), 3, "the put took revision 2, the revoke's delete 3");
    assert_status(c.put("k", "v", with_lease(live)).await, Code::NotFound, LEASE_NOT_FOUND);
    assert_status(c.lease_revoke(live).await, Code::NotFound, LEASE_NOT_FOUND);
    assert_eq!(ttl_of(&mut c, live).await?, -1);
    let answers = raw.round(&[live]).await?;
    assert_eq!((answers[0].id, answers[0].ttl), (live, 0), "KeepAlive of a revoked lease");

    info!("revoking a lease without keys changes nothing, so it takes no revision");
    let empty = c.lease_grant(30, None).await?.id();
    let r = c.lease_revoke(empty).await?;
    assert_eq!(rev(r.header()), 3);
    assert_eq!(rev(c.get("k", None).await?.header()), 3);

    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_deletes_every_attached_key_at_one_revision() -> Result<()> {
    let (cluster, mut c) = single().await?;
    let lease = c.lease_grant(60, None).await?.id();

    info!("three keys on the lease, one detached by a later put without lease, one never on it");
    for k in ["l/a", "l/b", "l/c", "l/d"] {
        c.put(k, "v", with_lease(lease)).await?; // revisions 2-5
    }
    c.put("l/d", "v2", None).await?; // 6: a put without a lease detaches the key
    c.put("l/z", "v", None).await?; // 7
    let got = c.get("l/", Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(
        kvs(&got)[0],
        Kv { lease, ..Kv::new("l/a", "v", 2, 2, 1) },
        "a put with a lease records it"
    );
    assert_eq!(kvs(&got)[3], Kv::new("l/d", "v2", 5, 6, 2), "detached key");

    let t = c.lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys())).await?;
    let mut attached: Vec<Vec<u8>> = t.keys().to_vec();
    attached.sort();
    assert_eq!(attached, vec![b"l/a".to_vec(), b"l/b".to_vec(), b"l/c".to_vec()]);
    assert_eq!(t.granted_ttl(), 60);

    let mut w = c.watch("l/", Some(WatchOptions::new().with_prefix().with_prev_key())).await?;
    watch::created(&mut w).await?;

    info!("revoke: all three keys go at one new revision, in one watch response");
    let r = c.lease_revoke(lease).await?;
    assert_eq!(rev(r.header()), 8);
    let resp = watch::next(&mut w, WATCH_TIMEOUT).await?;
    let on_lease = |k: &str, r: i64| Kv { lease, ..Kv::new(k, "v", r, r, 1) };
    let want = vec![
        Ev::delete("l/a", 8).with_prev(on_lease("l/a", 2)),
        Ev::delete("l/b", 8).with_prev(on_lease("l/b", 3)),
        Ev::delete("l/c", 8).with_prev(on_lease("l/c", 4)),
    ];
    assert_eq!(resp.events, want, "the revoke's events, in one response: {resp:?}");
    assert_eq!(resp.revision, 8);

    let got = c.get("l/", Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(keys(&got), ["l/d", "l/z"]);
    assert_eq!(rev(got.header()), 8);
    let before = c.get("l/", Some(GetOptions::new().with_prefix().with_revision(7))).await?;
    assert_eq!(keys(&before), ["l/a", "l/b", "l/c", "l/d", "l/z"], "history before the revoke");
    assert_eq!(ttl_of(&mut c, lease).await?, -1);
    assert!(c.leases().await?.leases().is_empty());

    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_keys_at_one_revision_and_keepalive_keeps_lease() -> Result<()> {
    let (cluster, mut c) = single().await?;
    let mut w = c.watch("exp/", Some(WatchOptions::new().with_prefix())).await?;
    watch::created(&mut w).await?;

    info!("two 2 s leases: one abandoned, one kept alive every 500 ms");
    let t0 = Instant::now();
    let abandoned = c.lease_grant(2, None).await?.id();
    let kept = c.lease_grant(2, None).await?.id();
    for k in ["exp/a1", "exp/a2", "exp/a3"] {
        c.put(k, "v", with_lease(abandoned)).await?;
    }
    let kept_rev = rev(c.put("exp/k", "v", with_lease(kept)).await?.header());
    let keeper = KeepAlive::start(c.clone(), kept);

    info!("the abandoned lease still lives 1 s after its grant");
    sleep_until(t0 + Duration::from_secs(1)).await;
    let ttl = ttl_of(&mut c, abandoned).await?;
    let attached = c.get("exp/a", Some(GetOptions::new().with_prefix().with_count_only())).await?;
    let answered = t0.elapsed();
    // Sound either way: the lease cannot expire before t0 + 2 s, so answers that arrived
    // before then must show it alive. (A later answer proves nothing and is not judged.)
    if answered < Duration::from_secs(2) {
        assert_live_ttl(ttl, 2, &format!("abandoned 2 s lease after {answered:?}"));
        assert_eq!(attached.count(), 3, "keys of a 2 s lease gone after {answered:?}");
    } else {
        info!(?answered, "TimeToLive answered too late to judge early expiry");
    }

    info!("the abandoned lease's keys are all deleted at one revision within 2 s + 3 s");
    let deadline = t0 + Duration::from_secs(2) + EXPIRY_SLACK;
    let resps =
        watch::read_until(&mut w, deadline.saturating_duration_since(Instant::now()), |r| {
            r.iter().any(|x| x.events.iter().any(|e| e.kind == Kind::Delete))
        })
        .await
        .context("waiting for the abandoned lease to expire")?;
    let deletes: Vec<&Ev> =
        resps.iter().flat_map(|r| &r.events).filter(|e| e.kind == Kind::Delete).collect();
    let expiry_rev = deletes[0].revision();
    let want: Vec<Ev> =
        ["exp/a1", "exp/a2", "exp/a3"].iter().map(|k| Ev::delete(k, expiry_rev)).collect();
    assert_eq!(
        resps.last().map(|r| r.events.clone()),
        Some(want),
        "expiry must delete all three keys in one revision, reported in one response"
    );
    let got = c.get("exp/", Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(keys(&got), ["exp/k"], "only the kept lease's key remains");
    assert_eq!(ttl_of(&mut c, abandoned).await?, -1);

    info!("the kept lease outlives 3.5 TTLs");
    sleep_until(t0 + Duration::from_secs(7)).await;
    let got = c.get("exp/k", None).await?;
    assert_eq!(kvs(&got).first().map(|kv| kv.create_revision), Some(kept_rev), "kept key");
    let ttl = ttl_of(&mut c, kept).await?;
    assert_live_ttl(ttl, 2, "kept lease");
    let stats = keeper.stop().await?;
    assert_kept(&stats, 2, "kept lease");
    assert!(stats.errors.is_empty(), "keep-alive errors on a healthy member: {stats:?}");

    info!("once keep-alives stop, it expires within its TTL + 3 s of the last answer");
    let last = stats.last_ok.context("no keep-alive answer")?;
    let resps = watch::read_until(
        &mut w,
        (last + Duration::from_secs(2) + EXPIRY_SLACK).saturating_duration_since(Instant::now()),
        |r| r.iter().any(|x| x.events.iter().any(|e| e.kind == Kind::Delete)),
    )
    .await
    .context("waiting for the kept lease to expire after its keep-alives stopped")?;
    let last_events = &resps.last().context("no response")?.events;
    assert_eq!(last_events.len(), 1, "{resps:?}");
    assert_eq!(last_events[0], Ev::delete("exp/k", last_events[0].revision()));
    assert!(last_events[0].revision() > expiry_rev);
    assert_eq!(ttl_of(&mut c, kept).await?, -1);

    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_leases_on_one_keepalive_stream() -> Result<()> {
    let (cluster, mut c) = single().await?;
    const N: usize = 20;
    let unknown = 0x7fff_0000_i64;

    info!(n = N, "grant 2 s leases, one key each");
    let mut ids = Vec::new();
    for i in 0..N {
        let id = c.lease_grant(2, None).await?.id();
        c.put(format!("many/{i:02}"), "v", with_lease(id)).await?;
        ids.push(id);
    }
    let distinct: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), N, "server-chosen lease ids must be distinct");
    assert!(!distinct.contains(&unknown));

    info!("keep all of them alive on ONE stream for 3 TTLs, with an unknown id mixed in");
    let mut raw = RawKeepAlive::open(&cluster.endpoint(0)).await?;
    let t0 = Instant::now();
    let mut last_answer = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < Duration::from_secs(6) {
        let mut batch = ids.clone();
        batch.insert(N / 2, unknown);
        let answers = raw.round(&batch).await?;
        last_answer = Instant::now();
        for a in &answers {
            let want = if a.id == unknown { 0 } else { 2 };
            assert_eq!(a.ttl, want, "keep-alive answer {a:?}");
        }
        rounds += 1;
        tokio::time::sleep(KEEPALIVE_EVERY).await;
    }
    assert!(rounds >= 4, "only {rounds} keep-alive rounds in 6 s");
    let got = c.get("many/", Some(GetOptions::new().with_prefix().with_count_only())).await?;
    assert_eq!(got.count(), N as i64, "every kept lease's key is still there after 3 TTLs");
    for &id in &ids {
        let ttl = ttl_of(&mut c, id).await?;
        assert_live_ttl(ttl, 2, &format!("lease {id:x}"));
    }

    info!("close the stream: every lease expires within 2 s + 3 s of the last answer");
    drop(raw);
    let deadline = last_answer + Duration::from_secs(2) + EXPIRY_SLACK;
    let mut remaining = BTreeMap::new();
    let attempts = (deadline.saturating_duration_since(Instant::now()).as_millis()
        / POLL_INTERVAL.as_millis()) as usize
        + 2;
    for _ in 0..attempts {
        let got = c.get("many/", Some(GetOptions::new().with_prefix())).await?;
        remaining = got
            .kvs()
            .iter()
            .map(|kv| (kv.key_str().unwrap_or("?").to_string(), kv.lease()))
            .collect();
        if remaining.is_empty() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    assert!(remaining.is_empty(), "keys left after their leases' deadline: {remaining:?}");
    assert!(c.leases().await?.leases().is_empty(), "expired leases still listed");

    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_and_time_to_live_through_every_member() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut clients = cluster.clients().await?;

    // There is no Maintenance.Status yet, so the leader is unknown: each lease is kept alive
    // through a different member, so at least two of them go through followers, which must
    // relay keep-alives to the leader.
    info!("one 2 s lease per member, granted and kept alive through that member");
    let mut leases = Vec::new();
    let mut watches = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        let mut w = c.watch("lf/", Some(WatchOptions::new().with_prefix())).await?;
        watch::created(&mut w).await?;
        watches.push(w);
        let id = c.lease_grant(2, None).await?.id();
        c.put(format!("lf/{i}"), "v", with_lease(id)).await?;
        leases.push(id);
    }
    let mut keepers: Vec<Option<KeepAlive>> =
        (0..3).map(|i| Some(KeepAlive::start(clients[i].clone(), leases[i]))).collect();

    info!("for 3 TTLs, every member answers TimeToLive for every lease with a live TTL");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        for (m, c) in clients.iter_mut().enumerate() {
            for &id in &leases {
                let t = c
                    .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
                    .await?;
                assert_eq!(t.granted_ttl(), 2, "lease {id:x} via member {m}");
                assert_live_ttl(t.ttl(), 2, &format!("lease {id:x} via member {m}"));
                assert_eq!(t.keys().len(), 1, "lease {id:x} keys via member {m}");
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for c in clients.iter_mut() {
        let got = c.get("lf/", Some(GetOptions::new().with_prefix())).await?;
        assert_eq!(keys(&got), ["lf/0", "lf/1", "lf/2"]);
        assert_eq!(ttl_of(c, 0x0bad_cafe).await?, -1, "TimeToLive of an unknown lease");
    }

    info!("stop keeping lease 1 alive: it expires; the others stay");
    let stats = keepers[1].take().context("keeper")?.stop().await?;
    assert_kept(&stats, 2, "lease kept through member 1");
    let last = stats.last_ok.context("no keep-alive answer")?;
    let deadline = last + Duration::from_secs(2) + EXPIRY_SLACK;
    wait_gone(&mut clients[2], "lf/1", deadline, "lease 1 after its keep-alives stopped").await?;

    info!("every member's watch sees lf/1 deleted at the same single revision");
    let mut revs = Vec::new();
    for (m, w) in watches.iter_mut().enumerate() {
        let resps = watch::read_until(w, WATCH_TIMEOUT, |r| {
            r.iter().any(|x| x.events.iter().any(|e| e.kind == Kind::Delete))
        })
        .await
        .with_context(|| format!("watch on member {m}"))?;
        let evs = &resps.last().context("no response")?.events;
        assert_eq!(evs.len(), 1, "member {m}: {resps:?}");
        assert_eq!(evs[0], Ev::delete("lf/1", evs[0].revision()), "member {m}");
        revs.push(evs[0].revision());
    }
    assert!(revs.iter().all(|&r| r == revs[0]), "delete revisions differ by member: {revs:?}");

    for i in [0, 2] {
        let stats = keepers[i].as_ref().context("keeper")?.stats();
        assert!(stats.lost.is_none(), "lease {i} lost: {stats:?}");
    }
    for (m, c) in clients.iter_mut().enumerate() {
        let got = c.get("lf/", Some(GetOptions::new().with_prefix())).await?;
        assert_eq!(keys(&got), ["lf/0", "lf/2"], "member {m}");
        let listed: BTreeSet<i64> = c.leases().await?.leases().iter().map(|l| l.id()).collect();
        assert_eq!(listed, BTreeSet::from([leases[0], leases[2]]), "Leases via member {m}");
    }
    for k in keepers.iter_mut() {
        if let Some(k) = k.take() {
            assert_kept(&k.stop().await?, 2, "lease kept to the end");
        }
    }

    info!("revokes through any member");
    clients[1].lease_revoke(leases[0]).await?;
    clients[2].lease_revoke(leases[2]).await?;
    assert!(clients[0].get("lf/", Some(GetOptions::new().with_prefix())).await?.kvs().is_empty());

    cluster.finish();
    Ok(())
}

/// The Raft term the member's linearizable read was served in.
async fn term(c: &mut Client) -> Result<u64> {
    let r = c.get("term-probe", None).await?;
    Ok(r.header().context("header")?.raft_term())
}

/// Puts through `clients` in turn until one succeeds; returns when it was acknowledged.
/// Bounded: 60 s (an election after killing the leader takes a few election timeouts).
async fn write_through(clients: &mut [Client], key: &str) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    for attempt in 0..600 {
        let c = &mut clients[attempt % clients.len()];
        match c.put(key, "probe", None).await {
            Ok(_) => return Ok(Instant::now()),
            Err(e) => last = Some(e),
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!("no write through the surviving members succeeded: {last:?}")
}

/// TTL of the abandoned lease in `leader_kill_keeps_kept_lease_and_expires_abandoned_one`:
/// long enough that the old leader's deadline (grant + 6 s) falls well before the new leader's
/// (election + 6 s), so an expiry on the old schedule would be visible.
const ABANDONED_TTL: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_keeps_kept_lease_and_expires_abandoned_one() -> Result<()> {
    // Without Maintenance.Status the leader is unknown, so each round kills one member; a round
    // whose kill raises the Raft term killed the leader. Rounds stop after the first such one.
    // Up to six rounds, because a restarted member can take leadership back between rounds.
    //
    // The bound asserted for the abandoned lease (TTL T, never kept alive) when the leader dies
    // T/2 after its grant: the new leader restarts every lease's full TTL, so it is gone at most
    // T + 3 s after the cluster serves writes again (that is, within T + election + T of its
    // grant, counting the old leader's half), and not before T after the kill (an expiry on the
    // old leader's schedule, grant + T, would be early).
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut leader_rounds = 0;
    for round in 0..6 {
        let victim = round % 3;
        let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
        let (s1, s2) = (survivors[0], survivors[1]);
        let mut c1 = cluster.client(s1).await?;
        let mut survivor_clients = vec![c1.clone(), cluster.client(s2).await?];

        info!(round, "a 2 s lease kept alive through a survivor, and an abandoned 6 s lease");
        let kept = c1.lease_grant(2, None).await?.id();
        let kept_key = format!("kept/{round}");
        let kept_rev = rev(c1.put(kept_key.as_str(), "v", with_lease(kept)).await?.header());
        let keeper = KeepAlive::start(cluster.client(s2).await?, kept);
        let t_grant = Instant::now();
        let abandoned = c1.lease_grant(ABANDONED_TTL.as_secs() as i64, None).await?.id();
        let abandoned_key = format!("abandoned/{round}");
        c1.put(abandoned_key.as_str(), "v", with_lease(abandoned)).await?;

        sleep_until(t_grant + ABANDONED_TTL / 2).await;
        let term_before = term(&mut c1).await?;
        info!(round, member = cluster.name(victim), term_before, "SIGKILL");
        let t_kill = Instant::now();
        cluster.kill(victim)?;
        let t_serving = write_through(&mut survivor_clients, &format!("probe/{round}")).await?;
        let term_after = term(&mut c1).await?;
        let leader_killed = term_after > term_before;
        info!(round, term_after, leader_killed, serving_after = ?t_serving - t_kill, "serving again");

        let deadline = t_serving + ABANDONED_TTL + EXPIRY_SLACK;
        let gone_at = wait_gone(&mut c1, &abandoned_key, deadline, "abandoned lease").await?;
        let not_before =
            if leader_killed { t_kill + ABANDONED_TTL } else { t_grant + ABANDONED_TTL };
        assert!(
            gone_at >= not_before,
            "round {round}: abandoned {}s lease was gone {:?} after the kill, before its full TTL \
             (leader killed: {leader_killed})",
            ABANDONED_TTL.as_secs(),
            gone_at - t_kill
        );
        info!(round, gone_after_kill = ?gone_at - t_kill, gone_after_grant = ?gone_at - t_grant, "abandoned lease gone");
        assert_eq!(ttl_of(&mut c1, abandoned).await?, -1);

        info!(round, "the kept lease is still alive, with its key from before the kill");
        let got = c1.get(kept_key.as_str(), None).await?;
        assert_eq!(
            kvs(&got).first().map(|kv| (kv.create_revision, kv.lease)),
            Some((kept_rev, kept)),
            "round {round}: kept lease's key"
        );
        let ttl = ttl_of(&mut c1, kept).await?;
        assert_live_ttl(ttl, 2, &format!("round {round}: kept lease"));
        let stats = keeper.stop().await?;
        assert_kept(&stats, 2, &format!("round {round} kept lease"));
        c1.lease_revoke(kept).await?;

        cluster.restart(victim).await?;
        if leader_killed {
            leader_rounds += 1;
            break;
        }
    }
    assert_eq!(leader_rounds, 1, "no round killed the leader (the Raft term never rose)");
    cluster.finish();
    Ok(())
}

/// TTL of the lease whose client goes silent in
/// `lease_of_a_silent_client_expires_within_its_bound`.
const SILENT_TTL: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_of_a_silent_client_expires_within_its_bound() -> Result<()> {
    // A client keeps a lease alive through a follower, then goes silent as if partitioned from
    // the cluster: its keep-alive stream stays open but carries nothing more. The lease must
    // outlive the last keep-alive sent by its full TTL, and be gone within TTL + EXPIRY_SLACK of
    // the last answer (the bound in `lease::keeper`'s docs without a leader change). A lease
    // kept alive meanwhile by another client through the other follower must stay.
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let leader = cluster.leader().await?;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let mut c = cluster.client(leader).await?;
    let ttl = SILENT_TTL.as_secs() as i64;
    let silent = c.lease_grant(ttl, None).await?.id();
    c.put("silent/key", "v", with_lease(silent)).await?;
    let kept = c.lease_grant(2, None).await?.id();
    c.put("kept/key", "v", with_lease(kept)).await?;
    let keeper = KeepAlive::start(cluster.client(followers[1]).await?, kept);

    info!(member = cluster.name(followers[0]), "keep the lease alive through a follower");
    let mut raw = RawKeepAlive::open(&cluster.endpoint(followers[0])).await?;
    let mut last_sent = Instant::now();
    let mut last_answer = Instant::now();
    for _ in 0..4 {
        last_sent = Instant::now();
        let answers = raw.round(&[silent]).await?;
        last_answer = Instant::now();
        assert_eq!(answers[0].ttl, ttl, "keep-alive answer carries the full TTL");
        tokio::time::sleep(KEEPALIVE_EVERY).await;
    }

    info!("the client goes silent; its stream stays open");
    let deadline = last_answer + SILENT_TTL + EXPIRY_SLACK;
    let gone_at = wait_gone(&mut c, "silent/key", deadline, "silent client's lease").await?;
    assert!(
        gone_at >= last_sent + SILENT_TTL,
        "silent client's lease was gone {:?} after its last keep-alive was sent, before its TTL",
        gone_at - last_sent
    );
    assert_eq!(ttl_of(&mut c, silent).await?, -1, "expired lease is unknown");
    drop(raw);

    info!("the lease kept alive by the other client is untouched");
    assert_eq!(keys(&c.get("kept/key", None).await?), vec!["kept/key".to_string()]);
    let stats = keeper.stop().await?;
    assert_kept(&stats, 2, "kept lease");
    cluster.finish();
    Ok(())
}

/// `picket_server_read_index_rounds_total{via="..."}` on the member at `endpoint`.
async fn read_index_rounds(
    http: &picket_tests::http::Http,
    endpoint: &str,
    via: &str,
) -> Result<u64> {
    http.labelled(endpoint, "picket_server_read_index_rounds_total", ("via", via)).await
}

/// Issue 20: a follower relays keep-alives and TimeToLive to the leader without first starting
/// a read-index round of its own, which its core could only refuse (it is not the leader) and
/// which cost a task and a core message per keep-alive. The leader's own rounds confirm the
/// relayed ones. Seen failing on the code before (the follower's local rounds grew by one per
/// keep-alive and TimeToLive: 25).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_relays_keep_alives_without_a_round_of_its_own() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let leader = cluster.leader().await?;
    let follower = (0..3).find(|&i| i != leader).context("a follower")?;
    let http = picket_tests::http::Http::new();
    let mut c = cluster.client(follower).await?;
    let id = c.lease_grant(10, None).await?.id();
    // A round of the follower's own now would be a read it asks the leader for, not a local
    // one: this settles that it knows the leader before counting.
    c.get("settle", None).await?;
    let (f_before, l_before) = (
        read_index_rounds(&http, &cluster.endpoint(follower), "local").await?,
        read_index_rounds(&http, &cluster.endpoint(leader), "local").await?,
    );

    info!(member = cluster.name(follower), "20 keep-alives and 5 TimeToLive through a follower");
    // `lease_keep_alive` sends the first keep-alive and waits for its answer itself.
    let (mut keeper, mut answers) = c.lease_keep_alive(id).await?;
    for i in 1..20 {
        keeper.keep_alive().await?;
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .context("keep-alive answer")??
            .context("keep-alive stream ended")?;
        ensure!(answer.ttl() > 0, "keep-alive {i} answered ttl {}", answer.ttl());
    }
    // The leader confirms keep-alives in rounds of their own (`Proposer::lease_read_index`),
    // counted with its read rounds: the metric must show them (it did not in b5a4322).
    let l_keep_alive_rounds =
        read_index_rounds(&http, &cluster.endpoint(leader), "local").await? - l_before;
    for _ in 0..5 {
        assert_live_ttl(ttl_of(&mut c, id).await?, 10, "TimeToLive through a follower");
    }
    drop((keeper, answers));

    let f_rounds = read_index_rounds(&http, &cluster.endpoint(follower), "local").await? - f_before;
    let l_rounds = read_index_rounds(&http, &cluster.endpoint(leader), "local").await? - l_before;
    assert_eq!(f_rounds, 0, "the follower started read-index rounds of its own");
    assert!(l_keep_alive_rounds > 0, "the leader counted no round for the relayed keep-alives");
    assert!(l_rounds > l_keep_alive_rounds, "the leader counted no round for the TimeToLives");
    cluster.finish();
    Ok(())
}
