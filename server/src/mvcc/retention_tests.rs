use super::*;

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// Drives `s` from `start` tick by tick for `total`, the revision growing by `per_tick` each
/// tick, and compacts whenever it asks. Returns (time since start, revision) of each compaction.
fn drive(s: &mut Schedule, start: Instant, total: Duration, per_tick: i64) -> Vec<(Duration, i64)> {
    let mut out = Vec::new();
    let mut now = start;
    let mut current = 0;
    while now - start < total {
        now += s.interval();
        current += per_tick;
        if let Some(rev) = s.tick(now, current) {
            out.push((now - start, rev));
            s.done(now, rev);
        }
    }
    out
}

#[test]
fn off_and_empty_retentions_have_no_schedule() {
    let now = Instant::now();
    assert!(Schedule::new(Retention::Off, now).is_none());
    assert!(Schedule::new(Retention::Periodic(Duration::ZERO), now).is_none());
    assert!(Schedule::new(Retention::Revisions(0), now).is_none());
    assert!(Schedule::new(Retention::Revisions(-3), now).is_none());
}

/// A one-hour period: samples every 6 minutes, the first compaction after a whole hour, then
/// every hour, each at the revision of about an hour before (here 10 revisions per tick, so an
/// hour is 100 revisions).
#[test]
fn periodic_compacts_every_interval_at_the_revision_one_period_ago() {
    let start = Instant::now();
    let mut s = Schedule::new(Retention::Periodic(HOUR), start).unwrap();
    assert_eq!(s.interval(), 6 * MIN);
    let got = drive(&mut s, start, 3 * HOUR + MIN, 10);
    assert_eq!(got, vec![(HOUR, 10), (2 * HOUR, 100), (3 * HOUR, 200)]);
}

/// A period longer than an hour still compacts every hour, keeping the whole period: with a
/// 3-hour period the first compaction is at 3 h, then at 4 h and 5 h, each 3 hours back.
#[test]
fn a_period_past_an_hour_compacts_hourly_and_keeps_the_whole_period() {
    let start = Instant::now();
    let mut s = Schedule::new(Retention::Periodic(3 * HOUR), start).unwrap();
    assert_eq!(s.interval(), 6 * MIN);
    let got = drive(&mut s, start, 5 * HOUR + MIN, 1);
    // One revision per 6-minute tick: 3 hours are 30 revisions.
    assert_eq!(got, vec![(3 * HOUR, 1), (4 * HOUR, 10), (5 * HOUR, 20)]);
}

/// A short period (seconds) samples ten times per period.
#[test]
fn a_short_period_samples_ten_times_per_period() {
    let start = Instant::now();
    let p = Duration::from_secs(2);
    let mut s = Schedule::new(Retention::Periodic(p), start).unwrap();
    assert_eq!(s.interval(), Duration::from_millis(200));
    let got = drive(&mut s, start, Duration::from_millis(4100), 1);
    assert_eq!(got, vec![(p, 1), (2 * p, 10)]);
}

/// A compaction that could not be made (not the leader, a failed proposal) is asked for again
/// at the next tick, at the oldest revision still in the window.
#[test]
fn an_unmade_compaction_is_asked_for_again_next_tick() {
    let start = Instant::now();
    let mut s = Schedule::new(Retention::Periodic(HOUR), start).unwrap();
    let mut now = start;
    let mut asked = Vec::new();
    for current in 1..=12 {
        now += s.interval();
        if let Some(rev) = s.tick(now, current) {
            asked.push(rev);
        }
    }
    // Ticks 10, 11 and 12 are at or past the hour; none was reported done. The window holds 11
    // samples, so the sample of tick 1 leaves it at tick 12.
    assert_eq!(asked, vec![1, 1, 2]);
}

/// Nothing written yet: no compaction at revision 0.
#[test]
fn periodic_does_not_compact_an_empty_store() {
    let start = Instant::now();
    let mut s = Schedule::new(Retention::Periodic(MIN), start).unwrap();
    assert!(drive(&mut s, start, 5 * MIN, 0).is_empty());
}

/// The revision mode compacts every 5 minutes at the current revision minus n, not before n
/// revisions exist and not twice at the same revision.
#[test]
fn revision_mode_keeps_the_last_n_revisions() {
    let start = Instant::now();
    let mut s = Schedule::new(Retention::Revisions(1000), start).unwrap();
    assert_eq!(s.interval(), REVISION_INTERVAL);
    // 5 minutes in: revision 600, nothing to compact yet.
    assert_eq!(s.tick(start + 5 * MIN, 600), None);
    // 10 minutes: 1,500, compact at 500.
    assert_eq!(s.tick(start + 10 * MIN, 1500), Some(500));
    s.done(start + 10 * MIN, 500);
    // No writes since: the same revision is not compacted again.
    assert_eq!(s.tick(start + 15 * MIN, 1500), None);
    // Before the interval has passed nothing is due, whatever the revision.
    assert_eq!(s.tick(start + 12 * MIN, 9000), None);
    assert_eq!(s.tick(start + 20 * MIN, 2200), Some(1200));
}
