//! A background write load whose outcome can be checked exactly: one put at a time, each to a
//! fresh key `<prefix><seq>` with value `value-<seq>`, never retried, round-robin over the members
//! not marked down.
//!
//! Every attempt ends in one of three outcomes, recorded per sequence number:
//! - acknowledged: the put returned a revision; the key must be present afterwards with exactly
//!   that value and revision (on every member);
//! - refused with a definite error: the request provably never became a Raft entry (the member
//!   answered `etcdserver: no leader`, or the TCP connection was refused, so nothing was sent);
//!   the key must never appear;
//! - indeterminate (a timeout, a connection reset mid-request, a leader change): the write may or
//!   may not have been applied, so the key may appear, but only with its own value.
//!
//! [`check_writes`] checks all three on every member at one pinned revision, and [`hash_kv_agree`]
//! checks that every member computes the same `Maintenance.HashKV` at that revision.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use etcd_client::{Client, GetOptions};
use tracing::info;

use crate::util::{grpc_status, kvs, rev, POLL_INTERVAL};
use crate::{eventually, Cluster, Kv};

/// Hard cap on the writes one writer attempts, so even a misbehaving test cannot loop forever.
pub const MAX_WRITER_ATTEMPTS: u64 = 100_000;

/// How long a writer may take to make a given amount of progress. Writes stall only while a new
/// leader is elected after a kill (a few election timeouts of 1-2 s) and while in-flight requests
/// to a dead or leaderless member time out (at most the 15 s client timeout); 60 s covers both.
pub const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a member may take to apply a revision the others already have, e.g. a restarted
/// member replaying its log or installing a snapshot on a loaded 2-core machine.
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// One acknowledged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    pub revision: i64,
}

/// Everything a writer attempted, by outcome.
#[derive(Debug, Clone, Default)]
pub struct WriteLog {
    pub prefix: String,
    /// In acknowledgement order (which is also attempt order: the writer is sequential).
    pub acks: Vec<Ack>,
    /// Sequence numbers refused with an error that proves the write was never proposed.
    pub refused: Vec<u64>,
    /// Sequence numbers whose outcome is unknown.
    pub indeterminate: Vec<u64>,
}

impl WriteLog {
    pub fn key(&self, seq: u64) -> String {
        format!("{}{seq:08}", self.prefix)
    }
}

/// The value written under sequence number `seq`.
pub fn value_of(seq: u64) -> String {
    format!("value-{seq}")
}

/// Whether a failed put provably never reached Raft. `etcdserver: no leader` is answered before
/// proposing; a failed TCP connect (tonic's `tcp connect error`, e.g. to a killed member) means
/// no byte of the request was sent. Anything else (timeouts, resets, `leader changed`, a
/// forward to the leader that failed midway) is treated as indeterminate, which is the
/// conservative choice: it only weakens what the check demands.
pub fn is_definite_refusal(e: &etcd_client::Error) -> bool {
    match grpc_status(e) {
        Some(s) => s.message() == "etcdserver: no leader" || s.message() == "tcp connect error",
        None => false,
    }
}

#[derive(Default)]
struct Shared {
    log: Mutex<WriteLog>,
    attempts: AtomicUsize,
    /// Set while the writer finds every member marked down, so no put is in flight.
    idle: AtomicBool,
}

/// A sequential background writer; see the module docs.
pub struct Writer {
    shared: Arc<Shared>,
    down: Arc<Vec<AtomicBool>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Starts writing `<prefix><seq>` keys through `clients` (one per member, in member order).
    pub fn start(clients: Vec<Client>, prefix: &str) -> Writer {
        let shared = Arc::new(Shared::default());
        shared.log.lock().unwrap().prefix = prefix.to_string();
        let down: Arc<Vec<AtomicBool>> =
            Arc::new(clients.iter().map(|_| AtomicBool::new(false)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
            let (shared, down, stop) = (shared.clone(), down.clone(), stop.clone());
            let mut clients = clients;
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                let n = clients.len();
                for seq in 0..MAX_WRITER_ATTEMPTS {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Some(i) = (0..n)
                        .map(|d| (seq as usize + d) % n)
                        .find(|&i| !down[i].load(Ordering::SeqCst))
                    else {
                        shared.idle.store(true, Ordering::SeqCst);
                        tokio::time::sleep(POLL_INTERVAL).await;
                        continue;
                    };
                    shared.idle.store(false, Ordering::SeqCst);
                    shared.attempts.fetch_add(1, Ordering::SeqCst);
                    let key = format!("{prefix}{seq:08}");
                    match clients[i].put(key, value_of(seq), None).await {
                        Ok(r) => shared
                            .log
                            .lock()
                            .unwrap()
                            .acks
                            .push(Ack { seq, revision: rev(r.header()) }),
                        Err(e) => {
                            let definite = is_definite_refusal(&e);
                            {
                                let mut log = shared.log.lock().unwrap();
                                if definite {
                                    log.refused.push(seq);
                                } else {
                                    log.indeterminate.push(seq);
                                }
                            }
                            // Never retried; pause so a leaderless cluster is not hammered.
                            tokio::time::sleep(POLL_INTERVAL).await;
                        }
                    }
                }
            })
        };
        Writer { shared, down, stop, task }
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> usize {
        self.shared.log.lock().unwrap().acks.len()
    }

    /// Marks member `i` as down (skipped) or up.
    pub fn set_down(&self, i: usize, down: bool) {
        self.down[i].store(down, Ordering::SeqCst);
    }

    /// Marks every member down and waits until the writer has no put in flight, so that the
    /// acknowledgements counted afterwards all belong to puts started afterwards. Bounded by the
    /// in-flight put's client timeout (15 s) plus one pause.
    pub async fn quiesce(&self) -> Result<()> {
        for d in self.down.iter() {
            d.store(true, Ordering::SeqCst);
        }
        self.shared.idle.store(false, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.shared.idle.load(Ordering::SeqCst) {
            if Instant::now() >= deadline || self.task.is_finished() {
                bail!("writer did not go idle within 30 s");
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Ok(())
    }

    /// Waits until `more` further writes have been acknowledged, or fails after
    /// [`PROGRESS_TIMEOUT`].
    pub async fn wait_progress(&self, more: usize, why: &str) -> Result<()> {
        let target = self.acked() + more;
        let deadline = Instant::now() + PROGRESS_TIMEOUT;
        while self.acked() < target {
            if Instant::now() >= deadline || self.task.is_finished() {
                let log = self.shared.log.lock().unwrap().clone();
                bail!(
                    "writer made no progress {why}: {} acked (wanted {target}), {} refused, {} \
                     indeterminate, of {} attempts",
                    log.acks.len(),
                    log.refused.len(),
                    log.indeterminate.len(),
                    self.shared.attempts.load(Ordering::SeqCst)
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Ok(())
    }

    /// Stops the writer (bounded by the in-flight put's client timeout) and returns what it did.
    pub async fn finish(self) -> Result<WriteLog> {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .context("writer did not stop within 30 s")?
            .context("writer task panicked")?;
        let log = self.shared.log.lock().unwrap().clone();
        info!(
            acked = log.acks.len(),
            refused = log.refused.len(),
            indeterminate = log.indeterminate.len(),
            "writer finished"
        );
        Ok(log)
    }
}

/// Every pair under `prefix` on member `i`, linearizable, at revision `at` (0 = latest), with
/// the header revision.
pub async fn read_prefix(
    cluster: &Cluster,
    i: usize,
    prefix: &str,
    at: i64,
) -> Result<(i64, Vec<Kv>)> {
    let mut c = cluster.client(i).await?;
    let r = c.get(prefix, Some(GetOptions::new().with_prefix().with_revision(at))).await?;
    Ok((rev(r.header()), kvs(&r)))
}

/// Checks `log` against every listed member at one pinned revision (the first member's latest;
/// an indeterminate write may still land later, so later reads use that revision): acknowledged
/// revisions increase in acknowledgement order; every acknowledged write is present with its
/// value and revision; no definitely refused write is present; every present key is one the
/// writer attempted, with its own value, written once; and all members return the same pairs.
/// Returns the pinned revision.
pub async fn check_writes(cluster: &Cluster, members: &[usize], log: &WriteLog) -> Result<i64> {
    for w in log.acks.windows(2) {
        ensure!(w[0].revision < w[1].revision, "acks out of order: {:?} then {:?}", w[0], w[1]);
    }
    let first_member = *members.first().context("no member to check")?;
    let (at, first) =
        eventually("a linearizable read of the written keys", CONVERGE_TIMEOUT, || {
            read_prefix(cluster, first_member, &log.prefix, 0)
        })
        .await?;
    let refused: BTreeSet<u64> = log.refused.iter().copied().collect();
    for &i in members {
        let name = cluster.name(i);
        let got =
            eventually(&format!("{name}: read at revision {at}"), CONVERGE_TIMEOUT, || async {
                Ok(read_prefix(cluster, i, &log.prefix, at).await?.1)
            })
            .await?;
        let by_key: BTreeMap<&[u8], &Kv> = got.iter().map(|kv| (kv.key.as_slice(), kv)).collect();
        for a in &log.acks {
            let key = log.key(a.seq);
            let kv = by_key
                .get(key.as_bytes())
                .with_context(|| format!("{name}: acknowledged write {a:?} ({key}) is lost"))?;
            let want = Kv::new(&key, value_of(a.seq), a.revision, a.revision, 1);
            ensure!(**kv == want, "{name}: acknowledged write {a:?} reads back as {kv:?}");
        }
        for kv in &got {
            let key = String::from_utf8_lossy(&kv.key);
            let seq: u64 = key
                .strip_prefix(log.prefix.as_str())
                .and_then(|s| s.parse().ok())
                .with_context(|| format!("{name}: unexpected key {key}"))?;
            ensure!(
                !refused.contains(&seq),
                "{name}: {kv:?} is present, but its write was refused with a definite error"
            );
            ensure!(
                kv.value == value_of(seq).as_bytes(),
                "{name}: {kv:?} has a value never written"
            );
            ensure!(kv.version == 1, "{name}: {kv:?} was written more than once");
        }
        ensure!(
            got == first,
            "{name} returned {} pairs at revision {at}, {} returned {}",
            got.len(),
            cluster.name(first_member),
            first.len()
        );
    }
    info!(
        revision = at,
        acked = log.acks.len(),
        refused = log.refused.len(),
        indeterminate = log.indeterminate.len(),
        members = members.len(),
        "every acknowledged write is present, no refused write is, on every member"
    );
    Ok(at)
}

/// `Maintenance.HashKV` at revision `at` on member `i`: (hash, compact revision). Retried until
/// the member has applied `at` (before that it answers "future revision").
pub async fn hash_kv(cluster: &Cluster, i: usize, at: i64) -> Result<(u32, i64)> {
    let what = format!("{}: HashKV at revision {at}", cluster.name(i));
    eventually(&what, CONVERGE_TIMEOUT, || async {
        let r = cluster.client(i).await?.hash_kv(at).await?;
        Ok((r.hash(), r.compact_version()))
    })
    .await
}

/// Checks that every listed member computes the same HashKV (and compact revision) at `at`.
pub async fn hash_kv_agree(cluster: &Cluster, members: &[usize], at: i64) -> Result<u32> {
    let mut seen = Vec::new();
    for &i in members {
        seen.push((cluster.name(i).to_string(), hash_kv(cluster, i, at).await?));
    }
    let first = seen.first().context("no member to hash")?.1;
    for (name, h) in &seen {
        ensure!(*h == first, "HashKV at revision {at} differs between members: {seen:x?} ({name})");
    }
    info!(revision = at, hash = first.0, members = seen.len(), "HashKV agrees on every member");
    Ok(first.0)
}
