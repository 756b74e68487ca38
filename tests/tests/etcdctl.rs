//! Debian's `etcdctl` 3.4 against a three-member cluster. Outputs are asserted exactly where
//! etcdctl's "simple" format is stable, and `-w json` output is parsed and checked field by field.
//! The expected outputs were recorded against etcd 3.4 itself.
//!
//! etcdctl 3.4 has no `get --count-only` (it arrived in 3.5), so the count is checked through
//! the `count` field of `-w json` output instead.
//!
//! `lease`, `watch`, `lock` and `elect` run etcdctl's own recipes over KV + Lease + Watch (not
//! the Lock and Election services), so they check that those pieces compose as clientv3 expects.
//! Long-running commands (`watch`, `lock`, `elect`, `lease keep-alive`) are read line by line
//! while they run and are stopped with SIGINT, as Ctrl-C would, or SIGKILL.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use picket_tests::etcdctl::{self, CtlChild, CtlOutput, Etcdctl};
use picket_tests::util::{base64, POLL_INTERVAL};
use picket_tests::{Cluster, ClusterOptions};
use serde_json::Value;
use tracing::info;

/// How long a long-running etcdctl may take to print an expected line: it dials (2 s dial
/// timeout), then waits for a server push; 15 s covers a loaded machine.
const LINE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a waiter must stay blocked while another process holds the lock or leadership. Any
/// line it printed in this window would break mutual exclusion, so the check is sound; 2 s is
/// long enough for a broken implementation to be caught (etcdctl acquires in milliseconds).
const BLOCKED_WINDOW: Duration = Duration::from_secs(2);

/// How long an etcdctl process may take to exit after SIGINT (it unlocks or resigns first).
const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs etcdctl, requires success, and returns stdout.
async fn ok(ctl: &Etcdctl, args: &[&str]) -> Result<String> {
    Ok(ctl.run(args, None).await?.ok().with_context(|| format!("etcdctl {args:?}"))?.stdout)
}

/// Asserts that etcdctl failed and printed `Error: <message>` as a line of stderr (etcdctl also
/// logs client-side retry warnings there, so other lines are allowed).
#[track_caller]
fn assert_ctl_error(out: &CtlOutput, message: &str) {
    assert!(
        !out.success,
        "expected etcdctl to fail with {message:?}, it succeeded: {}",
        out.stdout
    );
    let want = format!("Error: {message}");
    assert!(
        out.stderr.lines().any(|l| l.trim_end() == want),
        "expected a stderr line {want:?}; stderr was:\n{}",
        out.stderr
    );
}

fn json(text: &str) -> Result<Value> {
    serde_json::from_str(text.trim())
        .with_context(|| format!("etcdctl printed invalid JSON: {text}"))
}

/// Checks a `-w json` header: real ids and term, and the expected revision.
#[track_caller]
fn assert_json_header(v: &Value, revision: i64) {
    let h = &v["header"];
    assert!(h["cluster_id"].as_u64().is_some_and(|id| id != 0), "cluster_id in {v}");
    assert!(h["member_id"].as_u64().is_some_and(|id| id != 0), "member_id in {v}");
    assert!(h["raft_term"].as_u64().is_some_and(|t| t > 0), "raft_term in {v}");
    assert_eq!(h["revision"].as_i64(), Some(revision), "header revision in {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_put_get_del() -> Result<()> {
    // Fails, naming the package, when etcdctl is missing: this test never passes by skipping.
    etcdctl::path()?;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    // One etcdctl per member (followers must forward writes) plus one given every endpoint.
    let single: Vec<Etcdctl> = (0..3).map(|i| Etcdctl::new(&[cluster.endpoint(i)])).collect();
    let all = Etcdctl::new(&cluster.endpoints());

    info!("put through each member");
    assert_eq!(ok(&single[0], &["put", "foo", "bar"]).await?, "OK\n"); // rev 2
    assert_eq!(ok(&single[1], &["put", "foo/a", "1"]).await?, "OK\n"); // rev 3
    assert_eq!(ok(&single[2], &["put", "foo/b", "2"]).await?, "OK\n"); // rev 4
    assert_eq!(ok(&all, &["put", "foo/b", "22"]).await?, "OK\n"); // rev 5

    info!("get: plain, prefix, revision, sorted, limited, keys only");
    for ctl in single.iter().chain([&all]) {
        assert_eq!(ok(ctl, &["get", "foo"]).await?, "foo\nbar\n");
        assert_eq!(ok(ctl, &["get", "foo", "--prefix"]).await?, "foo\nbar\nfoo/a\n1\nfoo/b\n22\n");
    }
    assert_eq!(ok(&single[1], &["get", "foo/b", "--rev", "4"]).await?, "foo/b\n2\n");
    assert_eq!(ok(&single[2], &["get", "foo/b", "--rev", "3"]).await?, "");
    assert_eq!(
        ok(&single[0], &["get", "foo", "--prefix", "--sort-by=MODIFY", "--order=DESCEND"]).await?,
        "foo/b\n22\nfoo/a\n1\nfoo\nbar\n"
    );
    assert_eq!(
        ok(&single[1], &["get", "foo", "--prefix", "--sort-by=KEY", "--order=DESCEND"]).await?,
        "foo/b\n22\nfoo/a\n1\nfoo\nbar\n"
    );
    assert_eq!(
        ok(
            &single[2],
            &["get", "foo", "--prefix", "--sort-by=VERSION", "--order=DESCEND", "--limit", "1"]
        )
        .await?,
        "foo/b\n22\n"
    );
    assert_eq!(
        ok(&single[0], &["get", "foo", "--prefix", "--limit", "2"]).await?,
        "foo\nbar\nfoo/a\n1\n"
    );
    assert_eq!(
        ok(&single[1], &["get", "foo", "--prefix", "--keys-only"]).await?,
        "foo\n\nfoo/a\n\nfoo/b\n\n"
    );
    assert_eq!(
        ok(&single[2], &["get", "foo", "--prefix", "--print-value-only"]).await?,
        "bar\n1\n22\n"
    );
    assert_eq!(ok(&all, &["get", "foo/a", "--from-key"]).await?, "foo/a\n1\nfoo/b\n22\n");

    info!("-w json: header, base64 keys and values, revisions, count and more");
    let v = json(&ok(&single[1], &["get", "foo/b", "-w", "json"]).await?)?;
    assert_json_header(&v, 5);
    assert_eq!(v["count"].as_i64(), Some(1), "{v}");
    let kv = &v["kvs"][0];
    assert_eq!(kv["key"].as_str(), Some(base64(b"foo/b").as_str()), "{v}");
    assert_eq!(kv["value"].as_str(), Some(base64(b"22").as_str()), "{v}");
    assert_eq!(
        (kv["create_revision"].as_i64(), kv["mod_revision"].as_i64(), kv["version"].as_i64()),
        (Some(4), Some(5), Some(2)),
        "{v}"
    );
    let v =
        json(&ok(&single[2], &["get", "foo", "--prefix", "--limit", "1", "-w", "json"]).await?)?;
    assert_json_header(&v, 5);
    assert_eq!(v["count"].as_i64(), Some(3), "count is the whole range: {v}");
    assert_eq!(v["more"].as_bool(), Some(true), "{v}");
    assert_eq!(v["kvs"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["kvs"][0]["key"].as_str(), Some(base64(b"foo").as_str()), "{v}");
    assert_eq!(v["kvs"][0]["value"].as_str(), Some(base64(b"bar").as_str()), "{v}");
    let v = json(&ok(&single[0], &["put", "json", "x", "-w", "json"]).await?)?; // rev 6
    assert_json_header(&v, 6);
    let v = json(&ok(&single[0], &["get", "json", "--rev", "5", "-w", "json"]).await?)?;
    assert_json_header(&v, 6);
    assert!(
        v.get("kvs").is_none() && v.get("count").is_none(),
        "empty result must omit kvs and count: {v}"
    );

    info!("put --prev-kv and del: single, --prev-kv, --prefix, nothing");
    assert_eq!(ok(&single[1], &["put", "--prev-kv", "foo", "baz"]).await?, "OK\nfoo\nbar\n"); // rev 7
    for k in ["x/1", "x/2", "x/3"] {
        assert_eq!(ok(&single[2], &["put", k, "v"]).await?, "OK\n"); // revs 8-10
    }
    assert_eq!(ok(&single[0], &["del", "foo/a"]).await?, "1\n"); // rev 11
    assert_eq!(ok(&single[1], &["del", "--prev-kv", "foo/b"]).await?, "1\nfoo/b\n22\n"); // rev 12
    assert_eq!(ok(&single[2], &["del", "x", "--prefix"]).await?, "3\n"); // rev 13
    assert_eq!(ok(&all, &["del", "nothing"]).await?, "0\n");
    assert_eq!(ok(&all, &["get", "", "--from-key", "--keys-only"]).await?, "foo\n\njson\n\n");
    let v = json(&ok(&single[0], &["get", "foo", "-w", "json"]).await?)?;
    assert_json_header(&v, 13);
    assert_eq!(v["kvs"][0]["value"].as_str(), Some(base64(b"baz").as_str()), "{v}");

    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_txn_and_compaction() -> Result<()> {
    // Fails, naming the package, when etcdctl is missing: this test never passes by skipping.
    etcdctl::path()?;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let single: Vec<Etcdctl> = (0..3).map(|i| Etcdctl::new(&[cluster.endpoint(i)])).collect();
    let all = Etcdctl::new(&cluster.endpoints());
    assert_eq!(ok(&all, &["put", "k", "v"]).await?, "OK\n"); // rev 2

    // `etcdctl txn` reads compares, a blank line, success requests, a blank line, failure
    // requests and a blank line from stdin (the non-interactive form of `txn -i`).
    info!("txn success branch, with a range seeing the txn's own put");
    let out = single[1]
        .run(&["txn"], Some("mod(\"k\") = \"2\"\n\nput k v1\nget k\n\nput k v2\n\n"))
        .await?
        .ok()?;
    assert_eq!(out.stdout, "SUCCESS\n\nOK\n\nk\nv1\n"); // rev 3

    info!("txn failure branch");
    let out = single[2]
        .run(&["txn"], Some("value(\"k\") = \"nope\"\n\nput k bad\n\nput k v2\nget k\n\n"))
        .await?
        .ok()?;
    assert_eq!(out.stdout, "FAILURE\n\nOK\n\nk\nv2\n"); // rev 4

    info!("txn with several compares of every target and operator");
    let input = "version(\"k\") = \"3\"\ncreate(\"k\") = \"2\"\nvalue(\"k\") != \"v1\"\nmod(\"k\") > \"3\"\n\
                 version(\"k\") < \"4\"\n\ndel k\n\n\n";
    let out = single[0].run(&["txn"], Some(input)).await?.ok()?;
    assert_eq!(out.stdout, "SUCCESS\n\n1\n"); // rev 5
    let out =
        single[0].run(&["txn"], Some("version(\"k\") > \"0\"\n\nput k never\n\n\n")).await?.ok()?;
    assert_eq!(out.stdout, "FAILURE\n", "k was deleted, so its version is 0");
    assert_eq!(ok(&all, &["get", "k"]).await?, "");

    info!("compaction, then reads below, at and above the compacted revision");
    for v in ["1", "2", "3"] {
        assert_eq!(ok(&all, &["put", "c", v]).await?, "OK\n"); // revs 6, 7, 8
    }
    assert_eq!(ok(&single[1], &["compaction", "7"]).await?, "compacted revision 7\n");
    for ctl in &single {
        let out = ctl.run(&["get", "c", "--rev", "6"], None).await?;
        assert_ctl_error(&out, "etcdserver: mvcc: required revision has been compacted");
        assert_eq!(ok(ctl, &["get", "c", "--rev", "7"]).await?, "c\n2\n");
        assert_eq!(ok(ctl, &["get", "c"]).await?, "c\n3\n");
    }
    let out = single[2].run(&["get", "c", "--rev", "100"], None).await?;
    assert_ctl_error(&out, "etcdserver: mvcc: required revision is a future revision");
    let out = single[0].run(&["compaction", "7"], None).await?;
    assert_ctl_error(&out, "etcdserver: mvcc: required revision has been compacted");
    let out = single[0].run(&["compaction", "100"], None).await?;
    assert_ctl_error(&out, "etcdserver: mvcc: required revision is a future revision");

    cluster.finish();
    Ok(())
}

/// The hexadecimal lease id in a line such as `lease 694d7a6ab2f2c10b granted with TTL(60s)`.
fn lease_hex(line: &str) -> Result<String> {
    let id = line
        .strip_prefix("lease ")
        .and_then(|rest| rest.split_whitespace().next())
        .with_context(|| format!("no lease id in {line:?}"))?;
    ensure!(
        id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "lease id {id:?} is not 16 hex digits (etcdctl prints %016x)"
    );
    Ok(id.to_string())
}

/// The `N` in `..., remaining(Ns)...`.
fn remaining_secs(line: &str) -> Result<i64> {
    let rest =
        line.split("remaining(").nth(1).with_context(|| format!("no remaining in {line:?}"))?;
    let n = rest.split("s)").next().context("unterminated remaining")?;
    n.parse().with_context(|| format!("remaining {n:?} in {line:?}"))
}

/// Waits until `etcdctl get key` prints nothing, for at most `timeout`.
async fn wait_key_gone(ctl: &Etcdctl, key: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    for _ in 0..(timeout.as_millis() / POLL_INTERVAL.as_millis() + 1) {
        let out = ctl.run(&["get", key], None).await?;
        if out.success && out.stdout.is_empty() {
            return Ok(());
        }
        last = format!("{out:?}");
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    bail!("{key:?} still present after {timeout:?}: {last}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lease_commands() -> Result<()> {
    // Fails, naming the package, when etcdctl is missing: this test never passes by skipping.
    etcdctl::path()?;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let single: Vec<Etcdctl> = (0..3).map(|i| Etcdctl::new(&[cluster.endpoint(i)])).collect();
    let all = Etcdctl::new(&cluster.endpoints());

    info!("grant, attach keys, timetolive, list, keep-alive --once");
    let out = ok(&single[1], &["lease", "grant", "60"]).await?;
    let long = lease_hex(&out)?;
    assert_eq!(out, format!("lease {long} granted with TTL(60s)\n"));
    let out = ok(&single[2], &["lease", "grant", "1"]).await?;
    let short = lease_hex(&out)?;
    assert_eq!(out, format!("lease {short} granted with TTL(2s)\n"), "TTL raised to 2 s");
    assert_eq!(ok(&single[0], &["put", &format!("--lease={long}"), "lk1", "v"]).await?, "OK\n");
    assert_eq!(ok(&single[1], &["put", &format!("--lease={long}"), "lk2", "v"]).await?, "OK\n");

    let out = ok(&single[0], &["lease", "timetolive", &long]).await?;
    let n = remaining_secs(&out)?;
    assert!((0..=60).contains(&n), "remaining {n} of a fresh 60 s lease");
    assert_eq!(out, format!("lease {long} granted with TTL(60s), remaining({n}s)\n"));
    let out = ok(&single[2], &["lease", "timetolive", "--keys", &long]).await?;
    let n = remaining_secs(&out)?;
    // The key order is the server's; etcd keeps attached keys in a map, so accept either.
    let a =
        format!("lease {long} granted with TTL(60s), remaining({n}s), attached keys([lk1 lk2])\n");
    let b =
        format!("lease {long} granted with TTL(60s), remaining({n}s), attached keys([lk2 lk1])\n");
    assert!(out == a || out == b, "timetolive --keys printed {out:?}");

    let out = ok(&all, &["lease", "list"]).await?;
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("found 2 leases"), "{out}");
    let listed: BTreeSet<&str> = lines.collect();
    assert_eq!(listed, BTreeSet::from([long.as_str(), short.as_str()]), "lease list: {out}");

    assert_eq!(
        ok(&single[1], &["lease", "keep-alive", "--once", &long]).await?,
        format!("lease {long} keepalived with TTL(60)\n")
    );

    info!("a long-running keep-alive through one member keeps a 2 s lease for 3 TTLs");
    assert_eq!(ok(&single[2], &["put", &format!("--lease={short}"), "sk", "v"]).await?, "OK\n");
    let mut keeper = single[0].spawn(&["lease", "keep-alive", &short])?;
    let t0 = Instant::now();
    let first = keeper.next_line(LINE_TIMEOUT).await?;
    assert_eq!(first, format!("lease {short} keepalived with TTL(2)"));
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(t0.elapsed())).await;
    assert_eq!(ok(&single[1], &["get", "sk"]).await?, "sk\nv\n", "key of the kept lease");
    let lines = keeper.pending_lines();
    assert!(lines.len() >= 2, "keep-alive printed too few renewals in 6 s: {lines:?}");
    for l in &lines {
        assert_eq!(l, &format!("lease {short} keepalived with TTL(2)"));
    }
    info!("SIGKILL the keep-alive: the lease and its key are gone within 2 s + 5 s");
    keeper.kill().await?;
    wait_key_gone(&single[2], "sk", Duration::from_secs(7)).await?;
    let out = ok(&single[1], &["lease", "timetolive", &short]).await?;
    assert_eq!(out, format!("lease {short} already expired\n"));

    info!("revoke, then every command on the revoked lease");
    assert_eq!(
        ok(&single[2], &["lease", "revoke", &long]).await?,
        format!("lease {long} revoked\n")
    );
    assert_eq!(ok(&all, &["get", "lk", "--prefix"]).await?, "", "revoke deletes attached keys");
    let out = single[0].run(&["lease", "revoke", &long], None).await?;
    assert_ctl_error(&out, "failed to revoke lease (etcdserver: requested lease not found)");
    assert_eq!(
        ok(&single[1], &["lease", "timetolive", &long]).await?,
        format!("lease {long} already expired\n")
    );
    let out = single[2].run(&["lease", "keep-alive", "--once", &long], None).await?;
    assert_ctl_error(&out, "etcdserver: requested lease not found");
    let out = single[0].run(&["put", &format!("--lease={long}"), "k", "v"], None).await?;
    assert_ctl_error(&out, "etcdserver: requested lease not found");
    // Without --once, etcdctl reports the end of the lease and exits successfully.
    assert_eq!(
        ok(&single[1], &["lease", "keep-alive", &long]).await?,
        format!("lease {long} expired or revoked.\n")
    );
    assert_eq!(ok(&all, &["lease", "list"]).await?, "found 0 leases\n");

    cluster.finish();
    Ok(())
}

/// Splits etcdctl's simple watch output into lines, for readable comparisons.
fn lines(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch() -> Result<()> {
    // Fails, naming the package, when etcdctl is missing: this test never passes by skipping.
    etcdctl::path()?;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let single: Vec<Etcdctl> = (0..3).map(|i| Etcdctl::new(&[cluster.endpoint(i)])).collect();
    let all = Etcdctl::new(&cluster.endpoints());
    assert_eq!(ok(&all, &["put", "foo", "1"]).await?, "OK\n"); // 2
    assert_eq!(ok(&all, &["put", "foo", "2"]).await?, "OK\n"); // 3
    assert_eq!(ok(&all, &["put", "foo/a", "x"]).await?, "OK\n"); // 4
    assert_eq!(ok(&all, &["del", "foo"]).await?, "1\n"); // 5

    // Watches start at a past revision with --rev, so what they print does not depend on when
    // etcdctl's stream is established; each then continues live.
    info!("watch --rev: history, then a live put");
    let mut w = single[1].spawn(&["watch", "--rev=2", "foo"])?;
    let got = w.next_lines(9, LINE_TIMEOUT).await?;
    assert_eq!(got, lines(&["PUT", "foo", "1", "PUT", "foo", "2", "DELETE", "foo", ""]));
    assert_eq!(ok(&single[2], &["put", "foo", "3"]).await?, "OK\n"); // 6
    assert_eq!(w.next_lines(3, LINE_TIMEOUT).await?, lines(&["PUT", "foo", "3"]));
    w.interrupt().await?;

    info!("watch --prefix");
    let mut w = single[2].spawn(&["watch", "--rev=2", "--prefix", "foo"])?;
    let got = w.next_lines(15, LINE_TIMEOUT).await?;
    assert_eq!(
        got,
        lines(&[
            "PUT", "foo", "1", "PUT", "foo", "2", "PUT", "foo/a", "x", "DELETE", "foo", "", "PUT",
            "foo", "3"
        ])
    );
    assert_eq!(ok(&single[0], &["put", "foo/b", "y"]).await?, "OK\n"); // 7
    assert_eq!(w.next_lines(3, LINE_TIMEOUT).await?, lines(&["PUT", "foo/b", "y"]));
    w.interrupt().await?;

    info!("watch --prev-kv prints the previous pair before the new one");
    let mut w = single[0].spawn(&["watch", "--rev=2", "--prev-kv", "foo"])?;
    let got = w.next_lines(16, LINE_TIMEOUT).await?;
    assert_eq!(
        got,
        lines(&[
            "PUT", "foo", "1", // created: no previous pair
            "PUT", "foo", "1", "foo", "2", // previous, then current
            "DELETE", "foo", "2", "foo", "", // previous, then the deleted key
            "PUT", "foo", "3", // re-created
        ])
    );
    assert_eq!(ok(&single[1], &["put", "foo", "4"]).await?, "OK\n"); // 8
    assert_eq!(w.next_lines(5, LINE_TIMEOUT).await?, lines(&["PUT", "foo", "3", "foo", "4"]));
    w.interrupt().await?;

    info!("watch from a compacted revision: canceled with the compaction error");
    assert_eq!(ok(&all, &["compaction", "5"]).await?, "compacted revision 5\n");
    let out = single[1].run(&["watch", "--rev=2", "foo"], None).await?;
    assert!(!out.success, "a compacted watch must fail: {out:?}");
    assert!(out.stdout.is_empty(), "no events from a compacted watch: {out:?}");
    assert!(
        out.stderr
            .lines()
            .any(|l| l
                == "watch was canceled (etcdserver: mvcc: required revision has been compacted)"),
        "stderr: {}",
        out.stderr
    );
    assert_ctl_error(&out, "watch is canceled by the server");

    cluster.finish();
    Ok(())
}

/// Reads the line etcdctl prints when it gets a lock (`<name>/<lease hex>`, then the empty
/// value) and returns the key.
async fn lock_acquired(holder: &mut CtlChild, name: &str) -> Result<String> {
    let got = holder.next_lines(2, LINE_TIMEOUT).await?;
    let key = got[0].clone();
    ensure!(
        key.strip_prefix(&format!("{name}/"))
            .is_some_and(|id| id.chars().all(|c| c.is_ascii_hexdigit())),
        "lock key {key:?} is not {name}/<lease hex>"
    );
    ensure!(got[1].is_empty(), "lock key value {:?}", got[1]);
    Ok(key)
}

/// Asserts `waiter` prints nothing for [`BLOCKED_WINDOW`] and is still running.
async fn assert_blocked(waiter: &mut CtlChild, what: &str) -> Result<()> {
    if let Ok(line) = waiter.next_line(BLOCKED_WINDOW).await {
        bail!("{what}: printed {line:?} while another process held it");
    }
    ensure!(!waiter.has_exited()?, "{what}: exited while waiting; stderr: {}", waiter.stderr());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_is_mutually_exclusive() -> Result<()> {
    // Fails, naming the package, when etcdctl is missing: this test never passes by skipping.
    etcdctl::path()?;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let single: Vec<Etcdctl> = (0..3).map(|i| Etcdctl::new(&[cluster.endpoint(i)])).collect();

    info!("a second `lock` blocks while the first holds the lock, and gets it when it exits");
    let mut a = single[0].spawn(&["lock", "L"])?;
    let key_a = lock_acquired(&mut a, "L").await?;
    let mut b = single[1].spawn(&["lock", "L"])?;
    assert_blocked(&mut b, "second lock").await?;
    let v = json(
        &ok(
            &single[2],
            &["get", "L", "--prefix", "--sort-by=CREATE", "--order=ASCEND", "-w", "json"],
        )
        .await?,
    )?;
    let kvs = v["kvs"].as_array().context("kvs")?;
    assert_eq!(kvs.len(), 2, "holder and waiter keys: {v}");
    assert_eq!(
        kvs[0]["key"].as_str(),
        Some(base64(key_a.as_bytes()).as_str()),
        "the holder's key is the oldest: {v}"
    );
    assert!(
        kvs[0]["create_revision"].as_i64() < kvs[1]["create_revision"].as_i64(),
        "create revisions: {v}"
    );
    a.interrupt().await?;
    let status = a.wait(EXIT_TIMEOUT).await?;
    assert!(status.success(), "lock holder exit after SIGINT: {status}; {}", a.stderr());
    let key_b = lock_acquired(&mut b, "L").await?;
    assert_ne!(key_a, key_b);
    b.interrupt().await?;
    b.wait(EXIT_TIMEOUT).await?;
    assert_eq!(ok(&single[2], &["get", "L", "--prefix"]).await?, "", "unlock deletes the keys");

    info!("a holder killed without unlocking: its session lease expires and the waiter gets it");
    let mut a = single[1].spawn(&["lock", "--ttl=2", "K"])?;
    lock_acquired(&mut a, "K").await?;
    let mut b = single[2].spawn(&["lock", "--ttl=2", "K"])?;
    assert_blocked(&mut b, "waiter on a live holder").await?;
    a.kill().await?;
    // The 2 s session lease expires within 2 s + 3 s; etcdctl then needs one watch event and a
    // range, so allow 2 s more.
    let got =
        b.next_lines(2, Duration::from_secs(7)).await.context("waiter after holder SIGKILL")?;
    assert!(got[0].starts_with("K/"), "{got:?}");
    b.interrupt().await?;
    b.wait(EXIT_TIMEOUT).await?;

    info!("four contending `lock L <command>` runs execute their commands one at a time");
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("critical.sh");
    let log = dir.path().join("log");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"enter $1 $ETCD_LOCK_KEY $ETCD_LOCK_REV\" >> {log}\nsleep 0.3\necho \"exit $1\" >> {log}\n",
            log = log.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let script = script.display().to_string();
    let runs = (0..4).map(|i| {
        let ctl = single[i % 3].clone();
        let script = script.clone();
        async move { ctl.run(&["lock", "C", &script, &i.to_string()], None).await?.ok() }
    });
    for out in join_all(runs).await {
        out?;
    }
    let text = std::fs::read_to_string(&log)?;
    let entries: Vec<&str> = text.lines().collect();
    assert_eq!(entries.len(), 8, "{text}");
    let mut revs = Vec::new();
    let mut keys = BTreeSet::new();
    for pair in entries.chunks(2) {
        let enter: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(enter.len(), 4, "{text}");
        assert_eq!(enter[0], "enter", "critical sections overlap:\n{text}");
        assert_eq!(pair[1], format!("exit {}", enter[1]), "critical sections overlap:\n{text}");
        assert!(enter[2].starts_with("C/"), "ETCD_LOCK_KEY {:?}", enter[2]);
        keys.insert(enter[2].to_string());
        revs.push(enter[3].parse::<i64>().with_context(|| format!("ETCD_LOCK_REV in {text}"))?);
    }
    assert_eq!(keys.len(), 4, "each run holds its own key: {text}");
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "lock revisions must increase: {revs:?}");
    assert_eq!(ok(&single[0], &["get", "C", "--prefix"]).await?, "", "all unlocked");

    cluster.finish();
    Ok(())
}

/// Awaits every future concurrently (a tiny `join_all`, to avoid a dependency for one use).
async fn join_all<F>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("task panicked"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_observe() -> Result<()> {
    // Fails, naming the package, when etcdctl is missing: this test never passes by skipping.
    etcdctl::path()?;
    let cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let single: Vec<Etcdctl> = (0..3).map(|i| Etcdctl::new(&[cluster.endpoint(i)])).collect();

    info!("first candidate is elected; an observer sees it; a second candidate waits");
    let mut a = single[0].spawn(&["elect", "E", "p1"])?;
    let got = a.next_lines(2, LINE_TIMEOUT).await?;
    let key_a = got[0].clone();
    assert!(key_a.starts_with("E/"), "{got:?}");
    assert_eq!(got[1], "p1");
    let mut observer = single[2].spawn(&["elect", "-l", "E"])?;
    assert_eq!(observer.next_lines(2, LINE_TIMEOUT).await?, vec![key_a.clone(), "p1".into()]);
    let mut b = single[1].spawn(&["elect", "E", "p2"])?;
    assert_blocked(&mut b, "second candidate").await?;

    info!("the leader resigns on SIGINT: the second candidate leads and the observer follows");
    a.interrupt().await?;
    let status = a.wait(EXIT_TIMEOUT).await?;
    assert!(status.success(), "elected candidate exit after SIGINT: {status}; {}", a.stderr());
    let got = b.next_lines(2, LINE_TIMEOUT).await?;
    let key_b = got[0].clone();
    assert!(key_b.starts_with("E/") && key_b != key_a, "{got:?}");
    assert_eq!(got[1], "p2");
    assert_eq!(observer.next_lines(2, LINE_TIMEOUT).await?, vec![key_b, "p2".into()]);

    b.interrupt().await?;
    b.wait(EXIT_TIMEOUT).await?;
    observer.interrupt().await?;
    observer.wait(EXIT_TIMEOUT).await?;
    assert_eq!(ok(&single[0], &["get", "E", "--prefix"]).await?, "", "resign deletes the key");

    cluster.finish();
    Ok(())
}

/// Issue 21, the live path from etcd: `etcdctl make-mirror` from a running etcd 3.4 into Picket
/// copies the existing keys, then keeps applying etcd's puts and deletes until it is stopped, so
/// clients can move over once the mirror has caught up. This test fails, naming the package,
/// when etcd is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_make_mirror_copies_a_live_etcd_into_picket() -> Result<()> {
    let etcd = picket_procs::tools::etcd()?;
    let etcd_cluster =
        Cluster::start(1, ClusterOptions { binary: Some(etcd), ..ClusterOptions::default() })
            .await?;
    let picket = Cluster::start(3, ClusterOptions::default()).await?;
    let src = Etcdctl::new(&etcd_cluster.endpoints());
    let dst = Etcdctl::new(&picket.endpoints());
    for i in 0..20 {
        ok(&src, &["put", &format!("app/{i:02}"), &format!("v{i}")]).await?;
    }
    ok(&src, &["put", "other/x", "outside the prefix"]).await?;
    // make-mirror takes one destination endpoint (etcdctl 3.4 dials exactly that string).
    let dest = picket.endpoint(1);
    let mirror = src.spawn(&["make-mirror", "--prefix", "app/", &dest])?;

    info!("the existing keys arrive, then live changes follow");
    let stderr = || mirror.stderr();
    wait_for(&dst, "app/19", Some("v19")).await.with_context(stderr)?;
    ok(&src, &["put", "app/20", "live"]).await?;
    ok(&src, &["del", "app/00"]).await?;
    ok(&src, &["put", "app/01", "changed"]).await?;
    wait_for(&dst, "app/20", Some("live")).await?;
    wait_for(&dst, "app/01", Some("changed")).await?;
    wait_for(&dst, "app/00", None).await?;
    mirror.interrupt().await?;

    let want: Vec<String> = {
        let mut keys: Vec<String> = (1..=20).map(|i| format!("app/{i:02}")).collect();
        keys.sort();
        keys
    };
    let got = ok(&dst, &["get", "app/", "--prefix", "--keys-only"]).await?;
    let got: Vec<&str> = got.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(got, want, "keys mirrored into Picket");
    assert_eq!(ok(&dst, &["get", "other/x"]).await?, "", "outside the prefix stays behind");
    picket.finish();
    etcd_cluster.finish();
    Ok(())
}

/// Polls `ctl` until `key` holds `value` (`None`: absent), for at most [`LINE_TIMEOUT`].
async fn wait_for(ctl: &Etcdctl, key: &str, value: Option<&str>) -> Result<()> {
    let deadline = Instant::now() + LINE_TIMEOUT;
    loop {
        let out = ok(ctl, &["get", key, "--print-value-only"]).await?;
        let got = out.lines().next().filter(|l| !l.is_empty());
        if got == value {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{key} is {got:?}, expected {value:?}");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
