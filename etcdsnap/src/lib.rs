//! Reads an etcd v3 snapshot file into a neutral model, for `picket snapshot restore` (which
//! converts the model into Picket's store) and `picket snapshot status`.
//!
//! # The format
//!
//! An etcd v3 snapshot is etcd's backend database, a [bbolt] file, as `Maintenance.Snapshot`
//! streams it and `etcdctl snapshot save` writes it, followed by the SHA-256 of those bytes
//! (32 bytes; see [`read`] for when a trailer is assumed). bbolt stores named buckets of sorted
//! key-value pairs in B+trees of fixed-size pages. The private `bolt` module is a small read-only
//! reader written for this crate from bbolt's documented layout: no maintained Rust crate reads
//! bbolt files.
//!
//! # What is read
//!
//! - `key`: the MVCC history. Each key is a revision (8-byte big-endian main revision, `_`,
//!   8-byte big-endian sub revision, and a final `t` for a delete), each value an
//!   `mvccpb.KeyValue`. Becomes [`EtcdSnapshot::records`].
//! - `meta`: `consistent_index`, `finishedCompactRev`, `scheduledCompactRev`.
//! - `lease`: 8-byte big-endian lease id to `leasepb.Lease` (id, TTL, remaining TTL).
//! - `auth` (`authEnabled`, `authRevision`), `authUsers` and `authRoles` (`authpb.User`,
//!   `authpb.Role`).
//!
//! # What is ignored, and why
//!
//! - `members`, `members_removed` and `cluster`: the old cluster's membership and version. A
//!   restore founds a new cluster with its own members, as `etcdctl snapshot restore` does.
//! - `alarm`: alarms (NOSPACE, CORRUPT) belong to the old cluster's members.
//! - `meta` keys other than the three above (3.5's `term` and `confState`): the old Raft log's
//!   position, which a restore starts afresh.
//! - bbolt's freelist: it only lists pages a writer may reuse.
//!
//! Every bucket is still walked and checked by [`status`], so a damaged page anywhere fails it.
//!
//! # Robustness
//!
//! The file is untrusted input. Every malformed file gives an [`Error`]; none panics or loops:
//! offsets are checked against their page, pgids against the file, each page may be reached once
//! per walk (cycles fail) and the B+tree depth is bounded.
//!
//! # Tested against
//!
//! etcd 3.4 (Debian's 3.4.23 `etcd` and `etcdctl`): `tests/etcd.rs` builds history with
//! etcdctl, saves a snapshot and checks the model and [`status`] against what etcdctl reports.
//! etcd 3.5 keeps the same buckets and encodings and adds only `meta` keys, which are ignored; it
//! has not been run here.
//!
//! ```no_run
//! let bytes = std::fs::read("backup.db")?;
//! if picket_etcdsnap::is_etcd_snapshot(&bytes) {
//!     let snapshot = picket_etcdsnap::read(&bytes)?;
//!     println!("revision {}, {} records", snapshot.revision, snapshot.records.len());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [bbolt]: https://github.com/etcd-io/bbolt

#![doc(test(attr(deny(warnings))))]

mod bolt;
mod crc32c;
mod decode;
mod error;
mod model;
mod revision;
mod status;
mod trailer;

/// The checksum [`status`] reports, for a caller that reports its own format by the same rule
/// (`picket snapshot status`).
pub use crc32c::Crc32c;
pub use error::{Error, InvalidMeta, PageRef};
pub use model::{Auth, EtcdSnapshot, Lease, Record};
pub use status::Status;

/// Whether `bytes` looks like a bbolt file (the meta magic of page 0), so a caller can tell an
/// etcd snapshot from its own snapshot format before reading it. Says nothing about integrity.
pub fn is_etcd_snapshot(bytes: &[u8]) -> bool {
    bolt::meta::has_magic(bytes)
}

/// Reads the snapshot in `bytes`.
///
/// A trailer is assumed by etcd's own rule, when the length modulo 512 is 32 (a bbolt file is a
/// whole number of pages of at least 512 bytes); it must then match the SHA-256 of the bytes
/// before it. A file without a trailer (copied out of a data directory) is read unverified,
/// beyond bbolt's meta checksums and the structural checks.
pub fn read(bytes: &[u8]) -> Result<EtcdSnapshot, Error> {
    let (data, has_trailer) = trailer::split(bytes)?;
    decode::snapshot(&bolt::Db::open(data)?, has_trailer)
}

/// What `etcdctl snapshot status -w json` reports for the same file. The trailer is verified as
/// in [`read`] (etcdctl does not check it, but a status of a damaged file would be misleading).
pub fn status(bytes: &[u8]) -> Result<Status, Error> {
    let (data, _) = trailer::split(bytes)?;
    status::compute(&bolt::Db::open(data)?)
}

#[cfg(test)]
mod tests;
