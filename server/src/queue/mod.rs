//! Durable work queues (`picket.v1.Queue`), built in process on KV + lease + watch, like the lock
//! service ([`crate::concurrency`]).
//!
//! # Why ordinary keys and Txns
//!
//! Every queue is a set of ordinary keys under `picket/queue/<name>/` and every operation writes
//! them with etcd Txns (built by [`txns`]). Queue state is therefore replicated, snapshotted,
//! compacted and covered by `HashKV` like any key, and its watch events are ordinary ones.
//!
//! Claim and Ack are one Raft command each (`QueueCommand`, decided by [`decide`] in apply): the
//! member serving a Claim proposes "claim the best ready job of this queue for this lease, at my
//! clock reading", and apply picks the job and writes the claim Txn in the same step. So a claim
//! is one write with no read before it, and concurrent claimers never race for one job: each
//! gets the next one in claim order (a claimer that read then compared, as before, made all
//! workers choose the head job, and the queue got slower with more workers). Ack is decided the
//! same way, so it too is one write, and an Ack with `claim_next` does the ack and then the
//! claim in one command (a worker's loop is then one write per job, besides the enqueue). The other operations ([`ops`]) read, then run a Txn whose
//! compares make it safe, and retry on a lost race; they are not on a worker's hot path.
//!
//! # Layout (all under `picket/queue/<name>/`, see [`keys`])
//!
//! | key | value | lifetime |
//! |---|---|---|
//! | `job/<id>` | `QueueJobRecord`: payload and options (immutable) | enqueue to ack or dead letter |
//! | `pending/<inv prio>/<ready at>/<id>` | `QueuePendingRecord`: attempts, last error | the claim-order index; claimed jobs stay in it |
//! | `claim/<id>` | `QueueClaimRecord`, **attached to the worker's lease** | claim to ack/nack/lease end |
//! | `dead/<id>` | `QueueDeadRecord` | until requeued |
//! | `dedup/<dedup id>` | the job id | forever (dedup ids are remembered for the queue's life) |
//!
//! `<inv prio>` is `u32::MAX - priority` in 8 hex digits and `<ready at>` the unix millisecond
//! at which the job becomes claimable, 16 hex digits, so key order is claim order: highest
//! priority first, then earliest ready time (FIFO for jobs enqueued without delay).
//!
//! # Claims and fencing
//!
//! A claim is `claim/<id>`, created (in apply) by a Txn that compares `create_revision(claim/<id>)
//! == 0` and that the pending entry is the one apply chose; the same Txn bumps the attempt
//! count. The claim key's create revision is the **fencing token**. Ack, Nack and
//! Extend compare `create_revision(claim/<id>) == token`, so a stale claim is refused with an
//! error naming the current token or saying that the claim is gone. Since a job has one claim
//! key, at most one claim of a job is live at any revision.
//!
//! The claim key is attached to the worker's lease: when the lease expires or is revoked, apply
//! deletes the key at that revision and the job is claimable again, with nothing else to do.
//! Attempts are counted at claim, so a job whose claimants keep dying is not retried forever:
//! the next claimer of a job that has used `max_attempts` moves it to `dead/` instead.
//!
//! **Extend.** A claim lives exactly as long as its lease unless the claimer asked for a
//! visibility timeout; then it also ends at its deadline (a worker that is alive but stuck).
//! Extend checks the claim is still live and pushes that deadline. A claim past its deadline
//! stays valid until a claim reaps it (apply deletes it, one revision, before claiming), so an
//! expired deadline never yields two live claims; it only allows a takeover.
//!
//! # Clocks
//!
//! Delays, backoff and visibility deadlines need a clock, and apply may not read one. Times are
//! decided by the member serving the request (unix wall clock, milliseconds) and stored in keys;
//! a claim carries the serving member's reading in its command, and apply compares "is it ready
//! / expired" with that reading, so every member decides the same. Skew
//! between members only shifts when a delayed job becomes claimable or a deadline is honoured:
//! it never breaks "at most one live claim per job" or fencing, which rest only on Txn compares
//! evaluated in apply.
//!
//! How far a ready time may shift is bounded ([`waiting`]): every index entry records the delay
//! its writer asked for, and an entry whose ready time lies further ahead of the reader's clock
//! than that delay plus [`CLOCK_TOLERANCE_MS`] was stamped by a clock running ahead of the
//! reader's, so it counts as ready. Without that bound, a job enqueued with no delay through a
//! member whose wall clock had jumped an hour ahead (an NTP step, a VM resumed with a stale
//! clock) stayed invisible for that hour (found by the harness's `clock` nemesis, which bumps
//! one member's wall clock by up to an hour). So a skewed clock can make a job ready early (by
//! at most its own delay), but never hold it back more than [`CLOCK_TOLERANCE_MS`] past its
//! delay, or past the remaining delay of a correctly delayed job ahead of it in its priority
//! band (a claim stops scanning a band at its first waiting entry). Visibility deadlines are
//! not bounded this way: a deadline stamped far ahead only delays the takeover of a claim whose
//! worker is stuck yet keeps its lease alive; every other claim ends with its worker's lease.
//!
//! # Waiting
//!
//! A Claim subscribes to this member's applied-revision feed (the watch hub's source) before it
//! proposes; when apply answers "nothing claimable at revision R", it sleeps until an event
//! after R under the queue's `pending/` or a claim delete, the next delayed job's ready time, or
//! the request's wait limit, whichever comes first, then proposes again. Nothing polls; an
//! event wakes every waiting claimer of the queue, and all but one get "nothing" again (a
//! write each), which is the cost of waiting claimers outnumbering jobs.

pub mod decide;
pub mod keys;
pub mod ops;
pub mod run;
pub mod txns;
pub mod validate;

pub use crate::concurrency::{Backend, StoreError};

use picket_proto::picket::raft::v1::{QueueCommand, QueueResult};

/// The store as queue operations see it: a [`Backend`] that can also propose a
/// [`QueueCommand`] and return what apply decided ([`decide`]).
pub trait QueueBackend: Backend {
    /// Proposes `cmd` and returns apply's decision.
    fn decide(
        &self,
        cmd: QueueCommand,
    ) -> impl std::future::Future<Output = Result<QueueResult, StoreError>> + Send;
}

use thiserror::Error;

/// Claims a job gets before it is dead-lettered when Enqueue names no limit.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// Largest `max_attempts` accepted.
pub const MAX_MAX_ATTEMPTS: u32 = 1000;
/// Base of the exponential backoff when Enqueue names none.
pub const DEFAULT_BACKOFF_MS: u64 = 1000;
/// Longest backoff a Nack without a delay waits.
pub const MAX_BACKOFF_MS: u64 = 5 * 60 * 1000;
/// Longest delay, backoff base, visibility timeout or wait accepted (30 days): bounds ready times
/// far below the 16-hex-digit key encoding and catches unit mistakes (seconds passed as ms).
pub const MAX_DELAY_MS: u64 = 30 * 24 * 3600 * 1000;
/// Longest queue name.
pub const MAX_QUEUE_NAME: usize = 128;
/// Longest dedup id.
pub const MAX_DEDUP_ID: usize = 256;
/// Longest error text kept on a nacked job.
pub const MAX_ERROR_TEXT: usize = 1024;
/// Most jobs Inspect and DeadLetters list in one call.
pub const MAX_LIST: u32 = 1000;

/// What a queue operation can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The store refused or failed a request.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The request was malformed; the text names the field and the limit.
    #[error("{0}")]
    InvalidArgument(String),
    /// The token is not the job's live claim.
    #[error("{}", stale_text(.queue, .job, *.token, *.current, *.job_exists))]
    StaleClaim {
        /// The queue.
        queue: String,
        /// The job.
        job: String,
        /// The token the caller presented.
        token: i64,
        /// The job's live claim token, if it has one.
        current: Option<i64>,
        /// Whether the job is still in the queue.
        job_exists: bool,
    },
    /// Requeue of a job that is not in the dead-letter queue.
    #[error("picket: job {job} is not in the dead-letter queue of queue {queue:?}")]
    NotDead {
        /// The queue.
        queue: String,
        /// The job.
        job: String,
    },
    /// A stored record did not decode: a bug or foreign writes under the queue prefix.
    #[error("picket: corrupt queue record at {key:?}: {why}")]
    Corrupt {
        /// The key.
        key: String,
        /// The decode error.
        why: String,
    },
    /// Claims kept losing races to other claimers; the caller should retry.
    #[error("picket: claim of queue {0:?} lost too many races to other claimers; retry")]
    Contended(String),
}

fn stale_text(queue: &str, job: &str, token: i64, current: Option<i64>, exists: bool) -> String {
    let why = match (current, exists) {
        (Some(c), _) => format!("the job is now claimed with token {c}"),
        (None, true) => {
            "the claim is gone (nacked, or its lease expired or was revoked); the job is waiting to be claimed again".to_string()
        }
        (None, false) => "the job is no longer in the queue (acked or dead-lettered)".to_string(),
    };
    // "fencing token" is the phrase clients match to report a fenced-out request.
    format!("picket: fencing token {token} of job {job} in queue {queue:?} is stale: {why}")
}

/// How far ahead of its delay a ready time may lie, on the reading member's clock, before it
/// counts as stamped by a clock running ahead (see "Clocks"). Members kept by NTP agree to
/// milliseconds; one second leaves delays exact for them and bounds what a skewed member adds.
pub const CLOCK_TOLERANCE_MS: u64 = 1_000;

/// Whether an index entry ready at `ready_at_ms`, written with delay `delay_ms` (`None`: an
/// entry from before delays were recorded), is still waiting at `now_ms`.
pub fn waiting(ready_at_ms: u64, delay_ms: Option<u64>, now_ms: u64) -> bool {
    ready_at_ms > now_ms
        && delay_ms.is_none_or(|d| ready_at_ms - now_ms <= d.saturating_add(CLOCK_TOLERANCE_MS))
}

/// The backoff before retry number `attempt + 1`: `base * 2^(attempt-1)`, capped at
/// [`MAX_BACKOFF_MS`].
pub fn backoff_ms(base: u64, attempt: u32) -> u64 {
    let base = if base == 0 { DEFAULT_BACKOFF_MS } else { base };
    let shift = attempt.saturating_sub(1).min(30);
    base.saturating_mul(1u64 << shift).min(MAX_BACKOFF_MS.max(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ready time within its delay (plus the tolerance) of the reader's clock waits; one
    /// further ahead was stamped by a clock running ahead and is ready; an entry without a
    /// recorded delay waits for its ready time, as before delays were recorded.
    #[test]
    fn a_ready_time_waits_at_most_its_delay_and_the_tolerance() {
        let hour = 3_600_000;
        assert!(waiting(10_000, Some(5_000), 6_000), "a real delay waits");
        assert!(!waiting(10_000, Some(5_000), 10_000), "and ends at its ready time");
        assert!(waiting(10_000, Some(5_000), 4_000), "a writer ahead by the tolerance");
        assert!(!waiting(10_000, Some(5_000), 3_999), "a writer ahead by more");
        assert!(!waiting(hour + 1_000, Some(0), 1_000), "no delay, stamped an hour ahead");
        assert!(!waiting(hour + 1_050, Some(50), 1_000), "a backoff stamped an hour ahead");
        assert!(waiting(hour, None, 1_000), "no recorded delay: the ready time rules");
        assert!(!waiting(5, None, 5));
        assert!(waiting(u64::MAX, Some(u64::MAX), 0), "no overflow");
    }

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff_ms(0, 1), 1000);
        assert_eq!(backoff_ms(100, 1), 100);
        assert_eq!(backoff_ms(100, 2), 200);
        assert_eq!(backoff_ms(100, 4), 800);
        assert_eq!(backoff_ms(1000, 40), MAX_BACKOFF_MS);
    }

    #[test]
    fn stale_errors_name_the_current_token() {
        let e = QueueError::StaleClaim {
            queue: "q".into(),
            job: "j".into(),
            token: 7,
            current: Some(9),
            job_exists: true,
        };
        assert!(e.to_string().contains("token 7") && e.to_string().contains("token 9"));
        let e = QueueError::StaleClaim {
            queue: "q".into(),
            job: "j".into(),
            token: 7,
            current: None,
            job_exists: false,
        };
        assert!(e.to_string().contains("no longer in the queue"));
    }
}
