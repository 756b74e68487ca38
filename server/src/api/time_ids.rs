//! The serving member's clock, and the ids it chooses from it before proposing: lease ids
//! (`lease_id`) and queue job ids (`queue`).
//!
//! Such an id travels in the proposed command, so every member applies the same one; the clock
//! and the randomness are read here, outside apply. An id is the clock in milliseconds in its
//! high bits and a random draw in its low bits, and each id a process hands out is greater than
//! the one before. Records keyed by ids chosen together then sort together, so RocksDB writes
//! them beside the ones just written in its memtable rather than at random places in it (with
//! random ids, the skiplist inserts' cache misses were the largest single cost of a queue cycle
//! and a large one of a lease cycle: docs/benchmarks.md, "Job ids that sort by time" and "Lease
//! ids that sort by time"). etcd's lease ids are ordered the same way (a member prefix, the
//! clock, a counter).
//!
//! Ids stay unique without coordination: one process never repeats an id (each is greater than
//! the last), and two members collide only if they draw overlapping runs of the low bits in the
//! same millisecond. Each caller refuses a collision in apply and retries with a fresh id.

use std::sync::atomic::{AtomicU64, Ordering};

/// The serving member's wall clock in unix milliseconds. Used only to stamp ids, ready times and
/// deadlines into proposals and to compare them when choosing a job, never in apply; skew between
/// members shifts delays but cannot create a second live claim (see [`crate::queue`]).
#[allow(clippy::disallowed_methods)]
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// A generator of ids of `bits` bits: the clock's low `bits - low_bits` bits, then `low_bits`
/// bits that start at a random value each millisecond.
pub(crate) struct TimeIds {
    bits: u32,
    low_bits: u32,
    /// The last id this generator handed out.
    last: AtomicU64,
}

impl TimeIds {
    /// `bits` at most 64, `low_bits` below `bits`: checked when the static is built.
    pub(crate) const fn new(bits: u32, low_bits: u32) -> Self {
        assert!(bits <= 64 && low_bits > 0 && low_bits < bits);
        Self { bits, low_bits, last: AtomicU64::new(0) }
    }

    /// A fresh id, greater than every id this generator handed out before.
    pub(crate) fn next(&self) -> u64 {
        // Randomness outside apply: the id travels in the proposed command.
        #[allow(clippy::disallowed_methods)]
        let draw = rand::random::<u64>();
        self.next_from(self.candidate(now_ms(), draw))
    }

    /// The id a clock reading and a random draw (of which the top `low_bits` are used) give.
    pub(crate) fn candidate(&self, now_ms: u64, draw: u64) -> u64 {
        let clock_mask = (1u64 << (self.bits - self.low_bits)) - 1;
        ((now_ms & clock_mask) << self.low_bits) | (draw >> (64 - self.low_bits))
    }

    /// Hands out `candidate`, or the next id after the last one when the candidate is not
    /// greater (the same millisecond with a smaller draw, or a clock that stepped back).
    fn next_from(&self, candidate: u64) -> u64 {
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            let next = after(last, candidate);
            match self.last.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }
}

fn after(last: u64, candidate: u64) -> u64 {
    candidate.max(last.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_764_800_000_000; // 2025-12-03

    #[test]
    fn an_id_is_the_clock_then_the_draw() {
        let ids = TimeIds::new(64, 20);
        assert_eq!(ids.candidate(0, u64::MAX), 0xfffff);
        assert_eq!(ids.candidate(u64::MAX, 0), 0xffff_ffff_fff0_0000);
        assert_eq!(ids.candidate(1, 1 << 44), 0x10_0001);
        let ids = TimeIds::new(63, 19);
        let id = ids.candidate(MS, u64::MAX);
        assert_eq!(id >> 19, MS);
        assert_eq!(id & ((1 << 19) - 1), (1 << 19) - 1);
        // The clock's bits above the id's width are dropped, so the id keeps its width.
        assert!(ids.candidate(u64::MAX, u64::MAX) < 1 << 63);
        // Later milliseconds sort after, whatever the draws.
        assert!(ids.candidate(MS + 1, 0) > ids.candidate(MS, u64::MAX));
    }

    #[test]
    fn each_id_is_greater_than_the_last() {
        let ids = TimeIds::new(63, 19);
        let first = ids.next_from(ids.candidate(MS, u64::MAX));
        // Same millisecond, smaller draw: the next id after the last, not the draw.
        assert_eq!(ids.next_from(ids.candidate(MS, 0)), first + 1);
        // A clock that stepped back: still increasing.
        assert_eq!(ids.next_from(ids.candidate(MS - 5_000, 7 << 45)), first + 2);
        // A later millisecond: the draw itself.
        let later = ids.candidate(MS + 1, 3 << 45);
        assert_eq!(ids.next_from(later), later);
        // The first id is never 0, even for a clock at the epoch and a zero draw.
        assert_eq!(TimeIds::new(63, 19).next_from(0), 1);
    }

    #[test]
    fn the_generator_never_repeats_itself_and_follows_the_clock() {
        let ids = TimeIds::new(64, 20);
        let mut seen = std::collections::HashSet::new();
        let mut prev = 0;
        for _ in 0..10_000 {
            let id = ids.next();
            assert!(id > prev, "{id} after {prev}");
            assert!(seen.insert(id));
            prev = id;
        }
        // The newest id's top bits are about now (a run that began near the top of a
        // millisecond's low bits carries into the next millisecond).
        let now = now_ms() & ((1 << 44) - 1);
        assert!((prev >> 20).abs_diff(now) < 60_000, "{prev:x} at {now}");
    }
}
