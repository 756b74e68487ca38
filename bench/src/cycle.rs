//! The measured loop shared by the queue workloads ([`crate::queue`] against Picket,
//! [`crate::amqp`] against RabbitMQ), and the one result line every load workload prints, so
//! the scripts parse a queue run exactly as they parse a put.
//!
//! A workload supplies one [`Worker`] per client, set up before the clock starts; [`drive`]
//! runs every worker's cycles until the deadline and measures the window.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::cpu::{CpuMeter, HostCpu};
use crate::pct;

/// Bound on one cycle, as on one operation of the etcd workloads: a stuck cycle counts as an
/// error and cannot hold the run past its deadline by more than this.
pub const CYCLE_TIMEOUT: Duration = Duration::from_secs(10);

/// One client of a cycle workload: its connection, channel or lease, ready before the window.
pub trait Worker: Send + 'static {
    /// One full cycle; an error counts as a failed cycle and the worker goes on.
    fn cycle(&mut self) -> impl Future<Output = Result<()>> + Send;
    /// Releases what the worker holds (its lease, its channel) once its last cycle is done.
    fn finish(self) -> impl Future<Output = ()> + Send;
}

/// What a window of cycles (or operations) measured.
pub struct Measured {
    /// Latencies of the successful cycles, sorted.
    pub latencies: Vec<Duration>,
    pub errors: u64,
    pub elapsed: Duration,
    /// The servers' CPU seconds over the window (`--cpu-pids`).
    pub server_cpu: Option<f64>,
    /// The machine's busy share over the window, in percent.
    pub host_busy: Option<f64>,
}

impl Measured {
    /// The result line: `workload=... ops/s=... p50=...` plus the CPU figures when measured.
    pub fn print(&self, workload: impl std::fmt::Debug, clients: usize, conns: usize) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let all = &self.latencies;
        print!(
            "workload={workload:?} clients={clients} conns={conns} ops={} errors={} ops/s={:.0} p50={:.2}ms p90={:.2}ms p99={:.2}ms max={:.2}ms",
            all.len(),
            self.errors,
            all.len() as f64 / self.elapsed.as_secs_f64(),
            ms(pct(all, 0.50)),
            ms(pct(all, 0.90)),
            ms(pct(all, 0.99)),
            ms(all.last().copied().unwrap_or_default()),
        );
        // Appended to the same line, so the script's parser sees every figure of one run
        // together.
        if let Some(c) = self.server_cpu {
            print!(" server_cpu_us_per_op={:.0}", c * 1e6 / all.len().max(1) as f64);
        }
        if let Some(b) = self.host_busy {
            print!(" host_busy_pct={b:.0}");
        }
        println!();
    }
}

/// Runs every worker's cycles, one at a time per worker, until `window` has passed, then lets
/// each worker finish. The servers' CPU and the machine's busy share are sampled after setup and
/// after every worker has finished, so they include the release (one lease revoke or channel
/// close per worker), which is negligible beside a window's thousands of cycles.
pub async fn drive<W: Worker>(
    workers: Vec<W>,
    window: Duration,
    cpu: &CpuMeter,
) -> Result<Measured> {
    let cpu_before = cpu.sample();
    let host_before = HostCpu::sample();
    let start = Instant::now();
    let deadline = start + window;
    let mut tasks = Vec::new();
    for mut w in workers {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0u64;
            // Bounded by the deadline: each cycle is bounded by CYCLE_TIMEOUT.
            while Instant::now() < deadline {
                let t = Instant::now();
                match tokio::time::timeout(CYCLE_TIMEOUT, w.cycle()).await {
                    Ok(Ok(())) => lat.push(t.elapsed()),
                    Ok(Err(_)) | Err(_) => errors += 1,
                }
            }
            // The worker's cycles are over; releasing its channel here (not after every worker
            // is done) hands any message pushed to it back to the workers still cycling.
            let end = Instant::now();
            tokio::time::timeout(CYCLE_TIMEOUT, w.finish()).await.ok();
            (lat, errors, end)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut last = start;
    for t in tasks {
        let (lat, e, end) = t.await?;
        latencies.extend(lat);
        errors += e;
        last = last.max(end);
    }
    latencies.sort_unstable();
    Ok(Measured {
        latencies,
        errors,
        elapsed: last - start,
        server_cpu: cpu.since(cpu_before),
        host_busy: HostCpu::busy_percent_since(host_before),
    })
}
