//! etcd's HTTP/JSON gateway, end to end, with a plain HTTP client (`picket_tests::http`) against
//! a three-member cluster: every route family, a watch that streams across a leader kill, auth
//! on and off, a malformed body and a too-large one.
//!
//! Every body runs twice: against Picket and against Debian's etcd 3.4 (`etcd` on PATH, package
//! etcd-server), started by the same harness. The etcd run is the spec: the expected statuses,
//! codes and texts below are what etcd 3.4.23 answers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use picket_tests::http::{Http, Next, Reply};
use picket_tests::util::base64;
use picket_tests::{eventually, Cluster, ClusterOptions};
use serde_json::{json, Value};
use tracing::info;

/// How long a streamed line may take to arrive.
const LINE_TIMEOUT: Duration = Duration::from_secs(10);

/// `--max-request-bytes` of both servers (etcd's default, 1.5 MiB).
const MAX_REQUEST_BYTES: usize = 1536 * 1024;

fn b64(s: &str) -> String {
    base64(s.as_bytes())
}

/// A 64-bit integer field, which the gateway writes as a JSON string.
fn int(v: &Value, field: &str) -> Result<i64> {
    match v.get(field) {
        None => Ok(0),
        Some(Value::String(s)) => s.parse().with_context(|| format!("{field} = {s:?}")),
        Some(other) => bail!("{field} is not a string-encoded integer: {other}"),
    }
}

/// A uint64 field (member ids use the whole range, past i64's).
fn uint(v: &Value, field: &str) -> Result<u64> {
    match v.get(field) {
        None => Ok(0),
        Some(Value::String(s)) => s.parse().with_context(|| format!("{field} = {s:?}")),
        Some(other) => bail!("{field} is not a string-encoded integer: {other}"),
    }
}

fn revision(v: &Value) -> Result<i64> {
    int(&v["header"], "revision")
}

/// Asserts an etcd gateway error: HTTP status, gRPC code and text.
#[track_caller]
fn assert_error(r: &Reply, http: u16, code: i64, text: &str) {
    assert_eq!((r.status, r.code()), (http, Some(code)), "reply: {:?}", r.body);
    assert!(r.error().contains(text), "expected {text:?} in {:?}", r.body);
    assert_eq!(r.body["message"], r.body["error"], "message and error differ: {:?}", r.body);
}

async fn kv_routes(http: &Http, eps: &[String]) -> Result<()> {
    info!("kv: put through one member, read a prefix through another, txn, delete, compact");
    let put_a = json!({"key": b64("gw/kv/a"), "value": b64("1")});
    let rev_a = revision(&http.post(&eps[0], "/v3/kv/put", &put_a).await?.ok()?)?;
    ensure!(rev_a > 0, "put revision {rev_a}");
    http.post(&eps[1], "/v3/kv/put", &json!({"key": b64("gw/kv/b"), "value": b64("2")}))
        .await?
        .ok()?;
    let prefix = json!({"key": b64("gw/kv/"), "range_end": b64("gw/kv0")});
    let r = http.post(&eps[2], "/v3/kv/range", &prefix).await?.ok()?;
    assert_eq!(r["count"], "2", "{r}");
    let kv = &r["kvs"][0];
    assert_eq!((&kv["key"], &kv["value"]), (&json!(b64("gw/kv/a")), &json!(b64("1"))), "{r}");
    assert_eq!(int(kv, "create_revision")?, rev_a);
    assert_eq!(kv["version"], "1");
    // Input: camelCase names and enum numbers are accepted too; output omits zero values.
    let desc = json!({"key": b64("gw/kv/"), "rangeEnd": b64("gw/kv0"), "sortOrder": 2,
        "sort_target": "KEY", "limit": "1", "keys_only": true});
    let r = http.post(&eps[0], "/v3beta/kv/range", &desc).await?.ok()?;
    assert_eq!(r["kvs"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(r["kvs"][0]["key"], b64("gw/kv/b"));
    assert!(r["kvs"][0].get("value").is_none(), "keys_only returned a value: {r}");
    assert_eq!(r["more"], true);

    let txn = json!({
        "compare": [{"key": b64("gw/kv/a"), "target": "VERSION", "result": "EQUAL", "version": "1"}],
        "success": [{"request_put": {"key": b64("gw/kv/a"), "value": b64("3"), "prev_kv": true}}],
        "failure": [{"request_range": {"key": b64("gw/kv/a")}}],
    });
    let r = http.post(&eps[1], "/v3/kv/txn", &txn).await?.ok()?;
    assert_eq!(r["succeeded"], true, "{r}");
    assert_eq!(r["responses"][0]["response_put"]["prev_kv"]["value"], b64("1"), "{r}");
    // The same txn again: the compare fails (version is now 2) and `succeeded` is omitted.
    let r = http.post(&eps[2], "/v3/kv/txn", &txn).await?.ok()?;
    assert!(r.get("succeeded").is_none(), "{r}");
    assert_eq!(r["responses"][0]["response_range"]["kvs"][0]["value"], b64("3"), "{r}");

    let del = json!({"key": b64("gw/kv/"), "range_end": b64("gw/kv0"), "prev_kv": true});
    let r = http.post(&eps[0], "/v3/kv/deleterange", &del).await?.ok()?;
    assert_eq!(r["deleted"], "2", "{r}");
    assert_eq!(r["prev_kvs"].as_array().map(Vec::len), Some(2), "{r}");
    let now = revision(&r)?;
    http.post(
        &eps[1],
        "/v3/kv/compaction",
        &json!({"revision": now.to_string(), "physical": true}),
    )
    .await?
    .ok()?;
    let old = json!({"key": b64("gw/kv/a"), "revision": rev_a.to_string()});
    let r = http.post(&eps[2], "/v3/kv/range", &old).await?;
    assert_error(&r, 400, 11, "etcdserver: mvcc: required revision has been compacted");
    Ok(())
}

async fn watch_routes(http: &Http, eps: &[String]) -> Result<()> {
    info!("watch: history from a start revision, then live events, as newline-delimited JSON");
    let put = json!({"key": b64("gw/watch/k"), "value": b64("v1")});
    let first = revision(&http.post(&eps[0], "/v3/kv/put", &put).await?.ok()?)?;
    let create = json!({"create_request": {"key": b64("gw/watch/"), "range_end": b64("gw/watch0"),
        "start_revision": first.to_string(), "prev_kv": true}});
    let mut lines = http.stream(&eps[1], "/v3/watch", &create).await?;
    ensure!(lines.status == 200, "watch answered HTTP {}", lines.status);
    let created = lines.next(LINE_TIMEOUT).await?.context("stream ended")?;
    assert_eq!(created["result"]["created"], true, "{created}");
    let put2 = json!({"key": b64("gw/watch/k"), "value": b64("v2")});
    http.post(&eps[2], "/v3/kv/put", &put2).await?.ok()?;
    let mut events = Vec::new();
    while events.len() < 2 {
        let line = lines.next(LINE_TIMEOUT).await?.context("stream ended")?;
        for ev in line["result"]["events"].as_array().into_iter().flatten() {
            events.push(ev.clone());
        }
    }
    assert_eq!(int(&events[0]["kv"], "mod_revision")?, first);
    assert_eq!(events[1]["kv"]["value"], b64("v2"));
    assert_eq!(events[1]["prev_kv"]["value"], b64("v1"));
    // PUT is the enum's zero value, so it is omitted; a delete names its type.
    assert!(events[1].get("type").is_none(), "{:?}", events[1]);
    http.post(&eps[0], "/v3/kv/deleterange", &json!({"key": b64("gw/watch/k")})).await?.ok()?;
    let line = lines.next(LINE_TIMEOUT).await?.context("stream ended")?;
    assert_eq!(line["result"]["events"][0]["type"], "DELETE", "{line}");
    Ok(())
}

async fn lease_routes(http: &Http, eps: &[String]) -> Result<()> {
    info!("lease: grant, attach, time-to-live (both paths), list, keep-alive stream, revoke");
    let r = http.post(&eps[0], "/v3/lease/grant", &json!({"TTL": "60"})).await?.ok()?;
    let id = int(&r, "ID")?;
    assert_eq!(r["TTL"], "60", "{r}");
    let put = json!({"key": b64("gw/lease/k"), "value": b64("v"), "lease": id.to_string()});
    http.post(&eps[1], "/v3/kv/put", &put).await?.ok()?;
    for path in ["/v3/lease/timetolive", "/v3/kv/lease/timetolive"] {
        let r = http.post(&eps[2], path, &json!({"ID": id, "keys": true})).await?.ok()?;
        assert_eq!(r["grantedTTL"], "60", "{path}: {r}");
        assert_eq!(r["keys"], json!([b64("gw/lease/k")]), "{path}: {r}");
    }
    for path in ["/v3/lease/leases", "/v3/kv/lease/leases"] {
        let r = http.post(&eps[0], path, &json!({})).await?.ok()?;
        let ids: Vec<&Value> =
            r["leases"].as_array().into_iter().flatten().map(|l| &l["ID"]).collect();
        ensure!(ids.contains(&&json!(id.to_string())), "{path}: {r}");
    }
    // Two keep-alives in one body: two answers, then the stream ends (etcd ends it when the
    // request body is done).
    let two = format!("{}\n{}", json!({"ID": id.to_string()}), json!({"ID": id.to_string()}));
    let r = http.post_raw(&eps[1], "/v3/lease/keepalive", two.into()).await?;
    ensure!(r.status == 200, "keepalive: {r:?}");
    let text = match &r.body {
        Value::String(s) => s.clone(),
        other => format!("{other}\n"),
    };
    let answers: Vec<Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(answers.len(), 2, "{text}");
    assert_eq!(answers[0]["result"]["TTL"], "60", "{text}");
    for path in ["/v3/lease/revoke", "/v3/kv/lease/revoke"] {
        let r = http.post(&eps[2], path, &json!({"ID": id.to_string()})).await?;
        if path == "/v3/lease/revoke" {
            r.ok()?;
        } else {
            assert_error(&r, 404, 5, "etcdserver: requested lease not found");
        }
    }
    let r = http.post(&eps[0], "/v3/kv/range", &json!({"key": b64("gw/lease/k")})).await?.ok()?;
    ensure!(r.get("kvs").is_none(), "revoking the lease left its key: {r}");
    Ok(())
}

async fn cluster_and_maintenance(http: &Http, eps: &[String]) -> Result<()> {
    info!("cluster and maintenance routes, /version, /health and /metrics on the client URL");
    // Members publish their client URLs just after they start serving, in etcd too.
    let me = eventually("every member lists its client URL", Duration::from_secs(10), || async {
        let r = http.post(&eps[0], "/v3/cluster/member/list", &json!({})).await?.ok()?;
        let members = r["members"].as_array().context("no members")?;
        ensure!(members.len() == 3, "{r}");
        ensure!(members.iter().all(|m| m["clientURLs"].is_array()), "{r}");
        members
            .iter()
            .find(|m| m["clientURLs"].as_array().is_some_and(|u| u.contains(&json!(eps[0]))))
            .cloned()
            .with_context(|| format!("no member has client URL {}: {r}", eps[0]))
    })
    .await?;
    // Updating a member to its own peer URLs changes nothing and succeeds.
    let update = json!({"ID": me["ID"], "peerURLs": me["peerURLs"]});
    http.post(&eps[1], "/v3/cluster/member/update", &update).await?.ok()?;
    let r = http.post(&eps[1], "/v3/cluster/member/remove", &json!({"ID": "5"})).await?;
    assert_error(&r, 404, 5, "etcdserver: member not found");
    let r = http.post(&eps[1], "/v3/cluster/member/promote", &json!({"ID": "5"})).await?;
    assert_error(&r, 404, 5, "etcdserver: member not found");

    let r = http.post(&eps[2], "/v3/maintenance/status", &json!({})).await?.ok()?;
    ensure!(r["version"].as_str().is_some_and(|v| v.starts_with("3.")), "{r}");
    ensure!(uint(&r, "leader")? != 0 && int(&r, "dbSize")? > 0, "{r}");
    http.post(&eps[0], "/v3/maintenance/alarm", &json!({"action": "GET"})).await?.ok()?;
    let r = http.post(&eps[0], "/v3/maintenance/hash", &json!({})).await?.ok()?;
    ensure!(r["hash"].is_u64(), "uint32 stays a JSON number: {r}");
    http.post(&eps[1], "/v3/maintenance/defragment", &json!({})).await?.ok()?;

    let v = http.get(&eps[0], "/version").await?.ok()?;
    for field in ["etcdserver", "etcdcluster"] {
        let text = v[field].as_str().with_context(|| format!("{field}: {v}"))?;
        // Patroni parses both as dotted integers.
        let parts: Vec<u32> = text.split('.').map(str::parse).collect::<Result<_, _>>()?;
        ensure!(parts.len() == 3 && parts[0] == 3 && parts[1] >= 4, "{field} = {text}");
    }
    let h = http.get(&eps[1], "/health").await?.ok()?;
    assert_eq!(h["health"], "true", "{h}");
    let m = http.get(&eps[2], "/metrics").await?;
    ensure!(m.status == 200 && m.body.as_str().is_some_and(|t| t.contains("# TYPE")), "{m:?}");
    Ok(())
}

async fn lock_and_election(http: &Http, eps: &[String]) -> Result<()> {
    info!("lock: a second holder waits until the first unlocks");
    let lease = |ep: &str| {
        let ep = ep.to_string();
        let http = http.clone();
        async move {
            let r = http.post(&ep, "/v3/lease/grant", &json!({"TTL": "30"})).await?.ok()?;
            int(&r, "ID")
        }
    };
    let (l1, l2) = (lease(&eps[0]).await?, lease(&eps[1]).await?);
    let name = b64("gw/lock");
    let lock1 = json!({"name": name, "lease": l1.to_string()});
    let key1 = http.post(&eps[0], "/v3/lock/lock", &lock1).await?.ok()?["key"].clone();
    let waiter = {
        let (http, ep, name) = (http.clone(), eps[1].clone(), name.clone());
        tokio::spawn(async move {
            http.post(&ep, "/v3/lock/lock", &json!({"name": name, "lease": l2.to_string()})).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ensure!(!waiter.is_finished(), "the second lock was granted while the first was held");
    http.post(&eps[2], "/v3/lock/unlock", &json!({"key": key1})).await?.ok()?;
    let key2 = tokio::time::timeout(LINE_TIMEOUT, waiter).await???.ok()?["key"].clone();
    ensure!(key2 != key1, "both holders got {key1}");
    http.post(&eps[1], "/v3/lock/unlock", &json!({"key": key2})).await?.ok()?;

    info!("election: campaign, leader, observe (streamed), proclaim, resign");
    let name = b64("gw/elect");
    let campaign = json!({"name": name, "lease": l1.to_string(), "value": b64("v1")});
    let leader =
        http.post(&eps[0], "/v3/election/campaign", &campaign).await?.ok()?["leader"].clone();
    let r = http.post(&eps[1], "/v3/election/leader", &json!({"name": name})).await?.ok()?;
    assert_eq!(r["kv"]["value"], b64("v1"), "{r}");
    let mut observe = http.stream(&eps[2], "/v3/election/observe", &json!({"name": name})).await?;
    let line = observe.next(LINE_TIMEOUT).await?.context("observe ended")?;
    assert_eq!(line["result"]["kv"]["value"], b64("v1"), "{line}");
    let proclaim = json!({"leader": leader, "value": b64("v2")});
    http.post(&eps[0], "/v3/election/proclaim", &proclaim).await?.ok()?;
    let line = observe.next(LINE_TIMEOUT).await?.context("observe ended")?;
    assert_eq!(line["result"]["kv"]["value"], b64("v2"), "{line}");
    http.post(&eps[1], "/v3/election/resign", &json!({"leader": leader})).await?.ok()?;
    Ok(())
}

async fn bad_requests(http: &Http, eps: &[String]) -> Result<()> {
    info!("malformed and oversized bodies are refused and nothing is applied");
    let key = b64("gw/bad/k");
    let before = revision(&http.post(&eps[0], "/v3/kv/range", &json!({"key": key})).await?.ok()?)?;
    let r = http.post_raw(&eps[0], "/v3/kv/put", format!("{{\"key\":\"{key}\",").into()).await?;
    assert_error(&r, 400, 3, "");
    let r = http.post(&eps[1], "/v3/kv/put", &json!({"key": key, "value": "!!not base64"})).await?;
    assert_error(&r, 400, 3, "");
    let r = http.post(&eps[2], "/v3/kv/put", &json!({"key": key, "lease": 1.5})).await?;
    assert_error(&r, 400, 3, "");
    let r =
        http.post(&eps[0], "/v3/kv/range", &json!({"key": key, "sort_order": "SIDEWAYS"})).await?;
    assert_error(&r, 400, 3, "");
    let r = http.post(&eps[0], "/v3/kv/put", &json!({})).await?;
    assert_error(&r, 400, 3, "etcdserver: key is not provided");
    // Above --max-request-bytes, within gRPC's allowance: the server's own check.
    let value = base64(&vec![b'x'; MAX_REQUEST_BYTES + 1]);
    let r = http.post(&eps[1], "/v3/kv/put", &json!({"key": key, "value": value})).await?;
    assert_error(&r, 400, 3, "etcdserver: request is too large");
    // Beyond gRPC's allowance too: the transport's limit, as etcd's gateway relays it.
    let value = base64(&vec![b'x'; MAX_REQUEST_BYTES + 1024 * 1024]);
    let r = http.post(&eps[2], "/v3/kv/put", &json!({"key": key, "value": value})).await?;
    assert_error(&r, 429, 8, "grpc: received message larger than max");
    let r = http.post(&eps[0], "/v3/kv/range", &json!({"key": key})).await?.ok()?;
    ensure!(r.get("kvs").is_none(), "a refused put was applied: {r}");
    assert_eq!(revision(&r)?, before, "a refused request changed the revision");

    let r = http.post(&eps[0], "/v3/kv/nothing", &json!({})).await?;
    assert_eq!(r.status, 404, "{r:?}");
    let r = http.get(&eps[0], "/v3/kv/range").await?;
    assert_eq!(r.status, 405, "{r:?}");
    Ok(())
}

async fn auth_routes(http: &Http, eps: &[String]) -> Result<()> {
    info!("auth: users and roles through the gateway, then the token in Authorization");
    let ok = |ep: usize, path: &'static str, body: Value| {
        let (http, ep) = (http.clone(), eps[ep].clone());
        async move { http.post(&ep, path, &body).await?.ok() }
    };
    ok(0, "/v3/auth/user/add", json!({"name": "root", "password": "rootpw"})).await?;
    ok(1, "/v3/auth/user/grant", json!({"user": "root", "role": "root"})).await?;
    ok(2, "/v3/auth/role/add", json!({"name": "gw"})).await?;
    let perm =
        json!({"permType": "READWRITE", "key": b64("gw/auth/"), "range_end": b64("gw/auth0")});
    ok(0, "/v3/auth/role/grant", json!({"name": "gw", "perm": perm})).await?;
    let r = ok(1, "/v3/auth/role/get", json!({"role": "gw"})).await?;
    assert_eq!(r["perm"][0]["permType"], "READWRITE", "{r}");
    ok(2, "/v3/auth/user/add", json!({"name": "alice", "password": "pw1"})).await?;
    ok(0, "/v3/auth/user/grant", json!({"user": "alice", "role": "gw"})).await?;
    ok(1, "/v3/auth/enable", json!({})).await?;
    // An anonymous linearizable read is refused on every member. It also waits (its read
    // barrier) until each member has applied the enable; a write judged on a member that has
    // not is refused at apply, with the same "user name is empty" as etcd's recheck at apply.
    for ep in eps {
        let r = http.post(ep, "/v3/kv/range", &json!({"key": b64("gw/auth/a")})).await?;
        assert_error(&r, 400, 3, "etcdserver: user name is empty");
    }

    let put = |k: &str| json!({"key": b64(k), "value": b64("v")});
    let r = http.post(&eps[2], "/v3/kv/put", &put("gw/auth/a")).await?;
    assert_error(&r, 400, 3, "etcdserver: user name is empty");
    let bad = json!({"name": "alice", "password": "nope"});
    let r = http.post(&eps[0], "/v3/auth/authenticate", &bad).await?;
    assert_error(&r, 400, 3, "etcdserver: authentication failed, invalid user ID or password");
    let good = json!({"name": "alice", "password": "pw1"});
    let auth = http.post(&eps[0], "/v3/auth/authenticate", &good).await?.ok()?;
    let token = auth["token"].as_str().context("no token")?;
    let alice = http.with_token(token);
    alice.post(&eps[0], "/v3/kv/put", &put("gw/auth/a")).await?.ok()?;
    let r = alice.post(&eps[1], "/v3/kv/put", &put("gw/other")).await?;
    assert_error(&r, 403, 7, "etcdserver: permission denied");
    let r = http.with_token("garbage").post(&eps[2], "/v3/kv/put", &put("gw/auth/a")).await?;
    assert_error(&r, 401, 16, "etcdserver: invalid auth token");
    let r = alice.post(&eps[0], "/v3/auth/user/list", &json!({})).await?;
    assert_error(&r, 403, 7, "etcdserver: permission denied");

    let root_pw = json!({"name": "root", "password": "rootpw"});
    let r = http.post(&eps[1], "/v3/auth/authenticate", &root_pw).await?.ok()?;
    let root = http.with_token(r["token"].as_str().context("no root token")?);
    let r = root.post(&eps[1], "/v3/auth/user/list", &json!({})).await?.ok()?;
    assert_eq!(r["users"], json!(["alice", "root"]), "{r}");
    let r = root.post(&eps[2], "/v3/auth/user/get", &json!({"name": "alice"})).await?.ok()?;
    assert_eq!(r["roles"], json!(["gw"]), "{r}");
    let r = root.post(&eps[0], "/v3/auth/role/list", &json!({})).await?.ok()?;
    ensure!(r["roles"].as_array().is_some_and(|a| a.contains(&json!("gw"))), "{r}");
    let revoke = json!({"role": "gw", "key": b64("gw/auth/"), "range_end": b64("gw/auth0")});
    root.post(&eps[1], "/v3/auth/role/revoke", &revoke).await?.ok()?;
    let changepw = json!({"name": "alice", "password": "pw2"});
    root.post(&eps[2], "/v3/auth/user/changepw", &changepw).await?.ok()?;
    root.post(&eps[0], "/v3/auth/user/revoke", &json!({"name": "alice", "role": "gw"}))
        .await?
        .ok()?;
    root.post(&eps[1], "/v3/auth/user/delete", &json!({"name": "alice"})).await?.ok()?;
    root.post(&eps[2], "/v3/auth/role/delete", &json!({"role": "gw"})).await?.ok()?;
    root.post(&eps[0], "/v3/auth/disable", &json!({})).await?.ok()?;
    // Auth off: no token needed again.
    http.post(&eps[1], "/v3/kv/put", &put("gw/other")).await?.ok()?;
    ok(2, "/v3/auth/user/delete", json!({"name": "root"})).await?;
    Ok(())
}

/// One event stream across a leader kill: the watcher follows the leader, and when its stream
/// breaks it reconnects to the next member from the revision after the last one it saw. It must
/// see every applied write of the prefix exactly once, in order.
async fn watch_across_leader_kill(http: &Http, cluster: &mut Cluster) -> Result<()> {
    let eps: Vec<String> = (0..3).map(|i| cluster.endpoint(i)).collect();
    let leader = cluster.leader().await?;
    info!(leader, "watch across a leader kill: watching the leader");
    let (key, end) = (b64("gw/fail/"), b64("gw/fail0"));
    let start =
        revision(&http.post(&eps[leader], "/v3/kv/range", &json!({"key": key})).await?.ok()?)? + 1;
    let (target_tx, target_rx) = tokio::sync::watch::channel(i64::MAX);
    let watcher = {
        let (http, eps) = (http.clone(), eps.clone());
        tokio::spawn(async move { follow(&http, &eps, leader, &key, &end, start, target_rx).await })
    };

    let mut dead = None;
    for i in 0..30usize {
        if i == 10 {
            info!(leader, "killing the leader");
            cluster.kill(leader)?;
            dead = Some(leader);
        }
        let put = json!({"key": b64(&format!("gw/fail/{i:02}")), "value": b64("v")});
        // Retried (against the next member) while a new leader is elected; a put that failed
        // may still have been applied, which the final range below accounts for.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut member = i % 3;
        loop {
            if Some(member) != dead {
                match http.post(&eps[member], "/v3/kv/put", &put).await {
                    Ok(r) if r.status == 200 => break,
                    Ok(r) => {
                        info!(member, status = r.status, body = %r.body, "put refused; retrying")
                    }
                    Err(e) => info!(member, error = %e, "put failed; retrying"),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            member = (member + 1) % 3;
            ensure!(Instant::now() < deadline, "put {i} not acknowledged in 30 s");
        }
    }
    let live = (leader + 1) % 3;
    let all = json!({"key": b64("gw/fail/"), "range_end": b64("gw/fail0")});
    let r = http.post(&eps[live], "/v3/kv/range", &all).await?.ok()?;
    let applied: Vec<i64> = r["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|kv| int(kv, "mod_revision"))
        .collect::<Result<_>>()?;
    let applied: BTreeSet<i64> = applied.into_iter().collect();
    ensure!(applied.len() >= 30, "only {} of 30 acknowledged puts are there", applied.len());
    let last = *applied.last().context("no puts")?;
    target_tx.send(last)?;
    let seen = tokio::time::timeout(Duration::from_secs(60), watcher).await???;
    let seen_set: BTreeSet<i64> = seen.iter().copied().collect();
    ensure!(seen_set.len() == seen.len(), "duplicate events: {seen:?}");
    ensure!(seen.windows(2).all(|w| w[0] < w[1]), "events out of order: {seen:?}");
    ensure!(seen_set == applied, "watched {seen:?}, applied {applied:?}");
    Ok(())
}

/// The watcher of [`watch_across_leader_kill`]: returns the mod revisions it saw, once it saw
/// `target`'s.
async fn follow(
    http: &Http,
    eps: &[String],
    mut member: usize,
    key: &str,
    end: &str,
    start: i64,
    target: tokio::sync::watch::Receiver<i64>,
) -> Result<Vec<i64>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen: Vec<i64> = Vec::new();
    let mut next = start;
    let mut reconnects = 0;
    while Instant::now() < deadline {
        if next > *target.borrow() {
            ensure!(reconnects > 0, "the stream never broke: was the watched member killed?");
            return Ok(seen);
        }
        let create = json!({"create_request": {"key": key, "range_end": end, "start_revision": next.to_string()}});
        let mut lines = match http.stream(&eps[member], "/v3/watch", &create).await {
            Ok(l) if l.status == 200 => l,
            other => {
                info!(member, reply = ?other.map(|l| l.status), "watch not opened; next member");
                member = (member + 1) % eps.len();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        loop {
            if next > *target.borrow() {
                break;
            }
            match lines.poll(Duration::from_millis(500)).await {
                Ok(Next::Idle) => {}
                Ok(Next::Line(line)) => {
                    let res = &line["result"];
                    ensure!(res["canceled"] != true, "watch canceled: {line}");
                    for ev in res["events"].as_array().into_iter().flatten() {
                        let rev = int(&ev["kv"], "mod_revision")?;
                        seen.push(rev);
                        next = rev + 1;
                    }
                }
                Ok(Next::End) | Err(_) => {
                    info!(member, next, "watch stream broke; resuming on the next member");
                    reconnects += 1;
                    member = (member + 1) % eps.len();
                    break;
                }
            }
        }
    }
    bail!("the watcher did not see every write in 120 s; saw {seen:?}")
}

async fn run_all(cluster: &mut Cluster) -> Result<()> {
    let http = Http::new();
    let eps: Vec<String> = (0..3).map(|i| cluster.endpoint(i)).collect();
    kv_routes(&http, &eps).await?;
    watch_routes(&http, &eps).await?;
    lease_routes(&http, &eps).await?;
    cluster_and_maintenance(&http, &eps).await?;
    lock_and_election(&http, &eps).await?;
    bad_requests(&http, &eps).await?;
    auth_routes(&http, &eps).await?;
    watch_across_leader_kill(&http, cluster).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_against_picket() -> Result<()> {
    let mut cluster = Cluster::start(3, ClusterOptions::default()).await?;
    let res = run_all(&mut cluster).await;
    if res.is_err() {
        cluster.print_logs();
    }
    cluster.finish();
    res
}

/// The same bodies against etcd 3.4: the spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_against_etcd() -> Result<()> {
    // Fails, naming the package, when etcd is missing: this test never passes by skipping.
    let etcd = picket_procs::tools::etcd()?;
    let opts = ClusterOptions { binary: Some(etcd), ..ClusterOptions::default() };
    let mut cluster = Cluster::start(3, opts).await?;
    let res = run_all(&mut cluster).await;
    if res.is_err() {
        cluster.print_logs();
    }
    cluster.finish();
    res
}
