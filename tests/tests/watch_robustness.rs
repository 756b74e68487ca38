//! Watches under failure and overload, against real `picketd` processes with `etcd-client`:
//!
//! - a watch whose member is SIGKILLed (the leader) is resumed by the client on another member
//!   from its last revision + 1, and the two halves together are exactly the history: no gap,
//!   no duplicate;
//! - a watcher whose stream is not read while thousands of revisions are written blocks neither
//!   the writes nor a watcher on another connection, and when read again delivers every event
//!   in order; if history is compacted under it, it delivers a gap-free prefix and is then
//!   canceled with `compact_revision` and a reason.
//!
//! The history the watches are compared with is read back at the end (every key is written
//! once, so a prefix range lists every write with its revision), not taken from the writers'
//! acknowledgements: a write that timed out during an election may still have been applied.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, GetOptions, WatchOptions, WatchStream};
use picket_tests::util::POLL_INTERVAL;
use picket_tests::watch::{self, Ev, WatchResp, WATCH_TIMEOUT};
use picket_tests::{Cluster, ClusterOptions};
use tracing::info;

/// Every key under `prefix` with its value and the revision that wrote it, in revision order.
async fn history(c: &mut Client, prefix: &str) -> Result<Vec<(String, i64)>> {
    // Keys only: the flood tests write megabytes of values, more than one response may carry.
    let r = c.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
    let mut out: Vec<(String, i64)> = r
        .kvs()
        .iter()
        .map(|kv| {
            ensure!(kv.version() == 1, "key {:?} written twice", kv.key_str());
            Ok((kv.key_str()?.to_string(), kv.mod_revision()))
        })
        .collect::<Result<_>>()?;
    out.sort_by_key(|(_, r)| *r);
    Ok(out)
}

/// (key, revision) of every event, in arrival order.
fn keyed(events: &[Ev]) -> Vec<(String, i64)> {
    events.iter().map(|e| (String::from_utf8_lossy(&e.kv.key).into_owned(), e.revision())).collect()
}

/// Background writers putting fresh keys `prefix{task}/{n}` as fast as the cluster takes them,
/// each through its own client; failures (no leader during an election) are retried after a
/// pause, since the history read at the end, not this writer, is the record of what was written.
struct Writers {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    fn start(clients: Vec<Client>, prefix: &str, value_len: usize, max_each: u64) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let value = "v".repeat(value_len);
        let tasks = clients
            .into_iter()
            .enumerate()
            .map(|(t, mut c)| {
                let (stop, acked, value) = (stop.clone(), acked.clone(), value.clone());
                let prefix = prefix.to_string();
                tokio::spawn(async move {
                    // Bounded: `max_each` keys, and at most 300 failed attempts (30 s of
                    // pauses), whichever ends first.
                    let mut failures = 0;
                    let mut n = 0;
                    while n < max_each && !stop.load(Ordering::SeqCst) && failures < 300 {
                        let key = format!("{prefix}{t}/{n:06}");
                        match c.put(key, value.as_str(), None).await {
                            Ok(_) => {
                                acked.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(_) => {
                                failures += 1;
                                tokio::time::sleep(POLL_INTERVAL).await;
                            }
                        }
                        // A failed put may still have been applied, so never reuse its key.
                        n += 1;
                    }
                })
            })
            .collect();
        Writers { stop, acked, tasks }
    }

    fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits (at most `timeout`) until `n` writes in total were acknowledged.
    async fn until_acked(&self, n: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.acked() < n {
            ensure!(
                !self.tasks.iter().all(|t| t.is_finished()),
                "writers gave up after {} of {n} acknowledged writes",
                self.acked()
            );
            ensure!(
                Instant::now() < deadline,
                "only {} of {n} writes acknowledged within {timeout:?}",
                self.acked()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stops the writers and waits for them (each is within one request of stopping).
    async fn finish(self) -> Result<u64> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .context("writer did not stop")?
                .context("writer panicked")?;
        }
        Ok(self.acked.load(Ordering::SeqCst))
    }
}

/// Reads `stream` until it fails or ends (the member died) or `timeout` passes; returns the
/// events received.
async fn drain_until_broken(stream: &mut WatchStream, timeout: Duration) -> Vec<Ev> {
    let deadline = Instant::now() + timeout;
    let mut events = Vec::new();
    // Bounded by the deadline.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.message()).await {
            Ok(Ok(Some(r))) => events.extend(r.events().iter().map(Ev::from)),
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return events,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_on_another_member_after_leader_kill_without_gap_or_duplicate() -> Result<()>
{
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let leader = cluster.leader().await?;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    info!(leader = cluster.name(leader), "watch on the leader, writes through both followers");
    let mut on_leader = cluster.client(leader).await?;
    let mut stream = on_leader.watch("x/", Some(WatchOptions::new().with_prefix())).await?;
    watch::created(&mut stream).await?;
    let writers = Writers::start(
        vec![cluster.client(followers[0]).await?, cluster.client(followers[1]).await?],
        "x/",
        16,
        5_000,
    );
    writers.until_acked(40, Duration::from_secs(60)).await?;

    info!("SIGKILL the leader while the writes continue");
    cluster.kill(leader)?;
    let before = drain_until_broken(&mut stream, WATCH_TIMEOUT).await;
    let last = before.last().map(Ev::revision).context("no event before the kill")?;
    info!(events = before.len(), last, "the leader's watch broke");

    info!(member = cluster.name(followers[1]), from = last + 1, "resume the watch");
    let mut resumed_client = cluster.client(followers[1]).await?;
    let mut resumed = resumed_client
        .watch("x/", Some(WatchOptions::new().with_prefix().with_start_revision(last + 1)))
        .await?;
    watch::created(&mut resumed).await?;
    // Keep writing under the new leader, then stop and read the whole history.
    let acked_at_resume = writers.acked();
    writers.until_acked(acked_at_resume + 40, Duration::from_secs(60)).await?;
    let total = writers.finish().await?;
    let mut reader = cluster.client(followers[0]).await?;
    let all = history(&mut reader, "x/").await?;
    let final_rev = all.last().map(|(_, r)| *r).context("empty history")?;
    info!(acked = total, written = all.len(), final_rev, "writers stopped");

    let after_resps: Vec<WatchResp> =
        watch::read_until(&mut resumed, WATCH_TIMEOUT, |rs: &[WatchResp]| {
            rs.iter().any(|r| r.events.iter().any(|e| e.revision() >= final_rev))
        })
        .await
        .context("resumed watch")?;
    let after: Vec<Ev> = after_resps.iter().flat_map(|r| r.events.iter().cloned()).collect();

    let mut got = keyed(&before);
    got.extend(keyed(&after));
    let revs: Vec<i64> = got.iter().map(|(_, r)| *r).collect();
    for pair in revs.windows(2) {
        assert!(pair[0] < pair[1], "revision {} then {} (duplicate or reorder)", pair[0], pair[1]);
    }
    assert_eq!(got.len(), all.len(), "events before the kill + after the resume vs history");
    assert_eq!(got, all, "the two halves of the watch are exactly the history");
    cluster.finish();
    Ok(())
}

/// Revisions written while the slow watcher is not read. What can sit between an unread watcher
/// and its client: the client's HTTP/2 stream window (2 MiB by default in hyper), the server's
/// HTTP/2 send buffer (400 KiB) and 1,024 responses queued per watch stream; with 4 KiB values
/// that is about 1,650 revisions, after which the watcher blocks. The live event feed keeps
/// 4,096 revisions, so by 8,000 the blocked watcher has certainly fallen off it and must catch up
/// from the changelog. (With 1 KiB values and 7,000 revisions it did not: measured.)
const FLOOD_REVISIONS: u64 = 8_000;

/// Value size of the flood writes (see [`FLOOD_REVISIONS`]).
const FLOOD_VALUE_LEN: usize = 4096;

/// Bound on the whole flood (8,000 single-member writes take well under a minute even in a
/// debug build); it only keeps a wedged run from hanging the suite.
const FLOOD_TIMEOUT: Duration = Duration::from_secs(300);

/// Eight writers, so the flood takes seconds rather than minutes on a single member.
const FLOOD_WRITERS: usize = 8;

async fn writer_clients(cluster: &Cluster) -> Result<Vec<Client>> {
    let mut out = Vec::with_capacity(FLOOD_WRITERS);
    for _ in 0..FLOOD_WRITERS {
        out.push(cluster.client(0).await?);
    }
    Ok(out)
}

/// Checks that `events` are the first events of `history` (a gap-free, duplicate-free prefix);
/// the whole of it when `complete`.
#[track_caller]
fn assert_prefix(events: &[Ev], history: &[(String, i64)], complete: bool, what: &str) {
    let got = keyed(events);
    assert!(got.len() <= history.len(), "{what}: more events than writes");
    assert_eq!(got, history[..got.len()].to_vec(), "{what}: events are not a prefix of history");
    if complete {
        assert_eq!(got.len(), history.len(), "{what}: events missing at the end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_blocks_nothing_and_catches_up_in_order() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    // Separate connections: the slow stream's unread data fills its own connection's windows.
    let mut slow_client = cluster.client(0).await?;
    let mut fast_client = cluster.client(0).await?;
    let mut slow = slow_client.watch("s/", Some(WatchOptions::new().with_prefix())).await?;
    watch::created(&mut slow).await?;
    let mut fast = fast_client.watch("s/", Some(WatchOptions::new().with_prefix())).await?;
    watch::created(&mut fast).await?;

    info!(revisions = FLOOD_REVISIONS, "flood while the slow watcher is not read");
    let writers = Writers::start(
        writer_clients(&cluster).await?,
        "s/",
        FLOOD_VALUE_LEN,
        FLOOD_REVISIONS / FLOOD_WRITERS as u64,
    );
    // The fast watcher keeps up while the writes go on: read it concurrently.
    let fast_reader = tokio::spawn(async move {
        let mut events = Vec::new();
        // Bounded: ends when the stream breaks or stays quiet for WATCH_TIMEOUT, and never
        // reads more than the flood plus slack.
        while (events.len() as u64) < FLOOD_REVISIONS {
            match watch::next(&mut fast, WATCH_TIMEOUT).await {
                Ok(r) => events.extend(r.events),
                Err(_) => break,
            }
        }
        events
    });
    // Writes are not blocked by the unread watcher: each has the client's request timeout, so
    // a blocked apply would fail the writers rather than hang. The overall bound is generous for
    // a debug build on a loaded 2-core machine; it only keeps a wedged run from hanging.
    writers.until_acked(FLOOD_REVISIONS, FLOOD_TIMEOUT).await?;
    let acked = writers.finish().await?;
    let mut c = cluster.client(0).await?;
    let all = history(&mut c, "s/").await?;
    ensure!(acked == FLOOD_REVISIONS, "only {acked} of {FLOOD_REVISIONS} writes acknowledged");
    assert_eq!(all.len() as u64, FLOOD_REVISIONS, "history length");

    info!("the fast watcher saw every write while the slow one was not read");
    let fast_events =
        tokio::time::timeout(Duration::from_secs(120), fast_reader).await.context("fast")??;
    assert_prefix(&fast_events, &all, true, "fast watcher");

    info!("now read the slow watcher: every event, in order, no gap or duplicate");
    let last = all.last().map(|(_, r)| *r).context("empty history")?;
    let resps = watch::read_until(&mut slow, WATCH_TIMEOUT, |rs: &[WatchResp]| {
        rs.iter().any(|r| r.canceled || r.events.iter().any(|e| e.revision() >= last))
    })
    .await
    .context("slow watcher")?;
    ensure!(!resps.iter().any(|r| r.canceled), "slow watcher canceled without compaction");
    let slow_events: Vec<Ev> = resps.iter().flat_map(|r| r.events.iter().cloned()).collect();
    assert_prefix(&slow_events, &all, true, "slow watcher");
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_compacted_under_it_is_canceled_after_a_gap_free_prefix() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let mut slow_client = cluster.client(0).await?;
    let mut slow = slow_client.watch("c/", Some(WatchOptions::new().with_prefix())).await?;
    watch::created(&mut slow).await?;

    info!(revisions = FLOOD_REVISIONS, "flood, then compact, while the watcher is not read");
    let writers = Writers::start(
        writer_clients(&cluster).await?,
        "c/",
        FLOOD_VALUE_LEN,
        FLOOD_REVISIONS / FLOOD_WRITERS as u64,
    );
    writers.until_acked(FLOOD_REVISIONS, FLOOD_TIMEOUT).await?;
    let acked = writers.finish().await?;
    ensure!(acked == FLOOD_REVISIONS, "only {acked} of {FLOOD_REVISIONS} writes acknowledged");
    let mut c = cluster.client(0).await?;
    let all = history(&mut c, "c/").await?;
    let last = all.last().map(|(_, r)| *r).context("empty history")?;
    c.compact(last, None).await?;

    info!(compacted_at = last, "read the slow watcher");
    let resps = watch::read_until(&mut slow, WATCH_TIMEOUT, |rs: &[WatchResp]| {
        rs.iter().any(|r| r.canceled || r.events.iter().any(|e| e.revision() >= last))
    })
    .await
    .context("slow watcher")?;
    let events: Vec<Ev> = resps.iter().flat_map(|r| r.events.iter().cloned()).collect();
    assert_prefix(&events, &all, false, "slow watcher before its cancel");
    let Some(cancel) = resps.iter().find(|r| r.canceled) else {
        bail!(
            "the watcher delivered all {} events although history was compacted under it; \
             {FLOOD_REVISIONS} revisions should have pushed it off the live feed",
            events.len()
        );
    };
    info!(delivered = events.len(), ?cancel, "canceled");
    assert!(cancel.compact_revision >= last, "compact_revision {}", cancel.compact_revision);
    assert!(!cancel.cancel_reason.is_empty(), "a cancel must say why: {cancel:?}");
    let delivered_through = events.last().map(Ev::revision).unwrap_or(0);
    assert!(
        delivered_through < cancel.compact_revision,
        "canceled at {} after delivering through {delivered_through}",
        cancel.compact_revision
    );
    cluster.finish();
    Ok(())
}

/// Issue 19, Medium 10: one client cannot make a member hold unbounded watch state. Streams
/// beyond `--max-watch-streams` are refused with RESOURCE_EXHAUSTED, creates beyond
/// `--max-watchers-per-stream` are answered created-and-canceled with a reason, and a closed
/// stream gives its place back. Seen failing on 5c13469: the flags did not exist (picketd
/// refused to start), and with no limit every stream and watcher was accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_and_watchers_per_stream_are_limited() -> Result<()> {
    let opts = ClusterOptions {
        extra_args: ["--max-watch-streams", "2", "--max-watchers-per-stream", "3"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let cluster = Cluster::start(1, opts).await?;
    let mut c = cluster.client(0).await?;
    let mut first = c.watch("limit/a", None).await?;
    ensure!(first.message().await?.context("stream ended")?.created(), "first watch created");
    for k in ["limit/b", "limit/c"] {
        first.watch(k, None).await?;
        let r = first.message().await?.context("stream ended")?;
        ensure!(r.created() && !r.canceled(), "watch on {k}: {r:?}");
    }
    first.watch("limit/d", None).await?;
    let r = first.message().await?.context("stream ended")?;
    ensure!(
        r.created() && r.canceled() && r.cancel_reason().contains("too many watchers"),
        "the fourth watcher on the stream: {r:?}"
    );

    let mut second = c.watch("limit/e", None).await?;
    ensure!(second.message().await?.context("stream ended")?.created(), "second stream");
    let e = c.watch("limit/f", None).await.err().context("a third stream was accepted")?;
    ensure!(e.to_string().contains("too many watch streams"), "third stream refused with {e}");

    info!("closing the first stream gives its place back");
    drop(first);
    picket_tests::eventually("a stream after one closed", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let mut s = c.watch("limit/g", None).await?;
            ensure!(s.message().await?.context("stream ended")?.created(), "created");
            Ok(())
        }
    })
    .await?;
    cluster.finish();
    Ok(())
}
