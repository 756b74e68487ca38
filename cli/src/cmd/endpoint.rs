//! Per-endpoint maintenance: `endpoint status|health|hashkv`, `defrag`, and the cluster-wide
//! `move-leader` and `alarm list`.
//!
//! Per-endpoint commands act on every `--endpoints` entry, or with `--cluster` on every
//! member's client URLs as the member list reports them. An endpoint that fails is reported
//! in its row; the command then exits 5 (unavailable) after printing the others.

use std::time::Instant;

use anyhow::Result;
use clap::Subcommand;
use picket_client::{Client, GetOptions};
use serde_json::{json, Value};

use super::Ctx;
use crate::args::parse_hex_u64;
use crate::exit;
use crate::output::{self, header_json, hex, Format, Table};

#[derive(Debug, Clone, clap::Args)]
pub struct Targets {
    /// Act on every member's client URLs (from the member list) instead of --endpoints.
    #[arg(long)]
    pub cluster: bool,
}

#[derive(Debug, Subcommand)]
pub enum EndpointCmd {
    /// Version, store size, leader, Raft term and index of each endpoint.
    Status(Targets),
    /// Whether each endpoint serves a linearizable read, and how long it took.
    Health(Targets),
    /// Each endpoint's hash of the key-value store (equal on members at the same revision).
    Hashkv {
        #[command(flatten)]
        targets: Targets,
        /// Hash the store as of this revision (0: latest).
        #[arg(long, default_value_t = 0)]
        rev: i64,
    },
}

#[derive(Debug, Clone, clap::Args)]
pub struct DefragArgs {
    #[command(flatten)]
    pub targets: Targets,
}

#[derive(Debug, Clone, clap::Args)]
pub struct MoveLeaderArgs {
    /// The member (hex id, as `member list` prints it) to hand leadership to.
    #[arg(value_parser = parse_hex_u64)]
    pub target: u64,
}

#[derive(Debug, Subcommand)]
pub enum AlarmCmd {
    /// List active alarms.
    List,
}

async fn endpoints(client: &Client, t: &Targets) -> Result<Vec<String>> {
    if !t.cluster {
        return Ok(client.endpoints());
    }
    let mut eps: Vec<String> = Vec::new();
    for m in client.member_list().await? {
        if m.client_ur_ls.is_empty() {
            // A member publishes its client URLs once it runs; until then it cannot be asked.
            output::note(format!(
                "member {} ({}) has no client URL yet; skipped",
                hex(m.id),
                m.name
            ));
        }
        eps.extend(m.client_ur_ls);
    }
    eps.dedup();
    if eps.is_empty() {
        return Err(exit::fail(exit::ERROR, "the member list names no client URL"));
    }
    Ok(eps)
}

/// Prints the rows, then fails with "unavailable" if any endpoint failed.
fn finish(f: Format, table: Table, rows: Vec<Value>, failed: usize) -> Result<u8> {
    match f {
        Format::Json => output::json_pretty(&Value::Array(rows)),
        Format::Simple => {
            for r in table.rows() {
                output::line(r.join(", "));
            }
        }
        Format::Table => table.print(),
    }
    if failed > 0 {
        return Err(exit::fail(exit::UNAVAILABLE, format!("{failed} endpoint(s) failed")));
    }
    Ok(exit::OK)
}

pub async fn run(ctx: &Ctx, c: EndpointCmd) -> Result<u8> {
    let client = ctx.client().await?;
    let f = ctx.format();
    match c {
        EndpointCmd::Status(t) => {
            let mut table = Table::new([
                "ENDPOINT",
                "ID",
                "VERSION",
                "DB SIZE",
                "IS LEADER",
                "RAFT TERM",
                "RAFT INDEX",
                "RAFT APPLIED INDEX",
                "ERRORS",
            ]);
            let (mut rows, mut failed) = (Vec::new(), 0);
            for ep in endpoints(&client, &t).await? {
                match client.status(&ep).await {
                    Ok(s) => {
                        let id = s.header.as_ref().map(|h| h.member_id).unwrap_or(0);
                        let leader = s.leader != 0 && s.leader == id;
                        table.row([
                            ep.clone(),
                            hex(id),
                            s.version.clone(),
                            format!("{} B", s.db_size),
                            leader.to_string(),
                            s.raft_term.to_string(),
                            s.raft_index.to_string(),
                            s.raft_applied_index.to_string(),
                            s.errors.join("; "),
                        ]);
                        rows.push(json!({
                            "endpoint": ep,
                            "header": header_json(&s.header),
                            "id": hex(id),
                            "version": s.version,
                            "db_size": s.db_size,
                            "db_size_in_use": s.db_size_in_use,
                            "leader": hex(s.leader),
                            "is_leader": leader,
                            "raft_term": s.raft_term,
                            "raft_index": s.raft_index,
                            "raft_applied_index": s.raft_applied_index,
                            "errors": s.errors,
                        }));
                    }
                    Err(e) => {
                        failed += 1;
                        table.row([
                            ep.clone(),
                            String::new(),
                            String::new(),
                            String::new(),
                            String::new(),
                            String::new(),
                            String::new(),
                            String::new(),
                            e.to_string(),
                        ]);
                        rows.push(json!({"endpoint": ep, "error": e.to_string()}));
                    }
                }
            }
            finish(f, table, rows, failed)
        }
        EndpointCmd::Health(t) => {
            let mut table = Table::new(["ENDPOINT", "HEALTH", "TOOK", "ERROR"]);
            let (mut rows, mut failed) = (Vec::new(), 0);
            for ep in endpoints(&client, &t).await? {
                let start = Instant::now();
                // A client of its own, so the read is served by this endpoint and no other.
                let res = async {
                    let one = Client::connect_with([ep.as_str()], ctx.connect_options()).await?;
                    one.get_with("health", GetOptions::new()).await
                }
                .await;
                let took = start.elapsed();
                let (ok, err) = match res {
                    Ok(_) => (true, String::new()),
                    Err(e) => {
                        failed += 1;
                        (false, e.to_string())
                    }
                };
                table.row([
                    ep.clone(),
                    (if ok { "healthy" } else { "unhealthy" }).to_string(),
                    format!("{took:.1?}"),
                    err.clone(),
                ]);
                rows.push(json!({
                    "endpoint": ep, "health": ok, "took_ms": took.as_millis() as u64, "error": err,
                }));
            }
            finish(f, table, rows, failed)
        }
        EndpointCmd::Hashkv { targets, rev } => {
            let mut table =
                Table::new(["ENDPOINT", "HASH", "REVISION", "COMPACT REVISION", "ERROR"]);
            let (mut rows, mut failed) = (Vec::new(), 0);
            for ep in endpoints(&client, &targets).await? {
                match client.hash_kv(&ep, rev).await {
                    Ok(h) => {
                        let at = output::revision(&h.header);
                        table.row([
                            ep.clone(),
                            h.hash.to_string(),
                            at.to_string(),
                            h.compact_revision.to_string(),
                            String::new(),
                        ]);
                        rows.push(json!({
                            "endpoint": ep, "header": header_json(&h.header), "hash": h.hash,
                            "compact_revision": h.compact_revision,
                        }));
                    }
                    Err(e) => {
                        failed += 1;
                        table.row([
                            ep.clone(),
                            String::new(),
                            String::new(),
                            String::new(),
                            e.to_string(),
                        ]);
                        rows.push(json!({"endpoint": ep, "error": e.to_string()}));
                    }
                }
            }
            finish(f, table, rows, failed)
        }
    }
}

pub async fn defrag(ctx: &Ctx, a: DefragArgs) -> Result<u8> {
    let client = ctx.client().await?;
    let mut failed = 0;
    let mut rows = Vec::new();
    for ep in endpoints(&client, &a.targets).await? {
        output::note(format!("defragmenting {ep} ..."));
        match client.defragment(&ep).await {
            Ok(()) => {
                if ctx.format() != Format::Json {
                    output::line(format!("defragmented {ep}"));
                }
                rows.push(json!({"endpoint": ep, "ok": true}));
            }
            Err(e) => {
                failed += 1;
                output::note(format!("failed to defragment {ep}: {e}"));
                rows.push(json!({"endpoint": ep, "ok": false, "error": e.to_string()}));
            }
        }
    }
    if ctx.format() == Format::Json {
        output::json_pretty(&Value::Array(rows));
    }
    if failed > 0 {
        return Err(exit::fail(exit::UNAVAILABLE, format!("{failed} endpoint(s) failed")));
    }
    Ok(exit::OK)
}

pub async fn move_leader(ctx: &Ctx, a: MoveLeaderArgs) -> Result<u8> {
    let client = ctx.client().await?;
    let members = client.member_list().await?;
    if !members.iter().any(|m| m.id == a.target) {
        return Err(exit::fail(exit::NOT_FOUND, format!("no member with id {}", hex(a.target))));
    }
    client.move_leader(a.target).await?;
    match ctx.format() {
        Format::Json => output::json_pretty(&json!({"leader": hex(a.target)})),
        _ => output::line(format!("leadership transferred to {}", hex(a.target))),
    }
    Ok(exit::OK)
}

pub async fn alarm(ctx: &Ctx, c: AlarmCmd) -> Result<u8> {
    let client = ctx.client().await?;
    match c {
        AlarmCmd::List => {
            let alarms = client.alarm_list().await?;
            let name = |a: i32| match a {
                1 => "NOSPACE".to_string(),
                2 => "CORRUPT".to_string(),
                n => format!("ALARM({n})"),
            };
            match ctx.format() {
                Format::Json => output::json_pretty(&json!({
                    "alarms": alarms.iter().map(|a| json!({"member_id": hex(a.member_id), "alarm": name(a.alarm)})).collect::<Vec<_>>(),
                })),
                _ => {
                    for a in &alarms {
                        output::line(format!(
                            "memberID:{} alarm:{}",
                            hex(a.member_id),
                            name(a.alarm)
                        ));
                    }
                    if alarms.is_empty() && ctx.format() == Format::Table {
                        output::note("no alarms");
                    }
                }
            }
        }
    }
    Ok(exit::OK)
}
