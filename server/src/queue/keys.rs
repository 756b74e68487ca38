//! The key layout of a queue (documented in [`super`]). Pure functions, no I/O.

/// Every queue's keys start with this.
pub const ROOT: &str = "picket/queue/";

/// `picket/queue/<queue>/`.
pub fn queue_prefix(queue: &str) -> Vec<u8> {
    format!("{ROOT}{queue}/").into_bytes()
}

fn under(queue: &str, part: &str, rest: &str) -> Vec<u8> {
    format!("{ROOT}{queue}/{part}/{rest}").into_bytes()
}

/// `job/<id>`: payload and options.
pub fn job_key(queue: &str, id: &str) -> Vec<u8> {
    under(queue, "job", id)
}

/// `claim/<id>`: the live claim, attached to the worker's lease.
pub fn claim_key(queue: &str, id: &str) -> Vec<u8> {
    under(queue, "claim", id)
}

/// Prefix of every claim of `queue`.
pub fn claim_prefix(queue: &str) -> Vec<u8> {
    under(queue, "claim", "")
}

/// `dead/<id>`.
pub fn dead_key(queue: &str, id: &str) -> Vec<u8> {
    under(queue, "dead", id)
}

/// Prefix of every dead letter of `queue`.
pub fn dead_prefix(queue: &str) -> Vec<u8> {
    under(queue, "dead", "")
}

/// `dedup/<dedup id>`.
pub fn dedup_key(queue: &str, dedup: &str) -> Vec<u8> {
    under(queue, "dedup", dedup)
}

/// Prefix of the claim-order index.
pub fn pending_prefix(queue: &str) -> Vec<u8> {
    under(queue, "pending", "")
}

/// Prefix of one priority band of the index.
pub fn band_prefix(queue: &str, priority: u32) -> Vec<u8> {
    under(queue, "pending", &format!("{:08x}/", u32::MAX - priority))
}

/// `pending/<u32::MAX - priority, 8 hex>/<ready at ms, 16 hex>/<id>`: key order is claim order.
pub fn pending_key(queue: &str, priority: u32, ready_at_ms: u64, id: &str) -> Vec<u8> {
    under(queue, "pending", &format!("{:08x}/{ready_at_ms:016x}/{id}", u32::MAX - priority))
}

/// A parsed index key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingKey {
    /// The job's priority.
    pub priority: u32,
    /// When it may be claimed (unix ms).
    pub ready_at_ms: u64,
    /// The job id.
    pub id: String,
}

/// Parses a key under [`pending_prefix`]; `None` for anything else.
pub fn parse_pending_key(queue: &str, key: &[u8]) -> Option<PendingKey> {
    let rest = key.strip_prefix(pending_prefix(queue).as_slice())?;
    let rest = std::str::from_utf8(rest).ok()?;
    let mut parts = rest.splitn(3, '/');
    let inv = parts.next().filter(|p| p.len() == 8)?;
    let ready = parts.next().filter(|p| p.len() == 16)?;
    let id = parts.next().filter(|p| !p.is_empty())?;
    Some(PendingKey {
        priority: u32::MAX - u32::from_str_radix(inv, 16).ok()?,
        ready_at_ms: u64::from_str_radix(ready, 16).ok()?,
        id: id.to_string(),
    })
}

/// The id at the end of a `claim/<id>` or `dead/<id>` key.
pub fn id_after(prefix: &[u8], key: &[u8]) -> Option<String> {
    let id = key.strip_prefix(prefix)?;
    String::from_utf8(id.to_vec()).ok().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_keys_sort_in_claim_order_and_round_trip() {
        let hi_late = pending_key("q", 9, 2_000, "b");
        let hi_early = pending_key("q", 9, 1_000, "c");
        let lo_early = pending_key("q", 0, 1, "a");
        let mut keys = vec![lo_early.clone(), hi_late.clone(), hi_early.clone()];
        keys.sort();
        assert_eq!(keys, vec![hi_early.clone(), hi_late, lo_early]);
        assert_eq!(
            parse_pending_key("q", &hi_early),
            Some(PendingKey { priority: 9, ready_at_ms: 1_000, id: "c".into() })
        );
        assert!(hi_early.starts_with(&band_prefix("q", 9)));
        assert_eq!(parse_pending_key("q", &job_key("q", "c")), None);
        assert_eq!(parse_pending_key("other", &hi_early), None);
        assert_eq!(id_after(&claim_prefix("q"), &claim_key("q", "x1")), Some("x1".into()));
    }

    #[test]
    fn queues_do_not_share_prefixes() {
        // Names cannot contain '/', so one queue's prefix never covers another's keys.
        assert!(!job_key("ab", "1").starts_with(&queue_prefix("a")));
    }
}
