//! Debian's `etcdctl` 3.4 against a three-member cluster. Outputs are asserted exactly where
//! etcdctl's "simple" format is stable, and `-w json` output is parsed and checked field by field.
//! The expected outputs were recorded against etcd 3.4 itself.
//!
//! etcdctl 3.4 has no `get --count-only` (it arrived in 3.5), so the count is checked through
//! the `count` field of `-w json` output instead.

use anyhow::{Context, Result};
use picket_tests::etcdctl::{self, CtlOutput, Etcdctl};
use picket_tests::util::base64;
use picket_tests::{Cluster, ClusterOptions};
use serde_json::Value;
use tracing::info;

/// Returns `None` (after explaining why) when etcdctl is not installed.
fn etcdctl_or_skip() -> Option<()> {
    if etcdctl::available() {
        Some(())
    } else {
        eprintln!(
            "SKIPPED: {} is missing (install Debian's etcd-client package to run the etcdctl tests)",
            etcdctl::ETCDCTL
        );
        None
    }
}

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
    if etcdctl_or_skip().is_none() {
        return Ok(());
    }
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
    if etcdctl_or_skip().is_none() {
        return Ok(());
    }
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
