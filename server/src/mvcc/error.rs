//! The MVCC error type.
//!
//! Most variants are deterministic outcomes of a command (every replica computes the same one),
//! so they can travel in a command result. Their `Display` text is etcd's error message
//! verbatim because clients match on it; [`MvccError::kind`] names each on the wire and
//! `api::status` pairs the name with etcd's gRPC code.
//! [`MvccError::Engine`] and [`MvccError::Corrupt`] are the exception: they mean this node's
//! storage failed, and the node must stop rather than answer.

use picket_proto::picket::raft::v1::RefusalKind;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::storage::engine::EngineError;

#[derive(Debug, Clone, PartialEq, Eq, Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum MvccError {
    /// The requested revision is older than the compaction point (or, for a compaction, not
    /// newer than it). etcd `ErrCompacted`, gRPC OutOfRange. Ask for a newer revision.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// The requested revision is newer than the store's. etcd `ErrFutureRev`, gRPC OutOfRange.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    /// A put named a lease that does not exist. etcd `ErrLeaseNotFound`, gRPC NotFound.
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound(i64),
    /// `ignore_value`/`ignore_lease` on a key that does not exist, or an empty `RequestOp` in a
    /// txn. etcd `ErrKeyNotFound`/`ErrGRPCKeyNotFound`, gRPC InvalidArgument.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// An empty key. etcd `ErrGRPCEmptyKey`, gRPC InvalidArgument.
    #[error("etcdserver: key is not provided")]
    KeyNotProvided,
    /// A txn branch or compare list longer than `--max-txn-ops`. etcd `ErrGRPCTooManyOps`,
    /// gRPC InvalidArgument.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// A txn writes one key twice in one branch. etcd `ErrGRPCDuplicateKey`,
    /// gRPC InvalidArgument.
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// `ignore_value` together with a value. etcd `ErrGRPCValueProvided`, gRPC InvalidArgument.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a lease. etcd `ErrGRPCLeaseProvided`, gRPC InvalidArgument.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A read-only txn entry point was given a txn that writes. A caller bug, not a client
    /// error: check `validate::is_txn_read_only` first (gRPC Internal).
    #[error("picket: txn is not read-only")]
    TxnNotReadOnly,
    /// The storage engine failed. Fatal for the node.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Stored MVCC data does not decode or breaks an invariant. Fatal for the node.
    #[error("picket: corrupt mvcc data: {0}")]
    Corrupt(String),
}

impl MvccError {
    /// Whether this error means the node's storage failed rather than the request: such errors
    /// are never sent to clients as a command's outcome.
    pub fn is_fatal(&self) -> bool {
        matches!(self, MvccError::Engine(_) | MvccError::Corrupt(_))
    }

    /// The name a refusal with this error travels under; `None` for the fatal errors, which are
    /// never a command's outcome.
    pub fn kind(&self) -> Option<RefusalKind> {
        use RefusalKind as K;
        Some(match self {
            MvccError::Compacted => K::MvccCompacted,
            MvccError::FutureRevision => K::MvccFutureRevision,
            MvccError::LeaseNotFound(_) => K::MvccLeaseNotFound,
            MvccError::KeyNotFound => K::MvccKeyNotFound,
            MvccError::KeyNotProvided => K::MvccKeyNotProvided,
            MvccError::TooManyOps => K::MvccTooManyOps,
            MvccError::DuplicateKey => K::MvccDuplicateKey,
            MvccError::ValueProvided => K::MvccValueProvided,
            MvccError::LeaseProvided => K::MvccLeaseProvided,
            MvccError::TxnNotReadOnly => K::MvccTxnNotReadOnly,
            MvccError::Engine(_) | MvccError::Corrupt(_) => return None,
        })
    }
}

impl From<prost::DecodeError> for MvccError {
    fn from(e: prost::DecodeError) -> Self {
        MvccError::Corrupt(format!("undecodable record: {e}"))
    }
}
