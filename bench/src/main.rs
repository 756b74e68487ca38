//! `picket-bench`: drives any etcd-API endpoint list with N clients for a fixed time and prints
//! ops/s and latency percentiles (issue 9's workloads). It talks only the etcd API, so the same
//! run can target etcd for comparison. Lease workloads live in [`lease`], the watch latency
//! workload in [`watch`]. The queue workloads are the exception: `queue-cycle` and
//! `queue-overlap` ([`queue`]) speak Picket's own `picket.v1.Queue`, and `amqp-cycle`
//! ([`amqp`]) the same cycle over AMQP 0-9-1 against RabbitMQ; all run in [`cycle`]'s loop.

mod amqp;
mod cpu;
mod cycle;
mod json;
mod lease;
mod queue;
mod watch;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use etcd_client::{Client, GetOptions, LockOptions};
use rand::Rng;

/// A gateway request's failure, as the error type the other workloads report.
fn gateway(e: anyhow::Error) -> etcd_client::Error {
    etcd_client::Error::InvalidArgs(format!("{e:#}"))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Workload {
    /// Put 256-byte values to random keys out of 10,000.
    Put,
    /// Linearizable get of random keys out of 10,000.
    Get,
    /// Serializable get of random keys out of 10,000.
    GetSerializable,
    /// Every client locks and unlocks the same lock name (contended hand-off), each with its own
    /// lease; reports lock+unlock cycles.
    LockContended,
    /// Each client locks and unlocks its own lock name (uncontended acquire + release).
    LockUncontended,
    /// Grant a lease, keep it alive once, revoke it; reports full cycles.
    LeaseCycle,
    /// Hold `--leases` leases alive with keep-alives every `--keepalive-interval` seconds over
    /// `--conns` streams for the whole run; reports keep-alives answered, their latency and
    /// (with `--cpu-pids`) the servers' CPU seconds over the window.
    LeaseHold,
    /// Put 256-byte values through the HTTP/JSON gateway (HTTP/1.1, one connection per client).
    JsonPut,
    /// Linearizable get through the HTTP/JSON gateway (HTTP/1.1, one connection per client).
    JsonGet,
    /// Put-to-event latency with `--watchers` watchers on one prefix and one writer putting
    /// `--put-rate` keys per second.
    Watch,
    /// Picket's work queue: each client, with a lease of its own, enqueues a `--value-size`
    /// payload on `--queue`, claims a job and acks it; reports full cycles.
    QueueCycle,
    /// The same cycle with the enqueue and the ack-and-claim in flight together, as a RabbitMQ
    /// worker's unanswered ack overlaps its next publish (see the `queue` module docs).
    QueueOverlap,
    /// The same cycle against RabbitMQ (`--amqp-uri`): a durable quorum queue, a persistent
    /// publish waiting for its publisher confirm, a delivery (prefetch 1) and its manual ack.
    AmqpCycle,
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
    /// lease-hold: number of leases.
    #[arg(long, default_value_t = 2000)]
    leases: usize,
    /// lease-hold: seconds between keep-alives of one lease.
    #[arg(long, default_value_t = 3)]
    keepalive_interval: u64,
    /// watch: number of watchers (one watch stream each).
    #[arg(long, default_value_t = 16)]
    watchers: usize,
    /// watch: puts per second.
    #[arg(long, default_value_t = 50)]
    put_rate: u64,
    /// queue-cycle, queue-overlap, amqp-cycle: the queue's name (amqp-cycle declares it, purges it first and
    /// deletes it at the end).
    #[arg(long, default_value = "bench")]
    queue: String,
    /// queue-cycle, queue-overlap, amqp-cycle: jobs (messages) put on the queue before the
    /// window, so it starts with a backlog rather than empty.
    #[arg(long, default_value_t = 0)]
    prefill: usize,
    /// amqp-cycle: comma-separated AMQP URIs, one per RabbitMQ node; connections are spread
    /// over them round-robin.
    #[arg(long, value_delimiter = ',', default_value = "amqp://127.0.0.1:5672/%2f")]
    amqp_uri: Vec<String>,
    /// Comma-separated server PIDs whose CPU time (from /proc) to report over the measured
    /// window: per keep-alive for lease-hold, per operation for the other load workloads.
    #[arg(long, value_delimiter = ',')]
    cpu_pids: Vec<u32>,
}

pub(crate) fn pct(sorted: &[Duration], p: f64) -> Duration {
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
    let window = Duration::from_secs(args.seconds);
    // The queue workloads set up their own clients (no etcd client, and for amqp-cycle no etcd
    // endpoint at all) before the clock starts.
    match args.workload {
        Workload::QueueCycle | Workload::QueueOverlap => {
            let (n, size) = (args.clients, args.value_size);
            let overlap = matches!(args.workload, Workload::QueueOverlap);
            let shape = queue::Shape { payload_size: size, window, overlap, prefill: args.prefill };
            let w = queue::workers(&endpoints, args.conns, n, &args.queue, shape).await?;
            let m = cycle::drive(w, window, &cpu::CpuMeter::new(args.cpu_pids.clone())).await?;
            m.print(args.workload, args.clients, args.conns);
            return Ok(());
        }
        Workload::AmqpCycle => {
            let (n, size) = (args.clients, args.value_size);
            let (setup, w) =
                amqp::workers(&args.amqp_uri, args.conns, n, &args.queue, size, args.prefill)
                    .await?;
            let m = cycle::drive(w, window, &cpu::CpuMeter::new(args.cpu_pids.clone())).await?;
            setup.teardown().await;
            m.print(args.workload, args.clients, args.conns);
            return Ok(());
        }
        _ => {}
    }
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
    if matches!(args.workload, Workload::Get | Workload::GetSerializable | Workload::JsonGet) {
        // Preload so gets find values.
        let mut c = conns[0].clone();
        for k in 0..args.keys {
            c.put(format!("bench/{k:08}"), value.clone(), None).await?;
        }
    }
    // Lock workloads: one lease per client, granted before the clock starts.
    let mut leases = Vec::new();
    if matches!(args.workload, Workload::LockContended | Workload::LockUncontended) {
        let mut c = conns[0].clone();
        for _ in 0..args.clients {
            leases.push(c.lease_grant(60, None).await?.id());
        }
    }
    match args.workload {
        Workload::LeaseHold => {
            let interval = Duration::from_secs(args.keepalive_interval.max(1));
            let cpu = cpu::CpuMeter::new(args.cpu_pids.clone());
            let report =
                lease::hold(&conns[0], &endpoints, args.leases, args.conns, interval, window, &cpu)
                    .await?;
            report.print(args.leases, args.keepalive_interval, args.conns);
            return Ok(());
        }
        Workload::Watch => {
            let w = watch::WatchArgs { watchers: args.watchers, put_rate: args.put_rate, window };
            return watch::latency(&conns, &w).await;
        }
        _ => {}
    }
    // The servers' CPU and the machine's busy share over the measured window: on a small
    // machine shared by servers and client, a ratio of throughputs is a ratio of CPU per
    // operation once the machine is busy, and these two figures show whether it was.
    let cpu = cpu::CpuMeter::new(args.cpu_pids.clone());
    let cpu_before = cpu.sample();
    let host_before = cpu::HostCpu::sample();
    let deadline = Instant::now() + window;
    let mut tasks = Vec::new();
    for i in 0..args.clients {
        let mut c = conns[i % conns.len()].clone();
        let json = json::JsonClient::new(&endpoints[i % endpoints.len()]);
        let value = value.clone();
        let workload = args.workload;
        let keys = args.keys;
        let lease = leases.get(i).copied().unwrap_or(0);
        let lock_name = match workload {
            Workload::LockUncontended => format!("bench-lock/{i}"),
            _ => "bench-lock/shared".to_string(),
        };
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            // Bounded by the deadline: each iteration issues one request with the client's own
            // timeout, so the loop ends within one request of the deadline.
            while Instant::now() < deadline {
                let k = format!("bench/{:08}", rand::rng().random_range(0..keys));
                let t = Instant::now();
                // Per-operation bound, so one stuck request cannot hold the run past its deadline
                // by more than this; a timed-out operation counts as an error.
                let op = async {
                    match workload {
                        Workload::Put => c.put(k, value.clone(), None).await.map(|_| ()),
                        Workload::Get => c.get(k, None).await.map(|_| ()),
                        Workload::GetSerializable => {
                            c.get(k, Some(GetOptions::new().with_serializable())).await.map(|_| ())
                        }
                        Workload::JsonPut => json.put(&k, &value).await.map_err(gateway),
                        Workload::JsonGet => json.get(&k).await.map_err(gateway),
                        Workload::LeaseCycle => lease::cycle(&mut c).await,
                        Workload::LeaseHold
                        | Workload::Watch
                        | Workload::QueueCycle
                        | Workload::QueueOverlap
                        | Workload::AmqpCycle => Ok(()),
                        Workload::LockContended | Workload::LockUncontended => {
                            match c
                                .lock(
                                    lock_name.as_str(),
                                    Some(LockOptions::new().with_lease(lease)),
                                )
                                .await
                            {
                                Ok(l) => c.unlock(l.key()).await.map(|_| ()),
                                Err(e) => Err(e),
                            }
                        }
                    }
                };
                let r = tokio::time::timeout(Duration::from_secs(10), op)
                    .await
                    .unwrap_or_else(|_| Err(etcd_client::Error::InvalidArgs("timed out".into())));
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
    all.sort_unstable();
    let measured = cycle::Measured {
        latencies: all,
        errors,
        elapsed: start.elapsed(),
        server_cpu: cpu.since(cpu_before),
        host_busy: cpu::HostCpu::busy_percent_since(host_before),
    };
    measured.print(args.workload, args.clients, args.conns);
    Ok(())
}
