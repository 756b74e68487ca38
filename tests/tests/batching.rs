//! Group commit end to end (issue 9): concurrent writes through every member of a three-member
//! cluster share Raft entries on the leader (`server/src/raft/batcher.rs`), yet each write keeps
//! its own revision and result, every member ends with the same store, and nothing is applied
//! twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::GetOptions;
use picket_tests::util::rev;
use picket_tests::writer::hash_kv_agree;
use picket_tests::{eventually, kvs, Cluster, ClusterOptions};
use tracing::info;

/// How long followers may take to apply what the leader committed: milliseconds on loopback,
/// 30 s on a loaded 2-core machine.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

const WRITERS: usize = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_through_every_member_get_distinct_revisions_and_converge() -> Result<()> {
    picket_tests::init_tracing();
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let clients = cluster.clients().await?;
    let leader = cluster.leader().await?;
    let before = clients[leader].clone().status().await?;
    let (index_before, term_before) = (before.raft_index(), before.raft_term());

    info!("{WRITERS} puts at once, spread over all members (followers forward to the leader)");
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let mut c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("batch/{i:02}");
            let r = c.put(key.clone(), format!("value-{i}"), None).await?;
            anyhow::Ok((key, rev(r.header())))
        }));
    }
    let mut revision_of = BTreeMap::new();
    for t in tasks {
        let (key, revision) = t.await??;
        revision_of.insert(key, revision);
    }
    let distinct: BTreeSet<i64> = revision_of.values().copied().collect();
    ensure!(distinct.len() == WRITERS, "revisions are not distinct: {revision_of:?}");
    let max_rev = *distinct.last().context("no revision")?;
    let min_rev = *distinct.first().context("no revision")?;
    ensure!(
        max_rev - min_rev == WRITERS as i64 - 1,
        "{WRITERS} puts took revisions {min_rev}..={max_rev}: one revision each, no gaps"
    );
    let after = clients[leader].clone().status().await?;
    let entries = after.raft_index() - index_before;
    info!(entries, puts = WRITERS, "raft entries for the puts");
    // The leader keeps one batch in flight at a time, so while the first entry is being written
    // and replicated (an fsync and a round trip) the other puts queue behind it and share the
    // next entries: 64 concurrent puts in 64 entries would mean group commit does not happen.
    // A re-election adds a blank entry and restarts batching, so the bound is asserted only
    // within one term (a term change is reported; it has not been seen on loopback).
    ensure!(after.raft_term() == term_before, "the leader changed during the puts: {after:?}");
    ensure!(
        entries < WRITERS as u64,
        "{entries} entries for {WRITERS} puts: no entry carried more than one put"
    );

    info!("every key is readable on every member with the revision its put returned");
    for (i, c) in clients.iter().enumerate() {
        let c = c.clone();
        let what = format!("member {} serializable view at revision {max_rev}", cluster.name(i));
        let got = eventually(&what, CONVERGE_TIMEOUT, || {
            let mut c = c.clone();
            async move {
                let opts =
                    GetOptions::new().with_prefix().with_revision(max_rev).with_serializable();
                Ok(kvs(&c.get("batch/", Some(opts)).await?))
            }
        })
        .await?;
        ensure!(got.len() == WRITERS, "member {i} has {} keys: {got:?}", got.len());
        for kv in &got {
            let key = String::from_utf8_lossy(&kv.key).into_owned();
            let expected = revision_of.get(&key).context("unexpected key")?;
            ensure!(kv.mod_revision == *expected, "member {i}: {kv:?} but its put said {expected}");
            ensure!(kv.create_revision == *expected && kv.version == 1, "member {i}: {kv:?}");
            let n = key.trim_start_matches("batch/").parse::<usize>()?;
            ensure!(kv.value == format!("value-{n}").into_bytes(), "member {i}: {kv:?}");
        }
    }

    info!("HashKV agrees on every member at the last put's revision");
    hash_kv_agree(&cluster, &[0, 1, 2], max_rev).await?;
    cluster.finish();
    Ok(())
}

/// A fresh three-member cluster, one of its followers, that follower's endpoint and a client
/// of it.
async fn three_members_and_a_follower() -> Result<(Cluster, usize, String, etcd_client::Client)> {
    picket_tests::init_tracing();
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let leader = cluster.leader().await?;
    let follower = (0..3).find(|&i| i != leader).context("a follower")?;
    let endpoint = cluster.endpoint(follower);
    let client = cluster.client(follower).await?;
    Ok((cluster, follower, endpoint, client))
}

/// `picket_server_relay_calls_total{via="..."}` on the member at `endpoint`.
async fn relay_calls(http: &picket_tests::http::Http, endpoint: &str, via: &str) -> Result<u64> {
    http.labelled(endpoint, "picket_server_relay_calls_total", ("via", via)).await
}

/// Issue 20: a follower's writes, keep-alives and linearizable reads reach the leader as calls
/// on one relay stream, not as one RPC each, and each gets its own answer. Concurrent callers
/// on the follower share the stream (several calls in flight at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_calls_to_the_leader_travel_on_its_relay_stream() -> Result<()> {
    let (cluster, follower, endpoint, c) = three_members_and_a_follower().await?;
    let http = picket_tests::http::Http::new();
    let (stream_before, unary_before) = (
        relay_calls(&http, &endpoint, "stream").await?,
        relay_calls(&http, &endpoint, "unary").await?,
    );

    info!(member = cluster.name(follower), "16 callers: puts, linearizable gets, keep-alives");
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            let lease = c.lease_grant(30, None).await?.id();
            for j in 0..5 {
                let key = format!("relay/{i:02}/{j}");
                let opts = etcd_client::PutOptions::new().with_lease(lease);
                c.put(key.clone(), format!("v{i}.{j}"), Some(opts)).await?;
                let got = c.get(key.clone(), None).await?;
                let value = got.kvs().first().map(|kv| kv.value().to_vec());
                ensure!(value == Some(format!("v{i}.{j}").into_bytes()), "{key}: {value:?}");
                let (mut keeper, mut answers) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                let answer = tokio::time::timeout(Duration::from_secs(10), answers.message())
                    .await
                    .context("keep-alive answer")??
                    .context("keep-alive stream ended")?;
                ensure!(
                    answer.id() == lease && answer.ttl() > 0,
                    "keep-alive of {lease}: {answer:?}"
                );
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let stream = relay_calls(&http, &endpoint, "stream").await? - stream_before;
    let unary = relay_calls(&http, &endpoint, "unary").await? - unary_before;
    info!(stream, unary, "the follower's calls to the leader");
    // 16 grants and 80 puts (grouped: at least one call per group), 80 reads (rounds shared by
    // concurrent reads) and 160 keep-alives (one call each).
    ensure!(stream >= 160, "only {stream} calls on the relay stream");
    ensure!(unary == 0, "{unary} calls went as unary RPCs to a leader that has the stream");
    cluster.finish();
    Ok(())
}

/// `picket_server_forwarded_answers_total{by="..."}` on the member at `endpoint`.
async fn forwarded_answers(
    http: &picket_tests::http::Http,
    endpoint: &str,
    by: &str,
) -> Result<u64> {
    http.labelled(endpoint, "picket_server_forwarded_answers_total", ("by", by)).await
}

/// Puts `n` keys under `prefix` one at a time through `c`, and reads each back at once with a
/// serializable read (no leader involved) on the same member (`what`, for messages): each must
/// be there with its value and the revision its put returned, and revisions must increase.
async fn puts_each_read_back_here(
    c: &mut etcd_client::Client,
    prefix: &str,
    n: u64,
    what: &str,
) -> Result<()> {
    let mut last = 0;
    for i in 0..n {
        let key = format!("{prefix}/{i:02}");
        let put = c.put(key.clone(), format!("v{i}"), None).await?;
        let revision = rev(put.header());
        ensure!(revision > last, "{key}: revision {revision} after {last}");
        last = revision;
        let got = c.get(key.clone(), Some(GetOptions::new().with_serializable())).await?;
        let kv = got.kvs().first().with_context(|| format!("{key} not readable on {what}"))?;
        ensure!(kv.value() == format!("v{i}").as_bytes(), "{key}: {kv:?}");
        ensure!(kv.mod_revision() == revision, "{key}: {kv:?}, put said revision {revision}");
    }
    Ok(())
}

/// `picket_server_local_answers_total{by="..."}` on the member at `endpoint`.
async fn local_answers(http: &picket_tests::http::Http, endpoint: &str, by: &str) -> Result<u64> {
    http.labelled(endpoint, "picket_server_local_answers_total", ("by", by)).await
}

/// Issue 20 (session 38): the leader answers its own clients' writes with the result its apply
/// hands over (`server/src/raft/proposer.rs`, `propose_here`), not with openraft's answer to the
/// entry, which comes back later through the state machine's responder, the batcher and
/// openraft's core. Every answer is counted once, by the way it came; each write is readable on
/// the leader as soon as its put returns, and the results are the ones apply decided (one
/// revision per put, in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_answers_its_own_clients_writes_from_its_apply() -> Result<()> {
    const PUTS: u64 = 50;
    picket_tests::init_tracing();
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let leader = cluster.leader().await?;
    let endpoint = cluster.endpoint(leader);
    let mut c = cluster.client(leader).await?;
    let http = picket_tests::http::Http::new();
    let (apply_before, raft_before) = (
        local_answers(&http, &endpoint, "apply").await?,
        local_answers(&http, &endpoint, "raft").await?,
    );

    info!(member = cluster.name(leader), PUTS, "puts one at a time on the leader, each read back");
    puts_each_read_back_here(&mut c, "lead", PUTS, "the leader").await?;

    let by_apply = local_answers(&http, &endpoint, "apply").await? - apply_before;
    let by_raft = local_answers(&http, &endpoint, "raft").await? - raft_before;
    info!(by_apply, by_raft, "how the leader's answers came");
    ensure!(by_apply + by_raft == PUTS, "{by_apply} + {by_raft} answers for {PUTS} puts");
    // Apply hands the result over before it returns the entry's responder to openraft, so the
    // hand-over wins every race but one lost to a scheduler's whim; not fifty in a row unless
    // the hand-over does not happen.
    ensure!(by_apply > 0, "no write on the leader was answered from its own apply");
    cluster.finish();
    Ok(())
}

/// Issue 20: a follower answers a write it forwarded with the result its own apply of the entry
/// hands over (`server/src/storage/forwarded.rs`), instead of always waiting for the leader's
/// answer, which leaves the leader only after the leader applied the entry. Every answer is
/// counted once, by the way it came; each write is readable on the follower (a serializable
/// read, no leader involved) as soon as its put returns, whichever way that was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_its_forwarded_writes_from_its_own_apply() -> Result<()> {
    const PUTS: u64 = 50;
    let (cluster, follower, endpoint, mut c) = three_members_and_a_follower().await?;
    let http = picket_tests::http::Http::new();
    let (apply_before, leader_before) = (
        forwarded_answers(&http, &endpoint, "apply").await?,
        forwarded_answers(&http, &endpoint, "leader").await?,
    );

    info!(member = cluster.name(follower), PUTS, "puts one at a time, each read back there");
    puts_each_read_back_here(&mut c, "here", PUTS, "the follower").await?;

    let by_apply = forwarded_answers(&http, &endpoint, "apply").await? - apply_before;
    let by_leader = forwarded_answers(&http, &endpoint, "leader").await? - leader_before;
    info!(by_apply, by_leader, "how the follower's answers came");
    ensure!(by_apply + by_leader == PUTS, "{by_apply} + {by_leader} answers for {PUTS} puts");
    // On loopback the follower's own apply comes before the leader's answer most of the time
    // (two thirds in a traced run on this machine); the leader's answer can win any one race,
    // not fifty in a row unless the hand-over does not happen.
    ensure!(by_apply > 0, "no forwarded write was answered from the follower's own apply");
    cluster.finish();
    Ok(())
}
