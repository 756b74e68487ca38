//! Request validation for the queue API: every field of every request checked in one place,
//! before anything is read or proposed, each refusal a [`QueueError::InvalidArgument`] naming
//! the field and the limit. `crate::api::queue` calls one function per RPC.

use picket_proto::picket::v1::{
    AckJobRequest, ClaimRequest, DeadLettersRequest, EnqueueRequest, ExtendClaimRequest,
    NackJobRequest, QueueInspectRequest, RequeueJobRequest,
};

use super::{
    QueueError, MAX_DEDUP_ID, MAX_DELAY_MS, MAX_ERROR_TEXT, MAX_LIST, MAX_MAX_ATTEMPTS,
    MAX_QUEUE_NAME,
};

fn invalid(text: String) -> QueueError {
    QueueError::InvalidArgument(text)
}

/// Enqueue: the queue, the delays, the dedup id and the attempt limit.
pub fn enqueue(req: &EnqueueRequest) -> Result<(), QueueError> {
    validate_queue(&req.queue)?;
    validate_ms("delay_ms", req.delay_ms)?;
    validate_ms("backoff_ms", req.backoff_ms)?;
    if req.dedup_id.len() > MAX_DEDUP_ID {
        return Err(invalid(format!(
            "picket: dedup_id is {} bytes, the limit is {MAX_DEDUP_ID}",
            req.dedup_id.len()
        )));
    }
    if req.max_attempts > MAX_MAX_ATTEMPTS {
        return Err(invalid(format!(
            "picket: max_attempts is {}, the limit is {MAX_MAX_ATTEMPTS}",
            req.max_attempts
        )));
    }
    Ok(())
}

/// Claim: the queue, the worker's lease, the visibility timeout, the request id and the wait.
pub fn claim(req: &ClaimRequest) -> Result<(), QueueError> {
    validate_queue(&req.queue)?;
    if req.lease <= 0 {
        return Err(invalid(
            "picket: a claim needs the worker's lease (a positive lease id): grant one and keep it alive, so a crashed worker's job is claimable again".into(),
        ));
    }
    validate_ms("visibility_timeout_ms", req.visibility_timeout_ms)?;
    if req.request_id.len() > MAX_DEDUP_ID {
        return Err(invalid(format!(
            "picket: request_id is {} bytes, the limit is {MAX_DEDUP_ID}",
            req.request_id.len()
        )));
    }
    if let Some(w) = req.wait_timeout_ms {
        validate_ms("wait_timeout_ms", w)?;
    }
    Ok(())
}

/// Ack: the queue and the job, and with `claim_next` the claim as [`claim`] checks it. Returns
/// the claim to make next, its queue filled in, if the request asks for one.
pub fn ack(req: &AckJobRequest) -> Result<Option<ClaimRequest>, QueueError> {
    validate_queue(&req.queue)?;
    validate_job_id(&req.job_id)?;
    let Some(next) = &req.claim_next else { return Ok(None) };
    if !next.queue.is_empty() && next.queue != req.queue {
        return Err(invalid(format!(
            "picket: claim_next names queue {:?}, but an ack claims its next job from its own queue ({:?}): leave claim_next.queue empty or the same",
            next.queue, req.queue
        )));
    }
    let next = ClaimRequest { queue: req.queue.clone(), ..next.clone() };
    claim(&next)?;
    Ok(Some(next))
}

/// Nack: the queue, the job and the delay. Returns the error text to record: a long one is cut
/// to [`MAX_ERROR_TEXT`] bytes at a char boundary rather than refused, because the job must go
/// back either way.
pub fn nack(req: &NackJobRequest) -> Result<String, QueueError> {
    validate_queue(&req.queue)?;
    validate_job_id(&req.job_id)?;
    if let Some(d) = req.delay_ms {
        validate_ms("delay_ms", d)?;
    }
    let mut error = req.error.clone();
    if error.len() > MAX_ERROR_TEXT {
        let mut cut = MAX_ERROR_TEXT;
        while !error.is_char_boundary(cut) {
            cut -= 1;
        }
        error.truncate(cut);
    }
    Ok(error)
}

/// ExtendClaim: the queue, the job and the new visibility timeout.
pub fn extend(req: &ExtendClaimRequest) -> Result<(), QueueError> {
    validate_queue(&req.queue)?;
    validate_job_id(&req.job_id)?;
    validate_ms("visibility_timeout_ms", req.visibility_timeout_ms)
}

/// Inspect: the queue and the listing limit.
pub fn inspect(req: &QueueInspectRequest) -> Result<(), QueueError> {
    validate_queue(&req.queue)?;
    list_limit(req.limit)
}

/// DeadLetters: the queue and the listing limit.
pub fn dead_letters(req: &DeadLettersRequest) -> Result<(), QueueError> {
    validate_queue(&req.queue)?;
    list_limit(req.limit)
}

/// Requeue: the queue and the job.
pub fn requeue(req: &RequeueJobRequest) -> Result<(), QueueError> {
    validate_queue(&req.queue)?;
    validate_job_id(&req.job_id)
}

/// Refuses a listing limit above [`MAX_LIST`] (Inspect, DeadLetters).
fn list_limit(limit: u32) -> Result<(), QueueError> {
    if limit > MAX_LIST {
        return Err(invalid(format!("picket: limit is {limit}, the limit is {MAX_LIST}")));
    }
    Ok(())
}

/// Checks a queue name: 1 to [`MAX_QUEUE_NAME`] characters from `[A-Za-z0-9._:-]`, so names
/// never contain the key separator `/`.
pub fn validate_queue(name: &str) -> Result<(), QueueError> {
    if name.is_empty() {
        return Err(QueueError::InvalidArgument("picket: queue name is empty".into()));
    }
    if name.len() > MAX_QUEUE_NAME {
        return Err(QueueError::InvalidArgument(format!(
            "picket: queue name is {} bytes, the limit is {MAX_QUEUE_NAME}",
            name.len()
        )));
    }
    if let Some(c) =
        name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(QueueError::InvalidArgument(format!(
            "picket: queue name {name:?} contains {c:?}; use letters, digits, '.', '_', ':' and '-'"
        )));
    }
    Ok(())
}

/// Checks a job id: what Enqueue returns, 1 to 64 characters from `[0-9a-z]`.
pub fn validate_job_id(id: &str) -> Result<(), QueueError> {
    if id.is_empty()
        || id.len() > 64
        || !id.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    {
        return Err(QueueError::InvalidArgument(format!(
            "picket: job id {id:?} is not one Enqueue returns (1 to 64 characters of [0-9a-z])"
        )));
    }
    Ok(())
}

/// Checks a duration field against [`MAX_DELAY_MS`].
pub fn validate_ms(field: &str, ms: u64) -> Result<(), QueueError> {
    if ms > MAX_DELAY_MS {
        return Err(QueueError::InvalidArgument(format!(
            "picket: {field} is {ms} ms, the limit is {MAX_DELAY_MS} ms (30 days)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids() {
        assert!(validate_queue("emails.v2:eu-1_x").is_ok());
        assert!(validate_queue("").is_err());
        assert!(validate_queue("a/b").is_err());
        assert!(validate_queue(&"a".repeat(129)).is_err());
        assert!(validate_job_id("00ff12ab").is_ok());
        assert!(validate_job_id("").is_err());
        assert!(validate_job_id("../x").is_err());
        assert!(validate_ms("delay_ms", MAX_DELAY_MS).is_ok());
        assert!(validate_ms("delay_ms", MAX_DELAY_MS + 1).is_err());
    }

    fn refused(r: Result<impl std::fmt::Debug, QueueError>, needle: &str) {
        match r {
            Err(QueueError::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn each_request_names_the_field_it_refuses() {
        let q = || "jobs".to_string();
        refused(
            enqueue(&EnqueueRequest { queue: "a/b".into(), ..Default::default() }),
            "queue name",
        );
        refused(
            enqueue(&EnqueueRequest {
                queue: q(),
                dedup_id: "x".repeat(MAX_DEDUP_ID + 1),
                ..Default::default()
            }),
            "dedup_id",
        );
        refused(
            enqueue(&EnqueueRequest {
                queue: q(),
                max_attempts: MAX_MAX_ATTEMPTS + 1,
                ..Default::default()
            }),
            "max_attempts",
        );
        refused(
            enqueue(&EnqueueRequest {
                queue: q(),
                delay_ms: MAX_DELAY_MS + 1,
                ..Default::default()
            }),
            "delay_ms",
        );
        refused(claim(&ClaimRequest { queue: q(), lease: 0, ..Default::default() }), "lease");
        refused(
            claim(&ClaimRequest {
                queue: q(),
                lease: 1,
                wait_timeout_ms: Some(MAX_DELAY_MS + 1),
                ..Default::default()
            }),
            "wait_timeout_ms",
        );
        refused(
            ack(&AckJobRequest { queue: q(), job_id: "Not-An-Id".into(), ..Default::default() }),
            "job id",
        );
        let ack_next = |next: ClaimRequest| AckJobRequest {
            queue: q(),
            job_id: "ab".into(),
            token: 7,
            claim_next: Some(next),
        };
        let other = ClaimRequest { queue: "other".into(), lease: 1, ..Default::default() };
        refused(ack(&ack_next(other)), "claims its next job from its own queue");
        refused(ack(&ack_next(ClaimRequest::default())), "lease");
        let slow = ClaimRequest {
            lease: 1,
            wait_timeout_ms: Some(MAX_DELAY_MS + 1),
            ..Default::default()
        };
        refused(ack(&ack_next(slow)), "wait_timeout_ms");
        // An empty queue name means this ack's queue, filled in for the claim.
        let next = ack(&ack_next(ClaimRequest { lease: 1, ..Default::default() })).unwrap();
        assert_eq!(next.map(|n| (n.queue, n.lease)), Some((q(), 1)));
        assert_eq!(
            ack(&AckJobRequest { queue: q(), job_id: "ab".into(), ..Default::default() }).unwrap(),
            None
        );
        refused(
            extend(&ExtendClaimRequest {
                queue: q(),
                job_id: "ab".into(),
                visibility_timeout_ms: MAX_DELAY_MS + 1,
                ..Default::default()
            }),
            "visibility_timeout_ms",
        );
        refused(inspect(&QueueInspectRequest { queue: q(), limit: MAX_LIST + 1 }), "limit");
        refused(dead_letters(&DeadLettersRequest { queue: q(), limit: MAX_LIST + 1 }), "limit");
        refused(requeue(&RequeueJobRequest { queue: q(), job_id: String::new() }), "job id");
        assert!(enqueue(&EnqueueRequest { queue: q(), ..Default::default() }).is_ok());
    }

    #[test]
    fn a_long_nack_error_is_cut_at_a_char_boundary_not_refused() {
        let error = "é".repeat(MAX_ERROR_TEXT);
        let req = NackJobRequest {
            queue: "jobs".into(),
            job_id: "ab".into(),
            error,
            ..Default::default()
        };
        let kept = nack(&req).unwrap();
        assert!(kept.len() <= MAX_ERROR_TEXT && kept.chars().all(|c| c == 'é'));
    }
}
