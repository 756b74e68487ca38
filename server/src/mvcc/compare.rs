//! Txn guards: etcd's `applyCompare`/`compareKV`.
//!
//! A compare holds when it holds for every live key in its range. With no live key, the
//! attribute is compared as zero (so `create_revision == 0` means "absent"), except a VALUE
//! compare, which then always fails: gRPC cannot tell an empty value from a missing one.

use std::cmp::Ordering;

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::Compare;
use picket_proto::mvccpb::KeyValue;

use super::error::MvccError;
use super::read;
use crate::storage::engine::ReadView;

/// Evaluates one compare against the keys live at `at_rev` in `view`.
pub fn compare(view: &dyn ReadView, c: &Compare, at_rev: i64) -> Result<bool, MvccError> {
    let kvs = read::range_at(view, &c.key, &c.range_end, at_rev)?;
    if kvs.is_empty() {
        if c.target == CompareTarget::Value as i32 {
            return Ok(false);
        }
        return Ok(compare_kv(c, &KeyValue::default()));
    }
    Ok(kvs.iter().all(|kv| compare_kv(c, kv)))
}

/// All compares hold (true for an empty list).
pub fn compare_all(view: &dyn ReadView, cs: &[Compare], at_rev: i64) -> Result<bool, MvccError> {
    for c in cs {
        if !compare(view, c, at_rev)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// etcd's `compareKV`: an operand of the wrong kind for the target counts as zero/empty, an
/// unknown target compares equal and an unknown result holds.
pub fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let int_operand =
        |pick: fn(&TargetUnion) -> Option<i64>| c.target_union.as_ref().and_then(pick).unwrap_or(0);
    let ord = match CompareTarget::try_from(c.target) {
        Ok(CompareTarget::Value) => {
            let v: &[u8] = match &c.target_union {
                Some(TargetUnion::Value(v)) => v,
                _ => &[],
            };
            kv.value.as_slice().cmp(v)
        }
        Ok(CompareTarget::Create) => kv.create_revision.cmp(&int_operand(|t| match t {
            TargetUnion::CreateRevision(r) => Some(*r),
            _ => None,
        })),
        Ok(CompareTarget::Mod) => kv.mod_revision.cmp(&int_operand(|t| match t {
            TargetUnion::ModRevision(r) => Some(*r),
            _ => None,
        })),
        Ok(CompareTarget::Version) => kv.version.cmp(&int_operand(|t| match t {
            TargetUnion::Version(r) => Some(*r),
            _ => None,
        })),
        Ok(CompareTarget::Lease) => kv.lease.cmp(&int_operand(|t| match t {
            TargetUnion::Lease(r) => Some(*r),
            _ => None,
        })),
        Err(_) => Ordering::Equal,
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => ord == Ordering::Equal,
        Ok(CompareResult::NotEqual) => ord != Ordering::Equal,
        Ok(CompareResult::Greater) => ord == Ordering::Greater,
        Ok(CompareResult::Less) => ord == Ordering::Less,
        Err(_) => true,
    }
}
