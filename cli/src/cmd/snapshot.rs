//! `snapshot save FILE` streams a member's snapshot to a file; `snapshot restore FILE` builds
//! a data dir for a new cluster from one (offline, with the server's own
//! `picket_server::restore::restore_snapshot`, mirroring `etcdutl snapshot restore`); both
//! report progress on stderr. `snapshot status FILE` reports a file offline. `status` and
//! `restore` read Picket's snapshots and etcd's (bbolt) alike.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Subcommand;
use futures::StreamExt;
use picket_server::restore::{
    restore_snapshot, snapshot_status, RestoreOptions, RestoreReport, SnapshotFormat,
};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::Ctx;
use crate::exit;
use crate::output::{self, hex, Format};

/// How often progress is reported while a long operation runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Subcommand)]
pub enum SnapshotCmd {
    /// Save a snapshot of one member's store to FILE (written to FILE.part, then renamed).
    Save {
        file: PathBuf,
        /// The member to snapshot; default: the first --endpoints entry that answers (the
        /// leader when known).
        #[arg(long)]
        endpoint: Option<String>,
    },
    /// Show what a snapshot file holds (hash, revision, total keys, total size), offline.
    /// Reads both formats: Picket's own and etcd's (`etcdctl snapshot save` against etcd).
    Status { file: PathBuf },
    /// Restore FILE into a new data dir for a new cluster (run once per member, offline).
    /// FILE is Picket's own snapshot or an etcd v3 snapshot (etcd 3.4/3.5).
    Restore {
        file: PathBuf,
        /// This member's name; it must appear in --initial-cluster.
        #[arg(long, default_value = picket_server::config::DEFAULT_NAME)]
        name: String,
        /// The data dir to create (must not exist or be empty); default: NAME.picket.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// name=peer-url,... for every member of the new cluster; default: this member alone.
        #[arg(long)]
        initial_cluster: Option<String>,
        /// The token the restored members will be started with.
        #[arg(long, default_value = picket_server::restore::DEFAULT_INITIAL_CLUSTER_TOKEN)]
        initial_cluster_token: String,
        /// This member's peer URLs (comma-separated), as listed in --initial-cluster.
        #[arg(long, default_value = picket_server::config::DEFAULT_PEER_URL)]
        initial_advertise_peer_urls: String,
    },
}

pub async fn run(ctx: &Ctx, c: SnapshotCmd) -> Result<u8> {
    match c {
        SnapshotCmd::Save { file, endpoint } => save(ctx, &file, endpoint).await,
        SnapshotCmd::Status { file } => status(ctx, file).await,
        SnapshotCmd::Restore {
            file,
            name,
            data_dir,
            initial_cluster,
            initial_cluster_token,
            initial_advertise_peer_urls,
        } => {
            let mut o = RestoreOptions::new(file);
            o.name = name;
            o.data_dir = data_dir;
            o.initial_cluster = initial_cluster;
            o.initial_cluster_token = initial_cluster_token;
            o.initial_advertise_peer_urls = initial_advertise_peer_urls;
            restore(ctx, o).await
        }
    }
}

/// Overwrites one progress line on a terminal; prints one line per update elsewhere.
struct Progress {
    tty: bool,
    last: Instant,
}

impl Progress {
    fn new() -> Self {
        Self { tty: std::io::stderr().is_terminal(), last: Instant::now() }
    }
    fn update(&mut self, msg: &str, force: bool) {
        if !force && self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        if self.tty {
            eprint!("\r\x1b[2K{msg}");
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{msg}");
        }
    }
    fn done(&mut self, msg: &str) {
        self.update(msg, true);
        if self.tty {
            eprintln!();
        }
    }
}

/// A byte count for humans.
fn mib(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    }
}

async fn save(ctx: &Ctx, file: &Path, endpoint: Option<String>) -> Result<u8> {
    let client = ctx.client().await?;
    let ep = endpoint.unwrap_or_else(|| client.current_endpoint());
    let part = {
        let mut p = file.as_os_str().to_owned();
        p.push(".part");
        PathBuf::from(p)
    };
    output::note(format!("saving a snapshot of {ep} to {}", file.display()));
    let mut out =
        std::fs::File::create(&part).with_context(|| format!("creating {}", part.display()))?;
    let mut stream = client.snapshot_with_progress(&ep).await?;
    let mut progress = Progress::new();
    let mut received = 0u64;
    let mut hasher = Sha256::new();
    let mut tail: Vec<u8> = Vec::new();
    let result: Result<()> = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            out.write_all(&chunk.blob).with_context(|| format!("writing {}", part.display()))?;
            // Hash everything but the last 32 bytes, which are the sender's SHA-256 of the rest.
            tail.extend_from_slice(&chunk.blob);
            if tail.len() > 32 {
                let keep = tail.split_off(tail.len() - 32);
                hasher.update(&tail);
                tail = keep;
            }
            received += chunk.blob.len() as u64;
            let total = received + chunk.remaining_bytes;
            let pct = (received * 100).checked_div(total).unwrap_or(100);
            progress
                .update(&format!("received {} of {} ({pct}%)", mib(received), mib(total)), false);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&part);
        return Err(e.context(format!("snapshot of {ep} failed; nothing was saved")));
    }
    progress.done(&format!("received {} (100%)", mib(received)));
    // etcd's and Picket's snapshot files both end with the SHA-256 of everything before it.
    if tail.len() != 32 || hasher.finalize().as_slice() != tail.as_slice() {
        let _ = std::fs::remove_file(&part);
        return Err(exit::fail(
            exit::ERROR,
            format!("snapshot of {ep} is damaged: SHA-256 mismatch; nothing was saved"),
        ));
    }
    // Durability: the file must be on disk before the rename makes it look complete.
    out.sync_all().with_context(|| format!("syncing {}", part.display()))?;
    drop(out);
    std::fs::rename(&part, file)
        .with_context(|| format!("renaming {} to {}", part.display(), file.display()))?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Durability: sync the directory so the rename survives a crash. Best effort: some
        // filesystems refuse to fsync a directory, and the file itself is already synced.
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    match ctx.format() {
        Format::Json => output::json_pretty(&json!({
            "endpoint": ep, "file": file.display().to_string(), "bytes": received,
        })),
        _ => output::line(format!("Snapshot saved at {} ({} bytes)", file.display(), received)),
    }
    Ok(exit::OK)
}

async fn status(ctx: &Ctx, file: PathBuf) -> Result<u8> {
    let shown = file.display().to_string();
    let s = tokio::task::spawn_blocking(move || snapshot_status(&file))
        .await
        .context("the status task panicked")?
        .map_err(|e| exit::fail(exit::ERROR, format!("snapshot status failed: {e}")))?;
    let format = match s.format {
        SnapshotFormat::Picket => "picket",
        SnapshotFormat::Etcd => "etcd",
    };
    match ctx.format() {
        // etcdctl's JSON field names, plus the format.
        Format::Json => output::json_line(&json!({
            "hash": s.hash, "revision": s.revision, "totalKey": s.total_keys,
            "totalSize": s.total_size, "format": format,
        })),
        Format::Simple => output::line(format!(
            "{:x}, {}, {}, {}, {format}",
            s.hash,
            s.revision,
            s.total_keys,
            mib(s.total_size)
        )),
        Format::Table => {
            let mut t =
                output::Table::new(["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE", "FORMAT"]);
            t.row([
                format!("{:x}", s.hash),
                s.revision.to_string(),
                s.total_keys.to_string(),
                mib(s.total_size),
                format.to_string(),
            ]);
            t.print();
            output::note(format!(
                "{shown}: {}",
                match s.format {
                    SnapshotFormat::Picket => "restore with `picket snapshot restore`",
                    SnapshotFormat::Etcd =>
                        "restore with `picket snapshot restore` or `etcdutl snapshot restore`",
                }
            ));
        }
    }
    Ok(exit::OK)
}

async fn restore(ctx: &Ctx, o: RestoreOptions) -> Result<u8> {
    let size = std::fs::metadata(&o.snapshot).map(|m| m.len()).unwrap_or(0);
    output::note(format!(
        "restoring {} ({}) into {} as member {}",
        o.snapshot.display(),
        mib(size),
        o.data_dir().display(),
        o.name
    ));
    let started = Instant::now();
    let task = tokio::task::spawn_blocking(move || restore_snapshot(&o));
    tokio::pin!(task);
    let mut progress = Progress::new();
    let report: RestoreReport = loop {
        tokio::select! {
            r = &mut task => break r.context("the restore task panicked")?.map_err(|e| {
                let code = match e {
                    picket_server::restore::RestoreError::Options(_)
                    | picket_server::restore::RestoreError::PeerUrlMismatch { .. }
                    | picket_server::restore::RestoreError::DataDirNotEmpty(_) => exit::USAGE,
                    _ => exit::ERROR,
                };
                exit::fail(code, format!("restore failed: {e}"))
            })?,
            _ = tokio::time::sleep(PROGRESS_EVERY) => {
                progress.update(&format!("still restoring ({:.0?} so far)", started.elapsed()), true);
            }
        }
    };
    progress.done(&format!("restored in {:.1?}", started.elapsed()));
    match ctx.format() {
        Format::Json => output::json_pretty(&json!({
            "data_dir": report.data_dir.display().to_string(),
            "member_id": hex(report.member_id),
            "cluster_id": hex(report.cluster_id),
            "members": report.members.iter().map(|m| json!({
                "name": m.name, "id": hex(m.id), "peer_urls": m.peer_urls,
            })).collect::<Vec<_>>(),
            "revision": report.revision,
            "compact_revision": report.compact_revision,
            "hash": report.hash,
            "from_etcd": report.from_etcd,
            "keys": report.keys,
            "leases": report.leases,
            "snapshot_bytes": report.snapshot_bytes,
        })),
        _ => {
            output::line(format!("restored into {}", report.data_dir.display()));
            output::line(format!(
                "member {} of cluster {}; revision {}, {} keys, {} leases, hash {}",
                hex(report.member_id),
                hex(report.cluster_id),
                report.revision,
                report.keys,
                report.leases,
                report.hash
            ));
            output::line(
                "start picketd with this --data-dir and the same --name and --initial-cluster",
            );
        }
    }
    Ok(exit::OK)
}
