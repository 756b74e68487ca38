//! `elect NAME [PROPOSAL]` campaigns and holds leadership until Ctrl-C; `elect --listen NAME`
//! prints each leader's proposal as leadership changes.

use anyhow::{Context, Result};
use futures::StreamExt;
use picket_client::proto::KeyValue;
use picket_client::Session;
use serde_json::json;

use super::signals::interrupted;
use super::Ctx;
use crate::exit;
use crate::output::{self, kv_json, lease_hex, text, Format};

#[derive(Debug, Clone, clap::Args)]
pub struct ElectArgs {
    /// The election's name.
    pub name: String,
    /// The value to publish as leader (required unless --listen).
    #[arg(required_unless_present = "listen")]
    pub proposal: Option<String>,
    /// Only observe: print each new leader's proposal.
    #[arg(short, long, conflicts_with = "proposal")]
    pub listen: bool,
    /// TTL in seconds of the candidate's lease.
    #[arg(long, default_value_t = 10)]
    pub ttl: i64,
}

pub async fn run(ctx: &Ctx, a: ElectArgs) -> Result<u8> {
    let client = ctx.client().await?;
    if a.listen {
        return listen(ctx, &client, &a.name).await;
    }
    let proposal = a.proposal.clone().unwrap_or_default();
    let session = Session::new(&client, a.ttl).await?;
    let result = async {
        if let Ok(Some(kv)) = client.leader(a.name.clone()).await {
            output::note(format!(
                "campaigning for {}: current leader {} proposes {:?}",
                a.name,
                text(&kv.key),
                text(&kv.value)
            ));
        } else {
            output::note(format!("campaigning for {}", a.name));
        }
        let leadership = tokio::select! {
            l = client.campaign(a.name.clone(), proposal.clone(), &session) => l?,
            r = interrupted() => { r?; return Ok(exit::OK); }
        };
        match ctx.format() {
            Format::Json => output::json_line(&json!({
                "name": a.name,
                "key": text(&leadership.key),
                "revision": leadership.revision,
                "lease": lease_hex(leadership.lease),
                "proposal": proposal,
            })),
            Format::Simple => {
                output::line(text(&leadership.key));
                output::line(&proposal);
            }
            Format::Table => output::line(format!(
                "elected leader of {}: key {}, revision {}, proposal {proposal:?}",
                a.name,
                text(&leadership.key),
                leadership.revision
            )),
        }
        output::note("holding leadership; Ctrl-C resigns");
        tokio::select! {
            r = interrupted() => {
                r?;
                client.resign(&leadership).await.context("resigning")?;
                output::note("resigned");
                Ok(exit::OK)
            }
            _ = session.lost() => Err(exit::fail(exit::LOST, format!("leadership of {} lost: the session's lease ended", a.name))),
        }
    }
    .await;
    // Revoking the lease also ends the candidacy if the campaign was interrupted.
    let _ = session.close().await;
    result
}

async fn listen(ctx: &Ctx, client: &picket_client::Client, name: &str) -> Result<u8> {
    let mut leaders = client.observe(name.to_string());
    output::note(format!("observing election {name} (Ctrl-C to stop)"));
    let stop = interrupted();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = &mut stop => { r?; return Ok(exit::OK); }
            kv = leaders.next() => {
                let Some(kv) = kv else { return Err(exit::fail(exit::UNAVAILABLE, "observation ended")) };
                print_leader(ctx.format(), &kv);
            }
        }
    }
}

fn print_leader(f: Format, kv: &KeyValue) {
    match f {
        Format::Json => output::json_line(&kv_json(kv)),
        Format::Simple => {
            output::line(text(&kv.key));
            output::line(text(&kv.value));
        }
        Format::Table => output::line(format!(
            "leader {} (revision {}): {}",
            text(&kv.key),
            kv.create_revision,
            text(&kv.value)
        )),
    }
}
