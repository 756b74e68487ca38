//! Observability and operations with real processes: `picketd --version`, Prometheus metrics and
//! the health endpoints on `--listen-metrics-urls`, JSON logs, and a SIGTERMed leader handing
//! leadership to another member before it exits.
//!
//! Every member listens for metrics on port 0 (the harness gives all members the same extra
//! flags) and logs, as JSON, the address it bound; the test reads it from the member's log.
//! HTTP is spoken by hand over a TCP stream (one `GET`, `Connection: close`), so the test needs no
//! HTTP client crate.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use picket_tests::binary::picketd_bin;
use picket_tests::{eventually, Cluster, ClusterOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::info;

/// One HTTP request, connect to last byte. The endpoints answer from memory, except `/health`
/// and `/readyz`, whose linearizable read is bounded by one election timeout (1 s by default)
/// in the server; 10 s covers a loaded 2-core machine.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a state change (a new leader, a lost quorum showing in `/health`) may take to show.
/// Each takes at most a few election timeouts (1-2 s each); 30 s covers a loaded machine.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Families every member must export, whatever it has served so far.
const FAMILIES: &[&str] = &[
    "picket_server_has_leader",
    "picket_server_is_leader",
    "picket_server_leader_changes_seen_total",
    "picket_server_raft_term",
    "picket_server_proposals_applied_total",
    "picket_server_raft_last_log_index",
    "picket_server_proposals_pending",
    "picket_server_proposals_failed_total",
    "picket_server_proposal_duration_seconds",
    "picket_server_id",
    "picket_server_version",
    "picket_lease_active",
    "picket_mvcc_watch_stream_total",
    "picket_mvcc_db_total_size_in_bytes",
    "picket_mvcc_db_total_size_in_use_in_bytes",
    "picket_mvcc_current_revision",
    "picket_server_quota_backend_bytes",
    "picket_server_max_request_bytes",
    "picket_server_max_txn_ops",
    "picket_server_runtime_workers",
    "picket_disk_wal_fsync_duration_seconds",
    "picket_disk_backend_commit_duration_seconds",
    "picket_debugging_mvcc_watcher_total",
    "picket_debugging_mvcc_slow_watcher_total",
];

/// `GET path` on `addr`: the status code and the body.
async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let raw = tokio::time::timeout(HTTP_TIMEOUT, fetch)
        .await
        .with_context(|| format!("GET http://{addr}{path} timed out"))??;
    let (head, body) = raw.split_once("\r\n\r\n").context("response without a header end")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad status line in {head:?}"))?;
    Ok((code, body.to_string()))
}

/// The value of the first sample of `name` whose labels contain every one of `labels`
/// (`grpc_method="Put"`).
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let rest = l.strip_prefix(name)?;
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            return None;
        }
        if !labels.iter().all(|lab| rest.contains(lab)) {
            return None;
        }
        rest.rsplit(' ').next()?.parse().ok()
    })
}

/// The metrics address member `i` last logged as JSON
/// (`"fields":{"message":"serving metrics","addr":...}`).
fn metrics_addr(cluster: &Cluster, i: usize) -> Result<SocketAddr> {
    let log = std::fs::read_to_string(cluster.stderr_log(i))?;
    let addr = log
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "serving metrics")
        .find_map(|v| v["fields"]["addr"].as_str().map(str::to_string))
        .with_context(|| format!("member {} logged no metrics address", cluster.name(i)))?;
    addr.parse().with_context(|| format!("bad metrics address {addr:?}"))
}

/// Polls until member `i` has logged its metrics address (it does so right after binding).
async fn wait_metrics_addr(cluster: &Cluster, i: usize) -> Result<SocketAddr> {
    eventually("metrics address in the log", CONVERGE_TIMEOUT, || async {
        metrics_addr(cluster, i)
    })
    .await
}

#[test]
fn version_flag_prints_the_version() -> Result<()> {
    let out =
        Command::new(picketd_bin()?).arg("--version").output().context("picketd --version")?;
    ensure!(out.status.success(), "picketd --version failed: {out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        stdout.trim() == format!("picketd {}", env!("CARGO_PKG_VERSION")),
        "unexpected --version output {stdout:?}"
    );
    Ok(())
}

#[tokio::test]
async fn metrics_health_and_leader_transfer_on_sigterm() -> Result<()> {
    let opts = ClusterOptions {
        extra_args: ["--listen-metrics-urls", "http://127.0.0.1:0", "--log-format", "json"]
            .map(String::from)
            .to_vec(),
        // `--runtime-threads` sizes each member's runtime; the third keeps the default.
        member_args: vec![
            vec!["--runtime-threads".into(), "1".into()],
            vec!["--runtime-threads".into(), "3".into()],
        ],
        ..Default::default()
    };
    let mut cluster = Cluster::start(3, opts).await?;
    let mut addrs = Vec::new();
    for i in 0..cluster.len() {
        addrs.push(wait_metrics_addr(&cluster, i).await?);
    }

    info!("every member exports the expected families, and one leader is visible in them");
    let mut leaders = 0.0;
    for (i, &addr) in addrs.iter().enumerate() {
        let (code, text) = http_get(addr, "/metrics").await?;
        ensure!(code == 200, "/metrics on {} answered {code}", cluster.name(i));
        for family in FAMILIES {
            ensure!(
                text.contains(&format!("# TYPE {family} ")),
                "{} does not export {family}:\n{text}",
                cluster.name(i)
            );
        }
        ensure!(sample(&text, "picket_server_has_leader", &[]) == Some(1.0), "no leader: {text}");
        leaders += sample(&text, "picket_server_is_leader", &[]).unwrap_or(0.0);
    }
    ensure!(leaders == 1.0, "{leaders} members say they lead");

    info!("each member's runtime has the workers its --runtime-threads asked for");
    // The default (0) is tokio's: `TOKIO_WORKER_THREADS` if set (picketd inherits this
    // process's environment), else one per core.
    let cores = match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(n) => n.parse::<f64>().context("TOKIO_WORKER_THREADS")?,
        Err(_) => std::thread::available_parallelism()?.get() as f64,
    };
    for (i, want) in [1.0, 3.0, cores].into_iter().enumerate() {
        let (_, text) = http_get(addrs[i], "/metrics").await?;
        let got = sample(&text, "picket_server_runtime_workers", &[]);
        ensure!(got == Some(want), "{}: {got:?} runtime workers, want {want}", cluster.name(i));
    }

    info!("request counters and the proposal histogram grow with requests");
    let put = ["grpc_service=\"etcdserverpb.KV\"", "grpc_method=\"Put\"", "grpc_code=\"OK\""];
    let (_, before) = http_get(addrs[0], "/metrics").await?;
    let puts_before = sample(&before, "picket_grpc_server_handled_total", &put).unwrap_or(0.0);
    let proposals_before =
        sample(&before, "picket_server_proposal_duration_seconds_count", &[]).unwrap_or(0.0);
    let mut client = cluster.client(0).await?;
    for n in 0..5 {
        client.put(format!("obs/{n}"), "v", None).await?;
    }
    client.get("obs/0", None).await?;
    let (_, after) = http_get(addrs[0], "/metrics").await?;
    let puts_after = sample(&after, "picket_grpc_server_handled_total", &put).unwrap_or(0.0);
    ensure!(puts_after >= puts_before + 5.0, "Put count {puts_before} -> {puts_after}");
    let range = ["grpc_method=\"Range\""];
    ensure!(
        sample(&after, "picket_grpc_server_handling_seconds_count", &range).unwrap_or(0.0) >= 1.0,
        "no Range latency recorded:\n{after}"
    );
    let proposals_after =
        sample(&after, "picket_server_proposal_duration_seconds_count", &[]).unwrap_or(0.0);
    ensure!(
        proposals_after >= proposals_before + 5.0,
        "proposal count {proposals_before} -> {proposals_after}"
    );
    ensure!(
        sample(&after, "picket_mvcc_current_revision", &[]).unwrap_or(0.0) >= 6.0,
        "revision did not grow:\n{after}"
    );

    info!("disk histograms count the writes; the quota is exported; watchers are counted");
    let count =
        |text: &str, family: &str| sample(text, &format!("{family}_count"), &[]).unwrap_or(0.0);
    let fsync = "picket_disk_wal_fsync_duration_seconds";
    let commit = "picket_disk_backend_commit_duration_seconds";
    // Every put is one synced append on every member (possibly several puts per append when
    // the leader batches them), and one state-machine commit at least per applied batch.
    ensure!(count(&after, fsync) > count(&before, fsync), "no WAL fsync observed:\n{after}");
    ensure!(count(&after, commit) > count(&before, commit), "no backend commit observed");
    ensure!(
        sample(&after, "picket_server_quota_backend_bytes", &[]) == Some(2147483648.0),
        "the default quota is 2 GiB:\n{after}"
    );
    let watchers = |text: &str| sample(text, "picket_debugging_mvcc_watcher_total", &[]);
    ensure!(watchers(&after) == Some(0.0), "watchers before any watch: {:?}", watchers(&after));
    let stream = client.watch("obs/", None).await?;
    eventually("the open watcher is counted", CONVERGE_TIMEOUT, || async {
        let (_, text) = http_get(addrs[0], "/metrics").await?;
        ensure!(watchers(&text) == Some(1.0), "watcher gauge {:?}", watchers(&text));
        Ok(())
    })
    .await?;
    drop(stream);

    info!("every member is healthy and ready while the cluster has a leader");
    for (i, &addr) in addrs.iter().enumerate() {
        let (code, body) = http_get(addr, "/health").await?;
        ensure!(code == 200, "/health on {}: {code} {body}", cluster.name(i));
        let v: serde_json::Value = serde_json::from_str(&body)?;
        ensure!(v["health"] == "true", "/health body {body}");
        let (code, body) = http_get(addr, "/readyz").await?;
        ensure!(
            code == 200 && body.trim() == "ok",
            "/readyz on {}: {code} {body}",
            cluster.name(i)
        );
    }

    info!("SIGTERM on the leader hands leadership to another member before it exits");
    let old = cluster.leader().await?;
    let old_id = cluster.member_id(old).context("leader without a member id")?;
    let status = cluster.stop(old).await?;
    ensure!(status.success(), "the stopped leader exited with {status}");
    let log = std::fs::read_to_string(cluster.stderr_log(old))?;
    ensure!(
        log.contains("transferred leadership before shutdown"),
        "the stopped leader did not log a transfer:\n{}",
        cluster.log_tail(old)
    );
    let rest: Vec<usize> = (0..cluster.len()).filter(|&i| i != old).collect();
    let new = eventually("a new leader among the remaining members", CONVERGE_TIMEOUT, || async {
        let l = cluster.leader().await?;
        ensure!(l != old, "still led by the stopped member");
        Ok(l)
    })
    .await?;
    ensure!(cluster.member_id(new) != Some(old_id));
    let (_, text) = http_get(addrs[new], "/metrics").await?;
    ensure!(
        sample(&text, "picket_server_leader_changes_seen_total", &[]).unwrap_or(0.0) >= 2.0,
        "the new leader saw no leader change:\n{text}"
    );

    info!("with the other two members stopped, the last one reports unhealthy");
    let last = rest.iter().copied().find(|&i| i != new).context("a follower remains")?;
    cluster.stop(new).await?;
    let reason = eventually("/health turning 503", CONVERGE_TIMEOUT, || async {
        let (code, body) = http_get(addrs[last], "/health").await?;
        if code != 503 {
            bail!("/health answered {code} {body}");
        }
        let v: serde_json::Value = serde_json::from_str(&body)?;
        ensure!(v["health"] == "false", "503 with body {body}");
        Ok(v["reason"].as_str().unwrap_or_default().to_string())
    })
    .await?;
    info!(%reason, "unhealthy as expected");
    let (code, body) = http_get(addrs[last], "/readyz").await?;
    ensure!(code == 503 && body.contains("[-]"), "/readyz without a quorum: {code} {body}");
    // Metrics keep being served without a quorum: they are what an operator looks at then.
    let (code, _) = http_get(addrs[last], "/metrics").await?;
    ensure!(code == 200, "/metrics without a quorum answered {code}");

    cluster.finish();
    Ok(())
}
