//! Measures leader failover as a client sees it: the time from SIGKILL of the leader of a
//! three-member cluster, under a steady write load, to the first acknowledged write *issued
//! after the kill*. Prints one line per run and min/median/max; a measurement, not a test, so it
//! asserts nothing about the figures (docs/failover.md records them).
//!
//! ```text
//! cargo build --workspace
//! target/debug/failover_timing [--runs 5] [--heartbeat-ms 100 --election-ms 1000]
//! ```
//!
//! Load: a new put every [`ISSUE_INTERVAL`], each to a fresh key, alternating between the two
//! members that survive the kill (followers forward to the leader). Puts are issued open-loop
//! with a cap on those in flight, so a put blocked on the dead leader does not delay the next
//! one, and the first put issued after the kill that succeeds shows when the cluster takes
//! writes again, to within one issue interval. Only survivors are written to, so the figure is
//! the server's failover time, not a client's endpoint failover.
//!
//! The killed member is restarted (and must serve again) before the next run, so each run
//! starts from a healthy three-member cluster.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use picket_tests::{Cluster, ClusterOptions};
use tokio::sync::{Mutex, Semaphore};

/// Time between issued puts: the resolution of the measurement.
const ISSUE_INTERVAL: Duration = Duration::from_millis(20);

/// Puts in flight at most. While no leader exists, puts pile up until the server's request
/// timeout (7 s by default) fails them; 7 s / 20 ms is 350, and the cap keeps a debug build on
/// a 2-core machine from drowning in them. When the cap is hit, issuing pauses, which would only
/// make a measurement look worse, and a run reports it.
const MAX_IN_FLIGHT: usize = 256;

/// Give up on a run if no write succeeds this long after the kill. A healthy cluster elects
/// within a few election timeouts; a minute means something is broken.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Writes acknowledged before the kill, so the load is really flowing when the leader dies.
const WARMUP_ACKS: u64 = 20;

struct Args {
    runs: usize,
    heartbeat_ms: Option<u64>,
    election_ms: Option<u64>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args { runs: 5, heartbeat_ms: None, election_ms: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> Result<u64> {
            it.next().with_context(|| format!("{flag} needs a value"))?.parse().context("number")
        };
        match flag.as_str() {
            "--runs" => args.runs = usize::try_from(value()?)?,
            "--heartbeat-ms" => args.heartbeat_ms = Some(value()?),
            "--election-ms" => args.election_ms = Some(value()?),
            "-h" | "--help" => {
                println!("usage: failover_timing [--runs N] [--heartbeat-ms MS --election-ms MS]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    Ok(args)
}

/// One run's outcome.
struct Run {
    /// Kill to the first acknowledgement of a put issued after the kill.
    failover: Duration,
    /// Puts issued after the kill before the first success (all of them failed or were slower).
    issued_before_success: u64,
    /// Whether issuing ever paused on the in-flight cap.
    capped: bool,
}

async fn one_run(cluster: &mut Cluster, run: usize) -> Result<Run> {
    let leader = cluster.leader().await?;
    let survivors: Vec<usize> = (0..cluster.len()).filter(|&i| i != leader).collect();
    let mut clients = Vec::new();
    for &i in &survivors {
        clients.push(cluster.client(i).await?);
    }
    let acks = Arc::new(AtomicU64::new(0));
    // Set once: the instant of the kill, and the first post-kill success after it.
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let first_ok: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let stop = Arc::new(AtomicBool::new(false));
    let issued_after_kill = Arc::new(AtomicU64::new(0));
    let sem = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut capped = false;

    let deadline = Instant::now() + RUN_TIMEOUT * 2;
    let mut seq = 0u64;
    let mut ticker = tokio::time::interval(ISSUE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Bounded in time by `deadline` and in count by the number of ticks that fit in it.
    loop {
        ticker.tick().await;
        if Instant::now() >= deadline {
            bail!("run {run}: no write succeeded within {RUN_TIMEOUT:?} of the kill");
        }
        if first_ok.lock().await.is_some() {
            break;
        }
        if killed_at.lock().await.is_none() && acks.load(Ordering::SeqCst) >= WARMUP_ACKS {
            let victim = cluster.name(leader).to_string();
            *killed_at.lock().await = Some(Instant::now());
            cluster.kill(leader)?;
            eprintln!("run {run}: killed leader {victim}");
        }
        let permit = match sem.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                capped = true;
                continue;
            }
        };
        let post_kill = killed_at.lock().await.is_some();
        if post_kill {
            issued_after_kill.fetch_add(1, Ordering::SeqCst);
        }
        let mut c = clients[(seq % clients.len() as u64) as usize].clone();
        let (acks, first_ok, stop) = (acks.clone(), first_ok.clone(), stop.clone());
        let key = format!("failover/{run}/{seq:08}");
        seq += 1;
        tokio::spawn(async move {
            let _permit = permit;
            if stop.load(Ordering::SeqCst) {
                return;
            }
            if c.put(key, "x", None).await.is_ok() {
                acks.fetch_add(1, Ordering::SeqCst);
                if post_kill {
                    let mut f = first_ok.lock().await;
                    if f.is_none() {
                        *f = Some(Instant::now());
                    }
                }
            }
        });
    }
    stop.store(true, Ordering::SeqCst);
    let killed = killed_at.lock().await.context("never killed")?;
    let ok = first_ok.lock().await.context("no success")?;
    // The killed member comes back before the next run (and must serve again).
    cluster.restart(leader).await?;
    Ok(Run {
        failover: ok.duration_since(killed),
        issued_before_success: issued_after_kill.load(Ordering::SeqCst),
        capped,
    })
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let mut opts = ClusterOptions::default();
    if let (Some(h), Some(e)) = (args.heartbeat_ms, args.election_ms) {
        opts = opts.timing(h, e);
    } else if args.heartbeat_ms.is_some() || args.election_ms.is_some() {
        bail!("give both --heartbeat-ms and --election-ms, or neither");
    }
    let mut cluster = Cluster::start(3, opts).await?;
    let mut results = Vec::new();
    for run in 1..=args.runs {
        let r = one_run(&mut cluster, run).await?;
        println!(
            "run {run}: leader kill -> first successful write: {}{}",
            ms(r.failover),
            if r.capped { " (issuing paused on the in-flight cap)" } else { "" }
        );
        eprintln!("run {run}: {} puts issued after the kill", r.issued_before_success);
        results.push(r.failover);
    }
    cluster.finish();
    results.sort();
    let median = if results.len() % 2 == 1 {
        results[results.len() / 2]
    } else {
        (results[results.len() / 2 - 1] + results[results.len() / 2]) / 2
    };
    println!(
        "runs {}: min {}, median {}, max {}",
        results.len(),
        ms(results[0]),
        ms(median),
        ms(results[results.len() - 1])
    );
    Ok(())
}
