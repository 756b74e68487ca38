//! End to end against a real etcd 3.4: history is made with etcdctl, `etcdctl snapshot save`
//! writes the file, and everything the reader takes from it is checked against what etcdctl
//! reports about the same member (live keys, history at each revision since the compaction,
//! leases, users and roles) and about the same file (`etcdctl snapshot status`).
//!
//! A missing etcd or etcdctl fails the test with the package to install; it never skips.

mod common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use common::{b64, int, kvs, Etcd, Kv};
use picket_etcdsnap::{read, status, Error, EtcdSnapshot, Status};

/// The compaction revision of the scenario: the delete of `k2` (see `make_history`).
const COMPACT_AT: i64 = 7;

/// Keys written by the scenario's one big txn (etcd's default `--max-txn-ops` is 128).
const BULK_KEYS: usize = 100;

#[test]
fn snapshots_of_a_real_etcd_match_what_etcdctl_reports() -> Result<()> {
    let started = Instant::now();
    let mut etcd = Etcd::start()?;

    let leases = make_history(&etcd)?;
    let plain = etcd.dir().join("plain.db");
    etcd.ctl([OsStr::new("snapshot"), OsStr::new("save"), plain.as_os_str()])?;
    let snap = check_snapshot(&etcd, &plain)?;
    ensure!(snap.compact_revision == Some(COMPACT_AT), "{:?}", snap.compact_revision);
    ensure!(snap.scheduled_compact_revision == Some(COMPACT_AT));
    let ids: BTreeSet<i64> = snap.leases.iter().map(|l| l.id).collect();
    ensure!(ids == leases, "leases {ids:?}, granted {leases:?}");
    ensure!(!snap.auth.enabled && snap.auth.users.is_empty() && snap.auth.roles.is_empty());
    check_damage(&std::fs::read(&plain)?)?;

    let mutations = enable_auth(&mut etcd)?;
    let with_auth = etcd.dir().join("auth.db");
    etcd.ctl([OsStr::new("snapshot"), OsStr::new("save"), with_auth.as_os_str()])?;
    let snap = check_snapshot(&etcd, &with_auth)?;
    ensure!(snap.auth.enabled);
    // etcd 3.4 starts the auth revision at 1 and bumps it once per user or role change;
    // enabling auth does not bump it.
    ensure!(snap.auth.revision == 1 + mutations, "auth revision {}", snap.auth.revision);
    check_auth(&etcd, &snap)?;

    eprintln!("end-to-end test took {:?}", started.elapsed());
    Ok(())
}

fn put(etcd: &Etcd, key: &[u8], value: &[u8]) -> Result<()> {
    etcd.ctl([OsStr::new("put"), OsStr::from_bytes(key), OsStr::from_bytes(value)])?;
    Ok(())
}

/// Writes the scenario's history; returns the lease ids granted. Revisions, in order: k1 three
/// times (2-4), k2 twice (5-6), delete k2 (7), a key with non-UTF-8 bytes (8), a txn writing a
/// key with a NUL byte, k3, the bulk keys and a big value (9), two keys on a lease (10-11);
/// compaction at 7; then k2 again (12, a new incarnation), k1 a fourth time (13) and a delete of
/// k3 (14).
fn make_history(etcd: &Etcd) -> Result<BTreeSet<i64>> {
    for v in ["v1", "v2", "v3"] {
        put(etcd, b"k1", v.as_bytes())?;
    }
    put(etcd, b"k2", b"a")?;
    put(etcd, b"k2", b"b")?;
    etcd.ctl(["del", "k2"])?;
    // Any byte but NUL can travel in argv.
    put(etcd, b"bin\x01\xff\nkey", b"\xfe\x80 value")?;
    // etcdctl's txn reads Go-quoted strings, the one way to send a NUL byte through it. The
    // bulk keys (one revision, many sub revisions) fill several leaf pages under a branch page
    // and the big value spans overflow pages, so the real file exercises both.
    let mut txn =
        b"mod(\"k1\") > \"0\"\n\nput \"nul\\x00key\" \"v\\x00\\xff\"\nput k3 x\n".to_vec();
    for i in 0..BULK_KEYS {
        txn.extend(format!("put bulk/{i:03} {}\n", "v".repeat(200)).into_bytes());
    }
    txn.extend(format!("put big {}\n\nput never 1\n\n", "b".repeat(3 * 4096)).into_bytes());
    let out = etcd.ctl_stdin(["txn"], &txn)?;
    ensure!(out.starts_with(b"SUCCESS"), "txn: {}", String::from_utf8_lossy(&out));
    let mut leases = BTreeSet::new();
    for ttl in ["600", "300"] {
        leases.insert(int(&etcd.json(["lease", "grant", ttl])?["ID"]));
    }
    let first = format!("--lease={:x}", leases.iter().next().context("a lease")?);
    etcd.ctl(["put", &first, "lk1", "a"])?;
    etcd.ctl(["put", &first, "lk2", "b"])?;
    let out = etcd.ctl(["compaction", &COMPACT_AT.to_string(), "--physical"])?;
    ensure!(out.starts_with(b"compacted revision 7"), "{}", String::from_utf8_lossy(&out));
    put(etcd, b"k2", b"again")?;
    put(etcd, b"k1", b"v4")?;
    etcd.ctl(["del", "k3"])?;
    Ok(leases)
}

/// Turns auth on with a root user and a user with a prefix role, then writes as that user.
/// Returns the number of user and role changes made.
fn enable_auth(etcd: &mut Etcd) -> Result<u64> {
    let changes: &[&[&str]] = &[
        &["user", "add", "root:rootpw"],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "reader"],
        &["role", "grant-permission", "reader", "readwrite", "app/", "--prefix"],
        &["user", "add", "alice:alicepw"],
        &["user", "grant-role", "alice", "reader"],
    ];
    for args in changes {
        etcd.ctl(*args)?;
    }
    etcd.ctl(["auth", "enable"])?;
    etcd.user = Some("alice:alicepw".into());
    put(etcd, b"app/x", b"1")?;
    ensure!(etcd.ctl(["put", "other", "1"]).is_err(), "alice may write only under app/");
    etcd.user = Some("root:rootpw".into());
    Ok(changes.len() as u64)
}

/// Reads the file and checks it against the member it came from, which has not changed since.
fn check_snapshot(etcd: &Etcd, path: &Path) -> Result<EtcdSnapshot> {
    let bytes = std::fs::read(path)?;
    ensure!(picket_etcdsnap::is_etcd_snapshot(&bytes));
    let snap = read(&bytes)?;
    ensure!(snap.has_sha256_trailer, "etcdctl snapshot save writes the trailer");

    let now = etcd.json(["get", "", "--prefix"])?;
    ensure!(snap.revision == int(&now["header"]["revision"]), "revision {}: {now}", snap.revision);
    let model: Vec<Kv> = snap.kvs_at(snap.revision).into_iter().map(Kv::from).collect();
    ensure!(model == kvs(&now)?, "live keys differ:\nmodel {model:#?}\netcd {now}");
    ensure!(model.iter().any(|kv| kv.key == b"nul\x00key" && kv.value == b"v\x00\xff"));
    ensure!(model.iter().any(|kv| kv.lease != 0), "keys on a lease");

    // Every revision since the compaction; the one before it is gone from etcd and the model.
    let compact = snap.compact_revision.context("compacted")?;
    for rev in compact..=snap.revision {
        let at = etcd.json(["get", "", "--prefix", &format!("--rev={rev}")])?;
        let model: Vec<Kv> = snap.kvs_at(rev).into_iter().map(Kv::from).collect();
        ensure!(model == kvs(&at)?, "at revision {rev}:\nmodel {model:#?}\netcd {at}");
    }
    let gone = etcd.ctl(["get", "k1", &format!("--rev={}", compact - 1)]).unwrap_err();
    ensure!(format!("{gone:#}").contains("compacted"), "{gone:#}");

    let listed = etcd.json(["lease", "list"])?;
    let mut from_etcd = Vec::new();
    for l in listed["leases"].as_array().context("leases")? {
        let id = int(&l["id"]);
        let ttl = etcd.json(["lease", "timetolive", &format!("{id:x}")])?;
        from_etcd.push((id, int(&ttl["granted-ttl"])));
    }
    from_etcd.sort();
    let model: Vec<_> = snap.leases.iter().map(|l| (l.id, l.ttl)).collect();
    ensure!(model == from_etcd, "leases: model {model:?}, etcd {from_etcd:?}");

    // The consistent index is the Raft index of the last entry that changed the key space, so
    // at most the applied index (lease grants and auth changes come after some puts).
    let st = etcd.json(["endpoint", "status"])?;
    let applied = st[0]["Status"]["raftAppliedIndex"].as_u64().context("raftAppliedIndex")?;
    ensure!(snap.consistent_index > 0 && snap.consistent_index <= applied, "{st}");

    let want = etcd.json([OsStr::new("snapshot"), OsStr::new("status"), path.as_os_str()])?;
    let want = Status {
        hash: want["hash"].as_u64().context("hash")? as u32,
        revision: int(&want["revision"]),
        total_keys: want["totalKey"].as_u64().context("totalKey")?,
        total_size: want["totalSize"].as_u64().context("totalSize")?,
    };
    ensure!(status(&bytes)? == want, "status {:?}, etcdctl {want:?}", status(&bytes)?);
    Ok(snap)
}

/// Users and roles as `etcdctl user get` and `role get` show them.
fn check_auth(etcd: &Etcd, snap: &EtcdSnapshot) -> Result<()> {
    let names = |v: &serde_json::Value, field: &str| -> Vec<String> {
        v[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    let users: Vec<String> =
        snap.auth.users.iter().map(|u| String::from_utf8_lossy(&u.name).into_owned()).collect();
    ensure!(users == names(&etcd.json(["user", "list"])?, "users"), "users {users:?}");
    for u in &snap.auth.users {
        let name = String::from_utf8_lossy(&u.name).into_owned();
        let got = etcd.json(["user", "get", &name])?;
        ensure!(u.roles == names(&got, "roles"), "{name}: {:?} vs {got}", u.roles);
        ensure!(u.password.starts_with(b"$2a$"), "{name}: a bcrypt hash");
    }
    let roles: Vec<String> =
        snap.auth.roles.iter().map(|r| String::from_utf8_lossy(&r.name).into_owned()).collect();
    ensure!(roles == names(&etcd.json(["role", "list"])?, "roles"), "roles {roles:?}");
    for r in &snap.auth.roles {
        let name = String::from_utf8_lossy(&r.name).into_owned();
        let got = etcd.json(["role", "get", &name])?;
        let mut perms = Vec::new();
        for p in got["perm"].as_array().into_iter().flatten() {
            perms.push((int(&p["permType"]) as i32, b64(&p["key"])?, b64(&p["range_end"])?));
        }
        let model: Vec<_> = r
            .key_permission
            .iter()
            .map(|p| (p.perm_type, p.key.clone(), p.range_end.clone()))
            .collect();
        ensure!(model == perms, "role {name}: model {model:?}, etcd {got}");
    }
    Ok(())
}

/// The real file damaged: a flipped byte, a cut, the trailer removed.
fn check_damage(bytes: &[u8]) -> Result<()> {
    let mut flipped = bytes.to_vec();
    flipped[bytes.len() / 2] ^= 0x40;
    ensure!(matches!(read(&flipped), Err(Error::TrailerMismatch { .. })));
    let cut = &bytes[..bytes.len() - 32 - 4096];
    ensure!(read(cut).is_err() && status(cut).is_err(), "a truncated file is an error");
    // Without its trailer the file is the database itself, as copied from a data directory.
    let bare = &bytes[..bytes.len() - 32];
    let snap = read(bare)?;
    ensure!(!snap.has_sha256_trailer && snap.records == read(bytes)?.records);
    ensure!(status(bare)? == status(bytes)?);
    Ok(())
}
