//! Offline restore: builds a fresh data dir for a **new** cluster from a snapshot file, like
//! `etcdutl snapshot restore`. `picket snapshot restore` is a thin wrapper around
//! [`restore_snapshot`].
//!
//! The input is either of two formats, told apart by their first bytes:
//! - Picket's own, the file `Maintenance.Snapshot` streams from Picket (and `etcdctl snapshot
//!   save` writes against Picket): [`crate::storage::snapshot_file`] framing around a
//!   [`crate::storage::snapshot`] blob. Both checksums are verified before anything is written.
//! - **etcd's** (3.4/3.5): the bbolt database `etcdctl snapshot save` writes against etcd, with
//!   its SHA-256 trailer when present (verified). It is read whole and checked by
//!   `picket-etcdsnap` and converted by [`etcd`]: a team moving from etcd restores its backup
//!   the way it would have restored it into etcd.
//!
//! What the new data dir holds, and where each part comes from:
//! - **Data, from the snapshot:** every key with its history since the last compaction, the
//!   revision counters and compaction point, leases and their attached keys, and the changelog
//!   that serves watches from old revisions. A restored member answers HashKV at the snapshot's
//!   revision with the source member's hash, and its next write gets the next revision.
//! - **Membership, from the options:** `--name`, `--initial-cluster`,
//!   `--initial-cluster-token` and `--initial-advertise-peer-urls`, as for a new cluster
//!   (etcd's restore does the same). Member ids and the cluster id are derived exactly as
//!   `picketd` derives them on a first start ([`crate::raft::bootstrap`]).
//! - **Raft state, fresh:** the Raft progress recorded in the snapshot (applied log id and
//!   membership of the old cluster) is dropped; the new Raft log holds a single entry, the new
//!   cluster's membership at log id 0 — the entry `Raft::initialize` would append. Every member
//!   restored from the same file with the same `--initial-cluster` and token gets the same
//!   entry, so they agree on the log from the start, just like members of a freshly bootstrapped
//!   cluster. The state machine's applied log id starts empty; the data does not depend on it
//!   (revisions are MVCC's, not Raft's).
//! - **Identity:** `identity.json` with this member's id and the cluster id
//!   ([`crate::raft::identity`]), so `picketd` never re-derives or asks for them.
//!
//! Client URLs are not part of the restored membership: each member publishes its own once it
//! runs (`raft::member_tasks::publish`), as after a normal bootstrap. The initial membership
//! entry must be identical on every member, and one member's restore cannot know the others'
//! client URLs.
//!
//! # Starting the restored cluster
//! Restore every member from the same file, each with its own `--name` and `--data-dir` and
//! the same `--initial-cluster` and `--initial-cluster-token`; then start each `picketd` with
//! `--data-dir` pointing at its restored directory and the matching `--name`, peer and client
//! URLs. `--initial-cluster-state new` (the default) works: the member finds Raft state on disk
//! and recovers from it instead of initializing. The first election picks a leader.
//!
//! # Crash safety
//! The data dir is built in a staging directory next to the target
//! (`.<target name>.restoring`), synced, and renamed into place as the last step. A crash
//! before the rename leaves the target untouched (and a staging directory the next restore
//! removes); the rename itself is atomic. A target that exists and is not empty is refused
//! before anything is written.
//!
//! # Examples
//! ```no_run
//! use picket_server::restore::{restore_snapshot, RestoreOptions};
//!
//! let mut opts = RestoreOptions::new("backup.db");
//! opts.name = "n1".into();
//! opts.data_dir = Some("/var/lib/picket/n1".into());
//! opts.initial_cluster =
//!     Some("n1=http://10.0.0.1:2380,n2=http://10.0.0.2:2380,n3=http://10.0.0.3:2380".into());
//! opts.initial_advertise_peer_urls = "http://10.0.0.1:2380".into();
//! let report = restore_snapshot(&opts)?;
//! println!("restored revision {} into {}", report.revision, report.data_dir.display());
//! # Ok::<(), picket_server::restore::RestoreError>(())
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use clap::Parser;
use openraft::{EntryPayload, Membership};
use picket_proto::etcdserverpb::RangeRequest;
use rocksdb::{WriteBatch, WriteOptions};
use thiserror::Error;

use crate::config::{Config, ConfigError, DEFAULT_NAME, DEFAULT_PEER_URL};
use crate::raft::bootstrap;
use crate::raft::identity::{self, Identity, IdentityError};
use crate::raft::types::{Entry, NodeId};
use crate::storage::engine::Cf;
use crate::storage::log_store::LogStore;
use crate::storage::rocks::RocksEngine;
use crate::storage::snapshot::{self, SnapshotError};
use crate::storage::snapshot_file::{self, SnapshotFileError};
use crate::storage::snapshot_install;
use crate::storage::state_machine::{StateMachine, RAFT_META_KEYS};

pub mod etcd;
mod status;

pub use status::{snapshot_status, SnapshotFormat, SnapshotStatus};

/// `picketd`'s default `--initial-cluster-token`; a restore must use the token the restored
/// members will be started with.
pub const DEFAULT_INITIAL_CLUSTER_TOKEN: &str = "picket-cluster";

/// What to restore and for which new cluster. Field names follow `etcdutl snapshot restore`'s
/// flags; defaults are `picketd`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// The snapshot file (`etcdctl snapshot save` output or the `Maintenance.Snapshot` stream).
    pub snapshot: PathBuf,
    /// `--name`: this member's name. It must appear in `--initial-cluster`.
    pub name: String,
    /// `--data-dir`: the directory to create. It must not exist, or be empty. Defaults to
    /// `<name>.picket`, `picketd`'s default.
    pub data_dir: Option<PathBuf>,
    /// `--initial-cluster`: `name=peer-url,...` for every member of the new cluster. Defaults to
    /// `<name>=<initial-advertise-peer-urls>` (a single-member cluster).
    pub initial_cluster: Option<String>,
    /// `--initial-cluster-token`: mixed into the member and cluster ids.
    pub initial_cluster_token: String,
    /// `--initial-advertise-peer-urls`, comma-separated: this member's peer URLs. They must be
    /// the URLs `--initial-cluster` lists for `name`.
    pub initial_advertise_peer_urls: String,
}

impl RestoreOptions {
    /// Options with `picketd`'s defaults for everything but the snapshot file.
    pub fn new(snapshot: impl Into<PathBuf>) -> Self {
        Self {
            snapshot: snapshot.into(),
            name: DEFAULT_NAME.to_string(),
            data_dir: None,
            initial_cluster: None,
            initial_cluster_token: DEFAULT_INITIAL_CLUSTER_TOKEN.to_string(),
            initial_advertise_peer_urls: DEFAULT_PEER_URL.to_string(),
        }
    }

    /// The data dir that will be created.
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("{}.picket", self.name)))
    }
}

/// One member of the restored cluster's membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredMember {
    pub name: String,
    pub id: NodeId,
    pub peer_urls: Vec<String>,
}

/// What a successful restore produced.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreReport {
    /// The data dir that now exists.
    pub data_dir: PathBuf,
    /// This member's id in the new cluster.
    pub member_id: NodeId,
    /// The new cluster's id.
    pub cluster_id: u64,
    /// The new cluster's members, in `--initial-cluster` order.
    pub members: Vec<RestoredMember>,
    /// Whether the file was an etcd snapshot (bbolt) rather than Picket's own format.
    pub from_etcd: bool,
    /// The snapshot's (and so the restored store's) current revision.
    pub revision: i64,
    /// The snapshot's compaction point, -1 if it was never compacted.
    pub compact_revision: i64,
    /// HashKV at `revision`: equals the source member's `HashKV(revision)`.
    pub hash: u32,
    /// Live keys at `revision`.
    pub keys: i64,
    /// Leases carried over.
    pub leases: usize,
    /// Size of the snapshot file.
    pub snapshot_bytes: u64,
}

/// Why a restore failed. Nothing was written to the target data dir in any case.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The membership options are not a valid new cluster (fix the flags).
    #[error("invalid restore options: {0}")]
    Options(String),
    /// `--initial-advertise-peer-urls` disagree with this member's `--initial-cluster` entry.
    #[error(
        "--initial-cluster lists {name} with peer URLs {in_cluster:?}, but \
         --initial-advertise-peer-urls are {advertised:?}; they must match"
    )]
    PeerUrlMismatch { name: String, in_cluster: Vec<String>, advertised: Vec<String> },
    /// The target exists and holds something: restoring never overwrites data.
    #[error("data dir {0} already exists and is not empty; restore into a new directory")]
    DataDirNotEmpty(PathBuf),
    /// The snapshot file could not be read.
    #[error("cannot read snapshot file {path}: {source}")]
    ReadSnapshot { path: PathBuf, source: std::io::Error },
    /// The snapshot file is not a (complete, undamaged) Picket snapshot file.
    #[error("{path}: {source}")]
    SnapshotFile { path: PathBuf, source: SnapshotFileError },
    /// The file is an etcd snapshot, but damaged (its checksum or its pages).
    #[error("{path}: this etcd snapshot is unusable: {source}")]
    EtcdSnapshot { path: PathBuf, source: picket_etcdsnap::Error },
    /// The etcd snapshot reads, but holds something Picket cannot take over faithfully.
    #[error("{path}: cannot import this etcd snapshot: {source}")]
    EtcdImport { path: PathBuf, source: etcd::ImportError },
    /// The file's framing checks out but the state inside it is damaged or of an unknown format.
    #[error("{path}: the state inside the snapshot file is unusable: {source}")]
    SnapshotData { path: PathBuf, source: SnapshotError },
    /// A filesystem operation on the staging or target directory failed.
    #[error("cannot {op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    /// Writing or re-reading the restored store failed.
    #[error("cannot build the restored store: {0}")]
    Storage(String),
    /// Recording the member identity failed.
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

impl From<ConfigError> for RestoreError {
    fn from(e: ConfigError) -> Self {
        RestoreError::Options(e.to_string())
    }
}

fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RestoreError + 'a {
    move |source| RestoreError::Io { op, path: path.to_path_buf(), source }
}

fn storage(e: impl std::fmt::Display) -> RestoreError {
    RestoreError::Storage(e.to_string())
}

/// The new cluster's membership and this member's identity, derived from the options.
struct Plan {
    identity: Identity,
    members: Vec<RestoredMember>,
    first_entry: Entry,
}

impl Plan {
    fn new(opts: &RestoreOptions) -> Result<Self, RestoreError> {
        // Parse through picketd's own `Config`, so restore accepts exactly the membership flags
        // picketd accepts and derives ids the same way. Explicit flags override `PICKET_*`
        // environment variables.
        let mut args = vec![
            "picketd".to_string(),
            "--name".into(),
            opts.name.clone(),
            "--initial-cluster-token".into(),
            opts.initial_cluster_token.clone(),
            "--initial-advertise-peer-urls".into(),
            opts.initial_advertise_peer_urls.clone(),
        ];
        if let Some(ic) = &opts.initial_cluster {
            args.extend(["--initial-cluster".into(), ic.clone()]);
        }
        let cfg = Config::try_parse_from(args).map_err(|e| RestoreError::Options(e.to_string()))?;
        for u in cfg.advertise_peer_urls() {
            crate::config::url_to_addr("initial-advertise-peer-urls", &u)?;
        }
        let initial = cfg.initial_members()?;
        if initial.is_empty() {
            return Err(RestoreError::Options("--initial-cluster names no member".into()));
        }
        let own = initial
            .iter()
            .find(|m| m.name == cfg.name)
            .ok_or_else(|| ConfigError::NameNotInCluster(cfg.name.clone()))?;
        let mut names: Vec<&str> = initial.iter().map(|m| m.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::DuplicateName(w[0].to_string()).into());
        }
        let (mut listed, mut advertised) = (own.peer_urls.clone(), cfg.advertise_peer_urls());
        listed.sort();
        advertised.sort();
        if listed != advertised {
            return Err(RestoreError::PeerUrlMismatch {
                name: cfg.name.clone(),
                in_cluster: own.peer_urls.clone(),
                advertised: cfg.advertise_peer_urls(),
            });
        }
        let token = &cfg.initial_cluster_token;
        let identity = Identity {
            member_id: bootstrap::member_id(token, &cfg.name),
            cluster_id: bootstrap::cluster_id(token, &initial),
        };
        let members = initial
            .iter()
            .map(|m| RestoredMember {
                name: m.name.clone(),
                id: bootstrap::member_id(token, &m.name),
                peer_urls: m.peer_urls.clone(),
            })
            .collect();
        // Exactly what `Raft::initialize` appends for these nodes on a first start: the same
        // nodes (`bootstrap::initial_nodes`, shared with picketd), all voters, at log id 0.
        let nodes = bootstrap::initial_nodes(&cfg, &initial);
        let first_entry = Entry {
            log_id: crate::raft::types::log_id(0, 0, 0),
            payload: EntryPayload::Membership(Membership::from(nodes)),
        };
        Ok(Self { identity, members, first_entry })
    }
}

/// Restores `opts.snapshot` into a new data dir `opts.data_dir()` for a new cluster; see the
/// module docs for what the directory holds and how to start it. Blocking (file and RocksDB
/// I/O); call it from `spawn_blocking` inside an async runtime.
pub fn restore_snapshot(opts: &RestoreOptions) -> Result<RestoreReport, RestoreError> {
    let plan = Plan::new(opts)?;
    let target = opts.data_dir();
    ensure_empty_or_absent(&target)?;

    let path = &opts.snapshot;
    let file = fs::read(path)
        .map_err(|source| RestoreError::ReadSnapshot { path: path.clone(), source })?;
    // Check the whole input before creating anything.
    let source = if picket_etcdsnap::is_etcd_snapshot(&file) {
        let snap = picket_etcdsnap::read(&file)
            .map_err(|source| RestoreError::EtcdSnapshot { path: path.clone(), source })?;
        Source::Etcd(Box::new(snap))
    } else {
        let blob = snapshot_file::decode(&file)
            .map_err(|source| RestoreError::SnapshotFile { path: path.clone(), source })?;
        snapshot::parse(blob)
            .map_err(|source| RestoreError::SnapshotData { path: path.clone(), source })?;
        Source::Picket(blob)
    };

    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let target_name = target
        .file_name()
        .ok_or_else(|| {
            RestoreError::Options(format!("{} is not a directory name", target.display()))
        })?
        .to_string_lossy()
        .into_owned();
    fs::create_dir_all(&parent).map_err(io_err("create", &parent))?;
    let staging = parent.join(format!(".{target_name}.restoring"));
    if staging.exists() {
        // Only a restore into this same target creates this directory, and it becomes a data
        // dir only through the final rename, so a leftover is an interrupted restore's debris.
        tracing::warn!(path = %staging.display(), "removing an interrupted restore's staging dir");
        fs::remove_dir_all(&staging).map_err(io_err("remove", &staging))?;
    }
    fs::create_dir(&staging).map_err(io_err("create", &staging))?;

    let built = build(&staging, &source, &plan, path).and_then(|mut report| {
        identity::record(&staging, &plan.identity)?;
        // Durability: every file and directory of the new data dir must be on disk before the
        // rename publishes it, or a crash just after the rename could leave a data dir whose
        // contents were never written.
        sync_tree(&staging)?;
        // Re-check right before publishing: on Linux, rename replaces an empty directory but
        // fails on a non-empty one, so a target filled in the meantime is never overwritten.
        ensure_empty_or_absent(&target)?;
        fs::rename(&staging, &target)
            .map_err(io_err("rename the restored data dir to", &target))?;
        // Durability: fsync the parent so the rename itself survives a crash.
        sync_path(&parent)?;
        report.data_dir = target.clone();
        report.snapshot_bytes = file.len() as u64;
        Ok(report)
    });
    match built {
        Ok(report) => {
            tracing::info!(
                data_dir = %target.display(),
                revision = report.revision,
                node_id = report.member_id,
                "restored snapshot"
            );
            Ok(report)
        }
        Err(e) => {
            // Best effort: the staging dir is never a data dir, and a later restore removes it
            // anyway, so failing to remove it here must not hide the real error.
            let _ = fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// A checked input, of either format.
enum Source<'a> {
    Picket(&'a [u8]),
    Etcd(Box<picket_etcdsnap::EtcdSnapshot>),
}

/// Writes the store, the Raft log and snapshot dir into `dir`, then reopens the state machine
/// the way `picketd` will, to check it loads and to fill the report.
fn build(
    dir: &Path,
    source: &Source<'_>,
    plan: &Plan,
    path: &Path,
) -> Result<RestoreReport, RestoreError> {
    let engine = RocksEngine::open(dir.join("db")).map_err(storage)?;
    match source {
        Source::Picket(blob) => {
            // Durable inside `install_blob` (synced table files and manifest).
            snapshot_install::install_blob(&engine, blob, &dir.join("restore-tables"))
                .map_err(storage)?;
            let meta = engine.cf_handle(Cf::Meta);
            let mut batch = WriteBatch::default();
            for key in RAFT_META_KEYS {
                batch.delete_cf(meta, key);
            }
            let mut wo = WriteOptions::default();
            // Durability: the staging dir is synced as a whole before it is published, but
            // syncing the WAL here keeps every write of the restore durable by the same rule.
            wo.set_sync(true);
            engine.db().write_opt(batch, &wo).map_err(storage)?;
        }
        // Synced inside `import`; an etcd file holds no Raft state of ours to drop.
        Source::Etcd(snap) => etcd::import(&engine, snap)
            .map_err(|source| RestoreError::EtcdImport { path: path.to_path_buf(), source })?,
    }
    LogStore::new(engine.db().clone())
        .and_then(|log| log.seed(std::slice::from_ref(&plan.first_entry)))
        .map_err(storage)?;

    let sm = StateMachine::open(engine.clone(), dir.join("snapshots")).map_err(storage)?;
    let shared = sm.shared();
    if shared.last_applied().is_some() {
        return Err(storage("the old cluster's applied log id survived the restore"));
    }
    let revision = shared.revision();
    let compact_revision = shared.with_store(|s| s.compact_revision());
    let leases = shared.with_leases(|l| l.len());
    let hash = crate::mvcc::hash::hash_kv(&engine, 0).map_err(storage)?.hash;
    let all =
        RangeRequest { key: vec![0], range_end: vec![0], count_only: true, ..Default::default() };
    let keys = shared.reader().range(&all).map_err(storage)?.count;
    drop(sm);
    drop(engine);
    Ok(RestoreReport {
        data_dir: PathBuf::new(),
        member_id: plan.identity.member_id,
        cluster_id: plan.identity.cluster_id,
        members: plan.members.clone(),
        from_etcd: matches!(source, Source::Etcd(_)),
        revision,
        compact_revision,
        hash,
        keys,
        leases,
        snapshot_bytes: 0,
    })
}

fn ensure_empty_or_absent(target: &Path) -> Result<(), RestoreError> {
    match fs::read_dir(target) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(RestoreError::DataDirNotEmpty(target.to_path_buf())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // A file (or anything else that is not a readable directory) is in the way.
        Err(_) if target.exists() => Err(RestoreError::DataDirNotEmpty(target.to_path_buf())),
        Err(e) => Err(io_err("inspect", target)(e)),
    }
}

fn sync_path(path: &Path) -> Result<(), RestoreError> {
    fs::File::open(path).and_then(|f| f.sync_all()).map_err(io_err("fsync", path))
}

/// fsyncs every file and directory under `dir`, and `dir` itself.
fn sync_tree(dir: &Path) -> Result<(), RestoreError> {
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        let path = entry.path();
        if entry.file_type().map_err(io_err("inspect", &path))?.is_dir() {
            sync_tree(&path)?;
        } else {
            sync_path(&path)?;
        }
    }
    sync_path(dir)
}

#[cfg(test)]
mod tests;
