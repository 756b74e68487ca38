//! The replicated lease table.

use std::collections::BTreeMap;

use picket_proto::picket::raft::v1::RefusalKind;
use picket_proto::picket::storage::v1::LeaseRecord;
use thiserror::Error;

use crate::mvcc::LeaseLookup;

/// The shortest TTL granted; shorter requests are raised to it, as etcd does. etcd derives its
/// floor from the election timeout (1.5 election timeouts, 2 s with the defaults); Picket uses
/// the same 2 s as a constant so apply stays deterministic. Leader changes cannot make a short
/// lease expire early: a new leader restarts every lease's full TTL (see `LeaseClock`).
pub const MIN_TTL_SECONDS: i64 = 2;

/// The largest TTL etcd accepts (`MaxLeaseTTL`, 9e9 seconds).
pub const MAX_TTL_SECONDS: i64 = 9_000_000_000;

/// Deterministic outcomes of lease commands, serialized into the command result.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseError {
    /// etcd: `etcdserver: requested lease not found` (NotFound).
    #[error("etcdserver: requested lease not found")]
    NotFound,
    /// etcd: `etcdserver: lease already exists` (FailedPrecondition).
    #[error("etcdserver: lease already exists")]
    AlreadyExists,
    /// etcd: `etcdserver: too large lease TTL` (OutOfRange).
    #[error("etcdserver: too large lease TTL")]
    TtlTooLarge,
}

impl LeaseError {
    /// The name a refusal with this error travels under (the API layer maps it to a code).
    pub fn kind(&self) -> RefusalKind {
        match self {
            LeaseError::NotFound => RefusalKind::LeaseNotFound,
            LeaseError::AlreadyExists => RefusalKind::LeaseAlreadyExists,
            LeaseError::TtlTooLarge => RefusalKind::LeaseTtlTooLarge,
        }
    }
}

/// All live leases, keyed by id.
#[derive(Debug, Default, Clone)]
pub struct LeaseTable {
    leases: BTreeMap<i64, LeaseRecord>,
}

impl LeaseTable {
    pub fn from_records(records: impl IntoIterator<Item = LeaseRecord>) -> Self {
        Self { leases: records.into_iter().map(|r| (r.id, r)).collect() }
    }

    /// Validates and records a grant. The id was chosen by the proposer (never 0 here); the
    /// TTL is raised to the minimum, as etcd does.
    pub fn grant(&mut self, id: i64, ttl: i64) -> Result<LeaseRecord, LeaseError> {
        if ttl > MAX_TTL_SECONDS {
            return Err(LeaseError::TtlTooLarge);
        }
        if self.leases.contains_key(&id) {
            return Err(LeaseError::AlreadyExists);
        }
        let record = LeaseRecord { id, ttl: ttl.max(MIN_TTL_SECONDS) };
        self.leases.insert(id, record);
        Ok(record)
    }

    pub fn revoke(&mut self, id: i64) -> Result<LeaseRecord, LeaseError> {
        self.leases.remove(&id).ok_or(LeaseError::NotFound)
    }

    pub fn get(&self, id: i64) -> Option<&LeaseRecord> {
        self.leases.get(&id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &LeaseRecord> {
        self.leases.values()
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }
}

impl LeaseLookup for LeaseTable {
    fn exists(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_raises_ttl_to_minimum_and_rejects_duplicates() {
        let mut t = LeaseTable::default();
        assert_eq!(t.grant(7, 1).map(|r| r.ttl), Ok(MIN_TTL_SECONDS));
        assert_eq!(t.grant(7, 60), Err(LeaseError::AlreadyExists));
        assert!(t.exists(7));
        assert_eq!(t.revoke(7).map(|r| r.id), Ok(7));
        assert_eq!(t.revoke(7), Err(LeaseError::NotFound));
        assert_eq!(t.grant(8, MAX_TTL_SECONDS + 1), Err(LeaseError::TtlTooLarge));
    }
}
