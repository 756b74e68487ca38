//! The whole "API -> queue -> worker -> lock -> database -> log" pipeline on Picket alone, in
//! one program:
//!
//! - **producers** enqueue transfers between accounts on a work queue (with dedup ids, so a
//!   retried enqueue never doubles a transfer);
//! - **workers** claim jobs under their session's lease, lock both accounts (lower account
//!   first, so two workers never wait on each other in a cycle), read the balances, and write
//!   both balances plus a ledger entry in one fenced transaction: applied only if both lock
//!   tokens are still current and the job's ledger entry does not exist yet (so a job claimed
//!   again after a lost ack is not applied twice); then they ack the job;
//! - a **subscriber** consumes the ledger prefix through a durable subscription group,
//!   replaying each entry onto its own copy of the balances and committing as it goes; half
//!   way it drops its subscription and resumes from the committed position, as a restarted
//!   process would.
//!
//! At the end the program checks that money was conserved (the stored total equals the initial
//! total), that the replayed balances equal the stored ones, and that the subscriber saw every
//! ledger entry exactly once. It exits non-zero otherwise.
//!
//! ```text
//! picket local-cluster &     # or any Picket cluster
//! cargo run --example pipeline -- --endpoints 127.0.0.1:2379,127.0.0.1:22379,127.0.0.1:32379 \
//!     [--accounts 6] [--balance 100] [--transfers 40] [--producers 2] [--workers 3] \
//!     [--run NAME] [--timeout-secs 120]
//! ```
//!
//! Keys live under `pipeline/<run>/` (accounts, ledger), the queue is `pipeline-<run>`, locks
//! are `pipeline-locks/<run>/<account>` and the subscription group is `pipeline-<run>`, so runs
//! never collide; `--run` defaults to one derived from the process id and the store revision.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures::StreamExt;
use picket_client::proto::EventType;
use picket_client::{
    Client, Compare, CompareOp, Error, GetOptions, GroupOptions, LockOptions, Session, Txn, TxnOp,
};
use tokio::sync::watch;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: u64) -> Result<u64> {
    match arg(args, name) {
        Some(v) => v.parse().with_context(|| format!("{name} {v}: not a number")),
        None => Ok(default),
    }
}

/// Names of everything one run touches.
#[derive(Clone)]
struct Names {
    run: String,
}

impl Names {
    fn account(&self, i: u64) -> String {
        format!("pipeline/{}/accounts/{i:03}", self.run)
    }
    fn ledger_prefix(&self) -> String {
        format!("pipeline/{}/ledger/", self.run)
    }
    fn ledger(&self, job: u64) -> String {
        format!("{}{job:05}", self.ledger_prefix())
    }
    fn lock(&self, i: u64) -> String {
        // Outside the data prefix: every key under "<lock name>/" is a lock contender.
        format!("pipeline-locks/{}/{i:03}", self.run)
    }
    fn queue(&self) -> String {
        format!("pipeline-{}", self.run)
    }
    fn group(&self) -> String {
        format!("pipeline-{}", self.run)
    }
}

/// One transfer, as a job payload and as a ledger entry (`job,from,to,amount[,status]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Transfer {
    job: u64,
    from: u64,
    to: u64,
    amount: i64,
}

impl Transfer {
    fn encode(&self) -> String {
        format!("{},{},{},{}", self.job, self.from, self.to, self.amount)
    }
    fn decode(s: &[u8]) -> Result<(Self, Option<String>)> {
        let s = std::str::from_utf8(s)?;
        let f: Vec<&str> = s.split(',').collect();
        ensure!(f.len() >= 4, "malformed transfer {s:?}");
        let t = Transfer {
            job: f[0].parse()?,
            from: f[1].parse()?,
            to: f[2].parse()?,
            amount: f[3].parse()?,
        };
        Ok((t, f.get(4).map(|s| s.to_string())))
    }
}

/// A deterministic transfer plan: job `j` moves 1..=20 between two distinct accounts.
fn plan(job: u64, accounts: u64) -> Transfer {
    // An LCG step per job: varied enough to make workers contend, reproducible per run.
    let x = job.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let from = (x >> 33) % accounts;
    let to = (from + 1 + (x >> 17) % (accounts - 1)) % accounts;
    Transfer { job, from, to, amount: 1 + ((x >> 7) % 20) as i64 }
}

async fn balance(c: &Client, key: &str) -> Result<i64> {
    let kv = c.get(key).await?.with_context(|| format!("{key} missing"))?;
    Ok(std::str::from_utf8(&kv.value)?.parse()?)
}

#[derive(Default)]
struct Counts {
    applied: AtomicU64,
    rejected: AtomicU64,
    retried: AtomicU64,
    finished: AtomicU64,
}

/// What a worker did with one job.
enum Outcome {
    Applied,
    Rejected,
    /// The locks moved on before the write: give the job back.
    Fenced,
}

/// Applies one transfer under both account locks. Idempotent per job: the ledger entry is
/// written in the same transaction as the balances, only if absent.
async fn transfer(c: &Client, n: &Names, session: &Session, t: Transfer) -> Result<Outcome> {
    let (lo, hi) = (t.from.min(t.to), t.from.max(t.to));
    let opts = || LockOptions::new().session(session.clone());
    let g_lo = c.lock_with(n.lock(lo), opts()).await?;
    let g_hi = c.lock_with(n.lock(hi), opts()).await?;
    let ledger = n.ledger(t.job);
    let outcome = async {
        if c.get(ledger.as_str()).await?.is_some() {
            // Applied by an earlier claim whose ack was lost.
            return Ok(Outcome::Applied);
        }
        let (from_key, to_key) = (n.account(t.from), n.account(t.to));
        let (from_bal, to_bal) = (balance(c, &from_key).await?, balance(c, &to_key).await?);
        let (status, writes) = if from_bal < t.amount {
            ("rejected", vec![])
        } else {
            let nf = (from_bal - t.amount).to_string();
            let nt = (to_bal + t.amount).to_string();
            ("applied", vec![TxnOp::put(from_key, nf), TxnOp::put(to_key, nt)])
        };
        let mut ops = writes;
        ops.push(TxnOp::put(ledger.as_str(), format!("{},{status}", t.encode())));
        // The server checks the lower lock's token (FencedTxn); the txn itself compares the
        // higher lock's token and the ledger entry's absence, all in one apply step.
        let txn = Txn::new()
            .when([
                Compare::create_revision(g_hi.key().to_vec(), CompareOp::Equal, g_hi.token()),
                Compare::create_revision(ledger.as_str(), CompareOp::Equal, 0),
            ])
            .and_then(ops);
        match c.fenced_txn(&g_lo.fence(), txn).await {
            Ok(r) if r.succeeded && status == "applied" => Ok(Outcome::Applied),
            Ok(r) if r.succeeded => Ok(Outcome::Rejected),
            Ok(_) if c.get(ledger.as_str()).await?.is_some() => Ok(Outcome::Applied),
            Ok(_) | Err(Error::Fenced(_)) => Ok(Outcome::Fenced),
            Err(e) => Err(anyhow::Error::from(e)),
        }
    }
    .await;
    // Release both; a failed release ends with the session's lease anyway.
    let _ = g_hi.unlock().await;
    let _ = g_lo.unlock().await;
    outcome
}

async fn worker(c: Client, n: Names, total: u64, counts: Arc<Counts>) -> Result<()> {
    let session = Session::new(&c, 10).await?;
    let queue = c.queue(n.queue());
    while counts.finished.load(Ordering::SeqCst) < total {
        // Short waits, so the loop notices when every job is finished.
        let Some(job) = queue.claim(session.lease_id(), Some(Duration::from_millis(500))).await?
        else {
            continue;
        };
        let (t, _) = Transfer::decode(&job.payload)?;
        match transfer(&c, &n, &session, t).await? {
            Outcome::Fenced => {
                counts.retried.fetch_add(1, Ordering::SeqCst);
                job.nack(Some(Duration::from_millis(50)), "fenced out").await?;
                continue;
            }
            Outcome::Applied => counts.applied.fetch_add(1, Ordering::SeqCst),
            Outcome::Rejected => counts.rejected.fetch_add(1, Ordering::SeqCst),
        };
        match job.ack().await {
            // The claim ended meanwhile: another worker will find the ledger entry and ack.
            Err(Error::Fenced(_)) => {
                counts.retried.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => return Err(e.into()),
            Ok(()) => {
                counts.finished.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
    session.close().await?;
    Ok(())
}

/// What the subscriber replayed.
struct Replay {
    balances: BTreeMap<u64, i64>,
    entries: u64,
    resumed_at: i64,
}

/// Consumes the ledger through the group until it has seen `target` entries (sent once the
/// workers are done), dropping and re-opening its subscription after `resume_after` entries.
async fn subscriber(
    c: Client,
    n: Names,
    accounts: u64,
    initial: i64,
    resume_after: u64,
    mut target: watch::Receiver<Option<u64>>,
) -> Result<Replay> {
    let mut balances: BTreeMap<u64, i64> = (0..accounts).map(|i| (i, initial)).collect();
    let mut seen = HashSet::new();
    let mut resumed_at = 0;
    let mut sub = c.subscribe(&n.group()).await?;
    loop {
        if target.borrow().is_some_and(|t| seen.len() as u64 >= t) {
            sub.commit_position().await?;
            return Ok(Replay { balances, entries: seen.len() as u64, resumed_at });
        }
        let batch = tokio::select! {
            b = sub.next() => b.context("subscription ended")??,
            _ = target.changed() => continue,
        };
        for ev in &batch.events {
            let kv = ev.kv.as_ref().context("event without kv")?;
            ensure!(ev.r#type == EventType::Put as i32, "ledger entries are never deleted");
            let (t, status) = Transfer::decode(&kv.value)?;
            ensure!(seen.insert(t.job), "ledger entry for job {} delivered twice", t.job);
            if status.as_deref() == Some("applied") {
                *balances.entry(t.from).or_default() -= t.amount;
                *balances.entry(t.to).or_default() += t.amount;
            }
        }
        // Handled: commit, so a restarted subscriber resumes right after this batch.
        sub.commit_position().await?;
        if resumed_at == 0 && seen.len() as u64 >= resume_after {
            resumed_at = sub.committed();
            drop(sub);
            sub = c.subscribe(&n.group()).await?;
            ensure!(
                sub.committed() == resumed_at,
                "resumed at {} not {resumed_at}",
                sub.committed()
            );
        }
    }
}

async fn run(args: &[String]) -> Result<()> {
    let endpoints: Vec<String> = arg(args, "--endpoints")
        .unwrap_or_else(|| "127.0.0.1:2379".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let accounts = num(args, "--accounts", 6)?;
    ensure!(accounts >= 2, "--accounts must be at least 2");
    let initial = num(args, "--balance", 100)? as i64;
    let total = num(args, "--transfers", 40)?;
    let producers = num(args, "--producers", 2)?.max(1);
    let workers = num(args, "--workers", 3)?.max(1);
    let c = Client::connect(endpoints).await?;
    // The store revision only grows, so it names a fresh run without reading a clock.
    let now = c.get_with("pipeline/", GetOptions::new().prefix().count_only()).await?;
    let stamp = now.header.map(|h| h.revision).unwrap_or(0);
    let run = arg(args, "--run").unwrap_or_else(|| format!("{}-{stamp}", std::process::id()));
    let n = Names { run };

    for i in 0..accounts {
        c.put(n.account(i), initial.to_string()).await?;
    }
    // The group starts after the accounts exist: its consumers see only ledger entries.
    let ledger = n.ledger_prefix();
    c.create_group(&n.group(), ledger.as_str(), GroupOptions::new().prefix()).await?;
    println!("run {}: {accounts} accounts x {initial}, {total} transfers", n.run);

    let (target_tx, target_rx) = watch::channel(None);
    let sub = tokio::spawn(subscriber(
        c.clone(),
        n.clone(),
        accounts,
        initial,
        (total / 2).max(1),
        target_rx,
    ));
    let counts = Arc::new(Counts::default());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..workers {
        tasks.spawn(worker(c.clone(), n.clone(), total, counts.clone()));
    }
    for p in 0..producers {
        let (c, n) = (c.clone(), n.clone());
        tasks.spawn(async move {
            let queue = c.queue(n.queue());
            for job in (p..total).step_by(producers as usize) {
                let t = plan(job, accounts);
                // A job fenced out many times in a row is retried rather than dead-lettered.
                let opts = picket_client::EnqueueOptions::new()
                    .dedup_id(format!("job-{job}"))
                    .max_attempts(50);
                queue.enqueue_with(t.encode(), opts).await?;
            }
            Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }

    let entries =
        c.get_with(ledger.as_str(), GetOptions::new().prefix().count_only()).await?.count as u64;
    target_tx.send(Some(entries)).ok();
    let replay = sub.await??;

    let mut stored = BTreeMap::new();
    for i in 0..accounts {
        stored.insert(i, balance(&c, &n.account(i)).await?);
    }
    let sum: i64 = stored.values().sum();
    let want = initial * accounts as i64;
    let (applied, rejected, retried) = (
        counts.applied.load(Ordering::SeqCst),
        counts.rejected.load(Ordering::SeqCst),
        counts.retried.load(Ordering::SeqCst),
    );
    println!(
        "jobs {total}: applied {applied}, rejected {rejected} (insufficient funds), retried {retried}"
    );
    println!(
        "ledger replayed: {} entries, subscriber resumed once after revision {}",
        replay.entries, replay.resumed_at
    );
    ensure!(entries == total, "{entries} ledger entries for {total} jobs");
    ensure!(replay.entries == entries, "replayed {} of {entries} entries", replay.entries);
    if replay.balances != stored {
        bail!("replayed balances {:?} differ from stored {:?}", replay.balances, stored);
    }
    if sum != want {
        bail!("money was created or destroyed: total {sum}, expected {want}");
    }
    println!("total {sum} conserved; replayed balances match the accounts");
    c.delete_group(&n.group()).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let limit = Duration::from_secs(num(&args, "--timeout-secs", 120)?);
    // Bounded as a whole: a pipeline that cannot finish (no quorum) fails instead of hanging.
    tokio::time::timeout(limit, run(&args))
        .await
        .with_context(|| format!("pipeline did not finish within {limit:?}"))?
}
