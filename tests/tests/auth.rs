//! Authentication and RBAC (etcd's `Auth` service) with real `picketd` processes: the etcd Rust
//! client (`etcd-client`, which authenticates like etcd's Go client), the Picket client crate,
//! raw gRPC for forged and expired tokens, and Debian's `etcdctl` 3.4 with `--user`.
//!
//! Members run with `--bcrypt-cost 4` (bcrypt's minimum) so that hashing on the 2-core test
//! machine costs milliseconds; the cost does not change any behaviour under test.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use etcd_client::{Client, Compare, CompareOp, GetOptions, LockOptions, Permission, Txn, TxnOp};
use picket_proto::etcdserverpb::auth_client::AuthClient;
use picket_proto::etcdserverpb::kv_client::KvClient;
use picket_proto::etcdserverpb::{AuthenticateRequest, RangeRequest};
use picket_tests::cluster::{connect_as, READY_TIMEOUT};
use picket_tests::etcdctl::{self, Etcdctl};
use picket_tests::util::eventually;
use picket_tests::{assert_status, Cluster, ClusterOptions};
use tonic::Code;
use tracing::info;

const DENIED: &str = "etcdserver: permission denied";
const INVALID_TOKEN: &str = "etcdserver: invalid auth token";
const AUTH_FAILED: &str = "etcdserver: authentication failed, invalid user ID or password";
const ROOT_PW: &str = "rootpw";
const ALICE_PW: &str = "alicepw";

fn opts(extra: &[&str]) -> ClusterOptions {
    ClusterOptions {
        extra_args: ["--bcrypt-cost", "4"].iter().chain(extra).map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// root (with the root role) and alice (READWRITE on the prefix `/app/`), then auth enabled.
async fn setup(c: &mut Client) -> Result<()> {
    c.user_add("root", ROOT_PW, None).await?;
    c.user_grant_role("root", "root").await?;
    c.role_add("app").await?;
    c.role_grant_permission("app", Permission::read_write("/app/").with_prefix()).await?;
    c.user_add("alice", ALICE_PW, None).await?;
    c.user_grant_role("alice", "app").await?;
    c.auth_enable().await?;
    Ok(())
}

/// Authenticates with raw gRPC and returns the token.
async fn raw_token(endpoint: &str, user: &str, password: &str) -> Result<String> {
    let mut a = AuthClient::connect(endpoint.to_string()).await?;
    let r = a
        .authenticate(AuthenticateRequest { name: user.into(), password: password.into() })
        .await?;
    Ok(r.into_inner().token)
}

/// A linearizable Range of `key` with `token` in the metadata, as etcd clients send it.
async fn raw_get(endpoint: &str, token: &str, key: &str) -> Result<(), tonic::Status> {
    let mut kv = KvClient::connect(endpoint.to_string())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut req = tonic::Request::new(RangeRequest { key: key.into(), ..Default::default() });
    let value = token.parse().map_err(|_| tonic::Status::invalid_argument("token metadata"))?;
    req.metadata_mut().insert("token", value);
    kv.range(req).await.map(|_| ())
}

fn assert_raw(res: Result<(), tonic::Status>, code: Code, message: &str) {
    match res {
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert_eq!(s.message(), message, "{s:?}");
        }
        Ok(()) => panic!("expected {code:?} {message:?}, got success"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_is_confined_to_its_key_range() -> Result<()> {
    let cluster = Cluster::start(1, opts(&[])).await?;
    let ep = cluster.endpoint(0);
    let mut anon = cluster.client(0).await?;
    setup(&mut anon).await?;

    info!("without a token every request is refused once auth is on");
    assert_status(
        anon.get("/app/x", None).await,
        Code::InvalidArgument,
        "etcdserver: user name is empty",
    );

    info!("alice reads, writes, deletes, txns, watches and locks inside /app/");
    let mut alice = connect_as(&ep, "alice", ALICE_PW).await?;
    alice.put("/app/a", "1", None).await?;
    let got = alice.get("/app/a", None).await?;
    assert_eq!(got.kvs()[0].value(), b"1");
    alice.get("/app/", Some(GetOptions::new().with_prefix())).await?;
    let txn = Txn::new()
        .when([Compare::value("/app/a", CompareOp::Equal, "1")])
        .and_then([TxnOp::put("/app/b", "2", None)])
        .or_else([TxnOp::delete("/app/c", None)]);
    assert!(alice.txn(txn).await?.succeeded());
    let mut stream =
        alice.watch("/app/", Some(etcd_client::WatchOptions::new().with_prefix())).await?;
    alice.put("/app/w", "x", None).await?;
    // The first message is the "created" answer; the event follows. Bounded: a few messages.
    let mut seen = false;
    for _ in 0..5 {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .context("watch event")??
            .context("watch ended")?;
        if msg.events().iter().any(|e| e.kv().is_some_and(|kv| kv.key() == b"/app/w")) {
            seen = true;
            break;
        }
    }
    ensure!(seen, "alice's watch inside /app/ saw no event");
    let lock = alice.lock("/app/lk", None::<LockOptions>).await?;
    alice.unlock(lock.key()).await?;
    alice.delete("/app/b", None).await?;

    info!("and is refused everything outside it");
    assert_status(alice.get("/other", None).await, Code::PermissionDenied, DENIED);
    assert_status(
        alice.get("/app/", Some(GetOptions::new().with_from_key())).await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(alice.put("/other", "x", None).await, Code::PermissionDenied, DENIED);
    assert_status(alice.delete("/other", None).await, Code::PermissionDenied, DENIED);
    let sneaky = Txn::new()
        .when([Compare::value("/app/a", CompareOp::Equal, "nope")])
        .and_then([TxnOp::put("/app/b", "2", None)])
        .or_else([TxnOp::put("/other", "x", None)]);
    assert_status(alice.txn(sneaky).await, Code::PermissionDenied, DENIED);
    let peek = Txn::new().when([Compare::version("/secret", CompareOp::Equal, 0)]);
    assert_status(alice.txn(peek).await, Code::PermissionDenied, DENIED);
    assert_status(
        alice.lock("/other/lk", None::<LockOptions>).await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(alice.user_list().await, Code::PermissionDenied, DENIED);
    match alice.watch("/other", None).await {
        Err(e) => ensure!(e.to_string().contains("permission denied"), "{e}"),
        Ok(mut s) => {
            let first = tokio::time::timeout(Duration::from_secs(10), s.message()).await;
            let refused = match first {
                Ok(Ok(Some(ref m))) => {
                    m.canceled() && m.cancel_reason().contains("permission denied")
                }
                Ok(Err(ref e)) => e.to_string().contains("permission denied"),
                _ => false,
            };
            ensure!(refused, "watch outside /app/ was not refused: {first:?}");
        }
    }
    let outside = anon_free_get(&ep, "/other").await;
    ensure!(outside.is_err(), "unauthenticated raw get must fail");

    info!("any authenticated user may compact, as in etcd 3.4 (its auth applier checks no key)");
    alice.compact(1, None).await?;
    assert_status(
        anon.compact(1, None).await,
        Code::InvalidArgument,
        "etcdserver: user name is empty",
    );

    info!("root may do everything");
    let mut root = connect_as(&ep, "root", ROOT_PW).await?;
    root.put("/other", "root-was-here", None).await?;
    assert_eq!(root.get("/other", None).await?.kvs()[0].value(), b"root-was-here");
    root.compact(2, None).await?;
    let users = root.user_list().await?;
    assert_eq!(users.users(), ["alice", "root"]);

    info!("a wrong password is refused");
    let wrong = connect_as(&ep, "alice", "not-it").await;
    let msg = format!("{:#}", wrong.err().context("wrong password accepted")?);
    ensure!(msg.contains(AUTH_FAILED), "{msg}");

    info!("revoking the permission takes effect on alice's next request");
    root.role_revoke_permission(
        "app",
        "/app/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await?;
    assert_status(alice.get("/app/a", None).await, Code::PermissionDenied, DENIED);
    assert_status(alice.put("/app/a", "2", None).await, Code::PermissionDenied, DENIED);

    info!("a forged token is refused: right shape, signed with the wrong key");
    let token = raw_token(&ep, "root", ROOT_PW).await?;
    raw_get(&ep, &token, "/other").await?;
    let mut parts: Vec<String> = token.split('.').map(str::to_string).collect();
    let sig = parts.last_mut().context("token shape")?;
    let flipped = if sig.starts_with('A') { "B" } else { "A" };
    sig.replace_range(0..1, flipped);
    assert_raw(
        raw_get(&ep, &parts.join("."), "/other").await,
        Code::Unauthenticated,
        INVALID_TOKEN,
    );
    assert_raw(raw_get(&ep, "not-a-token", "/other").await, Code::Unauthenticated, INVALID_TOKEN);
    cluster.finish();
    Ok(())
}

/// A raw Range with no token at all.
async fn anon_free_get(endpoint: &str, key: &str) -> Result<(), tonic::Status> {
    let mut kv = KvClient::connect(endpoint.to_string())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    kv.range(RangeRequest { key: key.into(), ..Default::default() }).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_expire_and_the_picket_client_re_authenticates() -> Result<()> {
    let cluster = Cluster::start(1, opts(&["--auth-token-ttl", "1"])).await?;
    let ep = cluster.endpoint(0);
    let mut anon = cluster.client(0).await?;
    setup(&mut anon).await?;

    info!("a token is refused once its TTL (1 s) has passed");
    let token = raw_token(&ep, "alice", ALICE_PW).await?;
    raw_get(&ep, &token, "/app/x").await?;
    eventually("the token to expire", Duration::from_secs(10), || async {
        match raw_get(&ep, &token, "/app/x").await {
            Err(s) if s.code() == Code::Unauthenticated && s.message() == INVALID_TOKEN => Ok(()),
            other => anyhow::bail!("still accepted: {other:?}"),
        }
    })
    .await?;

    info!("the Picket client gets a new token by itself when its token expires");
    let opts = picket_client::ConnectOptions::default().with_user("alice", ALICE_PW);
    let pc = picket_client::Client::connect_with([ep.as_str()], opts).await?;
    pc.put("/app/p", "1").await?;
    // A 1 s token lives at least 1 s and less than 2 s (whole-second expiry, rounded up).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    pc.put("/app/p", "2").await?;
    assert_eq!(pc.get("/app/p").await?.context("/app/p")?.value, b"2");
    let denied = pc.put("/other", "x").await.err().context("write outside /app/ accepted")?;
    ensure!(denied.to_string().contains("permission denied"), "{denied}");
    let bad = picket_client::Client::connect_with(
        [ep.as_str()],
        picket_client::ConnectOptions::default().with_user("alice", "wrong"),
    )
    .await;
    ensure!(bad.is_err(), "a wrong password must fail the connect");
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_user_manages_auth_and_is_confined() -> Result<()> {
    etcdctl::path()?;
    let cluster = Cluster::start(1, opts(&[])).await?;
    let ctl = Etcdctl::new(&cluster.endpoints());
    let as_root = ["--user", "root:rootpw"];
    let run = |args: Vec<&'static str>| {
        let ctl = &ctl;
        async move { ctl.run(&args, None).await }
    };

    info!("etcdctl sets up root and enables auth");
    run(vec!["user", "add", "root", "--new-user-password", ROOT_PW, "--interactive=false"])
        .await?
        .ok()?;
    run(vec!["user", "grant-role", "root", "root"]).await?.ok()?;
    run(vec!["auth", "enable"]).await?.ok()?;

    info!("etcdctl --user root:pw adds a user and a role, grants a prefix and the role");
    let with_root = |rest: &[&'static str]| {
        as_root.iter().copied().chain(rest.iter().copied()).collect::<Vec<_>>()
    };
    run(with_root(&[
        "user",
        "add",
        "alice",
        "--new-user-password",
        ALICE_PW,
        "--interactive=false",
    ]))
    .await?
    .ok()?;
    run(with_root(&["role", "add", "app"])).await?.ok()?;
    run(with_root(&["role", "grant-permission", "app", "readwrite", "/app/", "--prefix"]))
        .await?
        .ok()?;
    run(with_root(&["user", "grant-role", "alice", "app"])).await?.ok()?;
    let got = run(with_root(&["role", "get", "app"])).await?.ok()?;
    ensure!(got.stdout.contains("/app/"), "{}", got.stdout);

    info!("the restricted user writes inside and is denied outside");
    let as_alice = |rest: &[&'static str]| {
        ["--user", "alice:alicepw"].into_iter().chain(rest.iter().copied()).collect::<Vec<_>>()
    };
    run(as_alice(&["put", "/app/k", "v"])).await?.ok()?;
    let read = run(as_alice(&["get", "/app/k"])).await?.ok()?;
    ensure!(read.stdout.contains('v'), "{}", read.stdout);
    let out = run(as_alice(&["get", "/other"])).await?;
    ensure!(!out.success && out.stderr.contains("permission denied"), "{out:?}");
    let out = run(as_alice(&["put", "/other", "x"])).await?;
    ensure!(!out.success && out.stderr.contains("permission denied"), "{out:?}");
    let out = run(vec!["--user", "alice:wrong", "get", "/app/k"]).await?;
    ensure!(!out.success && out.stderr.contains("authentication failed"), "{out:?}");
    let out = run(vec!["get", "/app/k"]).await?;
    ensure!(!out.success && out.stderr.contains("user name is empty"), "{out:?}");

    cluster.finish();
    Ok(())
}

/// Runs the `picket` CLI (built next to `picketd` by `cargo build --workspace --bins`).
fn picket(endpoint: &str, args: &[&str]) -> Result<std::process::Output> {
    let bin = picket_tests::binary::picketd_bin()?.with_file_name("picket");
    std::process::Command::new(&bin)
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {} {args:?}", bin.display()))
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picket_cli_manages_users_roles_and_auth() -> Result<()> {
    let cluster = Cluster::start(1, opts(&[])).await?;
    let ep = cluster.endpoint(0);
    let ok = |args: &[&str]| -> Result<String> {
        let o = picket(&ep, args)?;
        ensure!(o.status.success(), "picket {args:?}: {o:?}");
        Ok(stdout(&o))
    };

    info!("picket sets up root, a role with a prefix and a user, then enables auth");
    ok(&["user", "add", "root", "--new-user-password", ROOT_PW])?;
    ok(&["user", "grant-role", "root", "root"])?;
    // --user against a cluster whose auth is still off works, as with etcdctl.
    let o = picket(&ep, &["--user", "root:rootpw", "get", "nothing"])?;
    ensure!(o.status.code() == Some(3), "not found expected: {o:?}");
    ok(&["auth", "enable"])?;
    let root = |rest: &[&str]| -> Result<String> {
        let mut args = vec!["--user", "root:rootpw"];
        args.extend_from_slice(rest);
        ok(&args)
    };
    root(&["role", "add", "app"])?;
    root(&["role", "grant-permission", "app", "readwrite", "/app/", "--prefix"])?;
    root(&["user", "add", "carol:carolpw"])?;
    root(&["user", "grant-role", "carol", "app"])?;
    ensure!(root(&["user", "get", "carol"])?.contains("Roles: app"));
    assert_eq!(
        root(&["user", "list", "-w", "simple"])?.lines().collect::<Vec<_>>(),
        ["carol", "root"]
    );
    ensure!(root(&["role", "get", "app"])?.contains("READWRITE"));
    ensure!(root(&["auth", "status"])?.contains("Authentication Status: true"));

    info!("carol is confined to /app/, with --user name --password pw");
    ok(&["--user", "carol", "--password", "carolpw", "put", "/app/k", "v"])?;
    let o = picket(&ep, &["--user", "carol", "--password", "carolpw", "get", "/other"])?;
    ensure!(!o.status.success(), "{o:?}");
    ensure!(String::from_utf8_lossy(&o.stderr).contains("permission denied"), "{o:?}");
    let o = picket(&ep, &["--user", "carol:wrong", "get", "/app/k"])?;
    ensure!(String::from_utf8_lossy(&o.stderr).contains("authentication failed"), "{o:?}");

    info!("revoking the prefix and disabling auth");
    root(&["role", "revoke-permission", "app", "/app/", "--prefix"])?;
    let o = picket(&ep, &["--user", "carol:carolpw", "get", "/app/k"])?;
    ensure!(String::from_utf8_lossy(&o.stderr).contains("permission denied"), "{o:?}");
    root(&["auth", "disable"])?;
    ensure!(ok(&["get", "/app/k", "-w", "simple"])?.contains('v'));
    cluster.finish();
    Ok(())
}

/// Starts member `i` again and waits until alice can read through it (the harness's own
/// readiness probe has no credentials).
async fn restart_with_auth(cluster: &mut Cluster, i: usize) -> Result<()> {
    cluster.spawn(i)?;
    let ep = cluster.endpoint(i);
    eventually("the restarted member to serve alice", READY_TIMEOUT, || async {
        let mut c = connect_as(&ep, "alice", ALICE_PW).await?;
        c.get("/app/k", None).await?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_agree_and_auth_survives_restart_and_restore() -> Result<()> {
    let mut cluster = Cluster::start(3, opts(&[])).await?;
    let mut anon = cluster.client(0).await?;
    setup(&mut anon).await?;
    let mut alice = connect_as(&cluster.endpoint(0), "alice", ALICE_PW).await?;
    alice.put("/app/k", "v", None).await?;

    info!("a token from one member works on every other member");
    let token = raw_token(&cluster.endpoint(0), "alice", ALICE_PW).await?;
    for i in 1..3 {
        let ep = cluster.endpoint(i);
        eventually("the token to work on another member", Duration::from_secs(10), || async {
            raw_get(&ep, &token, "/app/k").await.map_err(anyhow::Error::from)
        })
        .await?;
        assert_raw(raw_get(&ep, &token, "/other").await, Code::PermissionDenied, DENIED);
    }

    info!("auth state survives a restart of every member");
    for i in 0..3 {
        cluster.stop(i).await?;
    }
    for i in 0..3 {
        cluster.spawn(i)?;
    }
    for i in 0..3 {
        let ep = cluster.endpoint(i);
        eventually("alice to read after the restart", READY_TIMEOUT, || async {
            let mut c = connect_as(&ep, "alice", ALICE_PW).await?;
            c.get("/app/k", None).await?;
            Ok(())
        })
        .await?;
    }
    let mut alice = connect_as(&cluster.endpoint(1), "alice", ALICE_PW).await?;
    assert_status(alice.get("/other", None).await, Code::PermissionDenied, DENIED);

    info!("and a snapshot restored into a new cluster");
    let mut root = connect_as(&cluster.endpoint(0), "root", ROOT_PW).await?;
    let mut stream = root.snapshot().await?;
    let mut file = Vec::new();
    for _ in 0..1_000_000 {
        let Some(msg) = stream.message().await? else { break };
        file.extend_from_slice(msg.blob());
        if msg.remaining_bytes() == 0 {
            break;
        }
    }
    let path = cluster.root().join("auth-backup.db");
    std::fs::write(&path, &file)?;
    let mut dst = Cluster::create(1, opts(&[]))?;
    let mut o = picket_server::restore::RestoreOptions::new(&path);
    o.name = dst.name(0).to_string();
    o.data_dir = Some(dst.data_dir(0).to_path_buf());
    o.initial_cluster = Some(dst.initial_cluster().to_string());
    o.initial_advertise_peer_urls = dst.peer_url(0);
    picket_server::restore::restore_snapshot(&o)?;
    restart_with_auth(&mut dst, 0).await?;
    let mut alice = connect_as(&dst.endpoint(0), "alice", ALICE_PW).await?;
    assert_eq!(alice.get("/app/k", None).await?.kvs()[0].value(), b"v");
    assert_status(alice.get("/other", None).await, Code::PermissionDenied, DENIED);
    dst.finish();
    cluster.finish();
    Ok(())
}

/// The Queue and Subscriptions services (picket.v1) are checked like KV: alice, confined to
/// `/app/`, can neither enqueue to nor inspect a queue outside her range, nor create or commit a
/// subscription group there; granted `picket/queue/jobs/` she can use that queue and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_and_subscriptions_are_checked() -> Result<()> {
    let cluster = Cluster::start(1, opts(&[])).await?;
    let ep = cluster.endpoint(0);
    let mut anon = cluster.client(0).await?;
    setup(&mut anon).await?;
    let as_user = |user: &'static str, pw: &'static str| {
        let ep = ep.clone();
        async move {
            let o = picket_client::ConnectOptions::default().with_user(user, pw);
            picket_client::Client::connect_with([ep], o).await
        }
    };
    let alice = as_user("alice", ALICE_PW).await?;
    let denied = |r: std::result::Result<(), picket_client::Error>, what: &str| {
        let e = r.expect_err(what);
        assert!(e.to_string().contains("permission denied"), "{what}: {e}");
    };
    denied(alice.queue("jobs").enqueue("x").await.map(|_| ()), "enqueue outside the range");
    denied(alice.queue("jobs").inspect(10).await.map(|_| ()), "inspect outside the range");
    let opts = picket_client::GroupOptions::new().prefix();
    denied(
        alice.create_group("g", "/other/", opts.clone()).await.map(|_| ()),
        "group over /other/",
    );
    // A group over her own range still writes its record under picket/sub/: refused too.
    denied(alice.create_group("g", "/app/", opts.clone()).await.map(|_| ()), "group record");

    // Grant the queue's prefix: that queue works, another one is still refused.
    let mut root = connect_as(&ep, "root", ROOT_PW).await?;
    root.role_grant_permission("app", Permission::read_write("picket/queue/jobs/").with_prefix())
        .await?;
    let alice = as_user("alice", ALICE_PW).await?;
    alice.queue("jobs").enqueue("x").await.context("enqueue after the grant")?;
    let stats = alice.queue("jobs").inspect(10).await?;
    info!(?stats, "alice's queue");
    denied(alice.queue("other").enqueue("x").await.map(|_| ()), "enqueue to another queue");
    // root may do anything, including groups.
    let root_client = as_user("root", ROOT_PW).await?;
    root_client.create_group("audit", "/app/", opts).await.context("root creates a group")?;
    Ok(())
}

/// Issue 21, gap 3: auth management refusals carry etcd's codes and texts (clients match both).
/// `InvalidAuthMgmt` is InvalidArgument in etcd's `rpctypes`, and a role never created (`root`
/// included: etcd's RoleGet reads only the roles that were added) is "role name not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_refusals_carry_etcds_codes() -> Result<()> {
    let cluster = Cluster::start(1, opts(&[])).await?;
    let ep = cluster.endpoint(0);
    let mut anon = cluster.client(0).await?;
    setup(&mut anon).await?;
    let mut root = connect_as(&ep, "root", ROOT_PW).await?;

    info!("a role never created, and root's role, which setup granted but never added");
    const NO_ROLE: &str = "etcdserver: role name not found";
    assert_status(root.role_get("never-made").await, Code::FailedPrecondition, NO_ROLE);
    assert_status(root.role_get("root").await, Code::FailedPrecondition, NO_ROLE);
    ensure!(!root.role_get("app").await?.permissions().is_empty(), "app lost its permission");

    info!("deleting root, or taking the root role from root, while auth is on");
    const MGMT: &str = "etcdserver: invalid auth management";
    assert_status(root.user_delete("root").await, Code::InvalidArgument, MGMT);
    assert_status(root.user_revoke_role("root", "root").await, Code::InvalidArgument, MGMT);
    cluster.finish();
    Ok(())
}

/// Issue 21, gap 3: a lease carries no rights past RBAC (etcd `checkLeasePuts`, and
/// `checkLeaseTimeToLive` from 3.4.26/3.5.8). Attaching a lease that holds a key the caller may
/// not write is refused (the caller could not revoke that lease), and TimeToLive with `keys`
/// is refused unless the caller may read every attached key; without `keys` it still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_grants_no_rights_past_rbac() -> Result<()> {
    use etcd_client::{LeaseTimeToLiveOptions, PutOptions};
    let cluster = Cluster::start(1, opts(&[])).await?;
    let ep = cluster.endpoint(0);
    let mut anon = cluster.client(0).await?;
    setup(&mut anon).await?;
    let mut root = connect_as(&ep, "root", ROOT_PW).await?;
    let mut alice = connect_as(&ep, "alice", ALICE_PW).await?;

    info!("root's lease holds /other/k, which alice may neither read nor write");
    let theirs = root.lease_grant(60, None).await?.id();
    root.put("/other/k", "v", Some(PutOptions::new().with_lease(theirs))).await?;

    info!("alice may not attach it, not even to a key she may write");
    let attach = Some(PutOptions::new().with_lease(theirs));
    assert_status(alice.put("/app/x", "v", attach).await, Code::PermissionDenied, DENIED);
    ensure!(alice.get("/app/x", None).await?.kvs().is_empty(), "the refused put was applied");

    info!("nor list its keys; its TTL alone is still hers to read");
    let keys = || Some(LeaseTimeToLiveOptions::new().with_keys());
    assert_status(alice.lease_time_to_live(theirs, keys()).await, Code::PermissionDenied, DENIED);
    let ttl = alice.lease_time_to_live(theirs, None).await?;
    ensure!(ttl.ttl() > 0 && ttl.keys().is_empty(), "{ttl:?}");

    info!("her own lease, on her own keys, works as before");
    let hers = alice.lease_grant(60, None).await?.id();
    alice.put("/app/y", "v", Some(PutOptions::new().with_lease(hers))).await?;
    alice.put("/app/z", "v", Some(PutOptions::new().with_lease(hers))).await?;
    let ttl = alice.lease_time_to_live(hers, keys()).await?;
    assert_eq!(ttl.keys(), [b"/app/y".to_vec(), b"/app/z".to_vec()]);
    let ttl = root.lease_time_to_live(theirs, keys()).await?;
    assert_eq!(ttl.keys(), [b"/other/k".to_vec()]);
    cluster.finish();
    Ok(())
}
