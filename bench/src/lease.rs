//! Lease workloads: the grant + keep-alive + revoke cycle, and holding many leases alive.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use etcd_client::Client;
use futures::stream::{self, StreamExt, TryStreamExt};
use parking_lot::Mutex;
use picket_proto::etcdserverpb::lease_client::LeaseClient;
use picket_proto::etcdserverpb::LeaseKeepAliveRequest;

use crate::cpu::CpuMeter;
use crate::pct;

/// Grants and revokes in flight at once while setting up and tearing down `lease-hold`: the
/// setup is not what is measured, it only has to be quick.
const SETUP_CONCURRENCY: usize = 32;

/// Bound on opening one keep-alive stream and on its first answer (setup, not measured).
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the receiver of a keep-alive stream waits for the answers still owed after the
/// senders stopped. Both servers answer in milliseconds; past this the rest count as lost.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// One lease cycle: grant, one keep-alive round trip, revoke.
///
/// `Client::lease_keep_alive` already sends the first keep-alive and waits for its answer
/// before returning; the keeper and stream are dropped right away, which closes the stream.
/// (The earlier version waited on the returned stream for a second answer while the keeper,
/// kept alive by the `match`, held the request side open: no second request was ever sent, so
/// every cycle hung until the 10 s per-operation timeout and counted as an error, on Picket and
/// etcd alike.)
pub async fn cycle(c: &mut Client) -> Result<(), etcd_client::Error> {
    let id = c.lease_grant(10, None).await?.id();
    let (keeper, stream) = c.lease_keep_alive(id).await?;
    drop((keeper, stream));
    c.lease_revoke(id).await.map(|_| ())
}

/// What `lease-hold` measured over its window.
pub struct HoldReport {
    pub answered: u64,
    pub errors: u64,
    pub lost: u64,
    pub window: Duration,
    pub latencies: Vec<Duration>,
    pub server_cpu: Option<f64>,
}

impl HoldReport {
    pub fn print(&self, leases: usize, interval: u64, conns: usize) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let secs = self.window.as_secs_f64();
        let cpu = match self.server_cpu {
            Some(c) => format!(
                " server_cpu_s={c:.2} server_cpu_ms_per_keepalive={:.3}",
                c * 1000.0 / self.answered.max(1) as f64
            ),
            None => String::new(),
        };
        println!(
            "workload=LeaseHold leases={leases} interval={interval}s conns={conns} window={secs:.1}s \
             keepalives={} errors={} lost={} keepalives/s={:.0} expected/s={:.0} \
             p50={:.2}ms p99={:.2}ms max={:.2}ms{cpu}",
            self.answered,
            self.errors,
            self.lost,
            self.answered as f64 / secs,
            leases as f64 / interval.max(1) as f64,
            ms(pct(&self.latencies, 0.50)),
            ms(pct(&self.latencies, 0.99)),
            ms(self.latencies.last().copied().unwrap_or_default()),
        );
    }
}

/// Keeps `leases` leases alive over `streams` keep-alive streams (many leases per stream, as
/// real clients multiplex them) for `window`, each lease renewed once per `interval`, spread
/// evenly over the interval as independent clients would be. Leases are granted before and
/// revoked after the window, so neither the measured rate nor the server CPU (sampled at the
/// window's edges) includes them.
pub async fn hold(
    c: &Client,
    endpoints: &[String],
    leases: usize,
    streams: usize,
    interval: Duration,
    window: Duration,
    cpu: &CpuMeter,
) -> Result<HoldReport> {
    let ids: Vec<i64> = stream::iter(0..leases)
        .map(|_| {
            let mut c = c.clone();
            // 60 s: comfortably longer than any window plus setup, so a lease only dies if the
            // server fails to renew it.
            async move { c.lease_grant(60, None).await.map(|r| r.id()) }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_collect()
        .await
        .context("granting leases")?;
    let streams = streams.max(1);
    let per = ids.len().div_ceil(streams).max(1);
    // Open every stream before the window starts.
    let mut opened = Vec::new();
    for (i, chunk) in ids.chunks(per).enumerate() {
        let ep = endpoints[i % endpoints.len()].clone();
        let mut client = LeaseClient::connect(ep.clone()).await.with_context(|| ep.clone())?;
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        // Prime the stream with one keep-alive before awaiting the call: a Go gRPC server (etcd)
        // sends the response headers only with its first answer, so awaiting the call with
        // nothing sent waits forever (this is what cut the earlier etcd run short).
        tx.send(LeaseKeepAliveRequest { id: chunk[0] }).await?;
        let mut answers = tokio::time::timeout(
            SETUP_TIMEOUT,
            client.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await
        .context("opening a keep-alive stream timed out")??
        .into_inner();
        tokio::time::timeout(SETUP_TIMEOUT, answers.message())
            .await
            .context("first keep-alive answer timed out")??
            .context("keep-alive stream ended at once")?;
        opened.push((chunk.to_vec(), tx, answers));
    }
    // CPU is sampled from just before the first keep-alive until every answer is in.
    let cpu_before = cpu.sample();
    let start = Instant::now();
    let end = start + window;
    let mut tasks = Vec::new();
    for (chunk, tx, mut answers) in opened {
        // Send times, oldest first: both servers answer one stream's keep-alives in order.
        let sent: Arc<Mutex<VecDeque<Instant>>> = Arc::default();
        let sender = {
            let sent = sent.clone();
            tokio::spawn(async move {
                let step = interval / chunk.len().max(1) as u32;
                let mut n: u32 = 0;
                // Bounded by the window's end: one send per step.
                'rounds: loop {
                    for id in &chunk {
                        let at = start + step * n;
                        n += 1;
                        if at >= end {
                            break 'rounds;
                        }
                        tokio::time::sleep_until(at.into()).await;
                        sent.lock().push_back(Instant::now());
                        if tx.send(LeaseKeepAliveRequest { id: *id }).await.is_err() {
                            break 'rounds;
                        }
                    }
                }
                // Dropping `tx` here would close the stream early; the receiver drops it.
                tx
            })
        };
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut errors) = (0u64, 0u64);
            let mut latencies = Vec::new();
            let drain_until = end + DRAIN_GRACE;
            // Bounded: every wait ends by `drain_until`.
            loop {
                let owed = !sent.lock().is_empty();
                if !owed && (sender.is_finished() || Instant::now() >= end) {
                    break;
                }
                let wait = drain_until.saturating_duration_since(Instant::now());
                match tokio::time::timeout(wait, answers.message()).await {
                    Ok(Ok(Some(r))) => {
                        let t = sent.lock().pop_front();
                        if r.ttl > 0 {
                            ok += 1;
                            if let Some(t) = t {
                                latencies.push(t.elapsed());
                            }
                        } else {
                            errors += 1;
                        }
                    }
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        errors += 1;
                        break;
                    }
                    Err(_) => break,
                }
            }
            let lost = sent.lock().len() as u64;
            drop(sender.await);
            (ok, errors, lost, latencies)
        }));
    }
    let mut report = HoldReport {
        answered: 0,
        errors: 0,
        lost: 0,
        window,
        latencies: Vec::new(),
        server_cpu: None,
    };
    for t in tasks {
        let (ok, errors, lost, lat) = t.await?;
        report.answered += ok;
        report.errors += errors;
        report.lost += lost;
        report.latencies.extend(lat);
    }
    report.server_cpu = cpu.since(cpu_before);
    report.latencies.sort_unstable();
    stream::iter(ids)
        .for_each_concurrent(SETUP_CONCURRENCY, |id| {
            let mut c = c.clone();
            async move {
                let _ = c.lease_revoke(id).await;
            }
        })
        .await;
    Ok(report)
}
