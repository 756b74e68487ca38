//! Lease ids the server chooses (a grant with id 0, and the implicit lease of a v3lock or
//! v3election call without one).
//!
//! An id is chosen on the member that receives the request, before proposing: it travels in
//! the command, so every member applies the same one. It is the member's clock in milliseconds
//! (44 bits) followed by 19 bits that start at a random value each millisecond, and each id a
//! member hands out is greater than the one before. Leases granted together then get ids that
//! sort together, so the `lease` and `lease_keys` records a grant and its revoke write land
//! beside the ones just written in RocksDB's memtable rather than at random places in it (the
//! queue's job ids made the same move: docs/benchmarks.md, "Job ids that sort by time"). etcd's
//! own ids are ordered the same way (a member prefix, the clock, a counter).
//!
//! Ids stay unique without coordination: one member never repeats an id while it runs (each is
//! greater than the last), and two members collide only if they draw overlapping runs of the
//! 19 bits in the same millisecond. A collision is refused by apply (`AlreadyExists`) and the
//! grant is retried with a fresh id ([`GRANT_ID_ATTEMPTS`]), so it can never reach a client.

use std::sync::atomic::{AtomicI64, Ordering};

/// Attempts at a server-chosen lease id: see the module comment for why a second is rare.
pub(crate) const GRANT_ID_ATTEMPTS: usize = 3;

const LOW_BITS: u32 = 19;
const CLOCK_MASK: u64 = (1 << (63 - LOW_BITS)) - 1;

/// The last id this process handed out.
static LAST: AtomicI64 = AtomicI64::new(0);

/// A fresh lease id: positive and non-zero (etcd clients treat 0 as "no lease" and print ids as
/// unsigned hex), greater than every id this process chose before.
#[allow(clippy::disallowed_methods)]
pub(crate) fn new_lease_id() -> i64 {
    // Randomness and the clock outside apply: the id travels in the proposed command.
    let candidate = lease_id(super::queue::now_ms(), rand::random::<u64>());
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = after(last, candidate);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// The id for a clock reading and a random draw, of which the top 19 bits are used.
fn lease_id(now_ms: u64, random: u64) -> i64 {
    let id = ((now_ms & CLOCK_MASK) << LOW_BITS) | (random >> (64 - LOW_BITS));
    // At most 63 bits, so positive; 0 only for a clock at the epoch and a zero draw.
    (id as i64).max(1)
}

/// The id handed out after `last` when the clock and draw give `candidate`: the candidate, or
/// the next id after `last` when the candidate is not greater (the same millisecond with a
/// smaller draw, or a clock that stepped back).
fn after(last: i64, candidate: i64) -> i64 {
    candidate.max(last.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_clock_and_stay_positive() {
        let ms = 1_764_800_000_000u64; // 2025-12-03
        let id = lease_id(ms, u64::MAX);
        assert!(id > 0);
        assert_eq!(id >> LOW_BITS, ms as i64);
        assert_eq!(id & ((1 << LOW_BITS) - 1), (1 << LOW_BITS) - 1);
        // Later milliseconds sort after, whatever the draws.
        assert!(lease_id(ms + 1, 0) > lease_id(ms, u64::MAX));
        // The largest clock the id holds still gives a positive id; 0 never comes out.
        assert!(lease_id(u64::MAX, u64::MAX) > 0);
        assert_eq!(lease_id(0, 0), 1);
    }

    #[test]
    fn each_id_is_greater_than_the_last() {
        let ms = 1_764_800_000_000u64;
        let first = after(0, lease_id(ms, u64::MAX));
        // Same millisecond, smaller draw: the next id after the last, not the draw.
        assert_eq!(after(first, lease_id(ms, 0)), first + 1);
        // A clock that stepped back: still increasing.
        assert_eq!(after(first, lease_id(ms - 5_000, 7 << 45)), first + 1);
        // A later millisecond: the draw itself.
        let later = lease_id(ms + 1, 3 << 45);
        assert_eq!(after(first, later), later);
    }

    #[test]
    fn the_generator_never_repeats_itself() {
        let mut seen = std::collections::HashSet::new();
        let mut prev = 0;
        for _ in 0..10_000 {
            let id = new_lease_id();
            assert!(id > prev, "{id} after {prev}");
            assert!(seen.insert(id));
            prev = id;
        }
        // And it follows the clock: the newest id's top bits are about now (a run that began
        // near the top of a millisecond's 19 bits carries into the next millisecond).
        let now = super::super::queue::now_ms();
        assert!((prev >> LOW_BITS).unsigned_abs().abs_diff(now) < 60_000, "{prev:x} at {now}");
    }
}
