//! Lease ids the server chooses (a grant with id 0, and the implicit lease of a v3lock or
//! v3election call without one): the member's clock in milliseconds (44 bits) followed by 19
//! bits that start at a random value each millisecond, each greater than the last the member
//! handed out ([`super::time_ids`] says why ids sort by time and why they stay unique). 63 bits:
//! positive and never 0, as etcd clients need (they treat 0 as "no lease" and print ids as
//! unsigned hex).
//!
//! Two members collide only if they draw overlapping runs of the 19 bits in the same
//! millisecond. A collision is refused by apply (`AlreadyExists`) and the grant is retried with a
//! fresh id ([`GRANT_ID_ATTEMPTS`]), so it can never reach a client.

use super::time_ids::TimeIds;

/// Attempts at a server-chosen lease id: see the module comment for why a second is rare.
pub(crate) const GRANT_ID_ATTEMPTS: usize = 3;

static LEASE_IDS: TimeIds = TimeIds::new(63, 19);

/// A fresh lease id, greater than every id this process chose before.
pub(crate) fn new_lease_id() -> i64 {
    // Below 2^63 until the 44 bits of clock run out in the year 2527: `TimeIds` masks the clock
    // to them, and only a run of ids past the largest clock reading could carry beyond.
    i64::try_from(LEASE_IDS.next()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_positive_and_follow_the_clock() {
        let mut prev = 0;
        for _ in 0..1_000 {
            let id = new_lease_id();
            assert!(id > prev, "{id} after {prev}");
            prev = id;
        }
        let now = super::super::time_ids::now_ms();
        assert!((prev >> 19).unsigned_abs().abs_diff(now) < 60_000, "{prev:x} at {now}");
    }
}
