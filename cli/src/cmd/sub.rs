//! `sub`: durable subscriptions (consumer groups). `create`, `delete`, `list`, `get` and
//! `commit` manage groups; `consume` prints a group's events from right after its committed
//! position and commits as it goes, so running it again resumes where it stopped. A group
//! whose history was compacted away fails with `lost history: committed X, compacted through
//! Y`; `commit --skip-lost` acknowledges the loss.

use anyhow::Result;
use futures::StreamExt;
use picket_client::{GroupInfo, GroupOptions};
use serde_json::json;

use super::signals::interrupted;
use super::watch::print_event;
use super::Ctx;
use crate::exit;
use crate::output::{self, text, Format, Table};

#[derive(Debug, clap::Subcommand)]
pub enum SubCmd {
    /// Create a group over a key, a prefix or a range.
    Create(CreateArgs),
    /// Delete a group (releases its hold on compaction).
    Delete(NameArgs),
    /// List every group with its position and lag.
    List,
    /// Show one group.
    Get(NameArgs),
    /// Move a group's committed position forward (a lower revision is ignored).
    Commit(CommitArgs),
    /// Print a group's events from its committed position on, committing as it goes.
    Consume(ConsumeArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct CreateArgs {
    /// Group name: 1 to 128 characters from [A-Za-z0-9._-].
    pub name: String,
    /// The key (or the start of the range) the group follows.
    pub key: String,
    /// Follow keys in [key, range_end).
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Follow every key starting with the key.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Follow every key >= the key.
    #[arg(long)]
    pub from_key: bool,
    /// The first revision consumers see (default: changes from now on).
    #[arg(long, default_value_t = 0)]
    pub start_rev: i64,
    /// Stop holding compaction back once the group lags more than this many revisions
    /// (default: the server's --sub-max-lag-revisions).
    #[arg(long, default_value_t = 0)]
    pub max_lag: i64,
}

#[derive(Debug, Clone, clap::Args)]
pub struct NameArgs {
    pub name: String,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CommitArgs {
    pub name: String,
    /// The revision every event up to which has been handled.
    #[arg(required_unless_present = "skip_lost", conflicts_with = "skip_lost")]
    pub revision: Option<i64>,
    /// After "lost history": commit up to the compaction point so the group can resume.
    #[arg(long)]
    pub skip_lost: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ConsumeArgs {
    pub name: String,
    /// Commit after every N events (and at every progress mark and on exit); 1 = after each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub commit_every: u64,
    /// Exit after printing this many events (committing them first).
    #[arg(long)]
    pub max_events: Option<u64>,
    /// Print events without committing anything.
    #[arg(long)]
    pub no_commit: bool,
    /// Ask for a progress mark this often, so a group on a quiet range commits (and keeps
    /// its lag within bound) while other keys change.
    #[arg(long, default_value = "10s", value_parser = crate::args::parse_duration)]
    pub progress_interval: std::time::Duration,
}

pub async fn run(ctx: &Ctx, cmd: SubCmd) -> Result<u8> {
    match cmd {
        SubCmd::Create(a) => create(ctx, a).await,
        SubCmd::Delete(a) => {
            let client = ctx.client().await?;
            if !client.delete_group(&a.name).await? {
                return Err(exit::fail(exit::NOT_FOUND, format!("no group {:?}", a.name)));
            }
            output::line(format!("deleted group {}", a.name));
            Ok(exit::OK)
        }
        SubCmd::List => {
            let groups = ctx.client().await?.list_groups().await?;
            print_groups(ctx.format(), &groups);
            Ok(exit::OK)
        }
        SubCmd::Get(a) => {
            let Some(g) = ctx.client().await?.group(&a.name).await? else {
                return Err(exit::fail(exit::NOT_FOUND, format!("no group {:?}", a.name)));
            };
            print_groups(ctx.format(), std::slice::from_ref(&g));
            Ok(exit::OK)
        }
        SubCmd::Commit(a) => {
            let client = ctx.client().await?;
            let committed = match a.revision {
                Some(rev) if !a.skip_lost => client.commit_group(&a.name, rev).await?,
                _ => client.skip_lost_history(&a.name).await?,
            };
            match ctx.format() {
                Format::Json => output::json_line(&json!({"name": a.name, "committed": committed})),
                _ => {
                    output::line(format!("group {} committed through revision {committed}", a.name))
                }
            }
            Ok(exit::OK)
        }
        SubCmd::Consume(a) => consume(ctx, a).await,
    }
}

async fn create(ctx: &Ctx, a: CreateArgs) -> Result<u8> {
    let opts = GroupOptions::new()
        .range(super::kv::key_range(a.prefix, a.from_key, &a.range_end))
        .start_revision(a.start_rev)
        .max_lag_revisions(a.max_lag);
    let g = ctx.client().await?.create_group(&a.name, a.key.clone(), opts).await?;
    print_groups(ctx.format(), std::slice::from_ref(&g));
    Ok(exit::OK)
}

fn print_groups(f: Format, groups: &[GroupInfo]) {
    match f {
        Format::Json => {
            let all: Vec<_> = groups
                .iter()
                .map(|g| {
                    json!({
                        "name": g.name,
                        "key": text(&g.key),
                        "range_end": text(&g.range_end),
                        "committed": g.committed,
                        "lag": g.lag,
                        "max_lag_revisions": g.max_lag_revisions,
                        "compact_revision": g.compact_revision,
                        "lost_history": g.lost_history,
                        "holding": g.holding,
                        "revision": g.revision,
                    })
                })
                .collect();
            output::json_line(&json!({ "groups": all }));
        }
        Format::Simple => {
            for g in groups {
                output::line(format!(
                    "{} {} {} {} {}",
                    g.name, g.committed, g.lag, g.lost_history, g.holding
                ));
            }
        }
        Format::Table => {
            let mut t = Table::new([
                "NAME",
                "KEY",
                "RANGE END",
                "COMMITTED",
                "LAG",
                "MAX LAG",
                "LOST",
                "HOLDING",
            ]);
            for g in groups {
                t.row([
                    g.name.clone(),
                    text(&g.key),
                    text(&g.range_end),
                    g.committed.to_string(),
                    g.lag.to_string(),
                    g.max_lag_revisions.to_string(),
                    g.lost_history.to_string(),
                    g.holding.to_string(),
                ]);
            }
            t.print();
        }
    }
}

async fn consume(ctx: &Ctx, a: ConsumeArgs) -> Result<u8> {
    let client = ctx.client().await?;
    let mut sub = client.subscribe(&a.name).await?;
    output::note(format!(
        "consuming group {} after revision {} (Ctrl-C to stop)",
        a.name,
        sub.committed()
    ));
    let stop = interrupted();
    tokio::pin!(stop);
    let (mut printed, mut uncommitted) = (0u64, 0u64);
    let period = a.progress_interval.max(std::time::Duration::from_millis(100));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        let batch = tokio::select! {
            _ = tick.tick() => {
                sub.request_progress().await;
                continue;
            }
            r = &mut stop => {
                r?;
                if !a.no_commit {
                    sub.commit_position().await?;
                }
                return Ok(exit::OK);
            }
            b = sub.next() => b,
        };
        let Some(batch) = batch else {
            return Err(exit::fail(exit::UNAVAILABLE, "subscription ended"));
        };
        let batch = batch?;
        for (i, ev) in batch.events.iter().enumerate() {
            print_event(ctx.format(), ev);
            printed += 1;
            uncommitted += 1;
            if a.max_events.is_some_and(|m| printed >= m) {
                // Commit through this event's revision only if no unprinted event shares it
                // (a txn's events share one revision); else through the one before, so the
                // next consumer prints the whole revision again rather than lose part of it.
                let rev_of = |i: usize| {
                    batch.events.get(i).and_then(|e| e.kv.as_ref()).map(|kv| kv.mod_revision)
                };
                let rev = rev_of(i).unwrap_or(0);
                let whole = rev_of(i + 1) != Some(rev);
                if !a.no_commit {
                    sub.commit(if whole { rev } else { rev - 1 }).await?;
                }
                return Ok(exit::OK);
            }
        }
        // Every event of a revision is in the same batch, so the position is a whole
        // revision: committing it never splits one.
        if !a.no_commit && (batch.is_progress() || uncommitted >= a.commit_every) {
            sub.commit_position().await?;
            uncommitted = 0;
        }
    }
}
