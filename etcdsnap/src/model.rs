//! The neutral model of an etcd snapshot: what a restore needs, in etcd's own terms and types,
//! with nothing of bbolt left in it.

use std::collections::BTreeMap;

use picket_proto::authpb::{Role, User};
use picket_proto::mvccpb::KeyValue;

/// Everything [`crate::read`] takes from a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdSnapshot {
    /// etcd's current revision when the snapshot was taken, by the rule etcd applies when it
    /// opens a backend: the main revision of the last `key` record, raised to the finished
    /// compaction revision if that is higher (a compaction may have removed the tombstones at
    /// the top of the history), and at least 1 (an empty store's revision).
    pub revision: i64,
    /// The revision of the last finished compaction (`meta/finishedCompactRev`); `None` when the
    /// store was never compacted. History below it is gone.
    pub compact_revision: Option<i64>,
    /// The revision of the last compaction requested (`meta/scheduledCompactRev`). When it is
    /// above [`Self::compact_revision`] the compaction was cut short and etcd resumes it on
    /// start; a restore should finish it.
    pub scheduled_compact_revision: Option<i64>,
    /// The Raft index of the last entry applied (`meta/consistent_index`); 0 when absent.
    pub consistent_index: u64,
    /// Every record of the `key` bucket, in (main, sub) revision order.
    pub records: Vec<Record>,
    /// Every lease of the `lease` bucket, in id order.
    pub leases: Vec<Lease>,
    pub auth: Auth,
    /// Whether the file ended with etcd's SHA-256 trailer (which was then verified). A database
    /// file copied out of a data directory has none.
    pub has_sha256_trailer: bool,
}

/// One `key` bucket record: a put, or a delete (tombstone).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub main: i64,
    pub sub: i64,
    /// A delete of `kv.key`; etcd stores only the key in a tombstone's `kv`.
    pub tombstone: bool,
    pub kv: KeyValue,
}

/// A lease of the `lease` bucket. Deadlines are not stored: a restored lease starts a new TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    /// The TTL granted, in seconds.
    pub ttl: i64,
    /// The TTL left at the last lease checkpoint (etcd's experimental lease checkpointing);
    /// 0 when never checkpointed, which means the full TTL.
    pub remaining_ttl: i64,
}

/// The auth store: the `auth`, `authUsers` and `authRoles` buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Auth {
    /// `auth/authEnabled` is 1.
    pub enabled: bool,
    /// `auth/authRevision`: bumped by every auth change; tokens carry it. 0 when absent.
    pub revision: u64,
    /// In name order; passwords are bcrypt hashes, as etcd stores them.
    pub users: Vec<User>,
    /// In name order.
    pub roles: Vec<Role>,
}

impl EtcdSnapshot {
    /// The key-values live at `revision`, in key order: for each key, its newest record at or
    /// below `revision`, unless that record is a delete. At or above the compaction revision
    /// this is what etcd answers for a range at `revision`; below it, history is incomplete.
    pub fn kvs_at(&self, revision: i64) -> Vec<&KeyValue> {
        let mut live: BTreeMap<&[u8], Option<&KeyValue>> = BTreeMap::new();
        for r in self.records.iter().take_while(|r| r.main <= revision) {
            live.insert(&r.kv.key, (!r.tombstone).then_some(&r.kv));
        }
        live.into_values().flatten().collect()
    }
}
