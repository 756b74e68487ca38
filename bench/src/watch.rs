//! The watch workload: put-to-event latency with N watchers on one prefix.
//!
//! N watch streams (one watch each, as N independent clients would open) are spread over the
//! connections, and so over every member. One writer puts keys under the prefix at a fixed rate;
//! each value is the send time in nanoseconds since a process-local origin, so a watcher computes
//! the put-to-event latency from the event alone. Every watcher must see every put: events that
//! never arrive are reported as `missed`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, WatchOptions};

use crate::pct;

/// Key prefix of the watch workload.
const PREFIX: &str = "bench-watch/";

/// How long watchers may take to deliver the last puts after the writer stops. Events arrive in
/// milliseconds; past this the rest count as missed, so a run always ends.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Bound on opening one watch (connect + created response).
const CREATE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct WatchArgs {
    pub watchers: usize,
    pub put_rate: u64,
    pub window: Duration,
}

pub async fn latency(conns: &[Client], args: &WatchArgs) -> Result<()> {
    let origin = Instant::now();
    let mut streams = Vec::with_capacity(args.watchers);
    for i in 0..args.watchers {
        let mut c = conns[i % conns.len()].clone();
        let open = async {
            let mut s = c.watch(PREFIX, Some(WatchOptions::new().with_prefix())).await?;
            // The first response confirms the watch is registered; puts before it would be
            // missed by design, not by the server.
            match s.message().await? {
                Some(r) if r.created() => Ok(s),
                other => bail!("watch {i} not created: {other:?}"),
            }
        };
        let s = tokio::time::timeout(CREATE_TIMEOUT, open)
            .await
            .with_context(|| format!("opening watch {i}"))??;
        streams.push(s);
    }
    // The writer tells watchers how many puts to expect once it is done.
    let (done_tx, done_rx) = tokio::sync::watch::channel(None::<u64>);
    let mut readers = Vec::with_capacity(streams.len());
    for mut s in streams {
        let mut done = done_rx.clone();
        readers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut seen = 0u64;
            let mut deadline: Option<Instant> = None;
            // Bounded: ends when every put was seen, or `DRAIN_GRACE` after the writer stops.
            loop {
                if let Some(n) = *done.borrow() {
                    if seen >= n {
                        break;
                    }
                    deadline.get_or_insert_with(|| Instant::now() + DRAIN_GRACE);
                }
                let wait = deadline
                    .map(|d| d.saturating_duration_since(Instant::now()))
                    .unwrap_or(DRAIN_GRACE);
                tokio::select! {
                    m = tokio::time::timeout(wait, s.message()) => match m {
                        Ok(Ok(Some(r))) => {
                            let now = origin.elapsed();
                            for e in r.events() {
                                let Some(kv) = e.kv() else { continue };
                                let Ok(sent) = std::str::from_utf8(kv.value()).unwrap_or("").parse::<u64>() else { continue };
                                lat.push(now.saturating_sub(Duration::from_nanos(sent)));
                                seen += 1;
                            }
                        }
                        Ok(_) => break,
                        Err(_) if deadline.is_some() => break,
                        Err(_) => {}
                    },
                    _ = done.changed(), if deadline.is_none() => {}
                }
            }
            lat
        }));
    }
    let mut writer = conns[0].clone();
    let step = Duration::from_secs(1) / args.put_rate.max(1) as u32;
    let start = Instant::now();
    let mut puts = 0u64;
    let mut errors = 0u64;
    // Bounded by the window: one put per step.
    while start.elapsed() < args.window {
        tokio::time::sleep_until((start + step * puts as u32).into()).await;
        let sent = origin.elapsed().as_nanos() as u64;
        match writer.put(format!("{PREFIX}{}", puts % 100), sent.to_string(), None).await {
            Ok(_) => puts += 1,
            Err(_) => errors += 1,
        }
        if errors > 100 {
            bail!("writer failed 100 times");
        }
    }
    let _ = done_tx.send(Some(puts));
    let mut all = Vec::new();
    let n = readers.len();
    for r in readers {
        all.extend(r.await?);
    }
    all.sort_unstable();
    let expected = puts * n as u64;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "workload=Watch watchers={n} puts={puts} put_errors={errors} events={} missed={} \
         p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
        all.len(),
        expected.saturating_sub(all.len() as u64),
        ms(pct(&all, 0.50)),
        ms(pct(&all, 0.90)),
        ms(pct(&all, 0.99)),
        ms(all.last().copied().unwrap_or_default()),
    );
    Ok(())
}
