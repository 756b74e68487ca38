//! `watch`: prints events as they happen. The client's `WatchStream` resumes on another
//! endpoint after a failure from the next revision owed, so the output has no gap and no
//! duplicate across node failures.

use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use picket_client::proto::{Event, EventType};
use picket_client::WatchOptions;
use serde_json::json;

use super::signals::interrupted;
use super::Ctx;
use crate::args::parse_duration;
use crate::exit;
use crate::output::{self, kv_json, text, Format};

#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    pub key: String,
    /// Watch keys in [key, range_end).
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Watch every key starting with the key.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Watch every key >= the key.
    #[arg(long)]
    pub from_key: bool,
    /// Replay history from this revision (inclusive) before going live.
    #[arg(long, default_value_t = 0)]
    pub rev: i64,
    /// Print each event's previous key-value.
    #[arg(long)]
    pub prev_kv: bool,
    /// Print progress marks (the revision everything up to which has been delivered) when
    /// the server sends them while the watch is idle.
    #[arg(long)]
    pub progress_notify: bool,
    /// Also ask for a progress mark at this interval (implies --progress-notify).
    #[arg(long, value_parser = parse_duration)]
    pub progress_interval: Option<Duration>,
    /// Exit after printing this many events.
    #[arg(long)]
    pub max_events: Option<u64>,
}

pub async fn run(ctx: &Ctx, a: WatchArgs) -> Result<u8> {
    let client = ctx.client().await?;
    let progress = a.progress_notify || a.progress_interval.is_some();
    let mut o = WatchOptions::new().start_revision(a.rev).range(super::kv::key_range(
        a.prefix,
        a.from_key,
        &a.range_end,
    ));
    if a.prev_kv {
        o = o.prev_kv();
    }
    if progress {
        o = o.progress_notify();
    }
    let mut stream = client.watch(a.key.clone(), o).await?;
    // The watch exists on the server from here on: anything written after this line is seen.
    output::note(format!("watching {} (Ctrl-C to stop)", describe(&a)));
    let mut printed = 0u64;
    let stop = interrupted();
    tokio::pin!(stop);
    // A tick that never fires without --progress-interval.
    let period = a.progress_interval.unwrap_or(Duration::from_secs(3600 * 24 * 365));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            r = &mut stop => {
                r?;
                return Ok(exit::OK);
            }
            _ = tick.tick(), if a.progress_interval.is_some() => stream.request_progress().await,
            batch = stream.next() => {
                let Some(batch) = batch else {
                    return Err(exit::fail(exit::UNAVAILABLE, "watch ended"));
                };
                let batch = batch?;
                if batch.is_progress() {
                    if progress {
                        print_progress(ctx.format(), batch.revision);
                    }
                    continue;
                }
                for ev in &batch.events {
                    print_event(ctx.format(), ev);
                    printed += 1;
                    if a.max_events.is_some_and(|m| printed >= m) {
                        return Ok(exit::OK);
                    }
                }
            }
        }
    }
}

fn describe(a: &WatchArgs) -> String {
    let what = if a.prefix {
        format!("prefix {:?}", a.key)
    } else if a.from_key {
        format!("keys >= {:?}", a.key)
    } else if let Some(end) = &a.range_end {
        format!("range [{:?}, {end:?})", a.key)
    } else {
        format!("key {:?}", a.key)
    };
    if a.rev > 0 {
        format!("{what} from revision {}", a.rev)
    } else {
        what
    }
}

fn kind(ev: &Event) -> &'static str {
    if ev.r#type == EventType::Delete as i32 {
        "DELETE"
    } else {
        "PUT"
    }
}

pub fn print_event(f: Format, ev: &Event) {
    let kv = ev.kv.clone().unwrap_or_default();
    match f {
        Format::Json => output::json_line(&json!({
            "type": kind(ev),
            "kv": kv_json(&kv),
            "prev_kv": ev.prev_kv.as_ref().map(kv_json),
        })),
        Format::Simple => {
            output::line(kind(ev));
            if let Some(p) = &ev.prev_kv {
                output::kv_simple(p, false);
            }
            output::line(text(&kv.key));
            output::line(text(&kv.value));
        }
        Format::Table => {
            let prev = match &ev.prev_kv {
                Some(p) => format!(" (was {:?})", text(&p.value)),
                None => String::new(),
            };
            if ev.r#type == EventType::Delete as i32 {
                output::line(format!("rev {:<6} DELETE {}{prev}", kv.mod_revision, text(&kv.key)));
            } else {
                output::line(format!(
                    "rev {:<6} PUT    {} = {}{prev}",
                    kv.mod_revision,
                    text(&kv.key),
                    text(&kv.value)
                ));
            }
        }
    }
}

fn print_progress(f: Format, revision: i64) {
    match f {
        Format::Json => output::json_line(&json!({"progress": true, "revision": revision})),
        Format::Simple => output::line(format!("PROGRESS {revision}")),
        Format::Table => {
            output::line(format!("progress: every event up to revision {revision} delivered"))
        }
    }
}
