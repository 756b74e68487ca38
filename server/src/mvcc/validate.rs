//! Request checks the API layer runs before proposing, as etcd's `v3rpc/key.go` does.
//!
//! They depend only on the request, never on the store, so a request that fails them never
//! reaches the Raft log. Checks that need the store (revisions, leases, key existence) happen
//! at apply time, in the same order on every replica.

use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use super::error::MvccError;

/// etcd `checkRangeRequest`.
pub fn range(req: &RangeRequest) -> Result<(), MvccError> {
    if req.key.is_empty() {
        return Err(MvccError::KeyNotProvided);
    }
    Ok(())
}

/// etcd `checkPutRequest`.
pub fn put(req: &PutRequest) -> Result<(), MvccError> {
    if req.key.is_empty() {
        return Err(MvccError::KeyNotProvided);
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(MvccError::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(MvccError::LeaseProvided);
    }
    Ok(())
}

/// etcd `checkDeleteRequest`.
pub fn delete_range(req: &DeleteRangeRequest) -> Result<(), MvccError> {
    if req.key.is_empty() {
        return Err(MvccError::KeyNotProvided);
    }
    Ok(())
}

/// etcd `kvServer.Txn`'s checks: `checkTxnRequest` (sizes, keys, nested ops, with nested txns
/// limited to what the outer one leaves of `max_txn_ops`), then `checkIntervals` on each
/// branch (no key written twice).
pub fn txn(req: &TxnRequest, max_txn_ops: usize) -> Result<(), MvccError> {
    check_txn(req, max_txn_ops)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    Ok(())
}

/// etcd `isTxnReadonly`: every op of both branches is a range (a nested txn counts as a write).
pub fn is_txn_read_only(req: &TxnRequest) -> bool {
    req.success.iter().chain(&req.failure).all(|op| matches!(op.request, Some(Op::RequestRange(_))))
}

fn check_txn(req: &TxnRequest, max_txn_ops: usize) -> Result<(), MvccError> {
    let ops = req.compare.len().max(req.success.len()).max(req.failure.len());
    if ops > max_txn_ops {
        return Err(MvccError::TooManyOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(MvccError::KeyNotProvided);
    }
    for op in req.success.iter().chain(&req.failure) {
        check_op(op, max_txn_ops - ops)?;
    }
    Ok(())
}

fn check_op(op: &RequestOp, max_txn_ops: usize) -> Result<(), MvccError> {
    match &op.request {
        Some(Op::RequestRange(r)) => range(r),
        Some(Op::RequestPut(p)) => put(p),
        Some(Op::RequestDeleteRange(d)) => delete_range(d),
        Some(Op::RequestTxn(t)) => check_txn(t, max_txn_ops),
        // etcd answers an empty op with ErrGRPCKeyNotFound.
        None => Err(MvccError::KeyNotFound),
    }
}

/// A deleted key range `[begin, end)` as etcd's interval tree sees it.
///
/// etcd builds `[key, range_end)` from the raw `range_end`, so `range_end == "\0"` ("every key
/// from `key` on") becomes an interval that contains no non-empty key: such a delete never
/// conflicts with a put. Picket keeps that quirk on purpose, since rejecting txns etcd accepts
/// would break clients, and the store applies a delete and a put of one key in one txn
/// correctly anyway (in op order).
struct Interval {
    begin: Vec<u8>,
    end: Vec<u8>,
}

impl Interval {
    fn of_delete(key: &[u8], range_end: &[u8]) -> Self {
        let end = if range_end.is_empty() {
            // A single key is the point interval [key, key + "\0").
            let mut e = key.to_vec();
            e.push(0);
            e
        } else {
            range_end.to_vec()
        };
        Interval { begin: key.to_vec(), end }
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.begin.as_slice() <= key && key < self.end.as_slice()
    }
}

type Puts = std::collections::BTreeSet<Vec<u8>>;

/// etcd `checkIntervals`: returns the keys put and ranges deleted by `ops` (nested txns
/// included), or [`MvccError::DuplicateKey`] when one branch writes a key twice: two puts, or a
/// put inside a delete. The two branches of a nested txn may put the same key, since only one
/// runs. As in etcd, the check is not symmetric: a put in an earlier nested txn and a delete
/// in a later one pass.
fn check_intervals(ops: &[RequestOp]) -> Result<(Puts, Vec<Interval>), MvccError> {
    let mut dels: Vec<Interval> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Op::RequestDeleteRange(d)) => Some(Interval::of_delete(&d.key, &d.range_end)),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[Interval], k: &[u8]| dels.iter().any(|d| d.contains(k));

    let mut puts = Puts::new();
    for op in ops {
        let Some(Op::RequestTxn(nested)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&nested.success)?;
        let (puts_else, dels_else) = check_intervals(&nested.failure)?;
        for k in &puts_then {
            if puts.contains(k) || deleted(&dels, k) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(k.clone());
        }
        for k in puts_else {
            if puts.contains(&k) && !puts_then.contains(&k) {
                return Err(MvccError::DuplicateKey);
            }
            if deleted(&dels, &k) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(k);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }

    for op in ops {
        let Some(Op::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || deleted(&dels, &p.key) {
            return Err(MvccError::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
