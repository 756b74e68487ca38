//! Txn execution, as etcd v3.5's `applierV3backend.Txn`.
//!
//! The order matters and is etcd's:
//! 1. Every compare, including those of nested txns on the chosen path, is evaluated against
//!    the state *before* the txn (`compareToPath`), giving the path as a list of booleans in
//!    depth-first order. A nested txn's compare does not see writes of the outer txn.
//! 2. The puts on the path are checked against that same state: `ignore_value`/`ignore_lease`
//!    need the key to exist, a lease must exist. Then the ranges: a revision above the current
//!    one is a future revision, below the compaction point is compacted.
//! 3. The ops run in order; ranges see the txn's earlier writes. All writes share one revision.
//!
//! A check failure fails the whole txn before any op runs. An op that fails while running
//! (only possible when a delete earlier in the same txn removed the key an `ignore_value` put
//! needs, which etcd answers with a panic) fails the whole request, and its writes are dropped.

use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::response_op::Response;
use picket_proto::etcdserverpb::{RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse};

use super::compare::compare_all;
use super::error::MvccError;
use super::read;
use super::request::{header, Request};
use super::LeaseLookup;
use crate::storage::engine::ReadView;

/// Runs `txn` inside `ctx`, which must not have written yet.
pub(crate) fn txn(
    ctx: &mut Request<'_>,
    txn: &TxnRequest,
    leases: &dyn LeaseLookup,
) -> Result<TxnResponse, MvccError> {
    let begin = ctx.begin;
    let compacted = ctx.compacted;
    let path = {
        let view = ctx.view();
        let mut path = Vec::new();
        compare_to_path(&view, txn, begin, &mut path)?;
        check_ops(txn, &mut path.iter().copied(), &mut |op| match op {
            Op::RequestPut(p) => {
                if (p.ignore_value || p.ignore_lease)
                    && read::get_at(&view, &p.key, begin)?.is_none()
                {
                    return Err(MvccError::KeyNotFound);
                }
                if p.lease != 0 && !leases.exists(p.lease) {
                    return Err(MvccError::LeaseNotFound(p.lease));
                }
                Ok(())
            }
            _ => Ok(()),
        })?;
        check_ops(txn, &mut path.iter().copied(), &mut |op| match op {
            // etcd `checkRequestRange`: unlike a plain Range, a negative revision is checked
            // against the compaction point as is (so it fails once anything is compacted).
            Op::RequestRange(r) if r.revision != 0 => {
                if r.revision > begin {
                    Err(MvccError::FutureRevision)
                } else if r.revision < compacted {
                    Err(MvccError::Compacted)
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        })?;
        path
    };
    let mut cursor = path.into_iter();
    let mut resp = execute(ctx, txn, &mut cursor, leases)?;
    resp.header = header(ctx.read_rev());
    Ok(resp)
}

fn path_exhausted() -> MvccError {
    // Invariant: `compare_to_path` pushes one entry per txn on the path, and `check_ops` and
    // `execute` visit the same txns in the same order.
    MvccError::Corrupt("txn path shorter than the txn (bug)".into())
}

/// etcd `compareToPath`: the outcome of this txn's compares, then of each nested txn on the
/// chosen branch, depth first.
fn compare_to_path(
    view: &dyn ReadView,
    txn: &TxnRequest,
    at_rev: i64,
    path: &mut Vec<bool>,
) -> Result<(), MvccError> {
    let ok = compare_all(view, &txn.compare, at_rev)?;
    path.push(ok);
    for op in branch(txn, ok) {
        if let Some(Op::RequestTxn(nested)) = &op.request {
            compare_to_path(view, nested, at_rev, path)?;
        }
    }
    Ok(())
}

fn branch(txn: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &txn.success
    } else {
        &txn.failure
    }
}

/// etcd `checkRequests`: calls `f` on every non-txn op of the chosen path, depth first.
fn check_ops(
    txn: &TxnRequest,
    path: &mut impl Iterator<Item = bool>,
    f: &mut impl FnMut(&Op) -> Result<(), MvccError>,
) -> Result<(), MvccError> {
    let ok = path.next().ok_or_else(path_exhausted)?;
    for op in branch(txn, ok) {
        match &op.request {
            Some(Op::RequestTxn(nested)) => check_ops(nested, path, f)?,
            Some(other) => f(other)?,
            None => {}
        }
    }
    Ok(())
}

/// etcd `applyTxn`. A nested txn's response carries an empty header, as in etcd.
fn execute(
    ctx: &mut Request<'_>,
    txn: &TxnRequest,
    path: &mut impl Iterator<Item = bool>,
    leases: &dyn LeaseLookup,
) -> Result<TxnResponse, MvccError> {
    let succeeded = path.next().ok_or_else(path_exhausted)?;
    let ops = branch(txn, succeeded);
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match &op.request {
            Some(Op::RequestRange(r)) => Some(Response::ResponseRange(ctx.range(r)?)),
            Some(Op::RequestPut(p)) => Some(Response::ResponsePut(ctx.put(p, leases, false)?)),
            Some(Op::RequestDeleteRange(d)) => {
                Some(Response::ResponseDeleteRange(ctx.delete_range(d)?))
            }
            Some(Op::RequestTxn(nested)) => {
                Some(Response::ResponseTxn(execute(ctx, nested, path, leases)?))
            }
            // An empty op (rejected by validation) has an empty response, as in etcd.
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse { header: Some(ResponseHeader::default()), succeeded, responses })
}
