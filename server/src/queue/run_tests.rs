//! The claimed run never changes what apply decides: random histories of every write a queue
//! sees (enqueues, claims with and without deadlines, acks, ack-claims, nacks, extends, lease
//! ends, clocks going back, foreign writes under the queue's keys) applied to two stores, one
//! keeping its run and scan floor, one forgetting both before every batch (a member that just
//! started); every outcome and the whole store must be the same.

use picket_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest};
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::raft::v1::queue_command::Op;
use picket_proto::picket::raft::v1::{QueueAckClaimOp, QueueAckOp, QueueClaimOp, QueueCommand};
use picket_proto::picket::v1::{QueueClaimRecord, QueueJobRecord, QueuePendingRecord};
use picket_proto::prefix_end;
use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::lease::LeaseTable;
use crate::mvcc::{ApplyBatch, MvccStore};
use crate::queue::{decide, txns};
use crate::storage::engine::MemEngine;

const Q: &str = "work";
const LEASES: [i64; 3] = [1, 2, 3];

struct Side {
    store: MvccStore<MemEngine>,
    leases: LeaseTable,
    forget: bool,
}

/// One write of the history, applied to each side in turn.
type StepFn = dyn Fn(&mut ApplyBatch<'_, MemEngine>, &mut LeaseTable) -> String;
type Step<'a> = &'a StepFn;

impl Side {
    fn new(forget: bool) -> Self {
        let mut leases = LeaseTable::default();
        for id in LEASES {
            leases.grant(id, 60).unwrap();
        }
        Self { store: MvccStore::open(MemEngine::new()).unwrap(), leases, forget }
    }

    fn batch(&mut self, steps: &[Step<'_>]) -> Vec<String> {
        let mut b = self.store.begin_apply();
        if self.forget {
            b.forget_hints();
        }
        let out = steps.iter().map(|s| s(&mut b, &mut self.leases)).collect();
        b.commit(false).unwrap();
        out
    }

    fn all(&self) -> (i64, Vec<KeyValue>) {
        let r = self
            .store
            .range(&RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() })
            .unwrap();
        (r.header.unwrap().revision, r.kvs)
    }

    fn under(&self, prefix: &[u8]) -> Vec<KeyValue> {
        let req = RangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        self.store.range(&req).unwrap().kvs
    }

    fn run_len(&mut self) -> usize {
        let mut b = self.store.begin_apply();
        b.follower(&keys::queue_prefix(Q), || ClaimedRun::new(Q)).entries().len()
    }
}

fn command(now_ms: u64, op: Op) -> QueueCommand {
    QueueCommand { queue: Q.into(), now_ms, op: Some(op) }
}

fn decide_step(
    cmd: QueueCommand,
) -> impl Fn(&mut ApplyBatch<'_, MemEngine>, &mut LeaseTable) -> String {
    move |b, leases| format!("{:?}", decide::apply(b, leases, &cmd))
}

fn claim_record(kv: &KeyValue) -> Option<QueueClaimRecord> {
    QueueClaimRecord::decode(kv.value.as_slice()).ok()
}

/// Whether the test can build a nack of this claim: its record and its index entry are there
/// and decode (foreign writes may have broken either).
fn nackable((_, kv): &(String, KeyValue), pending: &[KeyValue]) -> bool {
    let Some(rec) = claim_record(kv) else { return false };
    let old = rec.pending_key.into_bytes();
    keys::parse_pending_key(Q, &old).is_some()
        && pending
            .iter()
            .any(|p| p.key == old && QueuePendingRecord::decode(p.value.as_slice()).is_ok())
}

/// What a random history does at each step, with the weights it picks them by.
fn random_step(rng: &mut StdRng, a: &Side, now_ms: u64, n: &mut u32) -> Box<StepFn> {
    let claims: Vec<(String, KeyValue)> = a
        .under(&keys::claim_prefix(Q))
        .into_iter()
        .filter_map(|kv| Some((keys::id_after(&keys::claim_prefix(Q), &kv.key)?, kv)))
        .collect();
    let pending = a.under(&keys::pending_prefix(Q));
    let lease = LEASES[rng.random_range(0..LEASES.len())];
    let visibility_ms = if rng.random_bool(0.3) { rng.random_range(5..60) } else { 0 };
    let claim = QueueClaimOp { lease, visibility_ms, request_id: String::new() };
    let some_claim =
        (!claims.is_empty()).then(|| claims[rng.random_range(0..claims.len())].clone());
    // A token that is the claim's, or (sometimes) a stale one.
    let token = |kv: &KeyValue, rng: &mut StdRng| {
        if rng.random_bool(0.9) {
            kv.create_revision
        } else {
            kv.create_revision - 1
        }
    };
    match rng.random_range(0..100) {
        0..=24 => {
            *n += 1;
            let id = format!("j{n:04}");
            let job = QueueJobRecord {
                payload: id.clone().into_bytes(),
                priority: rng.random_range(0..2),
                max_attempts: rng.random_range(1..4),
                ..Default::default()
            };
            let delay = if rng.random_bool(0.2) { rng.random_range(1..40) } else { 0 };
            let txn = txns::enqueue(Q, &id, &job, now_ms, delay, None);
            Box::new(move |b, l| format!("{:?}", b.txn(&txn, l).map(|r| r.succeeded)))
        }
        25..=49 => Box::new(decide_step(command(now_ms, Op::Claim(claim)))),
        50..=64 if some_claim.is_some() => {
            let (id, kv) = some_claim.unwrap();
            let ack = QueueAckOp { job_id: id, token: token(&kv, rng) };
            Box::new(decide_step(command(now_ms, Op::Ack(ack))))
        }
        65..=79 if some_claim.is_some() => {
            let (id, kv) = some_claim.unwrap();
            let ack = QueueAckOp { job_id: id, token: token(&kv, rng) };
            let op = QueueAckClaimOp { ack: Some(ack), claim: Some(claim) };
            Box::new(decide_step(command(now_ms, Op::AckClaim(op))))
        }
        80..=84 if some_claim.as_ref().is_some_and(|c| nackable(c, &pending)) => {
            // A nack, moving the entry to a later ready time or leaving it in place.
            let (id, kv) = some_claim.unwrap();
            let rec = QueueClaimRecord::decode(kv.value.as_slice()).unwrap();
            let old = rec.pending_key.clone().into_bytes();
            let pk = keys::parse_pending_key(Q, &old).unwrap();
            let at = if rng.random_bool(0.5) { pk.ready_at_ms } else { now_ms + 7 };
            let new = keys::pending_key(Q, pk.priority, at, &id);
            let entry = pending.iter().find(|p| p.key == old).unwrap();
            let mut record = QueuePendingRecord::decode(entry.value.as_slice()).unwrap();
            record.last_error = "nacked".into();
            let txn = txns::nack(Q, &id, token(&kv, rng), &old, &new, &record);
            Box::new(move |b, l| format!("{:?}", b.txn(&txn, l).map(|r| r.succeeded)))
        }
        85..=88 if some_claim.as_ref().is_some_and(|(_, kv)| claim_record(kv).is_some()) => {
            let (id, kv) = some_claim.unwrap();
            let mut rec = QueueClaimRecord::decode(kv.value.as_slice()).unwrap();
            rec.deadline_ms =
                if rng.random_bool(0.3) { 0 } else { now_ms + rng.random_range(1..80) };
            let txn = txns::extend(Q, &id, token(&kv, rng), kv.lease, &rec);
            Box::new(move |b, l| format!("{:?}", b.txn(&txn, l).map(|r| r.succeeded)))
        }
        89..=91 => {
            // A worker's lease ends (its claims go with it) and a new one takes its id.
            Box::new(move |b, l| {
                let keys = b.revoke_lease_keys(lease);
                l.revoke(lease).unwrap();
                l.grant(lease, 60).unwrap();
                format!("{keys:?}")
            })
        }
        92..=95 if some_claim.is_some() => {
            // Foreign writes to a claim: deleted, or rewritten with garbage or with no deadline.
            let (_, kv) = some_claim.unwrap();
            let key = kv.key.clone();
            match rng.random_range(0..3) {
                0 => Box::new(move |b, _| {
                    let del = DeleteRangeRequest { key: key.clone(), ..Default::default() };
                    format!("{:?}", b.delete_range(&del).map(|r| r.deleted))
                }),
                k => {
                    let value = if k == 1 {
                        vec![0xff, 0xff]
                    } else {
                        let mut rec = claim_record(&kv).unwrap_or_default();
                        rec.deadline_ms = 0;
                        rec.encode_to_vec()
                    };
                    let put = PutRequest { key, value, ..Default::default() };
                    Box::new(move |b, l| format!("{:?}", b.put(&put, l).map(|_| ())))
                }
            }
        }
        96..=99 if !pending.is_empty() => {
            // Foreign writes to the index: an entry deleted, or its record rewritten.
            let kv = pending[rng.random_range(0..pending.len())].clone();
            if rng.random_bool(0.3) {
                // The same job id again, later in the index.
                let Some(pk) = keys::parse_pending_key(Q, &kv.key) else { unreachable!() };
                let key = keys::pending_key(Q, pk.priority, pk.ready_at_ms + 3, &pk.id);
                let put = PutRequest { key, value: kv.value, ..Default::default() };
                Box::new(move |b, l| format!("{:?}", b.put(&put, l).map(|_| ())))
            } else if rng.random_bool(0.5) {
                Box::new(move |b, _| {
                    let del = DeleteRangeRequest { key: kv.key.clone(), ..Default::default() };
                    format!("{:?}", b.delete_range(&del).map(|r| r.deleted))
                })
            } else {
                let put = PutRequest { key: kv.key, value: kv.value, ..Default::default() };
                Box::new(move |b, l| format!("{:?}", b.put(&put, l).map(|_| ())))
            }
        }
        _ => Box::new(decide_step(command(now_ms, Op::Claim(claim)))),
    }
}

/// Many random histories: every outcome and the whole store agree between a member keeping
/// its run and one that forgets it before every batch, and the run was in use (long runs of
/// jobs in flight) for much of them.
#[test]
fn the_claimed_run_never_changes_what_apply_decides() {
    let mut used = 0usize;
    for seed in 0..24u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut a, mut b) = (Side::new(false), Side::new(true));
        let (mut now, mut n) = (1_000u64, 0u32);
        for step in 0..300 {
            // The serving member's clock: mostly forward, sometimes back (another member).
            now = if rng.random_bool(0.1) {
                now.saturating_sub(rng.random_range(0..30))
            } else {
                now + rng.random_range(0..10)
            };
            let count = if rng.random_bool(0.2) { rng.random_range(2..4) } else { 1 };
            let steps: Vec<_> =
                (0..count).map(|_| random_step(&mut rng, &a, now, &mut n)).collect();
            let refs: Vec<Step<'_>> = steps.iter().map(|s| s.as_ref() as Step<'_>).collect();
            let (out_a, out_b) = (a.batch(&refs), b.batch(&refs));
            assert_eq!(out_a, out_b, "seed {seed}, step {step}: outcomes");
            if step % 10 == 0 {
                assert_eq!(a.all(), b.all(), "seed {seed}, step {step}: stores");
            }
            if a.run_len() >= 3 {
                used += 1;
            }
        }
        assert_eq!(a.all(), b.all(), "seed {seed}: stores at the end");
    }
    // Most histories keep long runs for much of their length (a few lose them early to lease
    // ends and foreign writes): 24 x 300 steps held 3+ jobs in flight at ~1,200 steps.
    assert!(used >= 600, "the run held 3+ jobs in flight at only {used} steps");
}

/// The common case, counted: with jobs in flight at the head, a claim's run holds them all,
/// an ack takes its job out, and a lease's end cuts the run at its first claim.
#[test]
fn the_run_holds_the_jobs_in_flight_and_a_lease_end_cuts_it() {
    let mut a = Side::new(false);
    let mut steps: Vec<Box<StepFn>> = Vec::new();
    for i in 0..6 {
        let job = QueueJobRecord { payload: vec![i], max_attempts: 3, ..Default::default() };
        let txn = txns::enqueue(Q, &format!("j{i}"), &job, 10 + u64::from(i), 0, None);
        steps.push(Box::new(move |b, l| format!("{:?}", b.txn(&txn, l).map(|r| r.succeeded))));
    }
    for lease in [1, 2, 1, 2] {
        let claim = QueueClaimOp { lease, visibility_ms: 0, request_id: String::new() };
        steps.push(Box::new(decide_step(command(100, Op::Claim(claim)))));
    }
    for s in &steps {
        a.batch(&[s.as_ref() as Step<'_>]);
    }
    assert_eq!(a.run_len(), 4, "the four claimed jobs");
    // Lease 2 holds j1 and j3: its end cuts the run at j1, leaving j0.
    let revoke: Step<'_> = &|b, l| {
        let keys = b.revoke_lease_keys(2);
        l.revoke(2).unwrap();
        format!("{keys:?}")
    };
    a.batch(&[revoke]);
    assert_eq!(a.run_len(), 1);
    let claim = QueueClaimOp { lease: 1, visibility_ms: 0, request_id: String::new() };
    let next = decide_step(command(100, Op::Claim(claim)));
    assert!(a.batch(&[&next])[0].contains("j1"), "the freed job is claimed next");
}

/// A claim that starts after a long run still stops where a scan from the floor stops: past
/// 64 pages of 128 jobs in flight it answers "nothing yet", as it always did, and does not
/// claim the job after them.
#[test]
fn a_claim_after_a_long_run_keeps_the_page_budget() {
    let mut a = Side::new(false);
    let total = 64 * 128 + 2;
    let mut steps: Vec<Box<StepFn>> = Vec::new();
    for i in 0..total {
        let job = QueueJobRecord { payload: vec![1], max_attempts: 3, ..Default::default() };
        let txn = txns::enqueue(Q, &format!("j{i:05}"), &job, 10, 0, None);
        steps.push(Box::new(move |b, l| format!("{:?}", b.txn(&txn, l).map(|r| r.succeeded))));
    }
    let refs: Vec<Step<'_>> = steps.iter().map(|s| s.as_ref() as Step<'_>).collect();
    a.batch(&refs);
    let claim = decide_step(command(
        100,
        Op::Claim(QueueClaimOp { lease: 1, visibility_ms: 0, request_id: String::new() }),
    ));
    let claims: Vec<Step<'_>> = vec![&claim; 64];
    for _ in 0..128 {
        assert!(a.batch(&claims).iter().all(|o| o.contains("Claimed")));
    }
    assert_eq!(a.run_len(), MAX_RUN, "the run stops at its limit");
    let with_run = a.batch(&[&claim]);
    assert!(with_run[0].contains("Empty"), "{with_run:?}");
    a.forget = true;
    assert_eq!(a.batch(&[&claim]), with_run);
}
