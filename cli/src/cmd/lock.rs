//! `lock NAME [-- CMD ARGS...]`: a distributed lock with its fencing token.
//!
//! Without a command, the lock is held until Ctrl-C (or SIGTERM). With one, the command runs
//! with `PICKET_LOCK_KEY`, `PICKET_FENCING_TOKEN` (and `PICKET_LOCK_NAME`, `PICKET_LOCK_LEASE`)
//! in its environment and the lock is released when it exits; picket exits with its code. If
//! the lock is lost while the command runs (lease revoked or expired, key deleted, keep-alives
//! failing past the session's safety deadline), the command gets SIGTERM, then SIGKILL after
//! `--kill-grace`, and picket exits 7: whatever the command was doing under the lock must be
//! assumed to overlap with the next holder, which is what the fencing token is for.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use picket_client::{Client, GetOptions, LockGuard, LockOptions, Session, SortBy, WatchOptions};
use serde_json::json;

use super::signals::{exit_code, interrupted, terminate};
use super::Ctx;
use crate::args::parse_duration;
use crate::exit;
use crate::output::{self, lease_hex, text, Format};

#[derive(Debug, Clone, clap::Args)]
pub struct LockArgs {
    /// The lock's name; contenders' keys are NAME/<lease id>.
    pub name: String,
    /// A command to run while holding the lock (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    /// TTL in seconds of the lock's lease: how long the lock outlives this process if it dies
    /// without releasing it.
    #[arg(long, default_value_t = picket_client::DEFAULT_LOCK_TTL)]
    pub ttl: i64,
    /// Take the lock only if it is free now; exit 4 if it is held.
    #[arg(long = "try", conflicts_with = "timeout")]
    pub try_lock: bool,
    /// Give up waiting after this long (exit 4), e.g. 30s.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// After the lock is lost (or on Ctrl-C), how long the command gets between SIGTERM and
    /// SIGKILL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kill_grace: Duration,
}

pub async fn run(ctx: &Ctx, a: LockArgs) -> Result<u8> {
    let client = ctx.client().await?;
    // Our own session, so the lease (and our contender key) is known before waiting: the
    // waiting report must not mistake our key for another holder's.
    let session = Session::new(&client, a.ttl).await?;
    let result = hold(ctx, &client, &session, &a).await;
    // Revoking the lease ends anything still attached to it; it may already be gone when the
    // lock was lost, which is fine.
    if let Err(e) = session.close().await {
        output::note(format!(
            "releasing the lock's lease failed ({e}); it expires within {}s",
            a.ttl
        ));
    }
    result
}

async fn hold(ctx: &Ctx, client: &Client, session: &Session, a: &LockArgs) -> Result<u8> {
    let own_key = format!("{}/{:x}", a.name, session.lease_id());
    let opts = LockOptions::new().session(session.clone());
    let guard = if a.try_lock {
        match client.try_lock_with(a.name.clone(), opts).await? {
            Some(g) => g,
            None => {
                let holder = match holder(client, &a.name, &own_key).await {
                    Ok((Some(h), _)) => format!(": held by {} (fencing token {})", h.key, h.token),
                    _ => String::new(),
                };
                return Err(exit::fail(
                    exit::NOT_ACQUIRED,
                    format!("lock {} not acquired{holder}", a.name),
                ));
            }
        }
    } else {
        let opts = match a.timeout {
            Some(t) => opts.timeout(t),
            None => opts,
        };
        let reporter =
            tokio::spawn(report_waiting(client.clone(), a.name.clone(), own_key.clone()));
        let acquired = tokio::select! {
            g = client.lock_with(a.name.clone(), opts) => g,
            r = interrupted() => {
                r?;
                reporter.abort();
                return Err(exit::fail(exit::NOT_ACQUIRED, format!("interrupted while waiting for lock {}", a.name)));
            }
        };
        reporter.abort();
        acquired?
    };
    print_acquired(ctx.format(), a, &guard);
    if a.command.is_empty() {
        hold_until_interrupted(guard).await
    } else {
        run_command(guard, a).await
    }
}

fn print_acquired(f: Format, a: &LockArgs, g: &LockGuard) {
    let key = text(g.key());
    let lease = lease_hex(g.session().lease_id());
    match f {
        Format::Json => output::json_line(&json!({
            "name": a.name, "key": key, "token": g.token(), "lease": lease,
        })),
        Format::Simple => {
            output::line(&key);
            output::line(g.token().to_string());
        }
        Format::Table => output::line(format!(
            "acquired lock {}: key {key}, fencing token {}, lease {lease}",
            a.name,
            g.token()
        )),
    }
}

async fn hold_until_interrupted(guard: LockGuard) -> Result<u8> {
    output::note("holding the lock; Ctrl-C releases it");
    tokio::select! {
        r = interrupted() => {
            r?;
            guard.unlock().await.context("releasing the lock")?;
            output::note("released");
            Ok(exit::OK)
        }
        _ = guard.lost() => Err(exit::fail(exit::LOST, format!("lock lost: {}", text(guard.key())))),
    }
}

async fn run_command(guard: LockGuard, a: &LockArgs) -> Result<u8> {
    let mut child = tokio::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .env("PICKET_LOCK_NAME", &a.name)
        .env("PICKET_LOCK_KEY", text(guard.key()))
        .env("PICKET_FENCING_TOKEN", guard.token().to_string())
        .env("PICKET_LOCK_LEASE", lease_hex(guard.session().lease_id()))
        .spawn()
        .with_context(|| format!("starting {:?}", a.command[0]))?;
    let pid = child.id().unwrap_or(0);
    tokio::select! {
        status = child.wait() => {
            let status = status.context("waiting for the command")?;
            if let Err(e) = guard.unlock().await {
                output::note(format!("releasing the lock failed ({e}); its lease ends it"));
            }
            Ok(exit_code(status))
        }
        _ = guard.lost() => {
            output::note(format!(
                "lock lost while the command ran: sending SIGTERM to pid {pid} (SIGKILL in {:?})",
                a.kill_grace
            ));
            let status = terminate(&mut child, a.kill_grace).await?;
            Err(exit::fail(exit::LOST, format!(
                "lock {} lost while the command ran; the command was stopped ({status})",
                text(guard.key())
            )))
        }
        r = interrupted() => {
            r?;
            output::note(format!("interrupted: sending SIGTERM to pid {pid} (SIGKILL in {:?})", a.kill_grace));
            let status = terminate(&mut child, a.kill_grace).await?;
            if let Err(e) = guard.unlock().await {
                output::note(format!("releasing the lock failed ({e}); its lease ends it"));
            }
            Ok(exit_code(status))
        }
    }
}

/// The current holder of a lock: the oldest contender key under `name/`.
struct Holder {
    key: String,
    token: i64,
    /// Contenders older than us, the holder included (0 when we are not queued yet).
    ahead: usize,
}

/// The holder (if any) and the revision it was read at.
async fn holder(client: &Client, name: &str, own_key: &str) -> Result<(Option<Holder>, i64)> {
    let resp = client
        .get_with(
            format!("{name}/"),
            GetOptions::new().prefix().keys_only().sort(SortBy::CreateRevision, true),
        )
        .await?;
    let rev = output::revision(&resp.header);
    let Some(first) = resp.kvs.first() else { return Ok((None, rev)) };
    let ahead = resp.kvs.iter().take_while(|kv| kv.key != own_key.as_bytes()).count();
    let ahead = if ahead == resp.kvs.len() { 0 } else { ahead };
    Ok((Some(Holder { key: text(&first.key), token: first.create_revision, ahead }), rev))
}

/// Says on stderr who holds the lock whenever that changes, until aborted (when the lock is
/// acquired). Best effort: a failure here only loses the report, never the wait.
async fn report_waiting(client: Client, name: String, own_key: String) {
    let mut last: Option<String> = None;
    loop {
        let seen_at;
        match holder(&client, &name, &own_key).await {
            Ok((Some(h), rev)) if h.key != own_key => {
                seen_at = rev;
                // Report each new holder once; the queue length is a detail of that line.
                if last.as_deref() != Some(h.key.as_str()) {
                    let queue = match h.ahead {
                        0 | 1 => String::new(),
                        n => format!(", {} contenders ahead of us", n),
                    };
                    output::note(format!(
                        "waiting for lock {name}: held by {} (fencing token {}){queue}",
                        h.key, h.token
                    ));
                    last = Some(h.key.clone());
                }
            }
            Ok((_, rev)) => seen_at = rev,
            Err(_) => {
                // Advisory only: look again after a pause (the client bounded the attempt).
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        // Wait for the next change under the lock's prefix after what was read, then look
        // again. A failed watch is retried after a pause; the report is advisory and the client
        // bounds each try.
        let changed = async {
            let opts = WatchOptions::new().prefix().start_revision(seen_at + 1);
            let mut w = client.watch(format!("{name}/"), opts).await.ok()?;
            w.next().await
        };
        if changed.await.is_none() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
