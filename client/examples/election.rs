//! Leader election: run several copies; one leads, the others wait and take over when it stops.
//!
//! ```text
//! election --endpoints E --name me-1 [--rounds 5]
//! ```
//!
//! Each candidate campaigns under a session; the leader proclaims a heartbeat value a few
//! times, then resigns (or just exits, and its lease hands over within the TTL). Every copy
//! prints the leaders it observes.

use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use picket_client::{Client, Session};

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let get =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned());
    let endpoints = get("--endpoints").unwrap_or_else(|| "127.0.0.1:2379".into());
    let me = get("--name").unwrap_or_else(|| format!("candidate-{}", std::process::id()));
    let rounds: u32 = get("--rounds").map(|r| r.parse()).transpose()?.unwrap_or(5);

    let client = Client::connect(endpoints.split(',')).await?;
    let observer = client.clone();
    tokio::spawn(async move {
        let mut leaders = Box::pin(observer.observe("example-election"));
        while let Some(kv) = leaders.next().await {
            println!("observed leader value {:?}", String::from_utf8_lossy(&kv.value));
        }
    });

    let session = Session::new(&client, 5).await?;
    println!("{me}: campaigning");
    let leadership = client.campaign("example-election", me.clone(), &session).await?;
    println!("{me}: elected (revision {})", leadership.revision);
    for round in 0..rounds {
        tokio::select! {
            reason = session.lost() => {
                println!("{me}: session lost ({reason:?}); no longer leader");
                return Ok(());
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        client.proclaim(&leadership, format!("{me} round {round}")).await?;
    }
    client.resign(&leadership).await?;
    println!("{me}: resigned");
    session.close().await?;
    Ok(())
}
