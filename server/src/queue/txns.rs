//! The Txns that implement every queue operation. Pure builders (no I/O), so their compares can
//! be unit-tested; [`super::ops`] reads, builds and runs them. Every write that changes a job's
//! ownership compares the claim key, so correctness rests on compares evaluated in apply.

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use picket_proto::picket::v1::{
    QueueClaimRecord, QueueDeadRecord, QueueJobRecord, QueuePendingRecord,
};
use prost::Message;

use super::keys;

fn cmp(key: Vec<u8>, target: CompareTarget, value: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key,
        range_end: Vec::new(),
        target_union: Some(value),
    }
}

/// `create_revision(key) == rev` (0: the key is absent).
pub fn created_at(key: Vec<u8>, rev: i64) -> Compare {
    cmp(key, CompareTarget::Create, TargetUnion::CreateRevision(rev))
}

/// `mod_revision(key) == rev`: nobody changed the key since it was read.
pub fn unchanged(key: Vec<u8>, rev: i64) -> Compare {
    cmp(key, CompareTarget::Mod, TargetUnion::ModRevision(rev))
}

fn put(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest { key, value, lease, ..Default::default() })),
    }
}

fn delete(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestDeleteRange(DeleteRangeRequest { key, ..Default::default() })),
    }
}

/// A single-key read op.
pub fn get(key: Vec<u8>) -> RequestOp {
    RequestOp { request: Some(Op::RequestRange(RangeRequest { key, ..Default::default() })) }
}

/// A new job: `job/<id>`, its index entry (ready `delay_ms` after `now_ms`, the serving
/// member's clock) and, with a dedup id, `dedup/<dedup>`, only if the id and the dedup id are
/// both new. Failure reads `dedup/<dedup>` (op 0, when given) so the caller can return the
/// existing job.
pub fn enqueue(
    queue: &str,
    id: &str,
    job: &QueueJobRecord,
    now_ms: u64,
    delay_ms: u64,
    dedup: Option<&str>,
) -> TxnRequest {
    let ready_at_ms = now_ms.saturating_add(delay_ms);
    let pending = QueuePendingRecord {
        job_id: id.to_string(),
        attempts: 0,
        last_error: String::new(),
        max_attempts: job.max_attempts,
        backoff_ms: job.backoff_ms,
        delay_ms: Some(delay_ms),
    };
    let mut compare = vec![created_at(keys::job_key(queue, id), 0)];
    let mut success = vec![
        put(keys::job_key(queue, id), job.encode_to_vec(), 0),
        put(keys::pending_key(queue, job.priority, ready_at_ms, id), pending.encode_to_vec(), 0),
    ];
    let mut failure = Vec::new();
    if let Some(d) = dedup {
        compare.push(created_at(keys::dedup_key(queue, d), 0));
        success.push(put(keys::dedup_key(queue, d), id.as_bytes().to_vec(), 0));
        failure.push(get(keys::dedup_key(queue, d)));
    }
    TxnRequest { compare, success, failure }
}

/// Claims the job of index entry `pending_key` (read at `pending_mod`) for `lease`: only if the
/// entry is unchanged and the job has no claim. Writes the bumped attempt count and the claim
/// key (its create revision, the Txn's revision, is the fencing token) and reads `job/<id>` (op
/// 2) for the payload.
pub fn claim(
    queue: &str,
    id: &str,
    pending_key: &[u8],
    pending_mod: i64,
    bumped: &QueuePendingRecord,
    lease: i64,
    record: &QueueClaimRecord,
) -> TxnRequest {
    TxnRequest {
        compare: vec![
            unchanged(pending_key.to_vec(), pending_mod),
            created_at(keys::claim_key(queue, id), 0),
        ],
        success: vec![
            put(pending_key.to_vec(), bumped.encode_to_vec(), 0),
            put(keys::claim_key(queue, id), record.encode_to_vec(), lease),
            get(keys::job_key(queue, id)),
        ],
        failure: Vec::new(),
    }
}

/// Deletes a claim past its visibility deadline, only if nobody touched it since it was read
/// (an Extend changes its `mod_revision`).
pub fn reap(queue: &str, id: &str, claim_mod: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![unchanged(keys::claim_key(queue, id), claim_mod)],
        success: vec![delete(keys::claim_key(queue, id))],
        failure: Vec::new(),
    }
}

/// The compare that proves the caller holds the job's live claim.
pub fn holds(queue: &str, id: &str, token: i64) -> Compare {
    created_at(keys::claim_key(queue, id), token)
}

/// Reads that explain a failed claim compare: the claim (op 0) and the job (op 1).
fn explain(queue: &str, id: &str) -> Vec<RequestOp> {
    vec![get(keys::claim_key(queue, id)), get(keys::job_key(queue, id))]
}

/// Completes the job held with `token`: deletes the claim, the index entry and the job.
pub fn ack(queue: &str, id: &str, token: i64, pending_key: &[u8]) -> TxnRequest {
    TxnRequest {
        compare: vec![holds(queue, id, token)],
        success: vec![
            delete(keys::claim_key(queue, id)),
            delete(pending_key.to_vec()),
            delete(keys::job_key(queue, id)),
        ],
        failure: explain(queue, id),
    }
}

/// Gives the job held with `token` back: ends the claim and moves its index entry to
/// `new_pending_key` (its new ready time) with `record` (the error text).
pub fn nack(
    queue: &str,
    id: &str,
    token: i64,
    old_pending_key: &[u8],
    new_pending_key: &[u8],
    record: &QueuePendingRecord,
) -> TxnRequest {
    let mut success = vec![delete(keys::claim_key(queue, id))];
    // A Txn may not touch one key twice; with an unchanged ready time the put alone suffices.
    if old_pending_key != new_pending_key {
        success.push(delete(old_pending_key.to_vec()));
    }
    success.push(put(new_pending_key.to_vec(), record.encode_to_vec(), 0));
    TxnRequest { compare: vec![holds(queue, id, token)], success, failure: explain(queue, id) }
}

/// Moves a job to `dead/<id>`. `guard` is the compare that makes the move safe: the caller's
/// live claim (a Nack of the last attempt), or "unclaimed and index entry unchanged" (a claimer
/// finding the attempts used up, see [`unclaimed`]).
pub fn dead_letter(
    queue: &str,
    id: &str,
    guard: Vec<Compare>,
    pending_key: &[u8],
    dead: &QueueDeadRecord,
    had_claim: bool,
) -> TxnRequest {
    let mut success = Vec::new();
    if had_claim {
        success.push(delete(keys::claim_key(queue, id)));
    }
    success.push(delete(pending_key.to_vec()));
    success.push(delete(keys::job_key(queue, id)));
    success.push(put(keys::dead_key(queue, id), dead.encode_to_vec(), 0));
    TxnRequest { compare: guard, success, failure: explain(queue, id) }
}

/// "The job has no claim and its index entry is as read": the guard of a claimer's move.
pub fn unclaimed(queue: &str, id: &str, pending_key: &[u8], pending_mod: i64) -> Vec<Compare> {
    vec![unchanged(pending_key.to_vec(), pending_mod), created_at(keys::claim_key(queue, id), 0)]
}

/// Rewrites the claim held with `token` (same lease, so it still ends with the worker) with a
/// new deadline. A put keeps the create revision, so the token does not change.
pub fn extend(
    queue: &str,
    id: &str,
    token: i64,
    lease: i64,
    record: &QueueClaimRecord,
) -> TxnRequest {
    TxnRequest {
        compare: vec![holds(queue, id, token)],
        success: vec![put(keys::claim_key(queue, id), record.encode_to_vec(), lease)],
        failure: explain(queue, id),
    }
}

/// Moves `dead/<id>` (read at `dead_mod`) back into the queue, attempts reset, ready at once
/// (`ready_at_ms`, the serving member's clock).
pub fn requeue(
    queue: &str,
    id: &str,
    dead_mod: i64,
    job: &QueueJobRecord,
    ready_at_ms: u64,
) -> TxnRequest {
    let pending = QueuePendingRecord {
        job_id: id.to_string(),
        attempts: 0,
        last_error: String::new(),
        max_attempts: job.max_attempts,
        backoff_ms: job.backoff_ms,
        delay_ms: Some(0),
    };
    TxnRequest {
        compare: vec![
            unchanged(keys::dead_key(queue, id), dead_mod),
            created_at(keys::job_key(queue, id), 0),
        ],
        success: vec![
            delete(keys::dead_key(queue, id)),
            put(keys::job_key(queue, id), job.encode_to_vec(), 0),
            put(
                keys::pending_key(queue, job.priority, ready_at_ms, id),
                pending.encode_to_vec(),
                0,
            ),
        ],
        failure: Vec::new(),
    }
}

#[cfg(test)]
#[path = "txns_tests.rs"]
mod tests;
