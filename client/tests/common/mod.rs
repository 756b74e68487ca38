//! Test bodies shared by the Picket runs and the etcd 3.4 comparison runs: each takes a
//! connected client and checks behaviour that both servers must show.

#![allow(dead_code)]

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use futures::StreamExt;
use picket_client::proto::EventType;
use picket_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, Error, GetOptions, PutOptions,
    Session, SortBy, Txn, TxnOp, WatchOptions,
};

/// Bounded wait for one watch batch.
pub async fn next_batch(w: &mut picket_client::WatchStream) -> Result<picket_client::WatchBatch> {
    // Bounded so a missing event fails the test instead of hanging it.
    let item = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .context("no watch batch within 10 s")?
        .context("watch stream ended")?;
    Ok(item?)
}

pub async fn connect(endpoints: Vec<String>) -> Result<Client> {
    let opts = ConnectOptions::default().with_dial_timeout(Duration::from_secs(1));
    Ok(Client::connect_with(endpoints, opts).await?)
}

pub async fn kv_and_txn(c: &Client) -> Result<()> {
    let p1 = c.put("kv/a", "1").await?;
    let rev1 = p1.header.context("header")?.revision;
    c.put("kv/b", "2").await?;
    let prev = c.put_with("kv/a", "3", PutOptions::new().prev_kv()).await?;
    ensure!(prev.prev_kv.map(|kv| kv.value) == Some(b"1".to_vec()), "prev_kv");

    let a = c.get("kv/a").await?.context("kv/a")?;
    ensure!(a.value == b"3" && a.version == 2 && a.create_revision == rev1, "{a:?}");
    ensure!(c.get("kv/none").await?.is_none());

    let all = c.get_prefix("kv/").await?;
    ensure!(all.len() == 2 && all[0].key == b"kv/a" && all[1].key == b"kv/b");
    let newest = c
        .get_with("kv/", GetOptions::new().prefix().sort(SortBy::ModRevision, false).limit(1))
        .await?;
    ensure!(newest.more && newest.count == 2 && newest.kvs[0].key == b"kv/a", "{newest:?}");
    let old = c.get_with("kv/a", GetOptions::new().revision(rev1)).await?;
    ensure!(old.kvs[0].value == b"1", "read at an old revision");
    let counted = c.get_with("kv/", GetOptions::new().prefix().count_only()).await?;
    ensure!(counted.count == 2 && counted.kvs.is_empty());

    // Create-if-absent, then compare-and-swap on the value.
    let create = Txn::new()
        .when([Compare::version("kv/c", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("kv/c", "first")])
        .or_else([TxnOp::get("kv/c")]);
    ensure!(c.txn(create.clone()).await?.succeeded, "first create succeeds");
    ensure!(!c.txn(create).await?.succeeded, "second create fails");
    let cas = Txn::new()
        .when([Compare::value("kv/c", CompareOp::Equal, "first")])
        .and_then([TxnOp::put("kv/c", "second"), TxnOp::get("kv/c")]);
    let r = c.txn(cas).await?;
    ensure!(r.succeeded && r.responses.len() == 2);

    let d = c.delete_with("kv/", DeleteOptions::new().prefix().prev_kv()).await?;
    ensure!(d.deleted == 3 && d.prev_kvs.len() == 3, "{d:?}");
    ensure!(c.get_prefix("kv/").await?.is_empty());

    // Typed errors.
    let rev = c.put("kv/x", "x").await?.header.context("header")?.revision;
    match c.get_with("kv/x", GetOptions::new().revision(rev + 1000)).await {
        Err(Error::FutureRevision) => {}
        other => anyhow::bail!("future revision: {other:?}"),
    }
    c.compact(rev, false).await?;
    match c.get_with("kv/x", GetOptions::new().revision(rev - 1)).await {
        Err(Error::Compacted { .. }) => {}
        other => anyhow::bail!("compacted revision: {other:?}"),
    }
    match c.put("", "v").await {
        Err(Error::InvalidArgument(m)) => ensure!(m.contains("key is not provided"), "{m}"),
        other => anyhow::bail!("empty key: {other:?}"),
    }
    Ok(())
}

pub async fn leases(c: &Client) -> Result<()> {
    let g = c.lease_grant(5, 0).await?;
    c.put_with("lease/k", "v", PutOptions::new().lease(g.id)).await?;
    let ttl = c.lease_time_to_live(g.id, true).await?;
    ensure!(
        ttl.ttl > 0 && ttl.granted_ttl == 5 && ttl.keys == vec![b"lease/k".to_vec()],
        "{ttl:?}"
    );
    ensure!(c.lease_list().await?.contains(&g.id));
    ensure!(c.lease_keep_alive_once(g.id).await? > 0);
    c.lease_revoke(g.id).await?;
    ensure!(c.get("lease/k").await?.is_none(), "revoked lease's key is gone");
    ensure!(c.lease_time_to_live(g.id, false).await?.ttl == -1);
    match c.lease_revoke(g.id).await {
        Err(Error::LeaseNotFound(id)) => ensure!(id == g.id),
        other => anyhow::bail!("revoking twice: {other:?}"),
    }
    match c.lease_keep_alive_once(g.id).await {
        Err(Error::LeaseNotFound(_)) => {}
        other => anyhow::bail!("keep-alive of a dead lease: {other:?}"),
    }
    match c.put_with("lease/k", "v", PutOptions::new().lease(g.id)).await {
        Err(Error::LeaseNotFound(_)) => {}
        other => anyhow::bail!("put with a dead lease: {other:?}"),
    }
    Ok(())
}

/// A session whose lease is revoked behind its back reports itself lost.
pub async fn session_lost_on_revoke(c: &Client) -> Result<()> {
    let s = Session::new(c, 5).await?;
    ensure!(!s.is_lost());
    c.lease_revoke(s.lease_id()).await?;
    // The keeper notices at its next keep-alive (a third of the TTL); bounded wait.
    let reason = tokio::time::timeout(Duration::from_secs(10), s.lost()).await?;
    ensure!(reason == picket_client::LostReason::Expired, "{reason:?}");
    ensure!(matches!(s.check(), Err(Error::SessionLost(_))));
    Ok(())
}

pub async fn watch_basics(c: &Client) -> Result<()> {
    let start = c.put("w/a", "0").await?.header.context("header")?.revision;
    let mut w = c.watch("w/", WatchOptions::new().prefix().start_revision(start).prev_kv()).await?;
    c.put("w/a", "1").await?;
    c.delete("w/a").await?;
    let mut got = Vec::new();
    while got.len() < 3 {
        for ev in next_batch(&mut w).await?.events {
            let kv = ev.kv.clone().unwrap_or_default();
            got.push((ev.r#type, kv.mod_revision, ev.prev_kv.map(|p| p.value)));
        }
    }
    let put = EventType::Put as i32;
    let del = EventType::Delete as i32;
    ensure!(
        got == vec![
            (put, start, None),
            (put, start + 1, Some(b"0".to_vec())),
            (del, start + 2, Some(b"1".to_vec())),
        ],
        "{got:?}"
    );
    c.compact(start + 2, false).await?;
    match c.watch("w/", WatchOptions::new().prefix().start_revision(start)).await {
        Err(Error::Compacted { compact_revision }) => ensure!(compact_revision == start + 2),
        Ok(mut w) => match w.next().await {
            Some(Err(Error::Compacted { compact_revision })) => {
                ensure!(compact_revision == start + 2)
            }
            other => anyhow::bail!("compacted watch: {other:?}"),
        },
        Err(e) => anyhow::bail!("compacted watch: {e:?}"),
    }
    Ok(())
}

/// Locks: mutual exclusion with increasing tokens, try-lock, bounded wait, loss detection, and
/// a fenced write refused after the lock moved on.
pub async fn locks(c: &Client) -> Result<()> {
    let a = c.lock("lk").await?;
    ensure!(a.key().starts_with(b"lk/") && a.token() > 0);
    ensure!(c.try_lock("lk").await?.is_none(), "try_lock while held");
    match c.lock_with_timeout("lk", Duration::from_millis(500)).await {
        Err(Error::NotAcquired { .. }) => {}
        other => anyhow::bail!("bounded wait: {other:?}"),
    }
    let fence_a = a.fence();
    c.fenced_put(&fence_a, "lk-resource", "a").await?;

    // The holder loses its lease (as if paused past the TTL): it is told, and its token no
    // longer opens the resource once the next holder has the lock.
    c.lease_revoke(a.session().lease_id()).await?;
    tokio::time::timeout(Duration::from_secs(10), a.lost()).await.context("lost() fires")?;
    let b = c.lock("lk").await?;
    ensure!(b.token() > a.token(), "tokens increase: {} then {}", a.token(), b.token());
    match c.fenced_put(&fence_a, "lk-resource", "stale").await {
        Err(Error::Fenced(_)) => {}
        other => anyhow::bail!("stale fenced put: {other:?}"),
    }
    c.fenced_put(&b.fence(), "lk-resource", "b").await?;
    ensure!(c.get("lk-resource").await?.context("resource")?.value == b"b");
    drop(a);
    b.unlock().await?;
    let c2 = c.try_lock("lk").await?.context("free after unlock")?;
    c2.unlock().await?;
    ensure!(c.get_prefix("lk/").await?.is_empty(), "no contender keys left");
    Ok(())
}

pub async fn election(c: &Client) -> Result<()> {
    let s1 = Session::new(c, 5).await?;
    let s2 = Session::new(c, 5).await?;
    let mut observe = Box::pin(c.observe("el"));
    let l1 = c.campaign("el", "one", &s1).await?;
    ensure!(c.leader("el").await?.context("leader")?.value == b"one");
    let seen =
        tokio::time::timeout(Duration::from_secs(10), observe.next()).await?.context("observe")?;
    ensure!(seen.value == b"one");
    c.proclaim(&l1, "one-b").await?;
    let seen =
        tokio::time::timeout(Duration::from_secs(10), observe.next()).await?.context("observe")?;
    ensure!(seen.value == b"one-b");
    let c2 = c.clone();
    let s2b = s2.clone();
    let second = tokio::spawn(async move { c2.campaign("el", "two", &s2b).await });
    // Observed, not assumed: the second candidate's key exists (it is queued) before we check
    // that it has not won. Bounded: 10 s at 20 ms per look.
    let mut queued = false;
    for _ in 0..500 {
        if c.get_prefix("el/").await?.len() == 2 {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ensure!(queued, "the second candidate never queued");
    ensure!(!second.is_finished(), "second candidate waits");
    c.resign(&l1).await?;
    let l2 = tokio::time::timeout(Duration::from_secs(10), second).await???;
    ensure!(l2.revision > l1.revision);
    ensure!(c.leader("el").await?.context("leader")?.value == b"two");
    match c.proclaim(&l1, "stale").await {
        Err(Error::NotLeader(_)) => {}
        other => anyhow::bail!("proclaim by a former leader: {other:?}"),
    }
    s1.close().await?;
    s2.close().await?;
    Ok(())
}
