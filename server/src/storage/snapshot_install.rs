//! Installing a snapshot: replacing the state-machine column families with a blob's contents
//! (`storage::snapshot` has the format).
//!
//! The blob is read record by record into RocksDB table files (one column family's records
//! are sorted, as they were written from an iterator), and the store ingests them. Until
//! session 33 the install was one synced `WriteBatch`: the whole snapshot went through the
//! write-ahead log, so a member that restarted after installing a 1.65 GB snapshot replayed
//! 1.65 GB into memtables (16 s in session 32's `set` long run), and the blob and the batch
//! were both in memory during the install. Now the log holds a few deletion records and
//! neither is in memory.
//!
//! Ingestion is atomic per column family only, so two things keep an install whole:
//! - **Readers.** The replace step holds [`RocksEngine::replacing`]; every view is taken
//!   through [`RocksEngine::whole`], so no view sees some families replaced and others not.
//! - **Crashes.** A received blob is first read through completely (its checksum checked,
//!   nothing of the store touched), then made durable and renamed to [`INSTALLING`], and only
//!   then does the store change. The rename is the commit point: at the next start,
//!   [`resume`] finds the file and installs it again from the beginning (the install replaces
//!   everything, so repeating it is harmless), before anything reads the store. Without the
//!   file the store is as before the install, which a crash before the rename leaves intact.

use std::fs;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use rocksdb::{IngestExternalFileOptions, IteratorMode, Options, SstFileWriter, WriteBatch};
use rocksdb::{WriteOptions, DB};

use super::rocks::RocksEngine;
use super::snapshot::{Records, SnapshotError, SNAPSHOT_CFS};

/// The blob of an install in progress, in the member's snapshot directory: present from the
/// moment the store may start to change until the install is complete.
pub const INSTALLING: &str = "installing.snap";

/// The directory the table files of an install are written into, beside [`INSTALLING`].
const TABLES: &str = "installing-tables";

/// Installs the blob in the file at `blob` (a received snapshot, which becomes [`INSTALLING`]
/// and is removed once installed) into `engine`, with `dir` the member's snapshot directory.
/// A damaged blob is refused before the store changes, and its file removed.
pub fn install_received(
    engine: &RocksEngine,
    dir: &Path,
    blob: &Path,
) -> Result<(), SnapshotError> {
    let tables_dir = dir.join(TABLES);
    let tables = match write_tables(fs::File::open(blob)?, &tables_dir) {
        Ok(tables) => tables,
        Err(e) => {
            // Nothing of the store changed; neither file is of any use. An error removing
            // them leaves them to the next start (`resume`, `SnapshotFiles::new`).
            let _ = fs::remove_dir_all(&tables_dir);
            let _ = fs::remove_file(blob);
            return Err(e);
        }
    };
    // Durability: the blob must read back after a crash exactly as it was just checked, since
    // the start after one installs it again; then the rename, which is the commit point, must
    // be on disk before the store changes.
    fs::File::open(blob)?.sync_all()?;
    let installing = dir.join(INSTALLING);
    fs::rename(blob, &installing)?;
    sync_dir(dir)?;
    #[cfg(test)]
    tests::crash_point(tests::Step::Committed)?;
    replace(engine, &tables)?;
    finish(dir)
}

/// Finishes an install a crash interrupted, if there is one: called at start, before anything
/// reads the store. Returns whether there was one.
pub fn resume(engine: &RocksEngine, dir: &Path) -> Result<bool, SnapshotError> {
    let installing = dir.join(INSTALLING);
    if !installing.exists() {
        // Table files of an install that stopped before its commit point, if any.
        match fs::remove_dir_all(dir.join(TABLES)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => return Ok(false),
        }
    }
    tracing::warn!(path = %installing.display(), "a snapshot install was interrupted; finishing it");
    // This blob was checked whole and synced before the store changed, so an error here is
    // damage since then; the store may be half replaced, and the start fails with it.
    let tables = write_tables(fs::File::open(&installing)?, &dir.join(TABLES))?;
    replace(engine, &tables)?;
    finish(dir)?;
    Ok(true)
}

/// Installs a blob held in memory (an offline restore): table files written under `scratch`
/// (removed after), no commit point (the restore publishes its directory only once complete).
pub fn install_blob(
    engine: &RocksEngine,
    blob: &[u8],
    scratch: &Path,
) -> Result<(), SnapshotError> {
    let tables = write_tables(blob, scratch);
    let done = tables.and_then(|tables| replace(engine, &tables));
    // An error removing the scratch directory leaves it behind in the restore's staging
    // directory, which is removed whole on failure.
    let _ = fs::remove_dir_all(scratch);
    done
}

/// Reads the whole blob from `blob` into table files under `dir` (made empty first): per
/// column family of [`SNAPSHOT_CFS`], its file, if it has any records. Returns only once the checksum
/// matched, so a damaged blob never reaches the store.
fn write_tables(blob: impl Read, dir: &Path) -> Result<Vec<Option<PathBuf>>, SnapshotError> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
        _ => {}
    }
    fs::create_dir_all(dir)?;
    let mut records = Records::new(BufReader::with_capacity(1 << 20, blob))?;
    let mut tables: Vec<Option<PathBuf>> = vec![None; SNAPSHOT_CFS.len()];
    // Options as the column families are opened with (`storage::rocks`: RocksDB's defaults),
    // so the files need no conversion when ingested.
    let opts = Options::default();
    let mut writer: Option<SstFileWriter<'_>> = None;
    let (mut key, mut value, mut last) = (Vec::new(), Vec::new(), Vec::new());
    let mut current = 0;
    while let Some(cf) = records.next_into(&mut key, &mut value)? {
        let sorted = match cf.cmp(&current) {
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => tables[cf].is_none() || key > last,
            std::cmp::Ordering::Greater => true,
        };
        if !sorted {
            return Err(SnapshotError::Malformed("records out of order"));
        }
        // One file per column family, however large: the family's old contents are deleted by
        // a range that overlaps every new file, so RocksDB places each ingested file in level
        // 0, and many files there would stall every write of the database (the Raft log's
        // included) until compaction caught up. One file adds one.
        if cf != current || writer.is_none() {
            if let Some(mut w) = writer.take() {
                w.finish()?;
            }
            current = cf;
            let path = dir.join(format!("{cf}.sst"));
            let w = SstFileWriter::create(&opts);
            w.open(&path)?;
            tables[cf] = Some(path);
            writer = Some(w);
        }
        if let Some(w) = writer.as_mut() {
            w.put(&key, &value)?;
        }
        std::mem::swap(&mut last, &mut key);
    }
    if let Some(mut w) = writer.take() {
        // Durability: `finish` syncs the file; ingesting it records it in the synced manifest.
        w.finish()?;
    }
    Ok(tables)
}

/// Replaces the state-machine column families with `tables`, with every new view held off
/// meanwhile. Deletes what each family holds by range (two records, whatever its size), then
/// ingests the family's file, whose keys RocksDB places above the deletion.
fn replace(engine: &RocksEngine, tables: &[Option<PathBuf>]) -> Result<(), SnapshotError> {
    let db = engine.db();
    let _whole = engine.replacing();
    let mut clear = WriteBatch::default();
    for name in SNAPSHOT_CFS {
        let handle = cf(db, name)?;
        let first = db.iterator_cf(handle, IteratorMode::Start).next().transpose()?;
        let last = db.iterator_cf(handle, IteratorMode::End).next().transpose()?;
        if let (Some((first, _)), Some((last, _))) = (first, last) {
            // The range's end is exclusive; the last key goes by itself.
            clear.delete_range_cf(handle, &first, &last);
            clear.delete_cf(handle, &last);
        }
    }
    let mut wo = WriteOptions::default();
    // Durability: a crash from here on is finished by `resume`; synced so the deletions are
    // never behind the ingested files the manifest already records.
    wo.set_sync(true);
    db.write_opt(clear, &wo)?;
    let mut ingest = IngestExternalFileOptions::default();
    // Moved (hard-linked) rather than copied: the files are on the store's file system, and
    // are of no use afterwards. Views taken before keep seeing the old contents (RocksDB's
    // default snapshot consistency).
    ingest.set_move_files(true);
    for (name, file) in SNAPSHOT_CFS.iter().zip(tables) {
        let Some(file) = file else { continue };
        db.ingest_external_file_cf_opts(cf(db, name)?, &ingest, vec![file])?;
        #[cfg(test)]
        tests::crash_point(tests::Step::Ingested)?;
    }
    Ok(())
}

/// Removes the install's files once the store holds the snapshot.
fn finish(dir: &Path) -> Result<(), SnapshotError> {
    fs::remove_file(dir.join(INSTALLING))?;
    // Durability: without the file a start does not install again; either way is correct now,
    // so this sync only keeps a start after a crash from repeating finished work.
    sync_dir(dir)?;
    match fs::remove_dir_all(dir.join(TABLES)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily, SnapshotError> {
    db.cf_handle(name).ok_or(SnapshotError::Malformed("column family missing"))
}

fn sync_dir(dir: &Path) -> Result<(), SnapshotError> {
    fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
#[path = "snapshot_install_tests.rs"]
mod tests;
