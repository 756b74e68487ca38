//! Automatic compaction: when to compact, and at which revision (etcd's
//! `--auto-compaction-mode` and `--auto-compaction-retention`, its `v3compactor`).
//!
//! Without compaction every deleted or overwritten value stays in the history: a queue leaves
//! each finished job's keys, a lock every hand-off's, and the store, its snapshots and its reads
//! grow without end (docs/benchmarks.md, "Issue 20, session 24"). etcd users turn on a policy;
//! Picket takes the same flags with the same meaning:
//!
//! - **periodic** keeps the history of the last `period`: a sample of the current revision is
//!   taken every tenth of the compaction interval (the period, at most an hour), and once a whole
//!   period has passed, and then every interval, the history is compacted at the oldest sample
//!   still in the window, the revision of about `period` ago.
//! - **revision** keeps the last `n` revisions: every 5 minutes the history is compacted at the
//!   current revision minus `n`, unless that is where the last compaction was.
//!
//! This is the schedule only, deterministic in the clock readings and revisions it is given; the
//! leader's driver (`api::auto_compact`) feeds it and proposes the Compaction, which apply checks
//! as any client's (and subscription groups may hold back). Every member keeps its own samples,
//! so a new leader compacts on its own schedule without any state handed over.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The longest compaction interval of the periodic mode: a longer period still compacts every
/// hour, each time at the revision one period ago (etcd).
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// How often the revision mode compacts (etcd's fixed 5 minutes).
pub const REVISION_INTERVAL: Duration = Duration::from_secs(300);

/// Samples per compaction interval in the periodic mode (etcd's 10).
const SAMPLES_PER_INTERVAL: u32 = 10;

/// What history to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Keep everything until a client compacts (the default, as etcd's retention "0").
    Off,
    /// Keep the history of the last period.
    Periodic(Duration),
    /// Keep the last this many revisions.
    Revisions(i64),
}

/// The schedule of one member. Feed it with [`Schedule::tick`] every [`Schedule::interval`];
/// report a compaction made (or found already made) with [`Schedule::done`].
#[derive(Debug)]
pub struct Schedule {
    retention: Retention,
    /// Periodic: samples of the current revision, oldest first, one per tick, at most a period's
    /// worth plus one.
    samples: VecDeque<i64>,
    /// When the history may next be compacted: a whole period after the start, then one
    /// interval after each compaction.
    due: Instant,
    /// Revision mode: where the last compaction was.
    last: i64,
}

impl Schedule {
    /// The schedule of `retention` started at `now`; `None` when it is [`Retention::Off`] or
    /// keeps nothing meaningful (a zero period or count).
    pub fn new(retention: Retention, now: Instant) -> Option<Self> {
        let first = match retention {
            Retention::Off => return None,
            Retention::Periodic(p) if p.is_zero() => return None,
            Retention::Revisions(n) if n <= 0 => return None,
            Retention::Periodic(p) => p,
            Retention::Revisions(_) => REVISION_INTERVAL,
        };
        Some(Self { retention, samples: VecDeque::new(), due: now + first, last: 0 })
    }

    /// How long to wait between two ticks.
    pub fn interval(&self) -> Duration {
        match self.retention {
            Retention::Periodic(_) => (self.compact_every() / SAMPLES_PER_INTERVAL).max(MIN_TICK),
            _ => self.compact_every(),
        }
    }

    /// The time between two compactions: the period, at most [`MAX_INTERVAL`], or
    /// [`REVISION_INTERVAL`].
    fn compact_every(&self) -> Duration {
        match self.retention {
            Retention::Periodic(p) => p.min(MAX_INTERVAL),
            _ => REVISION_INTERVAL,
        }
    }

    /// One tick at `now`, with the store's current revision: the revision to compact at, if
    /// it is time. Nothing changes until [`Schedule::done`], so a compaction that could not be
    /// made (this member does not lead, the proposal failed) is asked for again next tick.
    pub fn tick(&mut self, now: Instant, current: i64) -> Option<i64> {
        match self.retention {
            Retention::Periodic(p) => {
                self.samples.push_back(current);
                let keep = samples_kept(p, self.interval());
                while self.samples.len() > keep {
                    self.samples.pop_front();
                }
                (now >= self.due).then(|| self.samples[0]).filter(|rev| *rev > 0)
            }
            Retention::Revisions(n) => {
                let rev = current - n;
                (now >= self.due && rev > 0 && rev != self.last).then_some(rev)
            }
            Retention::Off => None,
        }
    }

    /// The history is compacted at `rev` (by this member's proposal, or found already compacted
    /// there or later): the next compaction is one interval from `now`.
    pub fn done(&mut self, now: Instant, rev: i64) {
        self.last = rev;
        self.due = now + self.compact_every();
    }
}

/// The shortest tick: a period given in milliseconds still samples at a sane rate.
const MIN_TICK: Duration = Duration::from_millis(10);

/// Samples that cover a period at one per `tick`, plus the one taken a whole period ago.
fn samples_kept(period: Duration, tick: Duration) -> usize {
    let n = period.as_nanos() / tick.as_nanos().max(1);
    usize::try_from(n).unwrap_or(usize::MAX).saturating_add(1)
}

#[cfg(test)]
#[path = "retention_tests.rs"]
mod tests;
