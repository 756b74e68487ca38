//! Watches through the `etcd-client` crate against real `picketd` processes: key, prefix, range
//! and from-key watches, many watchers on one stream, replay from a past revision continuing live
//! with no gap and no duplicate at the seam, start revisions zero, future and compacted,
//! `prev_kv`, the NOPUT/NODELETE filters, cancel, progress requests and notifications, one
//! response per Txn revision, watches on followers, and `fragment` for large revisions.
//!
//! Expected events are computed from the writes the test made (with the revisions the server
//! acknowledged) and compared exactly, so a missing, repeated, reordered or altered event fails.
//! The raw generated client is used only for `fragment`, which `etcd-client` does not expose.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, Txn, TxnOp, WatchFilterType, WatchOptions,
    WatchStream,
};
use picket_proto::etcdserverpb::WatchCreateRequest;
use picket_tests::util::rev;
use picket_tests::watch::{self, events_of, reached, Ev, Kind, WatchResp, WATCH_TIMEOUT};
use picket_tests::{Cluster, ClusterOptions, Kv};
use tracing::info;

async fn single(opts: ClusterOptions) -> Result<(Cluster, Client)> {
    let cluster = Cluster::start(1, opts).await?;
    let client = cluster.client(0).await?;
    Ok((cluster, client))
}

/// A put event with every field of the written pair.
fn put_ev(key: &str, value: &str, create: i64, modr: i64, version: i64) -> Ev {
    Ev::put(Kv::new(key, value, create, modr, version))
}

/// The flag that sets the progress notification interval: picketd's name, or etcd 3.4's
/// experimental name when the suite runs against etcd itself (`PICKETD_BIN=.../etcd`).
fn progress_interval_args(interval: &str) -> Vec<String> {
    let bin = std::env::var(picket_tests::binary::PICKETD_BIN_ENV).unwrap_or_default();
    let flag = if bin.ends_with("/etcd") {
        "--experimental-watch-progress-notify-interval"
    } else {
        "--watch-progress-notify-interval"
    };
    vec![flag.to_string(), interval.to_string()]
}

/// Opens another watch on `stream` and returns its id once created.
async fn add_watch(stream: &mut WatchStream, key: &str, opts: WatchOptions) -> Result<i64> {
    stream.watch(key, Some(opts)).await?;
    watch::created(stream).await
}

/// One write the test made and the revision the server acknowledged.
#[derive(Debug, Clone)]
struct Write {
    key: String,
    value: String,
    revision: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_prefix_range_and_from_key_watches_share_a_stream() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;

    info!("one stream: key, prefix, range, from-key and all-keys watches, plus 20 more prefix watches");
    let mut s = c.watch("a", None).await?;
    let w_key = watch::created(&mut s).await?;
    let w_prefix = add_watch(&mut s, "p/", WatchOptions::new().with_prefix()).await?;
    let w_range = add_watch(&mut s, "r/b", WatchOptions::new().with_range("r/d")).await?;
    let w_from = add_watch(&mut s, "r/c", WatchOptions::new().with_from_key()).await?;
    let w_all = add_watch(&mut s, "", WatchOptions::new().with_all_keys()).await?;
    let mut extra = Vec::new();
    for _ in 0..20 {
        extra.push(add_watch(&mut s, "p/", WatchOptions::new().with_prefix()).await?);
    }
    let mut ids = vec![w_key, w_prefix, w_range, w_from, w_all];
    ids.extend(&extra);
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "watch ids on one stream must be distinct: {ids:?}");

    info!("writes across the keyspace, then one txn that every watcher sees");
    let mut log: Vec<Ev> = Vec::new();
    let keys = ["a", "ab", "p", "p/1", "p/2", "q", "r/a", "r/b", "r/c", "r/d", "s", "z"];
    for (i, k) in keys.iter().enumerate() {
        let r = rev(c.put(*k, format!("v{i}"), None).await?.header());
        log.push(put_ev(k, &format!("v{i}"), r, r, 1));
    }
    let r = rev(c.put("p/1", "again", None).await?.header());
    log.push(put_ev("p/1", "again", log[3].kv.create_revision, r, 2));
    for k in ["a", "r/b", "p/2", "zz-absent"] {
        let d = c.delete(k, None).await?;
        if d.deleted() == 1 {
            log.push(Ev::delete(k, rev(d.header())));
        }
    }
    let txn = Txn::new().and_then([
        TxnOp::put("a", "t", None),
        TxnOp::put("p/3", "t", None),
        TxnOp::put("r/c", "t", None),
    ]);
    let final_rev = rev(c.txn(txn).await?.header());
    log.push(put_ev("a", "t", final_rev, final_rev, 1));
    log.push(put_ev("p/3", "t", final_rev, final_rev, 1));
    log.push(put_ev("r/c", "t", log[8].kv.create_revision, final_rev, 2));

    let resps = watch::read_until(&mut s, WATCH_TIMEOUT, |r| {
        ids.iter().all(|&id| reached(r, id, final_rev))
    })
    .await?;
    let expect = |pred: &dyn Fn(&str) -> bool| -> Vec<Ev> {
        log.iter().filter(|e| pred(std::str::from_utf8(&e.kv.key).unwrap_or(""))).cloned().collect()
    };
    assert_eq!(events_of(&resps, w_key), expect(&|k| k == "a"), "key watch");
    assert_eq!(events_of(&resps, w_prefix), expect(&|k| k.starts_with("p/")), "prefix watch");
    assert_eq!(events_of(&resps, w_range), expect(&|k| ("r/b".."r/d").contains(&k)), "range");
    assert_eq!(events_of(&resps, w_from), expect(&|k| k >= "r/c"), "from-key watch");
    assert_eq!(events_of(&resps, w_all), log, "all-keys watch");
    for &id in &extra {
        assert_eq!(events_of(&resps, id), events_of(&resps, w_prefix), "extra prefix watch {id}");
    }
    info!("the txn's events reach each watcher in one response");
    let txn_resp = resps
        .iter()
        .find(|r| r.watch_id == w_all && r.events.iter().any(|e| e.revision() == final_rev))
        .context("txn response")?;
    assert_eq!(txn_resp.events, log[log.len() - 3..].to_vec(), "{txn_resp:?}");
    for r in &resps {
        assert!(!r.created && !r.canceled, "unexpected response {r:?}");
        assert!(!r.events.is_empty(), "empty response without progress_notify: {r:?}");
    }
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_events_arrive_in_one_response_with_one_revision() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    c.put("t/c", "old", None).await?; // 2
    c.put("t/b", "old", None).await?; // 3
    let mut s = c.watch("t/", Some(WatchOptions::new().with_prefix().with_prev_key())).await?;
    watch::created(&mut s).await?;

    info!("a txn that puts, deletes and puts under the prefix and writes outside it");
    let txn = Txn::new().when([Compare::version("t/c", CompareOp::Equal, 1)]).and_then([
        TxnOp::put("t/b", "new", None),
        TxnOp::delete("t/c", None),
        TxnOp::put("t/a", "new", None),
        TxnOp::put("x", "outside", None),
    ]);
    let t = c.txn(txn).await?;
    assert!(t.succeeded());
    assert_eq!(rev(t.header()), 4);
    let r = watch::next(&mut s, WATCH_TIMEOUT).await?;
    let mut events = r.events.clone();
    assert_eq!(events.len(), 3, "all three events of the txn in one response: {r:?}");
    assert!(events.iter().all(|e| e.revision() == 4), "{r:?}");
    // etcd reports a txn's events in the order the txn applied them; sort to compare the
    // contents independently of that order, then check the order separately.
    events.sort_by(|x, y| x.kv.key.cmp(&y.kv.key));
    assert_eq!(
        events,
        vec![
            put_ev("t/a", "new", 4, 4, 1),
            put_ev("t/b", "new", 3, 4, 2).with_prev(Kv::new("t/b", "old", 3, 3, 1)),
            Ev::delete("t/c", 4).with_prev(Kv::new("t/c", "old", 2, 2, 1)),
        ]
    );
    let order: Vec<&[u8]> = r.events.iter().map(|e| e.kv.key.as_slice()).collect();
    assert_eq!(order, [&b"t/b"[..], b"t/c", b"t/a"], "events in the txn's operation order");
    cluster.finish();
    Ok(())
}

/// Writes continuously from a background task: two of every three writes go to `seam/`, the
/// third elsewhere, each to a fresh key.
struct Writer {
    writes: Arc<Mutex<Vec<Write>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Writer {
    fn start(mut c: Client) -> Writer {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (writes, stop) = (writes.clone(), stop.clone());
            tokio::spawn(async move {
                // Bounded: at most 20,000 writes even if never stopped.
                for n in 0..20_000u32 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let key =
                        if n % 3 == 2 { format!("other/{n:05}") } else { format!("seam/{n:05}") };
                    let value = format!("v{n}");
                    let r = c.put(key.as_str(), value.as_str(), None).await?;
                    writes.lock().unwrap().push(Write { key, value, revision: rev(r.header()) });
                }
                Ok(())
            })
        };
        Writer { writes, stop, task }
    }

    fn count(&self) -> usize {
        self.writes.lock().unwrap().len()
    }

    fn last_revision(&self) -> i64 {
        self.writes.lock().unwrap().last().map_or(1, |w| w.revision)
    }

    /// Waits (at most 60 s) until `more` further writes are acknowledged.
    async fn progress(&self, more: usize) -> Result<()> {
        let target = self.count() + more;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.count() < target {
            ensure!(!self.task.is_finished(), "writer stopped early");
            ensure!(Instant::now() < deadline, "writer made no progress in 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn finish(self) -> Result<Vec<Write>> {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .context("writer did not stop")?
            .context("writer panicked")?
            .context("a write failed on a healthy single member")?;
        let w = self.writes.lock().unwrap().clone();
        Ok(w)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_the_past_continues_live_without_gap_or_duplicate() -> Result<()> {
    let (cluster, c) = single(ClusterOptions::default()).await?;
    let writer = Writer::start(c.clone());
    writer.progress(60).await?;

    info!("create watches from past revisions while the writer keeps writing");
    let mut watches: Vec<(i64, WatchStream)> = Vec::new();
    for i in 0..5 {
        // From the very beginning, and from progressively later revisions, each still in the
        // past when the create reaches the server.
        let start = if i == 0 { 1 } else { writer.last_revision() - 20 };
        let mut wc = c.watch_client();
        let mut s = wc
            .watch("seam/", Some(WatchOptions::new().with_prefix().with_start_revision(start)))
            .await?;
        watch::created(&mut s).await?;
        watches.push((start, s));
        writer.progress(25).await?;
    }
    writer.progress(50).await?;
    let writes = writer.finish().await?;
    let last_seam = writes
        .iter()
        .filter(|w| w.key.starts_with("seam/"))
        .map(|w| w.revision)
        .max()
        .context("no writes")?;
    info!(writes = writes.len(), last_seam, "writer stopped");

    for (i, (start, s)) in watches.iter_mut().enumerate() {
        let want: Vec<Ev> = writes
            .iter()
            .filter(|w| w.key.starts_with("seam/") && w.revision >= *start)
            .map(|w| put_ev(&w.key, &w.value, w.revision, w.revision, 1))
            .collect();
        let resps = watch::read_until(s, WATCH_TIMEOUT, |r| {
            r.iter().any(|x| x.events.iter().any(|e| e.revision() >= last_seam))
        })
        .await
        .with_context(|| format!("watch {i} from revision {start}"))?;
        let got: Vec<Ev> = resps.iter().flat_map(|r| r.events.iter().cloned()).collect();
        let revs: Vec<i64> = got.iter().map(Ev::revision).collect();
        for pair in revs.windows(2) {
            assert!(pair[0] < pair[1], "watch {i}: revision {} then {}", pair[0], pair[1]);
        }
        assert_eq!(got.len(), want.len(), "watch {i} from {start}: event count");
        assert_eq!(got, want, "watch {i} from {start}: every matching write exactly once");
    }
    cluster.finish();
    Ok(())
}

/// Sends a create on `stream`, which already carries live watches, and reads on until its created
/// response, keeping every other response in `log`. Returns the new watch's id and the revision
/// its created response reports.
async fn create_amid(
    stream: &mut WatchStream,
    log: &mut Vec<WatchResp>,
    opts: WatchOptions,
) -> Result<(i64, i64)> {
    stream.watch("seam/", Some(opts)).await?;
    let deadline = Instant::now() + WATCH_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = watch::next(stream, left).await.context("waiting for a create")?;
        if r.created {
            ensure!(!r.canceled, "create refused: {r:?}");
            return Ok((r.watch_id, r.revision));
        }
        log.push(r);
    }
}

/// The member's watch hub (`api/watch_hub.rs`) takes a watcher over from its own task once the
/// watcher has caught up, catches it up from the revisions it still holds when the join arrives
/// late, and hands it back on anything it cannot deliver at once. Thirty watchers join two
/// streams while a writer never pauses, half of them from past revisions, and a third of them
/// are canceled midway: each live one sees every matching write exactly once, in order, from its
/// start; each canceled one sees a gap-free prefix and nothing after its canceled response.
/// (Whether a join arrives behind the hub is timing; the catch-up's arithmetic is pinned by
/// `watch_hub::tests`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_joining_the_live_fan_out_under_writes_see_every_event_once() -> Result<()> {
    let (cluster, c) = single(ClusterOptions::default()).await?;
    let writer = Writer::start(c.clone());
    writer.progress(40).await?;
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut wc = c.watch_client();
        let mut s = wc.watch("unused-first", None).await?;
        watch::created(&mut s).await?;
        streams.push(s);
    }
    // Per watch: (stream, id, first revision it must see, canceled).
    let mut watches: Vec<(usize, i64, i64, bool)> = Vec::new();
    let mut logs: Vec<Vec<WatchResp>> = vec![Vec::new(), Vec::new()];
    for i in 0..30usize {
        let k = i % 2;
        let past = i % 4 >= 2;
        let opts = WatchOptions::new().with_prefix();
        let (opts, from) = if past {
            let from = (writer.last_revision() - 25).max(1);
            (opts.with_start_revision(from), Some(from))
        } else {
            (opts, None)
        };
        let (id, at) = create_amid(&mut streams[k], &mut logs[k], opts).await?;
        watches.push((k, id, from.unwrap_or(at + 1), false));
        writer.progress(2).await?;
        if i % 3 == 1 {
            let victim = watches.len() - 2;
            let (vk, vid, _, _) = watches[victim];
            streams[vk].cancel(vid).await?;
            watches[victim].3 = true;
        }
    }
    writer.progress(40).await?;
    let writes = writer.finish().await?;
    let seam: Vec<&Write> = writes.iter().filter(|w| w.key.starts_with("seam/")).collect();
    let last = seam.last().context("no writes")?.revision;
    info!(writes = writes.len(), last, "writer stopped");

    for (k, s) in streams.iter_mut().enumerate() {
        let mine: Vec<(i64, bool)> =
            watches.iter().filter(|w| w.0 == k).map(|w| (w.1, w.3)).collect();
        let more = watch::read_until(s, WATCH_TIMEOUT, |r| {
            mine.iter().all(|&(id, canceled)| {
                let seen = |r: &[WatchResp]| {
                    if canceled {
                        r.iter().any(|x| x.watch_id == id && x.canceled)
                    } else {
                        reached(r, id, last)
                    }
                };
                seen(r) || seen(&logs[k])
            })
        })
        .await
        .with_context(|| format!("stream {k}"))?;
        logs[k].extend(more);
    }
    for &(k, id, from, canceled) in &watches {
        let log = &logs[k];
        let want: Vec<Ev> = seam
            .iter()
            .filter(|w| w.revision >= from)
            .map(|w| put_ev(&w.key, &w.value, w.revision, w.revision, 1))
            .collect();
        let got = events_of(log, id);
        if canceled {
            let at = log.iter().position(|r| r.watch_id == id && r.canceled);
            let at = at.with_context(|| format!("watch {id}: no canceled response"))?;
            ensure!(
                !log[at..].iter().any(|r| r.watch_id == id && !r.events.is_empty()),
                "watch {id}: an event after its canceled response"
            );
            assert_eq!(got, want[..got.len()], "watch {id} from {from}: a gap-free prefix");
        } else {
            assert_eq!(got.len(), want.len(), "watch {id} from {from}: event count");
            assert_eq!(got, want, "watch {id} from {from}: every matching write exactly once");
        }
    }
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_revision_zero_future_and_compacted() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    c.put("k", "v1", None).await?; // 2
    c.put("k", "v2", None).await?; // 3

    info!("start 0: created at the current revision, events from the next one");
    let mut s = c.watch("k", None).await?;
    let first = watch::next(&mut s, WATCH_TIMEOUT).await?;
    assert!(first.created && first.events.is_empty(), "{first:?}");
    assert_eq!(first.revision, 3, "create response header revision");
    let w0 = first.watch_id;

    info!("a future start revision: nothing until that revision, then everything from it");
    let w_future = add_watch(&mut s, "k", WatchOptions::new().with_start_revision(6)).await?;
    for v in ["v3", "v4", "v5", "v6"] {
        c.put("k", v, None).await?; // 4, 5, 6, 7
    }
    let resps =
        watch::read_until(&mut s, WATCH_TIMEOUT, |r| reached(r, w0, 7) && reached(r, w_future, 7))
            .await?;
    let at = |r: i64, v: &str| put_ev("k", v, 2, r, r - 1);
    assert_eq!(events_of(&resps, w0), vec![at(4, "v3"), at(5, "v4"), at(6, "v5"), at(7, "v6")]);
    assert_eq!(events_of(&resps, w_future), vec![at(6, "v5"), at(7, "v6")]);

    info!("compact at 5: a watch from 4 is created, then canceled with compact_revision 5");
    c.compact(5, None).await?;
    let mut wc = c.watch_client();
    let mut s2 = wc.watch("k", Some(WatchOptions::new().with_start_revision(4))).await?;
    let created = watch::next(&mut s2, WATCH_TIMEOUT).await?;
    assert!(created.created, "compacted watch must first be created: {created:?}");
    let canceled = watch::next(&mut s2, WATCH_TIMEOUT).await?;
    assert!(canceled.canceled, "then canceled: {canceled:?}");
    assert_eq!(canceled.watch_id, created.watch_id);
    assert_eq!(canceled.compact_revision, 5, "{canceled:?}");
    assert!(canceled.events.is_empty());

    info!("a watch from the compaction revision itself still replays");
    let w5 = add_watch(&mut s2, "k", WatchOptions::new().with_start_revision(5)).await?;
    let resps = watch::read_until(&mut s2, WATCH_TIMEOUT, |r| reached(r, w5, 7)).await?;
    assert_eq!(events_of(&resps, w5), vec![at(5, "v4"), at(6, "v5"), at(7, "v6")]);
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prev_kv_and_filters() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    let mut s = c.watch("k", Some(WatchOptions::new().with_prev_key())).await?;
    let w_prev = watch::created(&mut s).await?;
    let w_noput =
        add_watch(&mut s, "k", WatchOptions::new().with_filters([WatchFilterType::NoPut])).await?;
    let w_nodel =
        add_watch(&mut s, "k", WatchOptions::new().with_filters([WatchFilterType::NoDelete]))
            .await?;
    let w_plain = add_watch(&mut s, "k", WatchOptions::new()).await?;

    c.put("k", "v1", None).await?; // 2
    c.put("k", "v2", None).await?; // 3
    c.delete("k", None).await?; // 4
    c.put("k", "v3", None).await?; // 5
    c.delete("k", Some(DeleteOptions::new())).await?; // 6
                                                      // The NODELETE watcher's last event so far is the put at 5.
    let resps = watch::read_until(&mut s, WATCH_TIMEOUT, |r| {
        [w_prev, w_noput, w_plain].iter().all(|&id| reached(r, id, 6)) && reached(r, w_nodel, 5)
    })
    .await?;
    let v1 = Kv::new("k", "v1", 2, 2, 1);
    let v2 = Kv::new("k", "v2", 2, 3, 2);
    let v3 = Kv::new("k", "v3", 5, 5, 1);
    let plain = vec![
        Ev::put(v1.clone()),
        Ev::put(v2.clone()),
        Ev::delete("k", 4),
        Ev::put(v3.clone()),
        Ev::delete("k", 6),
    ];
    info!("prev_kv: none for a creation, the old pair for an update or a delete");
    assert_eq!(
        events_of(&resps, w_prev),
        vec![
            Ev::put(v1.clone()),
            Ev::put(v2.clone()).with_prev(v1.clone()),
            Ev::delete("k", 4).with_prev(v2.clone()),
            Ev::put(v3.clone()),
            Ev::delete("k", 6).with_prev(v3.clone()),
        ]
    );
    assert_eq!(events_of(&resps, w_plain), plain, "no prev_kv unless asked");
    info!("NOPUT and NODELETE");
    let only = |kind: Kind| plain.iter().filter(|e| e.kind == kind).cloned().collect::<Vec<_>>();
    assert_eq!(events_of(&resps, w_noput), only(Kind::Delete), "NOPUT");
    // The NODELETE watcher's last event is the put at 5; the delete at 6 must not follow.
    c.put("k", "fence", None).await?; // 7
    let more = watch::read_until(&mut s, WATCH_TIMEOUT, |r| reached(r, w_nodel, 7)).await?;
    let mut nodel = events_of(&resps, w_nodel);
    nodel.extend(events_of(&more, w_nodel));
    let mut want = only(Kind::Put);
    want.push(put_ev("k", "fence", 7, 7, 1));
    assert_eq!(nodel, want, "NODELETE");
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_watch() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    let mut s = c.watch("c", None).await?;
    let w = watch::created(&mut s).await?;
    let keep = add_watch(&mut s, "keep", WatchOptions::new()).await?;
    c.put("c", "1", None).await?; // 2
    let r = watch::next(&mut s, WATCH_TIMEOUT).await?;
    assert_eq!((r.watch_id, r.events.clone()), (w, vec![put_ev("c", "1", 2, 2, 1)]));

    info!("cancel: a canceled response for that watch, and no event for it afterwards");
    s.cancel(w).await?;
    let r = watch::next(&mut s, WATCH_TIMEOUT).await?;
    assert!(r.canceled && r.watch_id == w && r.events.is_empty(), "cancel response: {r:?}");
    c.put("c", "2", None).await?; // 3
    c.put("keep", "x", None).await?; // 4
    let r = watch::next(&mut s, WATCH_TIMEOUT).await?;
    assert_eq!(
        (r.watch_id, r.events.clone()),
        (keep, vec![put_ev("keep", "x", 4, 4, 1)]),
        "the next response must be the other watch's event, not one for the canceled watch"
    );

    info!("a new watch on the same stream gets a fresh id and works");
    let w2 = add_watch(&mut s, "c", WatchOptions::new()).await?;
    assert!(w2 != keep, "id {w2} reused while watch {keep} is live");
    c.put("c", "3", None).await?; // 5
    let r = watch::next(&mut s, WATCH_TIMEOUT).await?;
    assert_eq!((r.watch_id, r.events.clone()), (w2, vec![put_ev("c", "3", 2, 5, 3)]));
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_requests_and_notifications_never_run_ahead() -> Result<()> {
    let opts = ClusterOptions { extra_args: progress_interval_args("500ms"), ..Default::default() };
    let (cluster, mut c) = single(opts).await?;
    for i in 0..3 {
        c.put(format!("other/{i}"), "x", None).await?; // 2, 3, 4
    }

    info!("progress request: answered with watch_id -1 and the revision every watcher reached");
    let mut s = c.watch("pk", None).await?;
    watch::created(&mut s).await?;
    let mut answered = None;
    for _ in 0..20 {
        s.request_progress().await?;
        let r = watch::next(&mut s, WATCH_TIMEOUT).await?;
        assert_eq!(r.watch_id, -1, "progress response: {r:?}");
        assert!(r.is_progress(), "progress response: {r:?}");
        assert!(r.revision <= 4, "progress ahead of the store: {r:?}");
        if r.revision == 4 {
            answered = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered.is_some(), "progress never reached the store revision 4");

    info!("progress_notify: a quiet watcher is told the current revision");
    let mut wc = c.watch_client();
    let mut pn = wc.watch("pn", Some(WatchOptions::new().with_progress_notify())).await?;
    let w = watch::created(&mut pn).await?;
    let r = watch::next(&mut pn, Duration::from_secs(10)).await?;
    assert!(r.is_progress() && r.watch_id == w, "expected a progress notification: {r:?}");
    assert_eq!(r.revision, 4, "notification of a quiet store");

    info!("bursts of writes with quiet spells: no progress revision ever runs ahead of an event");
    let mut log: Vec<WatchResp> = Vec::new();
    let mut last_rev = 4;
    for burst in 0..4 {
        for i in 0..10 {
            let key = if i % 2 == 0 { "pn".to_string() } else { format!("other/{burst}/{i}") };
            last_rev = rev(c.put(key, format!("{burst}/{i}"), None).await?.header());
        }
        pn.request_progress().await?;
        // A quiet spell of three notification intervals.
        log.extend(watch::read_for(&mut pn, Duration::from_millis(1500)).await?);
    }
    let final_progress = watch::read_until(&mut pn, Duration::from_secs(10), |r| {
        r.iter().any(|x| x.is_progress() && x.watch_id == w && x.revision == last_rev)
    })
    .await
    .context("progress notifications must catch up with the store revision")?;
    log.extend(final_progress);

    let mut progress_seen = 0;
    let mut events_seen = 0;
    let mut notifications = 0;
    for r in &log {
        if r.is_progress() {
            assert!(r.watch_id == w || r.watch_id == -1, "progress for another watch: {r:?}");
            assert!(
                r.revision >= progress_seen,
                "progress went backwards: {r:?} after {progress_seen}"
            );
            assert!(
                r.revision >= events_seen,
                "progress {r:?} behind an event already sent at {events_seen}"
            );
            progress_seen = r.revision;
            if r.watch_id == w {
                notifications += 1;
            }
        } else {
            assert_eq!(r.watch_id, w, "{r:?}");
            for e in &r.events {
                assert!(
                    e.revision() > progress_seen,
                    "event at {} after progress claimed {progress_seen}: {r:?}",
                    e.revision()
                );
                events_seen = e.revision();
            }
        }
    }
    let pn_events = log.iter().flat_map(|r| &r.events).count();
    assert_eq!(pn_events, 20, "every put to pn, once");
    assert!(notifications >= 4, "expected a notification per quiet spell, got {notifications}");
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_on_every_member_see_every_write() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let mut clients = cluster.clients().await?;

    // The leader is unknown (no Maintenance.Status yet), so watch on every member and write
    // through every member: at least two watchers are on followers, and at least one third of
    // the writes goes through the leader.
    info!("a live watch on each member, then writes through each member in turn");
    let mut live = Vec::new();
    for c in clients.iter_mut() {
        let mut s = c.watch("f/", Some(WatchOptions::new().with_prefix())).await?;
        watch::created(&mut s).await?;
        live.push(s);
    }
    let mut want = Vec::new();
    for n in 0..30 {
        let key = format!("f/{n:02}");
        let r = rev(clients[n % 3].put(key.as_str(), "v", None).await?.header());
        want.push(put_ev(&key, "v", r, r, 1));
    }
    let last = want.last().context("writes")?.revision();
    for (m, s) in live.iter_mut().enumerate() {
        let resps = watch::read_until(s, WATCH_TIMEOUT, |r| {
            r.iter().any(|x| x.events.iter().any(|e| e.revision() >= last))
        })
        .await
        .with_context(|| format!("live watch on member {}", cluster.name(m)))?;
        let got: Vec<Ev> = resps.iter().flat_map(|r| r.events.iter().cloned()).collect();
        assert_eq!(got, want, "live watch on member {}", cluster.name(m));
    }

    info!("a replay from revision 1 on each member gives the same history");
    for (m, c) in clients.iter_mut().enumerate() {
        let mut s =
            c.watch("f/", Some(WatchOptions::new().with_prefix().with_start_revision(1))).await?;
        watch::created(&mut s).await?;
        let resps = watch::read_until(&mut s, WATCH_TIMEOUT, |r| {
            r.iter().any(|x| x.events.iter().any(|e| e.revision() >= last))
        })
        .await
        .with_context(|| format!("replay on member {}", cluster.name(m)))?;
        let got: Vec<Ev> = resps.iter().flat_map(|r| r.events.iter().cloned()).collect();
        assert_eq!(got, want, "replay on member {}", cluster.name(m));
    }
    cluster.finish();
    Ok(())
}

/// Reads raw responses of one watch until a response with events and `fragment=false` ends a
/// group, for at most [`WATCH_TIMEOUT`] per response; returns the group.
async fn fragment_group(w: &mut watch::RawWatch) -> Result<Vec<WatchResp>> {
    let mut group = Vec::new();
    for _ in 0..1000 {
        let r = w.next(WATCH_TIMEOUT).await.with_context(|| format!("after {group:?}"))?;
        ensure!(!r.created && !r.canceled, "unexpected {r:?}");
        let last = r.fragment == Some(false);
        group.push(r);
        if last {
            return Ok(group);
        }
    }
    bail!("no final fragment after 1000 responses")
}

/// etcd fragments a watch response once it reaches `--max-request-bytes` plus 512 KiB of
/// allowance for gRPC overhead (`grpcOverheadBytes` in etcd's watch server), so a revision meant
/// to be fragmented by every etcd-compatible server must exceed that.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_revisions_are_fragmented_on_request() -> Result<()> {
    const LIMIT: usize = 4096;
    const BIG: usize = 200;
    let (cluster, mut c) = single(ClusterOptions::default().max_request_bytes(LIMIT)).await?;

    // A request may not exceed 4 KiB, so each 3 KiB value is its own put; one small DeleteRange
    // then produces a single revision whose events (with prev_kv) take about 620 KiB: more than
    // the 4 KiB limit, and more than etcd's 4 KiB + 512 KiB fragmenting threshold.
    info!(big = BIG, "3 KiB values and four small ones, then one delete of them all");
    let mut puts = Vec::new();
    for i in 0..BIG {
        let key = format!("big/{i:03}");
        let value: String = (0..3072).map(|j| char::from(b'a' + ((i + j) % 26) as u8)).collect();
        let r = rev(c.put(key.as_str(), value.as_str(), None).await?.header());
        puts.push(Kv::new(&key, &value, r, r, 1));
    }
    for i in 0..4 {
        let key = format!("big/s{i}");
        let r = rev(c.put(key.as_str(), "small", None).await?.header());
        puts.push(Kv::new(&key, "small", r, r, 1));
    }
    let first = puts[0].mod_revision;
    let create = |fragment: bool, prev_kv: bool, start_revision: i64| WatchCreateRequest {
        key: b"big/".to_vec(),
        range_end: b"big0".to_vec(),
        start_revision,
        prev_kv,
        fragment,
        ..Default::default()
    };
    let mut frag = watch::raw_watch(&cluster.endpoint(0), create(true, true, 0)).await?;
    let r = frag.next(WATCH_TIMEOUT).await?;
    ensure!(r.created, "{r:?}");
    let mut whole = watch::raw_watch(&cluster.endpoint(0), create(false, true, 0)).await?;
    let r = whole.next(WATCH_TIMEOUT).await?;
    ensure!(r.created, "{r:?}");

    let d = c.delete("big/", Some(DeleteOptions::new().with_prefix())).await?;
    assert_eq!(d.deleted(), puts.len() as i64);
    let del_rev = rev(d.header());
    let deletes: Vec<Ev> =
        puts.iter().map(|kv| Ev::delete(&kv.key, del_rev).with_prev(kv.clone())).collect();

    info!("fragment=true: several responses, all but the last flagged, reassembling the revision");
    let group = fragment_group(&mut frag).await?;
    assert!(group.len() >= 2, "a ~620 KiB revision must be split: {} response(s)", group.len());
    for (i, r) in group.iter().enumerate() {
        assert_eq!(r.fragment, Some(i + 1 < group.len()), "fragment flag of response {i}: {r:?}");
        assert_eq!(r.revision, del_rev, "every fragment carries the revision's header: {r:?}");
        assert!(!r.events.is_empty(), "empty fragment: {r:?}");
        if r.events.len() > 1 {
            assert!(
                r.encoded_len < LIMIT + GRPC_OVERHEAD_BYTES,
                "a multi-event fragment of {} bytes ({} events)",
                r.encoded_len,
                r.events.len()
            );
        }
    }
    let joined: Vec<Ev> = group.iter().flat_map(|r| r.events.iter().cloned()).collect();
    assert_eq!(joined, deletes, "reassembled fragments");

    info!("fragment=false: the same revision in one response");
    let r = whole.next(WATCH_TIMEOUT).await?;
    assert_eq!(r.fragment, Some(false));
    assert_eq!(r.events, deletes, "unfragmented response");

    info!("a replay of the whole history with fragment=true reassembles to every event");
    let mut replay = watch::raw_watch(&cluster.endpoint(0), create(true, false, first)).await?;
    let r = replay.next(WATCH_TIMEOUT).await?;
    ensure!(r.created, "{r:?}");
    let mut want: Vec<Ev> = puts.iter().cloned().map(Ev::put).collect();
    want.extend(puts.iter().map(|kv| Ev::delete(&kv.key, del_rev)));
    let mut got = Vec::new();
    let mut responses = Vec::new();
    while got.len() < want.len() {
        let group = fragment_group(&mut replay)
            .await
            .with_context(|| format!("{} events so far", got.len()))?;
        for r in &group {
            if r.events.len() > 1 {
                assert!(
                    r.encoded_len < LIMIT + GRPC_OVERHEAD_BYTES,
                    "a multi-event response of {} bytes ({} events)",
                    r.encoded_len,
                    r.events.len()
                );
            }
            got.extend(r.events.iter().cloned());
        }
        responses.extend(group);
    }
    assert_eq!(got, want, "replayed events, reassembled");
    info!(responses = responses.len(), "replay responses");
    cluster.finish();
    Ok(())
}
