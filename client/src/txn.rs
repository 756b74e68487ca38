//! A transaction builder that reads like the request: compare, then, else.

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::kv_client::KvClient;
use picket_proto::etcdserverpb::request_op::Request;
use picket_proto::etcdserverpb::{Compare as PbCompare, RequestOp, TxnRequest, TxnResponse};

use crate::client::{request, Client, Retry};
use crate::error::Error;
use crate::kv::{prefix_end, DeleteOptions, GetOptions, PutOptions};

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `>`
    Greater,
    /// `<`
    Less,
}

impl CompareOp {
    fn to_pb(self) -> CompareResult {
        match self {
            CompareOp::Equal => CompareResult::Equal,
            CompareOp::NotEqual => CompareResult::NotEqual,
            CompareOp::Greater => CompareResult::Greater,
            CompareOp::Less => CompareResult::Less,
        }
    }
}

/// One condition of a transaction. A key that does not exist has version, create revision,
/// mod revision and lease 0, and no value (a value comparison on it is false).
#[derive(Debug, Clone)]
pub struct Compare(PbCompare);

impl Compare {
    fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: CompareTarget, u: TargetUnion) -> Self {
        Compare(PbCompare {
            result: op.to_pb() as i32,
            target: target as i32,
            key: key.into(),
            range_end: Vec::new(),
            target_union: Some(u),
        })
    }
    /// Compares the key's value.
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Self {
        Self::new(key, op, CompareTarget::Value, TargetUnion::Value(value.into()))
    }
    /// Compares the key's version (0 when it does not exist).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        Self::new(key, op, CompareTarget::Version, TargetUnion::Version(version))
    }
    /// Compares the key's create revision: the fencing-token check is
    /// `Compare::create_revision(lock_key, CompareOp::Equal, token)`.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, rev: i64) -> Self {
        Self::new(key, op, CompareTarget::Create, TargetUnion::CreateRevision(rev))
    }
    /// Compares the key's last modification revision.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, rev: i64) -> Self {
        Self::new(key, op, CompareTarget::Mod, TargetUnion::ModRevision(rev))
    }
    /// Compares the key's lease id.
    pub fn lease(key: impl Into<Vec<u8>>, op: CompareOp, lease: i64) -> Self {
        Self::new(key, op, CompareTarget::Lease, TargetUnion::Lease(lease))
    }
    /// Applies the comparison to every key starting with the key (all must satisfy it).
    pub fn with_prefix(mut self) -> Self {
        self.0.range_end = prefix_end(&self.0.key);
        self
    }
    /// Applies the comparison to every key in `[key, end)`.
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.0.range_end = end.into();
        self
    }
}

/// One operation of a transaction branch.
#[derive(Debug, Clone)]
pub struct TxnOp(RequestOp);

impl TxnOp {
    /// A put.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Self::put_with(key, value, PutOptions::new())
    }
    /// A put with options.
    pub fn put_with(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, o: PutOptions) -> Self {
        TxnOp(RequestOp {
            request: Some(Request::RequestPut(o.to_request(key.into(), value.into()))),
        })
    }
    /// A get of one key.
    pub fn get(key: impl Into<Vec<u8>>) -> Self {
        Self::get_with(key, GetOptions::new())
    }
    /// A get with options.
    pub fn get_with(key: impl Into<Vec<u8>>, o: GetOptions) -> Self {
        TxnOp(RequestOp { request: Some(Request::RequestRange(o.to_request(key.into()))) })
    }
    /// A delete of one key.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Self::delete_with(key, DeleteOptions::new())
    }
    /// A delete with options.
    pub fn delete_with(key: impl Into<Vec<u8>>, o: DeleteOptions) -> Self {
        TxnOp(RequestOp { request: Some(Request::RequestDeleteRange(o.to_request(key.into()))) })
    }
    /// A nested transaction.
    pub fn txn(t: Txn) -> Self {
        TxnOp(RequestOp { request: Some(Request::RequestTxn(t.into_request())) })
    }
}

/// A transaction: if every comparison holds, run the `and_then` branch, else the `or_else`
/// branch, all at one revision.
///
/// # Examples
/// ```
/// use picket_client::{Compare, CompareOp, Txn, TxnOp};
///
/// // Create "config" only if it does not exist yet; either way, read it back.
/// let txn = Txn::new()
///     .when([Compare::version("config", CompareOp::Equal, 0)])
///     .and_then([TxnOp::put("config", "v1"), TxnOp::get("config")])
///     .or_else([TxnOp::get("config")]);
/// # let _ = txn;
/// ```
#[derive(Debug, Clone, Default)]
pub struct Txn {
    compare: Vec<PbCompare>,
    success: Vec<RequestOp>,
    failure: Vec<RequestOp>,
}

impl Txn {
    /// An empty transaction (no comparisons: the `and_then` branch runs).
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds comparisons; all must hold.
    pub fn when(mut self, cmps: impl IntoIterator<Item = Compare>) -> Self {
        self.compare.extend(cmps.into_iter().map(|c| c.0));
        self
    }
    /// Adds operations to run when every comparison holds.
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.success.extend(ops.into_iter().map(|o| o.0));
        self
    }
    /// Adds operations to run otherwise.
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.failure.extend(ops.into_iter().map(|o| o.0));
        self
    }
    /// Whether no branch writes anything (so the transaction is a read and may be retried).
    pub fn is_read_only(&self) -> bool {
        fn ro(op: &RequestOp) -> bool {
            match &op.request {
                Some(Request::RequestRange(_)) | None => true,
                Some(Request::RequestTxn(t)) => {
                    t.success.iter().all(ro) && t.failure.iter().all(ro)
                }
                _ => false,
            }
        }
        self.success.iter().all(ro) && self.failure.iter().all(ro)
    }
    /// The wire request.
    pub fn into_request(self) -> TxnRequest {
        TxnRequest { compare: self.compare, success: self.success, failure: self.failure }
    }
}

impl Client {
    /// Runs a transaction. A read-only transaction is retried like a get; one that writes is
    /// never retried once it may have reached a server ([`Error::OutcomeUnknown`]).
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        let retry = if txn.is_read_only() { Retry::Idempotent } else { Retry::Write };
        let req = txn.into_request();
        self.call(retry, |ch| {
            let req = req.clone();
            async move { Ok(KvClient::new(ch).txn(request(req)).await?.into_inner()) }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_produces_the_request_it_reads_like() {
        let t = Txn::new()
            .when([Compare::create_revision("lock/a", CompareOp::Equal, 5).with_prefix()])
            .and_then([TxnOp::put("x", "1")])
            .or_else([TxnOp::get("lock/a")]);
        assert!(!t.is_read_only());
        let r = t.into_request();
        assert_eq!(r.compare.len(), 1);
        assert_eq!(r.compare[0].target, CompareTarget::Create as i32);
        assert_eq!(r.compare[0].range_end, b"lock/b");
        assert!(matches!(r.success[0].request, Some(Request::RequestPut(_))));
        assert!(matches!(r.failure[0].request, Some(Request::RequestRange(_))));
        let ro = Txn::new().and_then([TxnOp::txn(Txn::new().or_else([TxnOp::get("k")]))]);
        assert!(ro.is_read_only());
    }
}
