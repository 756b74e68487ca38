//! Importing an etcd v3 snapshot (the bbolt file `etcdctl snapshot save` writes against etcd,
//! read by `picket-etcdsnap`) into a fresh store: the path for a team moving from etcd.
//!
//! What the store gets, record by record (layouts in [`crate::mvcc`]):
//! - **History:** every record of etcd's `key` bucket becomes a `kv` record at its main
//!   revision (a delete becomes a tombstone), so the restored cluster answers `get --rev R` for
//!   every revision the snapshot still holds, with etcd's create and mod revisions, versions and
//!   leases. etcd numbers the changes of one revision with sub revisions; Picket's records are
//!   keyed by main revision alone, which is enough because etcd never changes one key twice in
//!   one revision (it refuses such a txn).
//! - **Changelog:** the events of every revision from the compaction point on, in sub-revision
//!   order, so watches can start anywhere etcd could have started them. Deletes at or below the
//!   compaction point are gone from etcd's file too, so neither serves them.
//! - **Counters:** the current revision and the compaction point. A compaction that etcd had
//!   scheduled but not finished when the snapshot was taken is resumed, as etcd would on start:
//!   the compaction point is the scheduled one, the physical point the finished one, and the
//!   leader's compaction steps finish the job.
//! - **Leases** with their TTLs (a restored lease starts a full TTL, as in etcd) and the
//!   lease-key index of every live key attached to one.
//! - **Auth:** users (etcd's bcrypt hashes work unchanged), roles, permissions, the auth
//!   revision and whether auth is on. The token signing key is not in etcd's file (etcd's simple
//!   tokens live in memory); it is left empty, and the first Authenticate on the restored
//!   cluster replicates a fresh random one (`api::auth`), so every member restored from the same
//!   file holds the same state and no key is derivable from the file.
//!
//! Refused, with the record that is wrong: a record whose mod revision is not its revision, one
//! key changed twice in one revision, and a live key attached to a lease the file does not hold.
//! Nothing is written before the whole snapshot has been checked.

use std::collections::HashSet;

use picket_etcdsnap::EtcdSnapshot;
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::{Event, KeyValue};
use picket_proto::picket::storage::v1::{AuthState, LeaseRecord, RevisionEvents};
use prost::Message;
use rocksdb::{WriteBatch, WriteOptions};

use crate::auth::replicated;
use crate::mvcc::keys;
use crate::storage::engine::Cf;
use crate::storage::rocks::RocksEngine;

/// Records per RocksDB write batch, so the store being built is not held in memory as well as
/// the snapshot.
const BATCH_RECORDS: usize = 10_000;

/// Why an etcd snapshot cannot be imported as it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    #[error(
        "the record at revision {main}_{sub} of key {key:?} says mod revision {mod_revision}; \
         an etcd snapshot's records carry their own revision"
    )]
    ModRevision { key: String, main: i64, sub: i64, mod_revision: i64 },
    #[error("key {key:?} changes twice in revision {main}; etcd never writes that")]
    TwiceInOneRevision { key: String, main: i64 },
    #[error("key {key:?} is attached to lease {lease:x}, which the snapshot does not hold")]
    MissingLease { key: String, lease: i64 },
    #[error("storage: {0}")]
    Storage(#[from] rocksdb::Error),
}

fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// Checks `snap` whole, then writes it into the empty store `engine` (synced at the end).
pub fn import(engine: &RocksEngine, snap: &EtcdSnapshot) -> Result<(), ImportError> {
    let live = snap.kvs_at(snap.revision);
    check(snap, &live)?;
    let db = engine.db();
    let mut batch = WriteBatch::default();
    let flush = |batch: &mut WriteBatch, sync: bool| -> Result<(), rocksdb::Error> {
        let mut wo = WriteOptions::default();
        // Durability: the restore fsyncs the whole staging directory before publishing it;
        // syncing the last write as well keeps the rule "every write of a restore is durable"
        // without paying an fsync per batch.
        wo.set_sync(sync);
        db.write_opt(std::mem::take(batch), &wo)
    };

    let compacted = snap.compact_revision.unwrap_or(0);
    let changelog = |batch: &mut WriteBatch, rev: i64, events: Vec<Event>| {
        let record = RevisionEvents { events };
        batch.put_cf(
            engine.cf_handle(Cf::Changelog),
            keys::changelog_key(rev),
            record.encode_to_vec(),
        );
    };
    // Records come in revision order, so one revision's events are consecutive: each
    // changelog record is written as soon as its revision ends, and nothing is held for later.
    let mut revision_events: Option<(i64, Vec<Event>)> = None;
    let mut pending = 0usize;
    for r in &snap.records {
        let key = keys::kv_key(&r.kv.key, r.main);
        let value = if r.tombstone { Vec::new() } else { r.kv.encode_to_vec() };
        batch.put_cf(engine.cf_handle(Cf::Kv), key, value);
        if r.main >= compacted {
            let event = if r.tombstone {
                Event {
                    r#type: EventType::Delete as i32,
                    kv: Some(KeyValue {
                        key: r.kv.key.clone(),
                        mod_revision: r.main,
                        ..Default::default()
                    }),
                    prev_kv: None,
                }
            } else {
                Event { r#type: EventType::Put as i32, kv: Some(r.kv.clone()), prev_kv: None }
            };
            match &mut revision_events {
                Some((rev, events)) if *rev == r.main => events.push(event),
                other => {
                    if let Some((rev, events)) = other.take() {
                        changelog(&mut batch, rev, events);
                    }
                    *other = Some((r.main, vec![event]));
                }
            }
        }
        pending += 1;
        if pending >= BATCH_RECORDS {
            flush(&mut batch, false)?;
            pending = 0;
        }
    }
    if let Some((rev, events)) = revision_events {
        changelog(&mut batch, rev, events);
    }

    for kv in live.into_iter().filter(|kv| kv.lease != 0) {
        batch.put_cf(engine.cf_handle(Cf::LeaseKeys), keys::lease_key(kv.lease, &kv.key), []);
    }
    for l in &snap.leases {
        let record = LeaseRecord { id: l.id, ttl: l.ttl };
        batch.put_cf(engine.cf_handle(Cf::Lease), l.id.to_be_bytes(), record.encode_to_vec());
    }

    let meta = engine.cf_handle(Cf::Meta);
    batch.put_cf(meta, keys::META_REVISION, snap.revision.to_be_bytes());
    let (point, physical) = compaction_points(snap);
    if let Some(point) = point {
        batch.put_cf(meta, keys::META_COMPACT_REVISION, point.to_be_bytes());
    }
    if let Some(physical) = physical {
        batch.put_cf(meta, keys::META_COMPACT_PHYSICAL, physical.to_be_bytes());
    }
    let mut users = snap.auth.users.clone();
    users.sort_by(|a, b| a.name.cmp(&b.name));
    let mut roles = snap.auth.roles.clone();
    roles.sort_by(|a, b| a.name.cmp(&b.name));
    let auth = AuthState {
        enabled: snap.auth.enabled,
        revision: snap.auth.revision,
        signing_key: Vec::new(),
        users,
        roles,
    };
    if auth != AuthState::default() {
        for (key, value) in replicated::stored_records(&auth) {
            batch.put_cf(meta, key, value);
        }
    }
    flush(&mut batch, true)?;
    Ok(())
}

/// The compaction point and, when etcd's last compaction did not finish, the physical point
/// (how far it got): `(None, None)` for a store never compacted.
fn compaction_points(snap: &EtcdSnapshot) -> (Option<i64>, Option<i64>) {
    match (snap.compact_revision, snap.scheduled_compact_revision) {
        (Some(done), Some(scheduled)) if scheduled > done => (Some(scheduled), Some(done)),
        // A compaction scheduled before any finished: nothing was dropped yet, so physically
        // the store starts from its beginning.
        (None, Some(scheduled)) => (Some(scheduled), Some(0)),
        (done, _) => (done, None),
    }
}

/// Everything [`import`] refuses, found before anything is written. `live` is the snapshot's
/// key-values at its revision.
fn check(snap: &EtcdSnapshot, live: &[&KeyValue]) -> Result<(), ImportError> {
    let mut in_revision: HashSet<&[u8]> = HashSet::new();
    let mut current = None;
    for r in &snap.records {
        if !r.tombstone && r.kv.mod_revision != r.main {
            return Err(ImportError::ModRevision {
                key: show(&r.kv.key),
                main: r.main,
                sub: r.sub,
                mod_revision: r.kv.mod_revision,
            });
        }
        if current != Some(r.main) {
            current = Some(r.main);
            in_revision.clear();
        }
        if !in_revision.insert(&r.kv.key) {
            return Err(ImportError::TwiceInOneRevision { key: show(&r.kv.key), main: r.main });
        }
    }
    let leases: HashSet<i64> = snap.leases.iter().map(|l| l.id).collect();
    for kv in live {
        if kv.lease != 0 && !leases.contains(&kv.lease) {
            return Err(ImportError::MissingLease { key: show(&kv.key), lease: kv.lease });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use picket_etcdsnap::{Lease, Record};

    use super::*;

    fn snap(records: Vec<Record>, leases: Vec<Lease>) -> EtcdSnapshot {
        EtcdSnapshot {
            revision: records.last().map_or(1, |r| r.main),
            compact_revision: None,
            scheduled_compact_revision: None,
            consistent_index: 0,
            records,
            leases,
            auth: Default::default(),
            has_sha256_trailer: true,
        }
    }

    /// [`check`] with the live keys computed as [`import`] computes them.
    fn check(s: &EtcdSnapshot) -> Result<(), ImportError> {
        super::check(s, &s.kvs_at(s.revision))
    }

    fn put(key: &str, main: i64, sub: i64, lease: i64) -> Record {
        let kv = KeyValue {
            key: key.into(),
            create_revision: main,
            mod_revision: main,
            version: 1,
            value: b"v".to_vec(),
            lease,
        };
        Record { main, sub, tombstone: false, kv }
    }

    #[test]
    fn what_etcd_never_writes_is_refused_before_anything_is_written() {
        assert!(check(&snap(vec![put("a", 2, 0, 0), put("b", 2, 1, 0)], vec![])).is_ok());
        let mut wrong = put("a", 2, 0, 0);
        wrong.kv.mod_revision = 3;
        assert!(matches!(check(&snap(vec![wrong], vec![])), Err(ImportError::ModRevision { .. })));
        let twice = vec![put("a", 2, 0, 0), put("a", 2, 1, 0)];
        assert!(matches!(
            check(&snap(twice, vec![])),
            Err(ImportError::TwiceInOneRevision { main: 2, .. })
        ));
        let orphan = vec![put("a", 2, 0, 9)];
        assert!(matches!(
            check(&snap(orphan.clone(), vec![])),
            Err(ImportError::MissingLease { lease: 9, .. })
        ));
        let lease = Lease { id: 9, ttl: 60, remaining_ttl: 0 };
        assert!(check(&snap(orphan, vec![lease])).is_ok());
    }

    #[test]
    fn an_unfinished_compaction_is_resumed() {
        let mut s = snap(vec![], vec![]);
        assert_eq!(compaction_points(&s), (None, None));
        s.compact_revision = Some(5);
        s.scheduled_compact_revision = Some(5);
        assert_eq!(compaction_points(&s), (Some(5), None));
        s.scheduled_compact_revision = Some(8);
        assert_eq!(compaction_points(&s), (Some(8), Some(5)));
        s.compact_revision = None;
        assert_eq!(compaction_points(&s), (Some(8), Some(0)));
    }
}
