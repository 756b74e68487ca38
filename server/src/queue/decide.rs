//! Claims and acks decided in apply (`picket.raft.v1.QueueCommand`): the job a claim gets is
//! picked inside the claim's own apply step, from the replicated state, so a claim is one Raft
//! write and no two claimers race for one job (issue 20). Before this, a claimer read the index,
//! chose the head job and proposed a Txn comparing it was still unclaimed; with 16 workers all
//! chose the same head job, one won and fifteen retried, and the queue got slower with more
//! workers.
//!
//! Everything here is deterministic: the serving member's clock reading travels in the command
//! (`now_ms`), reads see only this apply batch, and nothing runs concurrently with apply, so a
//! decision made here never goes stale before it is written. The writes are the same Txns
//! ([`super::txns`]) the rest of the queue uses, run in this batch, so the layout, the fencing
//! token (the claim key's create revision) and the watch events are what they always were.
//!
//! A claim may first tidy what blocks it: a claim past its visibility deadline is deleted (its
//! job is then claimable) and a job that used its attempts is dead-lettered, each its own
//! revision, at most [`MAX_FIXES`] per command so one command's work stays bounded.
//!
//! A claim's work is proportional to the jobs it passes (delayed ahead of the first ready one,
//! or in flight and not yet known to be), not to the queue's history: the index is scanned
//! from a scan floor (`ApplyBatch::scan_floor`) past the entries of finished jobs and from the
//! end of the claimed run ([`super::run`]) past the jobs in flight, each passed entry's claim
//! is one point read, and a retried request id is looked up among the lease's own keys.

use picket_proto::etcdserverpb::response_op::Response as OpResp;
use picket_proto::etcdserverpb::{RangeRequest, TxnRequest, TxnResponse};
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::raft::v1::queue_ack_claimed::Next;
use picket_proto::picket::raft::v1::queue_command::Op;
use picket_proto::picket::raft::v1::queue_result::Outcome;
use picket_proto::picket::raft::v1::{
    QueueAckClaimOp, QueueAckClaimed, QueueAckOp, QueueClaimOp, QueueCommand, QueueCorrupt,
    QueueDone, QueueEmpty, QueueResult, QueueStale,
};
use picket_proto::picket::v1::{
    ClaimedJob, QueueClaimRecord, QueueDeadRecord, QueueJobRecord, QueuePendingRecord,
};
use picket_proto::prefix_end;
use prost::Message;

use super::run::{ClaimedRun, Passed};
use super::{keys, txns};
use crate::mvcc::{ApplyBatch, LeaseLookup, MvccError};
use crate::storage::engine::Engine;

/// Index entries read per page while looking for a claimable job.
const CLAIM_PAGE: usize = 128;
/// Pages one claim reads at most: bounds apply's work when the head of the index is all in
/// flight or delayed (the claimer then waits for a change, as for an empty queue).
const CLAIM_PAGES: usize = 64;
/// Reaps and dead letters one claim command does at most before it answers "nothing yet, retry
/// now" (an [`Outcome::Empty`] due at once): each is a revision and a few writes.
pub const MAX_FIXES: usize = 64;

/// A record that did not decode: the command's outcome, the same on every member.
struct Corrupt(QueueCorrupt);

fn corrupt(key: &[u8], why: impl std::fmt::Display) -> Corrupt {
    Corrupt(QueueCorrupt { key: String::from_utf8_lossy(key).into_owned(), why: why.to_string() })
}

enum Failed {
    Mvcc(MvccError),
    Corrupt(Corrupt),
}

impl From<MvccError> for Failed {
    fn from(e: MvccError) -> Self {
        Failed::Mvcc(e)
    }
}

impl From<Corrupt> for Failed {
    fn from(c: Corrupt) -> Self {
        Failed::Corrupt(c)
    }
}

fn decode<M: Message + Default>(kv: &KeyValue) -> Result<M, Corrupt> {
    M::decode(kv.value.as_slice()).map_err(|e| corrupt(&kv.key, e))
}

/// Applies one queue command. `Err` is an MVCC error for apply's usual table (a claim on a lease
/// that does not exist gets etcd's "requested lease not found").
pub fn apply<E: Engine>(
    b: &mut ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    cmd: &QueueCommand,
) -> Result<QueueResult, MvccError> {
    let out = match &cmd.op {
        Some(Op::Claim(op)) => claim(b, leases, &cmd.queue, op, cmd.now_ms),
        Some(Op::Ack(op)) => ack(b, leases, &cmd.queue, op),
        Some(Op::AckClaim(op)) => ack_claim(b, leases, &cmd.queue, op, cmd.now_ms),
        None => Err(Failed::Corrupt(corrupt(cmd.queue.as_bytes(), "queue command without an op"))),
    };
    let outcome = match out {
        Ok(o) => o,
        Err(Failed::Mvcc(e)) => return Err(e),
        Err(Failed::Corrupt(Corrupt(c))) => Outcome::Corrupt(c),
    };
    Ok(QueueResult { outcome: Some(outcome) })
}

fn get<E: Engine>(b: &ApplyBatch<'_, E>, key: Vec<u8>) -> Result<Option<KeyValue>, MvccError> {
    Ok(b.range(&RangeRequest { key, ..Default::default() })?.kvs.into_iter().next())
}

fn range_kv(resp: &TxnResponse, i: usize) -> Option<&KeyValue> {
    match resp.responses.get(i)?.response.as_ref()? {
        OpResp::ResponseRange(r) => r.kvs.first(),
        _ => None,
    }
}

/// Runs a Txn whose compares this apply step just checked: it must succeed, or the state is
/// not what was read (a bug), which is refused as corrupt rather than written half.
fn run<E: Engine>(
    b: &mut ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    key: &[u8],
    txn: TxnRequest,
) -> Result<TxnResponse, Failed> {
    let resp = b.txn(&txn, leases)?;
    if !resp.succeeded {
        return Err(corrupt(key, "a compare checked in this apply step failed").into());
    }
    Ok(resp)
}

/// The job record of `id`; its absence beside an index entry or a claim is corrupt.
fn job<E: Engine>(b: &ApplyBatch<'_, E>, queue: &str, id: &str) -> Result<QueueJobRecord, Failed> {
    let key = keys::job_key(queue, id);
    match get(b, key.clone())? {
        Some(kv) => Ok(decode(&kv)?),
        None => Err(corrupt(&key, "index entry or claim without its job record").into()),
    }
}

fn claim<E: Engine>(
    b: &mut ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    queue: &str,
    op: &QueueClaimOp,
    now_ms: u64,
) -> Result<Outcome, Failed> {
    if let Some(job) = retried(b, leases, queue, op)? {
        return Ok(Outcome::Claimed(job));
    }
    Ok(match pick(b, leases, queue, op, now_ms)? {
        Next::Claimed(job) => Outcome::Claimed(job),
        Next::Empty(e) => Outcome::Empty(e),
    })
}

/// A worker's "done, give me the next" in one apply step: the ack, then, only if it removed the
/// job, the claim. Nothing is written when the claimer's lease is gone (refused before the ack,
/// as a claim is) or when the ack is stale (its outcome is the answer). A retried request id
/// whose first try applied gets that try's job: the ack and the claim were one command, so the
/// claim's presence proves the ack applied too. A corrupt record met by the claim (foreign
/// writes under the queue's prefix) leaves the ack applied and answers the corrupt outcome, the
/// same on every member, as a plain claim's reaps stay applied when it meets one.
fn ack_claim<E: Engine>(
    b: &mut ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    queue: &str,
    op: &QueueAckClaimOp,
    now_ms: u64,
) -> Result<Outcome, Failed> {
    let (Some(ack_op), Some(claim_op)) = (&op.ack, &op.claim) else {
        return Err(corrupt(queue.as_bytes(), "ack_claim without its ack or its claim").into());
    };
    if let Some(job) = retried(b, leases, queue, claim_op)? {
        let ack_revision = job.token;
        return Ok(Outcome::AckClaimed(QueueAckClaimed {
            ack_revision,
            next: Some(Next::Claimed(job)),
        }));
    }
    let ack_revision = match ack(b, leases, queue, ack_op)? {
        Outcome::Acked(done) => done.revision,
        refused => return Ok(refused),
    };
    let next = pick(b, leases, queue, claim_op, now_ms)?;
    Ok(Outcome::AckClaimed(QueueAckClaimed { ack_revision, next: Some(next) }))
}

/// What every claim does first: refuse a lease that does not exist, before anything is written
/// (the claim could not be written anyway), then find the job a retried request id already
/// claimed, if any.
fn retried<E: Engine>(
    b: &ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    queue: &str,
    op: &QueueClaimOp,
) -> Result<Option<ClaimedJob>, Failed> {
    if !leases.exists(op.lease) {
        return Err(MvccError::LeaseNotFound(op.lease).into());
    }
    if op.request_id.is_empty() {
        return Ok(None);
    }
    resume(b, queue, op)
}

/// The claim proper, once the lease is known to exist and no retried request id matched: the
/// first claimable job gets a claim, or nothing is claimable yet.
fn pick<E: Engine>(
    b: &mut ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    queue: &str,
    op: &QueueClaimOp,
    now_ms: u64,
) -> Result<Next, Failed> {
    let mut fixes = 0;
    let mut wake: Option<u64> = None;
    let mut note = |t: u64| wake = Some(wake.map_or(t, |w: u64| w.min(t)));

    // The claim-order index, live entries only, from the scan floor: the index of a busy queue
    // is mostly deleted entries (every finished job leaves its history until a compaction), and
    // a scan from the prefix would pass all of them on every claim. Past the floor come the
    // jobs in flight; the claimed run ([`ClaimedRun`]) says where they end, if it holds now.
    let prefix = keys::pending_prefix(queue);
    let end = prefix_end(&prefix);
    let owner = keys::queue_prefix(queue);
    let hint = b.follower(&owner, || ClaimedRun::new(queue)).start(now_ms);
    let floor = b.scan_floor(&prefix);
    let (mut start, before) = match &hint {
        Some(r) => {
            if let Some(w) = r.wake {
                note(w);
            }
            if let Some(first) = r.first.as_ref().filter(|f| floor.as_ref() != Some(*f)) {
                // The run's first entry is the first live one past the floor.
                b.set_scan_floor(&prefix, first.clone());
            }
            (floor.filter(|f| *f > r.end).unwrap_or_else(|| r.end.clone()), r.len)
        }
        None => (floor.unwrap_or_else(|| prefix.clone()), 0),
    };
    // A scan from the floor would have passed `before` live entries (the run) by here: its
    // pages continue where they would be, so the page budget ends where it always did.
    let mut page_no = before / CLAIM_PAGE;
    let mut limit = CLAIM_PAGE - before % CLAIM_PAGE;
    // What this scan learns for the run: every live entry it passes (claimed, not expiring)
    // until the first it does not (`broke`).
    let mut passed: Vec<Passed> = Vec::new();
    let mut broke: Option<Vec<u8>> = None;
    let reached = loop {
        if page_no >= CLAIM_PAGES {
            break start;
        }
        let mut page = Page::new(start.clone(), end.clone(), limit);
        let mut first = page.next(b)?;
        if before == 0 && page_no == 0 {
            // Nothing live below here: the next scan may start at the first live key (or, with
            // none, at the end, until a put lowers the floor again).
            let floor = first.as_ref().map_or_else(|| end.clone(), |kv| kv.key.clone());
            b.set_scan_floor(&prefix, floor);
        }
        // Where the next page starts when this one skips the rest of a band.
        let mut skip_to: Option<Vec<u8>> = None;
        loop {
            let kv = match first.take() {
                Some(kv) => kv,
                None => match page.next(b)? {
                    Some(kv) => kv,
                    None => break,
                },
            };
            let kv = &kv;
            let Some(pk) = keys::parse_pending_key(queue, &kv.key) else {
                breaks(&mut broke, &kv.key);
                continue;
            };
            // The entry as the page read it: nothing in this command wrote it since (a reap
            // below deletes only the claim key), so no second read.
            let rec: QueuePendingRecord = decode(kv)?;
            if super::waiting(pk.ready_at_ms, rec.delay_ms, now_ms) {
                // The band sorts by ready time, so the rest of it is later still (or stamped by
                // a clock running ahead, which `waiting` bounds): skip to the next band.
                note(pk.ready_at_ms);
                breaks(&mut broke, &kv.key);
                skip_to = Some(prefix_end(&keys::band_prefix(queue, pk.priority)));
                break;
            }
            if let Some(claim) = get(b, keys::claim_key(queue, &pk.id))? {
                let rec: QueueClaimRecord = decode(&claim)?;
                if rec.deadline_ms == 0 || rec.deadline_ms > now_ms {
                    if rec.deadline_ms > 0 {
                        note(rec.deadline_ms);
                    }
                    if broke.is_none() {
                        passed.push(Passed {
                            key: kv.key.clone(),
                            id: pk.id,
                            ready_at_ms: pk.ready_at_ms,
                            deadline_ms: rec.deadline_ms,
                        });
                    }
                    continue;
                }
                if fixes >= MAX_FIXES {
                    note(now_ms);
                    breaks(&mut broke, &kv.key);
                    continue;
                }
                // Past its visibility deadline: the job is claimable again (a takeover; the old
                // token is refused from this revision on).
                run(b, leases, &claim.key, txns::reap(queue, &pk.id, claim.mod_revision))?;
                fixes += 1;
            }
            let max = rec.max_attempts.max(1);
            if rec.attempts >= max {
                if fixes >= MAX_FIXES {
                    note(now_ms);
                    breaks(&mut broke, &kv.key);
                    continue;
                }
                let reason =
                    format!("its claimant's lease ended during attempt {} of {max}", rec.attempts);
                let dead = QueueDeadRecord {
                    job: Some(job(b, queue, &pk.id)?),
                    attempts: rec.attempts,
                    last_error: rec.last_error,
                    reason,
                };
                let guard = txns::unclaimed(queue, &pk.id, &kv.key, kv.mod_revision);
                let txn = txns::dead_letter(queue, &pk.id, guard, &kv.key, &dead, false);
                run(b, leases, &kv.key, txn)?;
                tracing::info!(queue, job = %pk.id, "job used its attempts: dead-lettered");
                fixes += 1;
                continue;
            }
            let attempt = rec.attempts + 1;
            let bumped = QueuePendingRecord { attempts: attempt, ..rec };
            let deadline_ms = if op.visibility_ms > 0 { now_ms + op.visibility_ms } else { 0 };
            let record = QueueClaimRecord {
                pending_key: String::from_utf8_lossy(&kv.key).into_owned(),
                attempt,
                claimed_at_ms: now_ms,
                deadline_ms,
                request_id: op.request_id.clone(),
            };
            let txn =
                txns::claim(queue, &pk.id, &kv.key, kv.mod_revision, &bumped, op.lease, &record);
            let resp = run(b, leases, &kv.key, txn)?;
            let job: QueueJobRecord = match range_kv(&resp, 2) {
                Some(kv) => decode(kv)?,
                None => {
                    return Err(corrupt(
                        &keys::job_key(queue, &pk.id),
                        "index entry without its job record",
                    )
                    .into())
                }
            };
            let run_end = broke.unwrap_or_else(|| {
                passed.push(Passed {
                    key: kv.key.clone(),
                    id: pk.id.clone(),
                    ready_at_ms: pk.ready_at_ms,
                    deadline_ms,
                });
                let mut k = kv.key.clone();
                k.push(0);
                k
            });
            b.follower(&owner, || ClaimedRun::new(queue)).extend(hint.as_ref(), passed, run_end);
            return Ok(Next::Claimed(ClaimedJob {
                job_id: pk.id,
                payload: job.payload,
                attempt,
                // The claim key's create revision: the Txn's, the last this batch took.
                token: b.revision(),
                priority: job.priority,
                max_attempts: max,
                deadline_ms,
            }));
        }
        page_no += 1;
        limit = CLAIM_PAGE;
        // A full page may have more after it; a short one read to the end of the index.
        match skip_to.or_else(|| page.next_start()) {
            Some(n) => start = n,
            None => break end.clone(),
        }
    };
    let run_end = broke.unwrap_or(reached);
    b.follower(&owner, || ClaimedRun::new(queue)).extend(hint.as_ref(), passed, run_end);
    Ok(Next::Empty(QueueEmpty { revision: b.revision(), wake_at_ms: wake.unwrap_or(0) }))
}

/// One page of the claim-order index (up to `limit` live entries from `from`), read a few
/// entries first and the rest only if the claim gets that far: most claims take the first entry
/// past the jobs in flight, and reading and decoding a whole page for each (up to
/// [`CLAIM_PAGE`] entries) was 40 % of the claim's CPU at 16 workers (docs/benchmarks.md,
/// "Issue 20, session 25"). The entries and their order are the whole page's: the claim writes nothing
/// into the index past the entries it has passed before it reads on (a reap writes a claim
/// key; a dead letter deletes an entry already passed; a claim returns), so a later read sees
/// what one read of the page would have.
struct Page {
    from: Vec<u8>,
    end: Vec<u8>,
    /// Entries this page may still read.
    left: usize,
    /// How many the next read asks for (at most `left`).
    want: usize,
    chunk: std::vec::IntoIter<KeyValue>,
    /// A read came back short: the index ends within this page.
    ended: bool,
}

/// Entries a page reads first.
const FIRST_READ: usize = 4;

impl Page {
    fn new(from: Vec<u8>, end: Vec<u8>, limit: usize) -> Self {
        let chunk = Vec::new().into_iter();
        Self { from, end, left: limit, want: FIRST_READ, chunk, ended: false }
    }

    /// The page's next entry, `None` past its last.
    fn next<E: Engine>(&mut self, b: &ApplyBatch<'_, E>) -> Result<Option<KeyValue>, MvccError> {
        if let Some(kv) = self.chunk.next() {
            return Ok(Some(kv));
        }
        if self.ended || self.left == 0 {
            return Ok(None);
        }
        let want = self.want.min(self.left);
        let got = b.live(&self.from, &self.end, want)?;
        self.ended = got.len() < want;
        self.left -= got.len();
        if let Some(last) = got.last() {
            self.from.clone_from(&last.key);
            self.from.push(0);
        }
        // Past the first few, the rest of the page at once.
        self.want = self.left;
        self.chunk = got.into_iter();
        Ok(self.chunk.next())
    }

    /// Where the next page starts, once this one was read to its end: past its last entry if
    /// it was full (more may follow), `None` if the index ended within it.
    fn next_start(&self) -> Option<Vec<u8>> {
        (!self.ended && self.left == 0).then(|| self.from.clone())
    }
}

/// Where a claim's scan first passed an entry it did not leave claimed: the run ends there.
fn breaks(broke: &mut Option<Vec<u8>>, at: &[u8]) {
    if broke.is_none() {
        *broke = Some(at.to_vec());
    }
}

/// A retry of a Claim that was applied but whose answer was lost: the claim this lease holds in
/// this queue with the same request id, found among the keys attached to the lease (a worker's
/// lease holds few), not by scanning the queue's claims.
fn resume<E: Engine>(
    b: &ApplyBatch<'_, E>,
    queue: &str,
    op: &QueueClaimOp,
) -> Result<Option<ClaimedJob>, Failed> {
    let prefix = keys::claim_prefix(queue);
    for key in b.lease_keys(op.lease)? {
        let Some(id) = keys::id_after(&prefix, &key) else { continue };
        let Some(kv) = get(b, key)? else { continue };
        let rec: QueueClaimRecord = decode(&kv)?;
        if rec.request_id != op.request_id {
            continue;
        }
        let job = job(b, queue, &id)?;
        return Ok(Some(ClaimedJob {
            job_id: id,
            payload: job.payload,
            attempt: rec.attempt,
            token: kv.create_revision,
            priority: job.priority,
            max_attempts: job.max_attempts.max(1),
            deadline_ms: rec.deadline_ms,
        }));
    }
    Ok(None)
}

fn ack<E: Engine>(
    b: &mut ApplyBatch<'_, E>,
    leases: &dyn LeaseLookup,
    queue: &str,
    op: &QueueAckOp,
) -> Result<Outcome, Failed> {
    let claim = get(b, keys::claim_key(queue, &op.job_id))?;
    if let Some(kv) = claim.as_ref().filter(|kv| kv.create_revision == op.token) {
        let rec: QueueClaimRecord = decode(kv)?;
        let txn = txns::ack(queue, &op.job_id, op.token, rec.pending_key.as_bytes());
        run(b, leases, &kv.key, txn)?;
        return Ok(Outcome::Acked(QueueDone { revision: b.revision() }));
    }
    let job_exists = get(b, keys::job_key(queue, &op.job_id))?.is_some();
    Ok(Outcome::Stale(QueueStale { current: claim.map_or(0, |kv| kv.create_revision), job_exists }))
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
