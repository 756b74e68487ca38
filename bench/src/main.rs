//! `picket-bench`: drives any etcd-API endpoint list with N clients for a fixed time and prints
//! ops/s and latency percentiles. The first workloads of issue 9 (put, get linearizable and
//! serializable); it talks only the etcd API, so the same run can target etcd for comparison.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use etcd_client::{Client, GetOptions};
use rand::Rng;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Workload {
    /// Put 256-byte values to random keys out of 10,000.
    Put,
    /// Linearizable get of random keys out of 10,000.
    Get,
    /// Serializable get of random keys out of 10,000.
    GetSerializable,
}

#[derive(Debug, Parser)]
#[command(
    name = "picket-bench",
    about = "Load an etcd-API cluster and report throughput and latency"
)]
struct Args {
    /// Comma-separated endpoints, e.g. http://127.0.0.1:2379,http://127.0.0.1:22379.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    endpoints: String,
    #[arg(long, value_enum, default_value = "put")]
    workload: Workload,
    /// Concurrent clients (each a task issuing one request at a time).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Connections the clients share (round-robin).
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Keys in the keyspace.
    #[arg(long, default_value_t = 10_000)]
    keys: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 256)]
    value_size: usize,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let endpoints: Vec<String> = args.endpoints.split(',').map(str::to_string).collect();
    let mut conns = Vec::new();
    for i in 0..args.conns.max(1) {
        // Spread connections over the endpoints, one endpoint per connection, so load reaches
        // every member (followers forward writes and read through ReadIndex).
        let ep = endpoints[i % endpoints.len()].clone();
        conns.push(
            Client::connect([ep.clone()], None).await.with_context(|| format!("connect {ep}"))?,
        );
    }
    let value = vec![b'x'; args.value_size];
    if matches!(args.workload, Workload::Get | Workload::GetSerializable) {
        // Preload so gets find values.
        let mut c = conns[0].clone();
        for k in 0..args.keys {
            c.put(format!("bench/{k:08}"), value.clone(), None).await?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let mut c = conns[i % conns.len()].clone();
        let value = value.clone();
        let workload = args.workload;
        let keys = args.keys;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            // Bounded by the deadline: each iteration issues one request with the client's own
            // timeout, so the loop ends within one request of the deadline.
            while Instant::now() < deadline {
                let k = format!("bench/{:08}", rand::rng().random_range(0..keys));
                let t = Instant::now();
                let r = match workload {
                    Workload::Put => c.put(k, value.clone(), None).await.map(|_| ()),
                    Workload::Get => c.get(k, None).await.map(|_| ()),
                    Workload::GetSerializable => {
                        c.get(k, Some(GetOptions::new().with_serializable())).await.map(|_| ())
                    }
                };
                match r {
                    Ok(()) => lat.push(t.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let start = Instant::now();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await?;
        all.extend(lat);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "workload={:?} clients={} conns={} ops={} errors={} ops/s={:.0} p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
        args.workload,
        args.clients,
        args.conns,
        all.len(),
        errors,
        all.len() as f64 / elapsed,
        ms(pct(&all, 0.50)),
        ms(pct(&all, 0.90)),
        ms(pct(&all, 0.99)),
        ms(all.last().copied().unwrap_or_default()),
    );
    Ok(())
}
