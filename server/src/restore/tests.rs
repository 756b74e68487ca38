use std::path::Path;

use picket_proto::etcdserverpb::{CompactionRequest, DeleteRangeRequest, PutRequest};
use prost::Message;
use rocksdb::IteratorMode;

use super::*;
use crate::lease::LeaseTable;
use crate::mvcc::MvccStore;
use crate::raft::types::StoredMembership;

const LEASE: i64 = 7;

/// A source store with history, a deletion, a compaction, a lease with an attached key and the
/// Raft progress of an "old" cluster; returns the snapshot file and the source's HashKV.
fn source_snapshot(dir: &Path) -> (Vec<u8>, u32, i64) {
    let engine = RocksEngine::open(dir.join("src-db")).unwrap();
    let mut store = MvccStore::open(engine.clone()).unwrap();
    let mut table = LeaseTable::default();
    let record = table.grant(LEASE, 60).unwrap();
    let exists = |id: i64| id == LEASE;
    for i in 0..20 {
        let mut b = store.begin_apply();
        let req = PutRequest {
            key: format!("k{}", i % 5).into_bytes(),
            value: format!("v{i}").into_bytes(),
            ..Default::default()
        };
        b.put(&req, &exists).unwrap();
        b.commit(false).unwrap();
    }
    let mut b = store.begin_apply();
    b.delete_range(&DeleteRangeRequest { key: b"k4".to_vec(), ..Default::default() }).unwrap();
    b.compact(&CompactionRequest { revision: 15, physical: false }).unwrap();
    let leased = PutRequest {
        key: b"leased".to_vec(),
        value: b"x".to_vec(),
        lease: LEASE,
        ..Default::default()
    };
    b.put(&leased, &exists).unwrap();
    b.put_raw(Cf::Lease, &LEASE.to_be_bytes(), &record.encode_to_vec());
    let old_applied: Option<crate::raft::types::LogId> = Some(crate::raft::types::log_id(9, 1, 77));
    b.put_raw(Cf::Meta, RAFT_META_KEYS[0], &postcard::to_allocvec(&old_applied).unwrap());
    let old_nodes =
        std::collections::BTreeMap::from([(99u64, crate::raft::types::Member::default())]);
    let old_membership = StoredMembership::new(old_applied, Membership::from(old_nodes));
    b.put_raw(Cf::Meta, RAFT_META_KEYS[1], &postcard::to_allocvec(&old_membership).unwrap());
    b.commit(true).unwrap();
    let hash = crate::mvcc::hash::hash_kv(&engine, 0).unwrap();
    let blob = snapshot::build(&engine).unwrap();
    (snapshot_file::encode(&blob), hash.hash, hash.current_revision)
}

struct Fixture {
    dir: tempfile::TempDir,
    hash: u32,
    revision: i64,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (file, hash, revision) = source_snapshot(dir.path());
        fs::write(dir.path().join("snap.db"), file).unwrap();
        Self { dir, hash, revision }
    }

    fn snap(&self) -> PathBuf {
        self.dir.path().join("snap.db")
    }

    /// Options for member `name` of the cluster `n1`, `n2`, `n3` on made-up ports.
    fn opts(&self, name: &str, target: &str) -> RestoreOptions {
        let mut o = RestoreOptions::new(self.snap());
        o.name = name.to_string();
        o.data_dir = Some(self.dir.path().join(target));
        o.initial_cluster = Some(
            "n1=http://127.0.0.1:7001,n2=http://127.0.0.1:7002,n3=http://127.0.0.1:7003".into(),
        );
        o.initial_advertise_peer_urls = match name {
            "n1" => "http://127.0.0.1:7001",
            "n2" => "http://127.0.0.1:7002",
            _ => "http://127.0.0.1:7003",
        }
        .into();
        o
    }

    /// Restores a damaged copy of the snapshot file and returns the error; checks that nothing
    /// was left behind.
    fn restore_bytes(&self, bytes: &[u8]) -> RestoreError {
        let path = self.dir.path().join("damaged.db");
        fs::write(&path, bytes).unwrap();
        let mut o = self.opts("n1", "damaged-target");
        o.snapshot = path;
        let err = restore_snapshot(&o).expect_err("a damaged file must be refused");
        assert!(!self.dir.path().join("damaged-target").exists());
        assert!(!self.dir.path().join(".damaged-target.restoring").exists());
        err
    }
}

/// The raw Raft log of a data dir: (index key, entry).
fn raft_log(data_dir: &Path) -> Vec<(Vec<u8>, Entry)> {
    let engine = RocksEngine::open(data_dir.join("db")).unwrap();
    let cf = engine.cf_handle(Cf::RaftLog);
    let out = engine
        .db()
        .iterator_cf(cf, IteratorMode::Start)
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.to_vec(), postcard::from_bytes::<Entry>(&v).unwrap())
        })
        .collect();
    let meta = engine.cf_handle(Cf::RaftMeta);
    assert!(
        engine.db().iterator_cf(meta, IteratorMode::Start).next().is_none(),
        "no vote, committed or purge marker: the new cluster starts from scratch"
    );
    out
}

#[test]
fn restores_data_with_fresh_raft_state_and_identity() {
    let f = Fixture::new();
    let report = restore_snapshot(&f.opts("n1", "n1.data")).unwrap();
    let data_dir = f.dir.path().join("n1.data");
    assert_eq!(report.data_dir, data_dir);
    assert_eq!((report.revision, report.hash), (f.revision, f.hash));
    assert_eq!(report.compact_revision, 15);
    assert_eq!((report.keys, report.leases), (5, 1), "k0..k3 and leased");
    assert_eq!(report.member_id, bootstrap::member_id(DEFAULT_INITIAL_CLUSTER_TOKEN, "n1"));
    assert_eq!(
        report.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["n1", "n2", "n3"]
    );
    assert!(!f.dir.path().join(".n1.data.restoring").exists());

    // The log holds only the new membership at log id 0, as `Raft::initialize` would write.
    let log = raft_log(&data_dir);
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].1.log_id, crate::raft::types::log_id(0, 0, 0));
    let EntryPayload::Membership(m) = &log[0].1.payload else { panic!("not a membership entry") };
    let voters: Vec<NodeId> = m.voter_ids().collect();
    let mut want: Vec<NodeId> = report.members.iter().map(|m| m.id).collect();
    want.sort_unstable();
    assert_eq!(voters, want);
    let n1 = m.get_node(&report.member_id).unwrap();
    assert_eq!(
        (n1.name.as_str(), n1.peer_urls.as_slice()),
        ("n1", ["http://127.0.0.1:7001".to_string()].as_slice())
    );

    // The state machine loads with the data and without the old cluster's Raft progress.
    let engine = RocksEngine::open(data_dir.join("db")).unwrap();
    let sm = StateMachine::open(engine.clone(), data_dir.join("snapshots")).unwrap();
    let shared = sm.shared();
    assert_eq!(shared.last_applied(), None);
    assert_eq!(shared.membership(), StoredMembership::default());
    assert_eq!(shared.revision(), f.revision);
    assert_eq!(shared.with_leases(|l| l.get(LEASE).map(|r| r.ttl)), Some(60));
    assert_eq!(shared.with_store(|s| s.keys_of_lease(LEASE)).unwrap(), vec![b"leased".to_vec()]);
    drop(sm);
    drop(engine);

    let id: Identity =
        serde_json::from_slice(&fs::read(data_dir.join("identity.json")).unwrap()).unwrap();
    assert_eq!(id, Identity { member_id: report.member_id, cluster_id: report.cluster_id });
}

#[test]
fn members_restored_from_one_file_share_the_first_entry_and_cluster_id() {
    let f = Fixture::new();
    let reports: Vec<RestoreReport> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| restore_snapshot(&f.opts(n, &format!("{n}.data"))).unwrap())
        .collect();
    assert!(reports.iter().all(|r| r.cluster_id == reports[0].cluster_id));
    let mut ids: Vec<NodeId> = reports.iter().map(|r| r.member_id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    let logs: Vec<Vec<u8>> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| {
            postcard::to_allocvec(&raft_log(&f.dir.path().join(format!("{n}.data")))[0].1).unwrap()
        })
        .collect();
    assert!(logs.iter().all(|l| *l == logs[0]), "entries at log id 0 must be identical");
}

#[test]
fn damaged_files_are_refused_with_clear_errors() {
    let f = Fixture::new();
    let good = fs::read(f.snap()).unwrap();

    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x40;
    let e = f.restore_bytes(&flipped);
    assert!(
        matches!(e, RestoreError::SnapshotFile { source: SnapshotFileError::Checksum, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("checksum mismatch"), "{e}");

    for cut in [good.len() - 1, good.len() - 32, good.len() / 2, 40] {
        let e = f.restore_bytes(&good[..cut]);
        assert!(
            matches!(e, RestoreError::SnapshotFile { source: SnapshotFileError::Length, .. }),
            "truncated to {cut}: {e}"
        );
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    for junk in [&b""[..], b"SQLite format 3\0 not a picket snapshot at all".as_slice()] {
        let e = f.restore_bytes(junk);
        assert!(
            matches!(e, RestoreError::SnapshotFile { source: SnapshotFileError::NotPicket, .. }),
            "{e}"
        );
    }

    // Valid framing around a damaged state blob: the inner checksum catches it.
    let mut blob = snapshot_file::decode(&good).unwrap().to_vec();
    let mid = blob.len() / 2;
    blob[mid] ^= 1;
    let e = f.restore_bytes(&snapshot_file::encode(&blob));
    assert!(matches!(e, RestoreError::SnapshotData { source: SnapshotError::Checksum, .. }), "{e}");

    let mut o = f.opts("n1", "missing-target");
    o.snapshot = f.dir.path().join("no-such-file.db");
    let e = restore_snapshot(&o).unwrap_err();
    assert!(matches!(e, RestoreError::ReadSnapshot { .. }), "{e}");
}

#[test]
fn non_empty_target_is_refused_and_left_alone() {
    let f = Fixture::new();
    let target = f.dir.path().join("busy");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("precious"), b"keep me").unwrap();
    let e = restore_snapshot(&f.opts("n1", "busy")).unwrap_err();
    assert!(matches!(&e, RestoreError::DataDirNotEmpty(p) if *p == target), "{e}");
    assert_eq!(fs::read(target.join("precious")).unwrap(), b"keep me");
    assert_eq!(fs::read_dir(&target).unwrap().count(), 1);

    // A file in the way is refused too.
    fs::write(f.dir.path().join("a-file"), b"x").unwrap();
    let e = restore_snapshot(&f.opts("n1", "a-file")).unwrap_err();
    assert!(matches!(e, RestoreError::DataDirNotEmpty(_)), "{e}");

    // An empty directory (made by an operator in advance) is fine, and so is a second restore
    // after an interrupted one left its staging directory behind.
    fs::create_dir(f.dir.path().join("empty")).unwrap();
    let staging = f.dir.path().join(".empty.restoring");
    fs::create_dir(&staging).unwrap();
    fs::write(staging.join("half-written"), b"").unwrap();
    restore_snapshot(&f.opts("n1", "empty")).unwrap();
    assert!(f.dir.path().join("empty/identity.json").exists());
    assert!(!staging.exists());
    // And a restored dir is not empty any more.
    let e = restore_snapshot(&f.opts("n1", "empty")).unwrap_err();
    assert!(matches!(e, RestoreError::DataDirNotEmpty(_)), "{e}");
}

#[test]
fn bad_membership_options_are_refused_before_any_write() {
    let f = Fixture::new();
    let mut o = f.opts("n9", "t1");
    o.initial_advertise_peer_urls = "http://127.0.0.1:7009".into();
    let e = restore_snapshot(&o).unwrap_err();
    assert!(matches!(e, RestoreError::Options(_)), "{e}");
    assert!(e.to_string().contains("n9"), "{e}");

    let mut o = f.opts("n1", "t2");
    o.initial_advertise_peer_urls = "http://127.0.0.1:7002".into();
    let e = restore_snapshot(&o).unwrap_err();
    assert!(matches!(e, RestoreError::PeerUrlMismatch { .. }), "{e}");

    let mut o = f.opts("n1", "t3");
    o.initial_cluster = Some("n1".into());
    let e = restore_snapshot(&o).unwrap_err();
    assert!(matches!(e, RestoreError::Options(_)), "{e}");

    let mut o = f.opts("n1", "t4");
    o.initial_cluster = Some("n1=http://127.0.0.1:7001,n1=http://127.0.0.1:7001".into());
    // A name with two URLs is one member in etcd's syntax, so this differs from the advertised
    // URL list and is refused as a mismatch.
    assert!(restore_snapshot(&o).is_err());

    for t in ["t1", "t2", "t3", "t4"] {
        assert!(!f.dir.path().join(t).exists(), "{t} was created");
    }

    // The single-member default: `--initial-cluster` derived from the advertised URLs.
    let mut o = RestoreOptions::new(f.snap());
    o.name = "solo".into();
    o.data_dir = Some(f.dir.path().join("solo"));
    let r = restore_snapshot(&o).unwrap();
    assert_eq!(r.members.len(), 1);
    assert_eq!(r.members[0].peer_urls, [DEFAULT_PEER_URL.to_string()]);
}
