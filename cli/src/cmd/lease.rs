//! `lease grant|revoke|keep-alive|ttl|list`. Lease ids are hexadecimal, as etcdctl prints and
//! takes them.

use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;
use picket_client::Error as ClientError;
use serde_json::json;

use super::signals::interrupted;
use super::Ctx;
use crate::args::parse_lease;
use crate::exit;
use crate::output::{self, header_json, lease_hex, text, Format, Table};

#[derive(Debug, Subcommand)]
pub enum LeaseCmd {
    /// Grant a lease of TTL seconds.
    Grant { ttl: i64 },
    /// Revoke a lease, deleting every key attached to it.
    Revoke {
        #[arg(value_parser = parse_lease)]
        id: i64,
    },
    /// Keep a lease alive until Ctrl-C (or renew it once with --once).
    KeepAlive {
        #[arg(value_parser = parse_lease)]
        id: i64,
        /// Renew once and exit.
        #[arg(long)]
        once: bool,
    },
    /// Show a lease's granted and remaining TTL.
    #[command(alias = "timetolive")]
    Ttl {
        #[arg(value_parser = parse_lease)]
        id: i64,
        /// Also list the keys attached to the lease.
        #[arg(long)]
        keys: bool,
    },
    /// List live leases.
    List,
}

pub async fn run(ctx: &Ctx, c: LeaseCmd) -> Result<u8> {
    let client = ctx.client().await?;
    let f = ctx.format();
    match c {
        LeaseCmd::Grant { ttl } => {
            let r = client.lease_grant(ttl, 0).await?;
            match f {
                Format::Json => output::json_pretty(&json!({
                    "header": header_json(&r.header), "id": lease_hex(r.id), "ttl": r.ttl,
                })),
                Format::Simple => output::line(lease_hex(r.id)),
                Format::Table => {
                    output::line(format!("lease {} granted with TTL({}s)", lease_hex(r.id), r.ttl))
                }
            }
        }
        LeaseCmd::Revoke { id } => {
            let r = client.lease_revoke(id).await?;
            match f {
                Format::Json => output::json_pretty(&json!({
                    "header": header_json(&r.header), "id": lease_hex(id), "revoked": true,
                })),
                _ => output::line(format!("lease {} revoked", lease_hex(id))),
            }
        }
        LeaseCmd::Ttl { id, keys } => {
            let r = client.lease_time_to_live(id, keys).await?;
            if r.ttl == -1 {
                return Err(ClientError::LeaseNotFound(id).into());
            }
            let names: Vec<String> = r.keys.iter().map(|k| text(k)).collect();
            match f {
                Format::Json => output::json_pretty(&json!({
                    "header": header_json(&r.header),
                    "id": lease_hex(id),
                    "ttl": r.ttl,
                    "granted_ttl": r.granted_ttl,
                    "keys": if keys { Some(names) } else { None },
                })),
                Format::Simple => output::line(r.ttl.to_string()),
                Format::Table => {
                    let mut s = format!(
                        "lease {} granted with TTL({}s), remaining({}s)",
                        lease_hex(id),
                        r.granted_ttl,
                        r.ttl
                    );
                    if keys {
                        s.push_str(&format!(", attached keys({names:?})"));
                    }
                    output::line(s);
                }
            }
        }
        LeaseCmd::List => {
            let mut ids = client.lease_list().await?;
            ids.sort_unstable();
            match f {
                Format::Json => output::json_pretty(&json!({
                    "leases": ids.iter().map(|i| lease_hex(*i)).collect::<Vec<_>>(),
                })),
                Format::Simple => ids.iter().for_each(|i| output::line(lease_hex(*i))),
                Format::Table => {
                    let mut t = Table::new(["LEASE"]);
                    ids.iter().for_each(|i| t.row([lease_hex(*i)]));
                    t.print();
                }
            }
        }
        LeaseCmd::KeepAlive { id, once } => {
            let print = |ttl: i64| match f {
                Format::Json => output::json_line(&json!({"id": lease_hex(id), "ttl": ttl})),
                Format::Simple => output::line(ttl.to_string()),
                Format::Table => {
                    output::line(format!("lease {} keepalived with TTL({ttl})", lease_hex(id)))
                }
            };
            let ttl = client.lease_keep_alive_once(id).await?;
            print(ttl);
            if once {
                return Ok(exit::OK);
            }
            let stop = interrupted();
            tokio::pin!(stop);
            let mut ttl = ttl;
            loop {
                // Renewing every third of the TTL leaves two more tries (each retried across
                // endpoints by the client) before the lease could expire.
                let period = Duration::from_secs((ttl.max(1) as u64).div_ceil(3));
                tokio::select! {
                    r = &mut stop => { r?; return Ok(exit::OK); }
                    _ = tokio::time::sleep(period) => {}
                }
                match client.lease_keep_alive_once(id).await {
                    Ok(t) => {
                        ttl = t;
                        print(t);
                    }
                    Err(ClientError::LeaseNotFound(_)) => {
                        return Err(exit::fail(
                            exit::NOT_FOUND,
                            format!("lease {} expired or was revoked", lease_hex(id)),
                        ))
                    }
                    // A failed renewal is retried at the next period: the client already tried
                    // every endpoint until the command timeout, and the lease may still have
                    // up to two thirds of its TTL left.
                    Err(e) => output::note(format!("keep-alive failed, retrying: {e}")),
                }
            }
        }
    }
    Ok(exit::OK)
}
