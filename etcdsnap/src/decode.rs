//! From bbolt buckets to the model: which etcd bucket holds what, and how each value is encoded
//! (etcd 3.4 `mvcc/kvstore.go`, `lease/lessor.go`, `auth/store.go`; 3.5 keeps the layout).

use std::collections::BTreeMap;

use picket_proto::authpb::{Role, User};
use picket_proto::mvccpb::KeyValue;
use prost::Message;

use crate::bolt::{Bucket, Db, Value, Walk};
use crate::error::show;
use crate::model::{Auth, EtcdSnapshot, Lease, Record};
use crate::{revision, Error};

/// etcd's `leasepb.Lease`, the value of a `lease` bucket entry. Defined here because Picket's
/// wire protos do not include etcd's server-internal packages.
#[derive(Clone, PartialEq, prost::Message)]
struct LeasePb {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(int64, tag = "2")]
    ttl: i64,
    #[prost(int64, tag = "3")]
    remaining_ttl: i64,
}

/// A bucket's plain entries, key and value, in key order.
type Entries<'a> = Vec<(&'a [u8], &'a [u8])>;

/// The plain values of one bucket, in key order. etcd nests no buckets inside its buckets, so a
/// nested one is an error rather than something to skip silently.
fn values<'a>(
    walk: &mut Walk<'a>,
    bucket: Bucket<'a>,
    name: &'static str,
) -> Result<Entries<'a>, Error> {
    let mut out = Vec::new();
    walk.for_each(bucket, &mut |k, v| match v {
        Value::Data(v) => {
            out.push((k, v));
            Ok(())
        }
        Value::Bucket(_) => Err(Error::UnexpectedBucket { bucket: name, key: show(k) }),
    })?;
    Ok(out)
}

fn bad(bucket: &'static str, key: &[u8], reason: &'static str) -> Error {
    Error::BadEntry { bucket, key: show(key), reason }
}

fn decode<M: Message + Default>(bucket: &'static str, key: &[u8], v: &[u8]) -> Result<M, Error> {
    M::decode(v).map_err(|source| Error::Decode { bucket, key: show(key), source })
}

fn be_u64(bucket: &'static str, key: &[u8], v: &[u8]) -> Result<u64, Error> {
    let a: [u8; 8] = v.try_into().map_err(|_| bad(bucket, key, "not an 8-byte integer"))?;
    Ok(u64::from_be_bytes(a))
}

/// Reads the model out of an opened database (its trailer already checked).
pub fn snapshot(db: &Db<'_>, has_sha256_trailer: bool) -> Result<EtcdSnapshot, Error> {
    let mut walk = db.walk();
    let mut top: BTreeMap<&[u8], Bucket<'_>> = BTreeMap::new();
    for (name, value) in walk.entries(db.root())? {
        match value {
            Value::Bucket(b) => top.insert(name, b),
            Value::Data(_) => return Err(Error::NotABucket { key: show(name) }),
        };
    }
    let mut bucket = |name: &'static str| -> Result<Entries<'_>, Error> {
        match top.get(name.as_bytes()) {
            Some(b) => values(&mut walk, *b, name),
            None => Ok(Vec::new()),
        }
    };
    // `key` and `meta` are created by every etcd 3 store before anything is written; without
    // them this is some other program's bbolt file.
    for name in ["key", "meta"] {
        if !top.contains_key(name.as_bytes()) {
            return Err(Error::MissingBucket { name });
        }
    }
    let records = records(bucket("key")?)?;
    let mut snap = EtcdSnapshot {
        revision: 1,
        compact_revision: None,
        scheduled_compact_revision: None,
        consistent_index: 0,
        records,
        leases: leases(bucket("lease")?)?,
        auth: Auth::default(),
        has_sha256_trailer,
    };
    for (k, v) in bucket("meta")? {
        // Other keys (3.5's `term` and `confState`, 3.6's `storageVersion`) describe the Raft
        // state of the old cluster, which a restore replaces.
        match k {
            b"consistent_index" => snap.consistent_index = be_u64("meta", k, v)?,
            b"finishedCompactRev" => {
                snap.compact_revision = Some(revision::main(v).map_err(|r| bad("meta", k, r))?)
            }
            b"scheduledCompactRev" => {
                snap.scheduled_compact_revision =
                    Some(revision::main(v).map_err(|r| bad("meta", k, r))?)
            }
            _ => {}
        }
    }
    for (k, v) in bucket("auth")? {
        match k {
            b"authEnabled" => snap.auth.enabled = v == [1],
            b"authRevision" => snap.auth.revision = be_u64("auth", k, v)?,
            _ => {}
        }
    }
    for (k, v) in bucket("authUsers")? {
        snap.auth.users.push(decode::<User>("authUsers", k, v)?);
    }
    for (k, v) in bucket("authRoles")? {
        snap.auth.roles.push(decode::<Role>("authRoles", k, v)?);
    }
    let last = snap.records.last().map_or(1, |r| r.main);
    snap.revision = last.max(snap.compact_revision.unwrap_or(0)).max(1);
    Ok(snap)
}

fn records(entries: Entries<'_>) -> Result<Vec<Record>, Error> {
    entries
        .into_iter()
        .map(|(k, v)| {
            let rev = revision::key(k).map_err(|r| bad("key", k, r))?;
            let kv = decode::<KeyValue>("key", k, v)?;
            Ok(Record { main: rev.main, sub: rev.sub, tombstone: rev.tombstone, kv })
        })
        .collect()
}

fn leases(entries: Entries<'_>) -> Result<Vec<Lease>, Error> {
    entries
        .into_iter()
        .map(|(k, v)| {
            let id = be_u64("lease", k, k)? as i64;
            let pb = decode::<LeasePb>("lease", k, v)?;
            // etcd recovers a lease from the value's ID; the key is the same id, for ordering.
            if pb.id != id {
                return Err(bad("lease", k, "the key and the value's ID differ"));
            }
            Ok(Lease { id, ttl: pb.ttl, remaining_ttl: pb.remaining_ttl })
        })
        .collect()
}
