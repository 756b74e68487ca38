//! What `etcdctl snapshot status` reports, computed the way etcd 3.4 computes it
//! (`clientv3/snapshot/v3_snapshot.go`, `Status`), so the numbers are the same for the same file.

use crate::bolt::{Db, Value};
use crate::crc32c::Crc32c;
use crate::error::show;
use crate::{revision, Error};

/// The summary of a snapshot file, field for field `etcdctl snapshot status -w json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// CRC-32C over, for each top-level bucket in name order, the bucket's name and then each
    /// entry's key and value in key order. A nested bucket's entry adds only its key: bbolt
    /// hands etcd a nil value for it.
    pub hash: u32,
    /// The main revision of the last `key` record (0 when there is none). Unlike
    /// [`crate::EtcdSnapshot::revision`] it is not raised to the compaction revision: etcdctl
    /// does not.
    pub revision: i64,
    /// The number of entries in all top-level buckets (`totalKey`).
    pub total_keys: u64,
    /// bbolt's `Tx.Size()`: pages in use times the page size, the trailer not included.
    pub total_size: u64,
}

pub fn compute(db: &Db<'_>) -> Result<Status, Error> {
    let mut walk = db.walk();
    let mut hash = Crc32c::default();
    let mut status = Status { hash: 0, revision: 0, total_keys: 0, total_size: db.size() };
    for (name, value) in walk.entries(db.root())? {
        let Value::Bucket(bucket) = value else {
            return Err(Error::NotABucket { key: show(name) });
        };
        hash.update(name);
        let is_key = name == b"key";
        walk.for_each(bucket, &mut |k, v| {
            hash.update(k);
            if let Value::Data(v) = v {
                hash.update(v);
            }
            if is_key {
                status.revision = revision::key(k)
                    .map_err(|reason| Error::BadEntry { bucket: "key", key: show(k), reason })?
                    .main;
            }
            status.total_keys += 1;
            Ok(())
        })?;
    }
    status.hash = hash.sum();
    Ok(status)
}
