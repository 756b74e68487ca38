//! `put`, `get`, `del` and `compact`.

use std::io::Read;

use anyhow::{Context, Result};
use clap::ValueEnum;
use picket_client::proto::{DeleteRangeResponse, PutResponse, RangeResponse};
use picket_client::{DeleteOptions, GetOptions, KeyRange, PutOptions, SortBy};
use serde_json::json;

use super::Ctx;
use crate::args::parse_lease;
use crate::exit;
use crate::output::{
    self, header_json, key_json, kv_json, kv_simple, revision, text, Format, Table,
};

#[derive(Debug, Clone, clap::Args)]
pub struct PutArgs {
    pub key: String,
    /// The value; read from stdin when omitted.
    pub value: Option<String>,
    /// Attach the key to this lease (hex id, as `lease grant` prints it).
    #[arg(long, value_parser = parse_lease)]
    pub lease: Option<i64>,
    /// Print the previous key-value.
    #[arg(long)]
    pub prev_kv: bool,
    /// Keep the current value (change only the lease).
    #[arg(long)]
    pub ignore_value: bool,
    /// Keep the current lease (change only the value).
    #[arg(long)]
    pub ignore_lease: bool,
}

impl PutArgs {
    pub fn options(&self) -> PutOptions {
        let mut o = PutOptions::new();
        if let Some(l) = self.lease {
            o = o.lease(l);
        }
        if self.prev_kv {
            o = o.prev_kv();
        }
        if self.ignore_value {
            o = o.ignore_value();
        }
        if self.ignore_lease {
            o = o.ignore_lease();
        }
        o
    }
}

/// Read consistency (`--consistency`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    /// Linearizable: confirmed with a quorum; never stale.
    #[value(name = "l")]
    Linearizable,
    /// Serializable: served by the contacted member alone; faster, possibly stale.
    #[value(name = "s")]
    Serializable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Order {
    #[value(name = "ASCEND", alias = "ascend")]
    Ascend,
    #[value(name = "DESCEND", alias = "descend")]
    Descend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SortTarget {
    #[value(name = "KEY", alias = "key")]
    Key,
    #[value(name = "VERSION", alias = "version")]
    Version,
    #[value(name = "CREATE", alias = "create")]
    Create,
    #[value(name = "MODIFY", alias = "modify")]
    Modify,
    #[value(name = "VALUE", alias = "value")]
    Value,
}

#[derive(Debug, Clone, clap::Args)]
pub struct GetArgs {
    pub key: String,
    /// Read keys in [key, range_end).
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Read every key starting with the key.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Read every key >= the key.
    #[arg(long)]
    pub from_key: bool,
    /// Read the store as of this revision (0: latest).
    #[arg(long, default_value_t = 0)]
    pub rev: i64,
    /// At most this many keys (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
    /// Sort order (with --sort-by; default ASCEND).
    #[arg(long, value_enum)]
    pub order: Option<Order>,
    /// Sort target (with --order; default KEY).
    #[arg(long, value_enum)]
    pub sort_by: Option<SortTarget>,
    /// Print keys only.
    #[arg(long)]
    pub keys_only: bool,
    /// Print only the number of keys.
    #[arg(long)]
    pub count_only: bool,
    /// Print values only (simple format).
    #[arg(long)]
    pub print_value_only: bool,
    /// l: linearizable (default); s: serializable (local, possibly stale).
    #[arg(long, value_enum, default_value_t = Consistency::Linearizable)]
    pub consistency: Consistency,
}

/// The key range selected by the `[END]`, `--prefix` and `--from-key` arguments that get, del
/// and watch share (clap makes them mutually exclusive).
pub fn key_range(prefix: bool, from_key: bool, end: &Option<String>) -> KeyRange {
    match (prefix, from_key, end) {
        (true, _, _) => KeyRange::Prefix,
        (_, true, _) => KeyRange::FromKey,
        (_, _, Some(end)) => KeyRange::End(end.as_bytes().to_vec()),
        _ => KeyRange::Key,
    }
}

impl GetArgs {
    /// Whether this reads one exact key (so "nothing there" is "not found").
    fn single_key(&self) -> bool {
        self.range_end.is_none() && !self.prefix && !self.from_key
    }

    pub fn options(&self) -> GetOptions {
        let mut o = GetOptions::new().limit(self.limit).revision(self.rev).range(key_range(
            self.prefix,
            self.from_key,
            &self.range_end,
        ));
        if self.order.is_some() || self.sort_by.is_some() {
            let by = match self.sort_by.unwrap_or(SortTarget::Key) {
                SortTarget::Key => SortBy::Key,
                SortTarget::Version => SortBy::Version,
                SortTarget::Create => SortBy::CreateRevision,
                SortTarget::Modify => SortBy::ModRevision,
                SortTarget::Value => SortBy::Value,
            };
            o = o.sort(by, self.order.unwrap_or(Order::Ascend) == Order::Ascend);
        }
        if self.keys_only {
            o = o.keys_only();
        }
        if self.count_only {
            o = o.count_only();
        }
        if self.consistency == Consistency::Serializable {
            o = o.serializable();
        }
        o
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct DelArgs {
    pub key: String,
    /// Delete keys in [key, range_end).
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Delete every key starting with the key.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Delete every key >= the key.
    #[arg(long)]
    pub from_key: bool,
    /// Print the deleted key-values.
    #[arg(long)]
    pub prev_kv: bool,
}

impl DelArgs {
    pub fn options(&self) -> DeleteOptions {
        let mut o =
            DeleteOptions::new().range(key_range(self.prefix, self.from_key, &self.range_end));
        if self.prev_kv {
            o = o.prev_kv();
        }
        o
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct CompactArgs {
    /// Discard history before this revision.
    pub revision: i64,
    /// Wait until the space is reclaimed on every member.
    #[arg(long)]
    pub physical: bool,
}

pub async fn put(ctx: &Ctx, a: PutArgs) -> Result<u8> {
    let value = match &a.value {
        Some(v) => v.clone().into_bytes(),
        None if a.ignore_value => Vec::new(),
        None => read_stdin_value()?,
    };
    let client = ctx.client().await?;
    let resp = client.put_with(a.key.clone(), value, a.options()).await?;
    print_put(ctx.format(), &resp, a.prev_kv);
    Ok(exit::OK)
}

/// The value of `put` without one on the command line: stdin, minus one trailing newline (so
/// `echo hello | picket put k` stores `hello`).
fn read_stdin_value() -> Result<Vec<u8>> {
    let mut v = Vec::new();
    std::io::stdin().read_to_end(&mut v).context("reading the value from stdin")?;
    if v.ends_with(b"\n") {
        v.pop();
    }
    Ok(v)
}

pub fn print_put(f: Format, resp: &PutResponse, show_prev: bool) {
    match f {
        Format::Json => output::json_pretty(&json!({
            "header": header_json(&resp.header),
            "prev_kv": resp.prev_kv.as_ref().map(kv_json),
        })),
        Format::Table | Format::Simple => {
            output::line("OK");
            if let (true, Some(kv)) = (show_prev, &resp.prev_kv) {
                kv_simple(kv, false);
            }
        }
    }
}

pub async fn get(ctx: &Ctx, a: GetArgs) -> Result<u8> {
    let client = ctx.client().await?;
    let resp = client.get_with(a.key.clone(), a.options()).await?;
    print_range(ctx.format(), &resp, &a);
    if a.single_key() && !a.count_only && resp.kvs.is_empty() {
        return Err(exit::quiet(exit::NOT_FOUND));
    }
    Ok(exit::OK)
}

pub fn print_range(f: Format, resp: &RangeResponse, a: &GetArgs) {
    match f {
        Format::Json => {
            let kvs: Vec<_> = resp
                .kvs
                .iter()
                .map(|kv| if a.keys_only { key_json(&kv.key) } else { kv_json(kv) })
                .collect();
            output::json_pretty(&json!({
                "header": header_json(&resp.header),
                "kvs": kvs,
                "count": resp.count,
                "more": resp.more,
            }));
        }
        Format::Simple => {
            if a.count_only {
                output::line(resp.count.to_string());
            }
            for kv in &resp.kvs {
                if a.print_value_only {
                    output::line(text(&kv.value));
                } else {
                    kv_simple(kv, a.keys_only);
                }
            }
        }
        Format::Table => {
            if a.count_only {
                output::line(format!("{} keys at revision {}", resp.count, revision(&resp.header)));
                return;
            }
            if a.print_value_only {
                for kv in &resp.kvs {
                    output::line(text(&kv.value));
                }
                return;
            }
            if resp.kvs.is_empty() {
                return;
            }
            let mut t = if a.keys_only {
                Table::new(["KEY"])
            } else {
                Table::new(["KEY", "VALUE", "CREATE REV", "MOD REV", "VERSION", "LEASE"])
            };
            for kv in &resp.kvs {
                if a.keys_only {
                    t.row([text(&kv.key)]);
                } else {
                    t.row([
                        text(&kv.key),
                        text(&kv.value),
                        kv.create_revision.to_string(),
                        kv.mod_revision.to_string(),
                        kv.version.to_string(),
                        output::lease_hex(kv.lease),
                    ]);
                }
            }
            t.print();
            if resp.more {
                output::note(format!("({} keys in all; raise --limit to see more)", resp.count));
            }
        }
    }
}

pub async fn del(ctx: &Ctx, a: DelArgs) -> Result<u8> {
    let client = ctx.client().await?;
    let resp = client.delete_with(a.key.clone(), a.options()).await?;
    print_delete(ctx.format(), &resp);
    Ok(exit::OK)
}

pub fn print_delete(f: Format, resp: &DeleteRangeResponse) {
    match f {
        Format::Json => output::json_pretty(&json!({
            "header": header_json(&resp.header),
            "deleted": resp.deleted,
            "prev_kvs": resp.prev_kvs.iter().map(kv_json).collect::<Vec<_>>(),
        })),
        Format::Table | Format::Simple => {
            output::line(resp.deleted.to_string());
            for kv in &resp.prev_kvs {
                kv_simple(kv, false);
            }
        }
    }
}

pub async fn compact(ctx: &Ctx, a: CompactArgs) -> Result<u8> {
    if a.revision <= 0 {
        return Err(exit::fail(exit::USAGE, "the revision to compact at must be positive"));
    }
    let client = ctx.client().await?;
    let resp = client.compact(a.revision, a.physical).await?;
    match ctx.format() {
        Format::Json => output::json_pretty(&json!({
            "header": header_json(&resp.header),
            "compact_revision": a.revision,
        })),
        _ => output::line(format!("compacted revision {}", a.revision)),
    }
    Ok(exit::OK)
}
