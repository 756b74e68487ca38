//! Key-range permissions: what a request needs and whether a user's roles cover it.
//!
//! A permission (and a request) names `[key, range_end)`: an empty `range_end` is the single key
//! `key`, and `range_end == "\0"` is every key from `key` on (etcd's conventions). A request is
//! allowed when the union of the user's permitted ranges of the right type covers its whole range
//! (etcd's `rangePermCache`): READ is granted by READ and READWRITE, WRITE by WRITE and
//! READWRITE. A user holding the `root` role may do everything.

use picket_proto::authpb::permission::Type as PermType;
use picket_proto::authpb::{Role, User};
use picket_proto::etcdserverpb::request_op::Request as OpRequest;
use picket_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use super::{AuthError, ROOT};

/// `[key, range_end)` with etcd's conventions (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

impl KeyRange {
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        Self { key: key.to_vec(), range_end: range_end.to_vec() }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: &[u8]) -> Self {
        Self { key: prefix.to_vec(), range_end: picket_proto::prefix_end(prefix) }
    }

    /// The half-open interval this range denotes.
    fn interval(&self) -> (Vec<u8>, End) {
        let end = if self.range_end.is_empty() {
            let mut k = self.key.clone();
            k.push(0);
            End::Key(k)
        } else if self.range_end == [0] {
            End::Inf
        } else {
            End::Key(self.range_end.clone())
        };
        (self.key.clone(), end)
    }
}

/// The exclusive end of an interval; `Inf` sorts after every key (variant order).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Key(Vec<u8>),
    Inf,
}

/// One access a request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    Read(KeyRange),
    Write(KeyRange),
}

/// Whether a permission's range is well formed (non-empty).
pub fn valid_perm_range(key: &[u8], range_end: &[u8]) -> bool {
    range_end.is_empty() || range_end == [0] || key < range_end
}

/// Whether `user` holds the root role.
pub fn is_root(user: &User) -> bool {
    user.roles.iter().any(|r| r == ROOT)
}

/// Checks every need of a request against `user`'s roles (looked up in `roles`).
pub fn check(user: &User, roles: &[Role], needs: &[Need]) -> Result<(), AuthError> {
    if is_root(user) {
        return Ok(());
    }
    let granted = |want_write: bool| {
        let mut out = Vec::new();
        for role in roles.iter().filter(|r| user.roles.iter().any(|n| n.as_bytes() == r.name)) {
            for p in &role.key_permission {
                let ok = match PermType::try_from(p.perm_type) {
                    Ok(PermType::Readwrite) => true,
                    Ok(PermType::Read) => !want_write,
                    Ok(PermType::Write) => want_write,
                    Err(_) => false,
                };
                if ok {
                    out.push(KeyRange::new(&p.key, &p.range_end).interval());
                }
            }
        }
        out.sort();
        out
    };
    let (mut reads, mut writes) = (None, None);
    for need in needs {
        let (range, set) = match need {
            Need::Read(r) => (r, reads.get_or_insert_with(|| granted(false))),
            Need::Write(r) => (r, writes.get_or_insert_with(|| granted(true))),
        };
        if !covers(set, range) {
            return Err(AuthError::PermissionDenied);
        }
    }
    Ok(())
}

/// Whether the sorted `intervals` together cover `range`.
fn covers(intervals: &[(Vec<u8>, End)], range: &KeyRange) -> bool {
    let (start, end) = range.interval();
    if let End::Key(e) = &end {
        if *e <= start {
            // An empty range reads or writes nothing.
            return true;
        }
    }
    // Walk the intervals in start order, extending the covered prefix [start, reached).
    let mut reached = End::Key(start);
    for (s, e) in intervals {
        let gap = match &reached {
            End::Key(r) => s > r,
            End::Inf => false,
        };
        if gap {
            break;
        }
        if *e > reached {
            reached = e.clone();
        }
        if reached >= end {
            return true;
        }
    }
    reached >= end
}

/// What a Range needs.
pub fn range_needs(req: &RangeRequest) -> Vec<Need> {
    vec![Need::Read(KeyRange::new(&req.key, &req.range_end))]
}

/// What a Put needs: WRITE on the key, and READ too when it returns the previous value.
pub fn put_needs(req: &PutRequest, out: &mut Vec<Need>) {
    out.push(Need::Write(KeyRange::new(&req.key, &[])));
    if req.prev_kv {
        out.push(Need::Read(KeyRange::new(&req.key, &[])));
    }
}

/// What a DeleteRange needs: WRITE on the range, and READ too when it returns what it deleted.
pub fn delete_needs(req: &DeleteRangeRequest, out: &mut Vec<Need>) {
    out.push(Need::Write(KeyRange::new(&req.key, &req.range_end)));
    if req.prev_kv {
        out.push(Need::Read(KeyRange::new(&req.key, &req.range_end)));
    }
}

fn compare_needs(c: &Compare, out: &mut Vec<Need>) {
    out.push(Need::Read(KeyRange::new(&c.key, &c.range_end)));
}

fn op_needs(op: &RequestOp, out: &mut Vec<Need>) {
    match &op.request {
        Some(OpRequest::RequestRange(r)) => out.extend(range_needs(r)),
        Some(OpRequest::RequestPut(p)) => put_needs(p, out),
        Some(OpRequest::RequestDeleteRange(d)) => delete_needs(d, out),
        Some(OpRequest::RequestTxn(t)) => txn_needs_into(t, out),
        None => {}
    }
}

fn txn_needs_into(txn: &TxnRequest, out: &mut Vec<Need>) {
    for c in &txn.compare {
        compare_needs(c, out);
    }
    // Both branches: which one runs is only known at apply time.
    for op in txn.success.iter().chain(&txn.failure) {
        op_needs(op, out);
    }
}

/// What a Txn needs: READ for every compare and range, WRITE for every put and delete, in both
/// branches and nested txns.
pub fn txn_needs(txn: &TxnRequest) -> Vec<Need> {
    let mut out = Vec::new();
    txn_needs_into(txn, &mut out);
    out
}
