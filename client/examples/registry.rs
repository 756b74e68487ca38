//! A service registry: instances register themselves under a lease and stay listed while they
//! live; a watcher keeps an up-to-date view of the instances without polling.
//!
//! ```text
//! registry --endpoints E register --service api --addr 10.0.0.5:8080 [--seconds 20]
//! registry --endpoints E watch --service api [--seconds 20]
//! ```
//!
//! An instance that crashes stops its keep-alives; its lease expires within the TTL and its
//! entry disappears from every watcher's view in the same revision.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Result};
use futures::StreamExt;
use picket_client::proto::EventType;
use picket_client::{Client, GetOptions, PutOptions, Session, WatchOptions};

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let get =
        |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned());
    let endpoints = get("--endpoints").unwrap_or_else(|| "127.0.0.1:2379".into());
    let service = get("--service").unwrap_or_else(|| "api".into());
    let seconds: u64 = get("--seconds").map(|s| s.parse()).transpose()?.unwrap_or(20);
    let prefix = format!("services/{service}/");
    let client = Client::connect(endpoints.split(',')).await?;

    if args.iter().any(|a| a == "register") {
        let addr = get("--addr").unwrap_or_else(|| "127.0.0.1:0".into());
        let session = Session::new(&client, 5).await?;
        let key = format!("{prefix}{:x}", session.lease_id());
        client
            .put_with(key.clone(), addr.clone(), PutOptions::new().lease(session.lease_id()))
            .await?;
        println!("registered {key} -> {addr}");
        tokio::select! {
            reason = session.lost() => bail!("registration lost: {reason:?}"),
            _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        }
        session.close().await?;
        println!("deregistered {key}");
    } else if args.iter().any(|a| a == "watch") {
        // Read the current set, then watch from the next revision: no change is missed between
        // the read and the watch.
        let snapshot = client.get_with(prefix.clone(), GetOptions::new().prefix()).await?;
        let rev = snapshot.header.map(|h| h.revision).unwrap_or(0);
        let mut view: BTreeMap<String, String> = snapshot
            .kvs
            .into_iter()
            .map(|kv| {
                (String::from_utf8_lossy(&kv.key).into(), String::from_utf8_lossy(&kv.value).into())
            })
            .collect();
        println!("at revision {rev}: {view:?}");
        let mut watch =
            client.watch(prefix, WatchOptions::new().prefix().start_revision(rev + 1)).await?;
        let deadline = tokio::time::sleep(Duration::from_secs(seconds));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                batch = watch.next() => {
                    let Some(batch) = batch else { break };
                    let batch = batch?;
                    for ev in batch.events {
                        let kv = ev.kv.unwrap_or_default();
                        let key = String::from_utf8_lossy(&kv.key).into_owned();
                        if ev.r#type == EventType::Delete as i32 {
                            view.remove(&key);
                        } else {
                            view.insert(key, String::from_utf8_lossy(&kv.value).into());
                        }
                    }
                    println!("at revision {}: {view:?}", batch.revision);
                }
            }
        }
    } else {
        bail!("usage: registry --endpoints E register|watch --service S [--addr A] [--seconds N]");
    }
    Ok(())
}
