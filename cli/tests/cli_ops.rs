//! Operator commands as processes against real clusters: member, endpoint, move-leader,
//! defrag, alarm, snapshot save/restore, completion and local-cluster.

mod common;

use anyhow::{bail, ensure, Context, Result};
use common::{picket, run, Running};
use picket_tests::cluster::READY_TIMEOUT;
use picket_tests::{eventually, Cluster, ClusterOptions};
use serde_json::Value;
use tracing::info;

fn rows(v: &Value) -> Result<&Vec<Value>> {
    v.as_array().context("expected a JSON array")
}

#[tokio::test]
async fn membership_endpoints_and_maintenance() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();

    info!("member list");
    let v = run(&eps, &["member", "list", "-w", "json"]).await?.ok()?.json()?;
    let members = v["members"].as_array().context("members")?;
    ensure!(members.len() == 3 && members.iter().all(|m| m["is_learner"] == false), "{v}");

    info!("endpoint status/health/hashkv --cluster, from one endpoint");
    let one = vec![cluster.endpoint(0)];
    // Members publish their client URLs just after they start serving.
    let status = eventually("every member publishes its client URL", READY_TIMEOUT, || {
        let one = one.clone();
        async move {
            let status = run(&one, &["endpoint", "status", "--cluster", "-w", "json"])
                .await?
                .ok()?
                .json()?;
            ensure!(rows(&status)?.len() == 3, "{status}");
            Ok(status)
        }
    })
    .await?;
    ensure!(rows(&status)?.iter().filter(|r| r["is_leader"] == true).count() == 1, "{status}");
    let out = run(&one, &["endpoint", "health", "--cluster"]).await?.ok()?;
    ensure!(out.stdout.matches("healthy").count() == 3, "{}", out.stdout);
    let rev = run(&eps, &["put", "h", "1", "-w", "json"]).await?.ok()?.json()?["header"]
        ["revision"]
        .clone();
    let rev = rev.as_i64().context("revision")?.to_string();
    let hashes = eventually("members converge on one hash", READY_TIMEOUT, || {
        let (one, rev) = (one.clone(), rev.clone());
        async move {
            let v = run(&one, &["endpoint", "hashkv", "--cluster", "--rev", &rev, "-w", "json"])
                .await?
                .ok()?
                .json()?;
            let hs: Vec<Value> = rows(&v)?.iter().map(|r| r["hash"].clone()).collect();
            ensure!(hs.len() == 3 && hs.iter().all(|h| h == &hs[0] && h.is_number()), "{v}");
            Ok(hs)
        }
    })
    .await?;
    info!(?hashes, "hashkv agrees");

    info!("move-leader to a follower; unknown ids are not found");
    let leader_id =
        rows(&status)?.iter().find(|r| r["is_leader"] == true).context("leader")?["id"].clone();
    let target =
        rows(&status)?.iter().find(|r| r["is_leader"] == false).context("follower")?["id"].clone();
    let target = target.as_str().context("id")?.to_string();
    run(&eps, &["move-leader", &target]).await?.ok()?;
    eventually("the target leads", READY_TIMEOUT, || {
        let (eps, target) = (eps.clone(), target.clone());
        async move {
            let v = run(&eps, &["endpoint", "status", "-w", "json"]).await?.ok()?.json()?;
            let l = rows(&v)?.iter().find(|r| r["is_leader"] == true).map(|r| r["id"].clone());
            ensure!(l == Some(Value::String(target.clone())), "{v}");
            Ok(())
        }
    })
    .await?;
    ensure!(leader_id != Value::String(target.clone()), "moved away from the old leader");
    run(&eps, &["move-leader", "abcdef"]).await?.expect_code(3)?;

    info!("defrag and alarm list");
    let out = run(&eps, &["defrag"]).await?.ok()?;
    ensure!(out.stdout.matches("defragmented").count() == 3, "{out:?}");
    let v = run(&eps, &["alarm", "list", "-w", "json"]).await?.ok()?.json()?;
    ensure!(v["alarms"].as_array().is_some_and(|a| a.is_empty()), "{v}");

    info!("member add (learner), start it, promote, update, remove");
    let i = cluster.prepare_member()?;
    let peer = cluster.peer_url(i);
    let added = run(
        &eps,
        &["member", "add", cluster.name(i), "--peer-urls", &peer, "--learner", "-w", "json"],
    )
    .await?
    .ok()?
    .json()?;
    let id = added["member"]["id"].as_str().context("new id")?.to_string();
    ensure!(added["member"]["is_learner"] == true, "{added}");
    ensure!(
        added["initial_cluster"]
            .as_str()
            .is_some_and(|s| s.contains(&format!("{}={peer}", cluster.name(i)))),
        "{added}"
    );
    cluster.spawn(i)?;
    eventually("the learner catches up and is promoted", READY_TIMEOUT, || {
        let (eps, id) = (eps.clone(), id.clone());
        async move {
            let promoted = run(&eps, &["member", "promote", &id]).await?;
            let v = run(&eps, &["member", "list", "-w", "json"]).await?.ok()?.json()?;
            let me = v["members"]
                .as_array()
                .and_then(|ms| ms.iter().find(|m| m["id"] == id.as_str()).cloned());
            match me {
                Some(m) if m["is_learner"] == false => Ok(()),
                _ => bail!("not promoted yet: {promoted:?}"),
            }
        }
    })
    .await?;
    run(&eps, &["member", "update", &id, "--peer-urls", &peer]).await?.ok()?;
    run(&eps, &["member", "remove", &id]).await?.ok()?;
    let v = run(&eps, &["member", "list", "-w", "json"]).await?.ok()?.json()?;
    ensure!(v["members"].as_array().is_some_and(|m| m.len() == 3), "{v}");
    run(&eps, &["member", "remove", &id]).await?.expect_code(3)?;

    info!("an endpoint that is down is reported and exits 5");
    cluster.kill(2)?;
    let out = run(&eps, &["endpoint", "status"]).await?.expect_code(5)?;
    ensure!(out.stdout.contains(&cluster.endpoint(2)), "{out:?}");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn snapshot_save_and_restore() -> Result<()> {
    let src = Cluster::start(1, ClusterOptions::default()).await?;
    let eps = src.endpoints();
    for i in 0..20 {
        run(&eps, &["put", &format!("s/{i:02}"), &format!("v{i}")]).await?.ok()?;
    }
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("backup.db");
    let file_s = file.to_str().context("path")?;

    info!("save, with progress on stderr");
    let out = run(&eps, &["snapshot", "save", file_s, "-w", "json"]).await?.ok()?;
    ensure!(out.stderr.contains("received") && out.stderr.contains("(100%)"), "{out:?}");
    let bytes = out.json()?["bytes"].as_u64().context("bytes")?;
    ensure!(std::fs::metadata(&file)?.len() == bytes, "file size");
    ensure!(!dir.path().join("backup.db.part").exists(), "no partial file left");

    info!("restore into a new cluster's data dir and start it");
    let mut dst = Cluster::create(1, ClusterOptions::default())?;
    let data = dst.data_dir(0).to_str().context("path")?.to_string();
    let out = run(
        &[],
        &[
            "snapshot",
            "restore",
            file_s,
            "--name",
            dst.name(0),
            "--data-dir",
            &data,
            "--initial-cluster",
            dst.initial_cluster(),
            "--initial-advertise-peer-urls",
            &dst.peer_url(0),
            "-w",
            "json",
        ],
    )
    .await?
    .ok()?;
    ensure!(out.stderr.contains("restoring") && out.stderr.contains("restored in"), "{out:?}");
    let report = out.json()?;
    ensure!(report["keys"] == 20, "{report}");
    dst.restart_all().await?;
    let out = run(&dst.endpoints(), &["get", "s/", "--prefix", "--count-only", "-w", "simple"])
        .await?
        .ok()?;
    ensure!(out.stdout.trim() == "20", "{out:?}");
    let out = run(&dst.endpoints(), &["get", "s/07", "--print-value-only", "-w", "simple"])
        .await?
        .ok()?;
    ensure!(out.stdout == "v7\n", "{out:?}");

    info!("restoring over existing data is refused as a usage error");
    let out = run(
        &[],
        &[
            "snapshot",
            "restore",
            file_s,
            "--name",
            dst.name(0),
            "--data-dir",
            &data,
            "--initial-cluster",
            dst.initial_cluster(),
            "--initial-advertise-peer-urls",
            &dst.peer_url(0),
        ],
    )
    .await?
    .expect_code(2)?;
    ensure!(out.stderr.contains("not empty"), "{out:?}");
    src.finish();
    dst.finish();
    Ok(())
}

#[tokio::test]
async fn completion_scripts() -> Result<()> {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&[], &["completion", shell]).await?.ok()?;
        ensure!(
            out.stdout.contains("local-cluster") && out.stdout.contains("move-leader"),
            "{shell}"
        );
    }
    run(&[], &["completion", "tcsh"]).await?.expect_code(2)?;
    Ok(())
}

/// Three client ports whose port + 1 (the peer port) is reserved as well, below the ephemeral
/// range and never etcd's defaults ([`picket_procs::ports`]).
fn six_free_ports() -> Result<Vec<u16>> {
    Ok(picket_procs::ports::reserve_pairs(3)?)
}

async fn start_local(dir: &std::path::Path, ports: &str) -> Result<(Running, Vec<String>)> {
    let mut lc = Running::spawn(picket(
        &[],
        &[
            "local-cluster",
            "--data-dir",
            dir.to_str().context("path")?,
            "--client-ports",
            ports,
            "--stop-timeout",
            "20s",
        ],
    ))?;
    let mut endpoints = None;
    while endpoints.is_none() {
        let l = lc.line().await?;
        if let Some(e) = l.strip_prefix("endpoints: ") {
            endpoints = Some(e.split(',').map(str::to_string).collect::<Vec<_>>());
        }
    }
    Ok((lc, endpoints.unwrap_or_default()))
}

#[tokio::test]
async fn local_cluster_starts_restarts_and_stops() -> Result<()> {
    picket_tests::init_tracing();
    let dir = tempfile::tempdir()?;
    let ports = six_free_ports()?.iter().map(u16::to_string).collect::<Vec<_>>().join(",");

    info!("first run: a new cluster");
    let (mut lc, eps) = start_local(dir.path(), &ports).await?;
    ensure!(eps.len() == 3, "{eps:?}");
    run(&eps, &["put", "greeting", "hello"]).await?.ok()?;
    let status = run(&eps, &["endpoint", "status", "-w", "json"]).await?.ok()?.json()?;
    ensure!(rows(&status)?.len() == 3, "{status}");
    lc.interrupt()?;
    ensure!(lc.exit_code().await? == 0, "Ctrl-C stops cleanly");
    lc.stderr_until("stopped").await?;
    run(&eps[..1], &["get", "greeting"]).await?.expect_code(5)?;

    info!("second run: the same data, restarted");
    let (mut lc, eps) = start_local(dir.path(), &ports).await?;
    lc.stderr_until("restarting three members").await?;
    let out = run(&eps, &["get", "greeting", "--print-value-only", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "hello\n", "{out:?}");
    lc.interrupt()?;
    ensure!(lc.exit_code().await? == 0, "Ctrl-C stops cleanly");
    Ok(())
}
