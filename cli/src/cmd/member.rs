//! `member list|add|remove|update|promote`. Member ids are hexadecimal, as etcdctl prints them.

use anyhow::Result;
use clap::Subcommand;
use picket_client::proto::Member;
use serde_json::json;

use super::Ctx;
use crate::args::parse_hex_u64;
use crate::exit;
use crate::output::{self, header_json, hex, member_json, Format, Table};

#[derive(Debug, Subcommand)]
pub enum MemberCmd {
    /// List every member (learners included).
    List,
    /// Add a member; prints the picketd flags to start it with.
    Add {
        /// The new member's name (used in the printed --initial-cluster).
        name: String,
        /// The new member's peer URLs, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        peer_urls: Vec<String>,
        /// Add it as a learner (non-voting until promoted).
        #[arg(long)]
        learner: bool,
    },
    /// Remove a member.
    Remove {
        #[arg(value_parser = parse_hex_u64)]
        id: u64,
    },
    /// Change a member's peer URLs.
    Update {
        #[arg(value_parser = parse_hex_u64)]
        id: u64,
        #[arg(long, value_delimiter = ',', required = true)]
        peer_urls: Vec<String>,
    },
    /// Promote a learner that has caught up to a voting member.
    Promote {
        #[arg(value_parser = parse_hex_u64)]
        id: u64,
    },
}

pub async fn run(ctx: &Ctx, c: MemberCmd) -> Result<u8> {
    let client = ctx.client().await?;
    let f = ctx.format();
    match c {
        MemberCmd::List => print_members(f, &client.member_list().await?),
        MemberCmd::Add { name, peer_urls, learner } => {
            let r = client.member_add(peer_urls.clone(), learner).await?;
            let m = r.member.clone().unwrap_or_default();
            let initial: Vec<String> = r
                .members
                .iter()
                .flat_map(|x| {
                    let n = if x.id == m.id { name.clone() } else { x.name.clone() };
                    x.peer_ur_ls.iter().map(move |u| format!("{n}={u}"))
                })
                .collect();
            let initial = initial.join(",");
            match f {
                Format::Json => output::json_pretty(&json!({
                    "header": header_json(&r.header),
                    "member": member_json(&m),
                    "members": r.members.iter().map(member_json).collect::<Vec<_>>(),
                    "initial_cluster": initial,
                })),
                _ => {
                    let kind = if learner { "learner" } else { "member" };
                    output::line(format!("added {kind} {} ({name}) to the cluster", hex(m.id)));
                    output::line("start it with:");
                    output::line(format!(
                        "  picketd --name {name} --initial-advertise-peer-urls {} --listen-peer-urls {} \
                         --initial-cluster {initial} --initial-cluster-state existing",
                        peer_urls.join(","),
                        peer_urls.join(",")
                    ));
                }
            }
        }
        MemberCmd::Remove { id } => {
            let members = client.member_remove(id).await?;
            done(f, "removed", id, &members);
        }
        MemberCmd::Update { id, peer_urls } => {
            let members = client.member_update(id, peer_urls).await?;
            done(f, "updated", id, &members);
        }
        MemberCmd::Promote { id } => {
            let members = client.member_promote(id).await?;
            done(f, "promoted", id, &members);
        }
    }
    Ok(exit::OK)
}

fn done(f: Format, what: &str, id: u64, members: &[Member]) {
    match f {
        Format::Json => output::json_pretty(&json!({
            "id": hex(id),
            what: true,
            "members": members.iter().map(member_json).collect::<Vec<_>>(),
        })),
        _ => output::line(format!("member {} {what}", hex(id))),
    }
}

pub fn print_members(f: Format, members: &[Member]) {
    match f {
        Format::Json => output::json_pretty(&json!({
            "members": members.iter().map(member_json).collect::<Vec<_>>(),
        })),
        Format::Simple => {
            for m in members {
                output::line(format!(
                    "{}, {}, {}, {}, {}, {}",
                    hex(m.id),
                    if m.name.is_empty() { "unstarted" } else { "started" },
                    m.name,
                    m.peer_ur_ls.join(","),
                    m.client_ur_ls.join(","),
                    m.is_learner
                ));
            }
        }
        Format::Table => {
            let mut t =
                Table::new(["ID", "STATUS", "NAME", "PEER ADDRS", "CLIENT ADDRS", "IS LEARNER"]);
            for m in members {
                t.row([
                    hex(m.id),
                    (if m.name.is_empty() { "unstarted" } else { "started" }).to_string(),
                    m.name.clone(),
                    m.peer_ur_ls.join(","),
                    m.client_ur_ls.join(","),
                    m.is_learner.to_string(),
                ]);
            }
            t.print();
        }
    }
}
