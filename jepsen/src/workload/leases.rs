//! Lease plumbing shared by the workloads whose clients hold a lease while they work (lock,
//! queue): a recorded grant and a background keep-alive.

use std::time::Duration;

use etcd_client::Client;
use serde_json::json;

use super::{Recorder, WorkloadError};
use crate::client;

/// Grants a lease (recorded as `lease_grant`); `Ok(None)` when the grant failed (recorded).
pub(super) async fn grant(
    rec: &mut Recorder,
    c: &mut Client,
    ttl: i64,
    timeout: Duration,
) -> Result<Option<i64>, WorkloadError> {
    rec.invoke("lease_grant", None, json!({ "ttl": ttl }))?;
    match client::bounded(timeout, c.lease_grant(ttl, None)).await {
        Ok(r) => {
            let h = client::header(r.header());
            rec.ok("lease_grant", None, json!({"ttl": r.ttl(), "id": r.id()}), h)?;
            Ok(Some(r.id()))
        }
        Err(e) => {
            rec.error("lease_grant", None, json!({ "ttl": ttl }), &e, false)?;
            Ok(None)
        }
    }
}

/// Keeps `lease` alive through `c` until aborted: a keep-alive every third of the TTL, each
/// round trip bounded by `rpc_timeout`. A keep-alive that does not come back in time is simply
/// tried again at the next tick; the lease's fate is decided by the server, and the checkers
/// never assume a keep-alive worked.
pub(super) fn keep_alive(
    mut c: Client,
    lease: i64,
    ttl: i64,
    rpc_timeout: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let every = Duration::from_millis((ttl.max(1) as u64) * 1000 / 3);
        let mut stream = None;
        // Bounded by the owner's abort; the count bound is a backstop (an hour of keep-alives).
        for _ in 0..(3600 * 1000 / every.as_millis().max(1) as u64) {
            if stream.is_none() {
                stream = tokio::time::timeout(rpc_timeout, c.lease_keep_alive(lease))
                    .await
                    .ok()
                    .and_then(Result::ok);
            } else if let Some((keeper, s)) = stream.as_mut() {
                let ok = tokio::time::timeout(rpc_timeout, async {
                    keeper.keep_alive().await?;
                    s.message().await
                })
                .await;
                match ok {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                    // The lease is gone: nothing left to keep alive.
                    Ok(Ok(Some(_))) => return,
                    _ => stream = None,
                }
            }
            tokio::time::sleep(every).await;
        }
    })
}
