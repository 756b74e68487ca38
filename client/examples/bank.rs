//! A bank-transfer worker pool: several processes move money between accounts under
//! per-account locks, with fenced writes, and the total never changes — even when a worker is
//! paused (SIGSTOP) past its lease while it holds locks.
//!
//! ```text
//! bank init   --endpoints E --accounts 8 --balance 100
//! bank worker --endpoints E --id 1 --transfers 50 [--think-ms 100] [--ttl 2] [--unfenced] [--verbose]
//! bank check  --endpoints E --accounts 8 --balance 100
//! ```
//!
//! A transfer locks both accounts (in name order, so two workers never wait on each other in a
//! cycle), reads both balances, "thinks" (the window in which a pause hurts), and writes both
//! balances in one transaction that compares each lock key's create revision with the token
//! the worker was granted. A worker that was paused past its lease wakes up holding stale
//! tokens: its transaction fails and it moves on, so no update is lost. With `--unfenced` the
//! transaction skips the token comparison — run that under a pause to watch the total drift,
//! which is what Redlock-style locks allow.
//!
//! Output: one line per worker at the end, `worker <id>: done <n> fenced <n> failed <n>`. With
//! `--verbose` a worker also prints `worker <id>: holding <a> <b>` to stderr each time it holds
//! both locks and has read both balances, just before it thinks: the moment to pause it
//! (client/tests/client_examples.rs does).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use picket_client::{Client, Compare, CompareOp, LockOptions, Txn, TxnOp};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn num(args: &[String], name: &str, default: u64) -> Result<u64> {
    match arg(args, name) {
        Some(v) => v.parse().with_context(|| format!("{name} {v}")),
        None => Ok(default),
    }
}

fn account(i: u64) -> String {
    format!("bank/accounts/{i:03}")
}

fn lock_name(i: u64) -> String {
    // Lock names live outside the data prefix: every key under "<name>/" is a contender.
    format!("bank-locks/{i:03}")
}

async fn balance(c: &Client, i: u64) -> Result<i64> {
    let kv = c.get(account(i)).await?.with_context(|| format!("account {i} missing"))?;
    Ok(String::from_utf8_lossy(&kv.value).parse()?)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let endpoints: Vec<String> = arg(&args, "--endpoints")
        .unwrap_or_else(|| "127.0.0.1:2379".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let client = Client::connect(endpoints).await?;
    let accounts = num(&args, "--accounts", 8)?;
    let initial = num(&args, "--balance", 100)? as i64;
    match args.get(1).map(String::as_str) {
        Some("init") => {
            for i in 0..accounts {
                client.put(account(i), initial.to_string()).await?;
            }
            println!("{accounts} accounts with {initial} each");
        }
        Some("check") => {
            let mut total = 0;
            for i in 0..accounts {
                total += balance(&client, i).await?;
            }
            let want = initial * accounts as i64;
            println!("total {total} (expected {want})");
            if total != want {
                bail!("money was created or destroyed: total {total}, expected {want}");
            }
        }
        Some("worker") => worker(&client, &args, accounts).await?,
        _ => bail!("usage: bank init|worker|check --endpoints E [options]"),
    }
    Ok(())
}

/// How one transfer ended.
enum Outcome {
    Done,
    /// The fenced transaction was refused: the locks had passed on (the worker was paused).
    Fenced,
}

async fn worker(c: &Client, args: &[String], accounts: u64) -> Result<()> {
    let id = num(args, "--id", 0)?;
    let transfers = num(args, "--transfers", 20)?;
    let think = Duration::from_millis(num(args, "--think-ms", 50)?);
    let ttl = num(args, "--ttl", 2)? as i64;
    let fenced = !args.iter().any(|a| a == "--unfenced");
    let verbose = args.iter().any(|a| a == "--verbose");
    let (mut done, mut refused, mut failed) = (0, 0, 0);
    // A small deterministic generator: the example needs variety, not randomness.
    let mut seed = id.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    };
    for _ in 0..transfers {
        let a = next() % accounts;
        let b = (a + 1 + next() % (accounts - 1)) % accounts;
        let amount = (next() % 10 + 1) as i64;
        let announce = verbose.then_some(id);
        match transfer(c, a, b, amount, think, ttl, fenced, announce).await {
            Ok(Outcome::Done) => done += 1,
            Ok(Outcome::Fenced) => refused += 1,
            // A session lost while waiting for a lock, a request that timed out while this
            // process was frozen: the transfer did not happen (or, for an unknown outcome,
            // happened atomically). Either way the total is intact; move on.
            Err(e) => {
                eprintln!("worker {id}: transfer {a}->{b} failed: {e}");
                failed += 1;
            }
        }
    }
    println!("worker {id}: done {done} fenced {refused} failed {failed}");
    Ok(())
}

/// Moves `amount` from `a` to `b` under both accounts' locks. `announce` (the worker id) prints
/// the moment the worker holds both locks and has read the balances.
#[allow(clippy::too_many_arguments)]
async fn transfer(
    c: &Client,
    a: u64,
    b: u64,
    amount: i64,
    think: Duration,
    ttl: i64,
    fenced: bool,
    announce: Option<u64>,
) -> Result<Outcome> {
    let (first, second) = (a.min(b), a.max(b));
    let g1 = c.lock_with(lock_name(first), LockOptions::new().ttl(ttl)).await?;
    let g2 = c.lock_with(lock_name(second), LockOptions::new().ttl(ttl)).await?;
    let (ba, bb) = (balance(c, a).await?, balance(c, b).await?);
    if let Some(id) = announce {
        eprintln!("worker {id}: holding {a} {b}");
    }
    tokio::time::sleep(think).await;
    let mut txn = Txn::new();
    if fenced {
        txn = txn.when([
            Compare::create_revision(g1.key().to_vec(), CompareOp::Equal, g1.token()),
            Compare::create_revision(g2.key().to_vec(), CompareOp::Equal, g2.token()),
        ]);
    }
    let txn = txn.and_then([
        TxnOp::put(account(a), (ba - amount).to_string()),
        TxnOp::put(account(b), (bb + amount).to_string()),
    ]);
    let succeeded = c.txn(txn).await?.succeeded;
    // Release errors are harmless here: the locks' sessions end with the guards anyway.
    let _ = g2.unlock().await;
    let _ = g1.unlock().await;
    Ok(if succeeded { Outcome::Done } else { Outcome::Fenced })
}
