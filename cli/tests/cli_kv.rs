//! `picket put/get/del/txn/compact/watch/lease` and the exit codes, as a process against a real
//! three-member cluster.

mod common;

use anyhow::{ensure, Context, Result};
use common::{picket, run, run_cmd, Running};
use picket_tests::{Cluster, ClusterOptions};
use tracing::info;

#[tokio::test]
async fn kv_txn_compact_and_exit_codes() -> Result<()> {
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();

    info!("put and get, in every output format");
    run(&eps, &["put", "greeting", "hello"]).await?.ok()?;
    let out = run(&eps, &["get", "greeting", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "greeting\nhello\n", "{out:?}");
    let v = run(&eps, &["get", "greeting", "-w", "json"]).await?.ok()?.json()?;
    ensure!(v["kvs"][0]["key"] == "greeting" && v["kvs"][0]["value"] == "hello", "{v}");
    let rev1 = v["kvs"][0]["mod_revision"].as_i64().context("mod_revision")?;
    let out = run(&eps, &["get", "greeting"]).await?.ok()?;
    ensure!(out.stdout.contains("| greeting | hello |"), "{}", out.stdout);
    // The value from stdin, without its trailing newline.
    run_cmd(picket(&eps, &["put", "greeting"]), Some("bonjour\n")).await?.ok()?;
    let out = run(&eps, &["get", "greeting", "--print-value-only", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "bonjour\n", "{out:?}");
    let out =
        run(&eps, &["get", "greeting", "--rev", &rev1.to_string(), "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "greeting\nhello\n", "--rev reads history: {out:?}");

    info!("prefix, from-key, limit, sort, keys-only, count-only, consistency");
    for k in ["job/a", "job/b", "job/c"] {
        run(&eps, &["put", k, &format!("v-{k}")]).await?.ok()?;
    }
    let v = run(
        &eps,
        &[
            "get",
            "job/",
            "--prefix",
            "--limit",
            "2",
            "--order",
            "DESCEND",
            "--sort-by",
            "KEY",
            "-w",
            "json",
        ],
    )
    .await?
    .ok()?
    .json()?;
    ensure!(v["kvs"][0]["key"] == "job/c" && v["kvs"][1]["key"] == "job/b", "{v}");
    ensure!(v["more"] == true && v["count"] == 3, "{v}");
    let out =
        run(&eps, &["get", "job/b", "--from-key", "--keys-only", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "job/b\njob/c\n", "{out:?}");
    let out =
        run(&eps, &["get", "job/", "--prefix", "--count-only", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout.trim() == "3", "{out:?}");
    let out = run(&eps, &["get", "job/a", "--consistency", "s", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "job/a\nv-job/a\n", "{out:?}");

    info!("exit codes: not found, usage, unavailable");
    let out = run(&eps, &["get", "missing"]).await?.expect_code(3)?;
    ensure!(out.stdout.is_empty(), "{out:?}");
    run(&eps, &["get", "missing/", "--prefix"]).await?.expect_code(0)?;
    run(&eps, &["get", "k", "--sort-by", "NONSENSE"]).await?.expect_code(2)?;
    run(&eps, &["frobnicate"]).await?.expect_code(2)?;
    run(&["http://127.0.0.1:1".to_string()], &["get", "k"]).await?.expect_code(5)?;
    let help = run(&eps, &["--help"]).await?.ok()?;
    ensure!(
        help.stdout.contains("Exit codes:") && help.stdout.contains("4  lock not acquired"),
        "{}",
        help.stdout
    );

    info!("txn from stdin (etcdctl syntax) and from a file, both branches");
    let txn = "value(\"greeting\") = \"bonjour\"\n\nput greeting hallo\nget greeting\n\nput greeting nope\n\n";
    let out = run_cmd(picket(&eps, &["txn", "-w", "simple"]), Some(txn)).await?.ok()?;
    ensure!(out.stdout == "SUCCESS\n\nOK\n\ngreeting\nhallo\n", "{out:?}");
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("txn.txt");
    std::fs::write(&file, txn)?;
    let v = run(&eps, &["txn", "--file", file.to_str().context("path")?, "-w", "json"])
        .await?
        .ok()?
        .json()?;
    ensure!(v["succeeded"] == false && v["responses"][0]["put"].is_object(), "{v}");
    let out = run(&eps, &["get", "greeting", "--print-value-only", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout == "nope\n", "failure branch ran: {out:?}");
    let out = run_cmd(picket(&eps, &["txn", "-i"]), Some("size(\"k\") = \"1\"\n\n\n"))
        .await?
        .expect_code(2)?;
    ensure!(out.stderr.contains("unknown target"), "{out:?}");

    info!("del with prefix and prev-kv");
    let out = run(&eps, &["del", "job/", "--prefix", "--prev-kv", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout.starts_with("3\njob/a\nv-job/a\n"), "{out:?}");

    info!("compact: old revisions are gone afterwards");
    let head = run(&eps, &["put", "greeting", "latest", "-w", "json"]).await?.ok()?.json()?;
    let head = head["header"]["revision"].as_i64().context("revision")?;
    let out = run(&eps, &["compact", &head.to_string()]).await?.ok()?;
    ensure!(out.stdout.trim() == format!("compacted revision {head}"), "{out:?}");
    let out = run(&eps, &["get", "greeting", "--rev", &rev1.to_string()]).await?.expect_code(1)?;
    ensure!(out.stderr.contains("compacted"), "{out:?}");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn watch_resumes_across_a_leader_kill() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();
    const N: usize = 10;

    info!("a watch with prev-kv and progress marks, through all three endpoints");
    run(&eps, &["put", "w/0", "seed"]).await?.ok()?;
    let mut watch = Running::spawn(picket(
        &eps,
        &["watch", "w/", "--prefix", "--prev-kv", "--progress-interval", "500ms", "-w", "json"],
    ))?;
    watch.stderr_until("watching prefix").await?;
    let progress = loop {
        let v: serde_json::Value = serde_json::from_str(&watch.line().await?)?;
        if v["progress"] == true {
            break v;
        }
    };
    ensure!(progress["revision"].as_i64() >= Some(2), "{progress}");

    info!("writes before and after the leader (which the watch prefers) is killed");
    let write = |i: usize| {
        let eps = eps.clone();
        async move {
            // Created only if absent: a write whose outcome was unknown can be retried without
            // ever producing a second event for the same key.
            let txn = format!("version(\"w/{i:02}\") = \"0\"\n\nput w/{i:02} v{i}\n\n");
            picket_tests::eventually(&format!("write w/{i:02}"), common::RUN_TIMEOUT, || {
                let eps = eps.clone();
                let txn = txn.clone();
                async move { run_cmd(picket(&eps, &["txn"]), Some(&txn)).await?.ok().map(|_| ()) }
            })
            .await
        }
    };
    for i in 1..=N / 2 {
        write(i).await?;
    }
    let leader = cluster.leader().await?;
    cluster.kill(leader)?;
    for i in N / 2 + 1..=N {
        write(i).await?;
    }
    let mut keys = Vec::new();
    while keys.len() < N {
        let v: serde_json::Value = serde_json::from_str(&watch.line().await?)?;
        if v["type"] == "PUT" {
            keys.push(v["kv"]["key"].as_str().context("key")?.to_string());
        }
    }
    let want: Vec<String> = (1..=N).map(|i| format!("w/{i:02}")).collect();
    ensure!(keys == want, "every write exactly once, in order: {keys:?}");
    watch.child.start_kill()?;
    watch.exit_code().await?;

    info!("--max-events ends the watch; --rev replays history");
    let out =
        run(&eps, &["watch", "w/", "--prefix", "--rev", "1", "--max-events", "3", "-w", "simple"])
            .await?
            .ok()?;
    ensure!(out.stdout.starts_with("PUT\nw/0\nseed\nPUT\nw/01\nv1\n"), "{out:?}");
    cluster.finish();
    Ok(())
}

#[tokio::test]
async fn lease_subcommands() -> Result<()> {
    let cluster = Cluster::start(1, ClusterOptions::default()).await?;
    let eps = cluster.endpoints();

    let id =
        run(&eps, &["lease", "grant", "60", "-w", "simple"]).await?.ok()?.stdout.trim().to_string();
    run(&eps, &["put", "leased", "x", "--lease", &id]).await?.ok()?;
    let v = run(&eps, &["lease", "ttl", &id, "--keys", "-w", "json"]).await?.ok()?.json()?;
    ensure!(v["granted_ttl"] == 60 && v["keys"][0] == "leased", "{v}");
    let out = run(&eps, &["lease", "list", "-w", "simple"]).await?.ok()?;
    ensure!(out.stdout.lines().any(|l| l == id), "{out:?}");
    let out = run(&eps, &["lease", "keep-alive", &id, "--once"]).await?.ok()?;
    ensure!(out.stdout.contains(&format!("lease {id} keepalived")), "{out:?}");

    info!("keep-alive until Ctrl-C");
    let mut ka = Running::spawn(picket(&eps, &["lease", "keep-alive", &id, "-w", "json"]))?;
    let first: serde_json::Value = serde_json::from_str(&ka.line().await?)?;
    ensure!(first["id"] == id.as_str(), "{first}");
    ka.interrupt()?;
    ensure!(ka.exit_code().await? == 0, "Ctrl-C ends keep-alive cleanly");

    let out = run(&eps, &["lease", "revoke", &id]).await?.ok()?;
    ensure!(out.stdout.contains("revoked"), "{out:?}");
    run(&eps, &["get", "leased"]).await?.expect_code(3)?;
    run(&eps, &["lease", "ttl", &id]).await?.expect_code(3)?;
    run(&eps, &["lease", "revoke", &id]).await?.expect_code(3)?;
    run(&eps, &["lease", "keep-alive", &id, "--once"]).await?.expect_code(3)?;
    cluster.finish();
    Ok(())
}
