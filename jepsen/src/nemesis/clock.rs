//! `clock` and `clock-rate`: restart one node under a skewed clock with libfaketime (Debian
//! `faketime` / `libfaketime`), hold it, then restart it with the true clock.
//!
//! The `clock` skew (`FAKETIME`, see faketime(1) and libfaketime's README) is one of:
//! - a **bump**: the wall clock 30 s to 1 h ahead or behind (`FAKETIME="+1234s"`);
//! - a **bump with a rate skew**: the same, and the wall clock running at 0.5x, 0.8x, 1.5x or
//!   2x (`FAKETIME="+1234s x1.5"`).
//!
//! Only the wall clock is faked: the node runs with `FAKETIME_DONT_FAKE_MONOTONIC=1`. What we
//! found (libfaketime 0.9.10, Debian 12, a Rust test binary): by default libfaketime also fakes
//! `CLOCK_MONOTONIC`, so Rust's `Instant` (and tokio's timers, and therefore Picket's lease
//! expiry and Raft timeouts) would run at the skewed rate; the offset is applied to
//! `CLOCK_REALTIME` only. With `FAKETIME_DONT_FAKE_MONOTONIC=1`, `Instant` stays true, but a
//! rate skew still scales sleeps and poll timeouts (`nanosleep`, `epoll_wait`...): with `x2`
//! a 1 s `thread::sleep` returns after 0.5 s, with `x0.5` after 2 s. Tokio re-checks its
//! deadlines against `Instant`, so timers still fire on time when woken early and up to
//! 1/rate late when a poll is stretched.
//!
//! `clock-rate` ([`ClockNemesis::rate`]) is the other fault: a **monotonic clock-rate skew**.
//! The node runs with `FAKETIME="+0 x<rate>"` and *without* `FAKETIME_DONT_FAKE_MONOTONIC`, so
//! `Instant`, tokio's timers and every timeout on it run `rate` times as fast (or slow) as real
//! time. Lease safety in Picket, as in etcd, assumes bounded clock-rate drift between the leader
//! and the clients: a leader whose clock runs 2x fast expires a 2 s lease after 1 s of real
//! time, while its holder, keeping it alive every TTL/3 of *its* (true) clock, believes it
//! alive. So this fault is expected to produce `early-expiry` (lease workload) and holders that
//! lose their lock mid-section (lost updates in `lock-set`) once the fast node leads, while
//! fenced resources stay safe.
//! Fast rates (1.5x-3x) are the dangerous ones; 0.5x (a slow node: late expiry, late elections)
//! is drawn too, as a liveness fault. It is not a must-pass fault and not part of the long runs'
//! default nemesis set; `jepsen/README.md` reports what it finds.
//!
//! etcd is a Go program: Go reads clocks through the vDSO without libc, so libfaketime has no
//! effect on it; against `--target etcd` the fault is only the restart.
//!
//! The fault is recorded with the node, the `FAKETIME` value and the hold; the heal restarts
//! the node without the library (`restart` with `clock: "true"`).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{
    between, FaultContext, FaultError, FaultEvent, Faults, Injected, NodeState, SyncNemesis,
};

/// The multi-threaded build of libfaketime (picketd is multi-threaded), found through Debian's
/// `libfaketime` package's file list (its directory names the architecture). When it is missing
/// the bare file name is used, which the loader cannot find; the runner refuses the `clock`
/// nemeses before that happens ([`unavailable_reason`]).
fn libfaketime() -> String {
    picket_procs::tools::libfaketime().map_or_else(
        |_| picket_procs::tools::LIBFAKETIME_MT.to_string(),
        |p| p.display().to_string(),
    )
}

/// How long the node runs with the skewed clock.
const HOLD_MIN: Duration = Duration::from_secs(5);
const HOLD_MAX: Duration = Duration::from_secs(10);

/// Wall-clock offsets, in seconds (either sign), and rates of the skewed runs.
const OFFSET_S: (u64, u64) = (30, 3600);
const RATES: &[&str] = &["0.5", "0.8", "1.5", "2"];

/// Rates of the `clock-rate` fault (monotonic clock included): mostly fast, since a fast clock
/// on the leader is what breaks the bounded-drift assumption of leases.
const MONOTONIC_RATES: &[&str] = &["0.5", "1.5", "2", "3"];

/// Share of faults that hit the leader (the rest a random node). The restart need not cost the
/// leader its leadership: openraft resumes its committed vote on restart when no one else was
/// elected meanwhile, which is what the `clock-rate` runs showed (a leader restarted at 3x was
/// expiring leases as leader within a second).
const LEADER_SHARE: f64 = 0.4;

/// Which clock the fault skews.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Skew {
    /// `clock`: the wall clock only (offset, sometimes a rate); `Instant` stays true.
    #[default]
    Wall,
    /// `clock-rate`: the monotonic clock too, at a rate (no offset).
    MonotonicRate,
}

/// Why the clock nemesis cannot run here, or `None` when libfaketime is installed.
pub fn unavailable_reason() -> Option<String> {
    picket_procs::tools::libfaketime().err().map(|e| e.to_string())
}

#[derive(Debug, Default)]
pub struct ClockNemesis {
    skew: Skew,
    /// The node running under libfaketime.
    skewed: Option<usize>,
}

/// Restarts node `i` (if it runs) with `env`; a down node only gets `env` for its next start.
fn restart_with(
    env: &mut dyn Faults,
    i: usize,
    vars: Vec<(String, String)>,
) -> Result<bool, FaultError> {
    env.set_env(i, vars)?;
    match env.node_state(i) {
        NodeState::Running | NodeState::Paused => {
            env.kill(i)?;
            env.restart(i)?;
            Ok(true)
        }
        NodeState::Down | NodeState::Removed => Ok(false),
    }
}

impl ClockNemesis {
    /// The `clock-rate` nemesis: the node's monotonic clock (and wall clock) runs at a rate.
    pub fn rate() -> Self {
        ClockNemesis { skew: Skew::MonotonicRate, skewed: None }
    }

    /// The `FAKETIME` value and the other variables of one skewed start.
    fn environment(&self, rng: &mut StdRng) -> (String, Vec<(String, String)>) {
        let faketime = match self.skew {
            Skew::Wall => {
                let offset = rng.random_range(OFFSET_S.0..=OFFSET_S.1);
                let sign = if rng.random_bool(0.5) { "+" } else { "-" };
                if rng.random_bool(0.5) {
                    format!("{sign}{offset}s")
                } else {
                    format!("{sign}{offset}s x{}", RATES[rng.random_range(0..RATES.len())])
                }
            }
            Skew::MonotonicRate => {
                format!("+0 x{}", MONOTONIC_RATES[rng.random_range(0..MONOTONIC_RATES.len())])
            }
        };
        let mut vars = vec![
            ("LD_PRELOAD".to_string(), libfaketime()),
            ("FAKETIME".to_string(), faketime.clone()),
        ];
        if self.skew == Skew::Wall {
            vars.push(("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()));
        }
        (faketime, vars)
    }

    fn skew(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        if self.skewed.is_some() {
            return Ok(None);
        }
        let running: Vec<usize> =
            (0..env.node_count()).filter(|&i| env.node_state(i) == NodeState::Running).collect();
        if running.is_empty() {
            return Ok(None);
        }
        let leader = ctx.leader.filter(|l| running.contains(l));
        let (target, leader_target) = match leader {
            Some(l) if rng.random_bool(LEADER_SHARE) => (l, true),
            _ => (running[rng.random_range(0..running.len())], false),
        };
        let (faketime, vars) = self.environment(rng);
        // Marked before the restart, so a failure half-way is still healed.
        self.skewed = Some(target);
        restart_with(env, target, vars)?;
        let hold = between(rng, HOLD_MIN, HOLD_MAX);
        Ok(Some(Injected {
            event: FaultEvent {
                f: self.name().to_string(),
                value: json!({
                    "nodes": [env.node_name(target)],
                    "leader": leader_target,
                    "faketime": faketime,
                    "monotonic": match self.skew {
                        Skew::Wall => "real",
                        Skew::MonotonicRate => "skewed",
                    },
                    "hold_ms": hold.as_millis() as u64,
                }),
            },
            hold,
        }))
    }

    fn unskew(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let Some(i) = self.skewed.take() else { return Ok(Vec::new()) };
        let restarted = restart_with(env, i, Vec::new())?;
        Ok(vec![FaultEvent {
            f: "restart".to_string(),
            value: json!({"nodes": [env.node_name(i)], "clock": "true", "restarted": restarted}),
        }])
    }
}

impl SyncNemesis for ClockNemesis {
    fn name(&self) -> &'static str {
        match self.skew {
            Skew::Wall => "clock",
            Skew::MonotonicRate => "clock-rate",
        }
    }

    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        self.skew(env, ctx, rng)
    }

    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        self.unskew(env)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn var<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
        vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn wall_skew_keeps_the_monotonic_clock_true() {
        let mut rng = StdRng::seed_from_u64(1);
        let n = ClockNemesis::default();
        assert_eq!(n.name(), "clock");
        for _ in 0..50 {
            let (faketime, vars) = n.environment(&mut rng);
            assert_eq!(var(&vars, "FAKETIME"), Some(faketime.as_str()));
            assert_eq!(var(&vars, "FAKETIME_DONT_FAKE_MONOTONIC"), Some("1"));
            let lib = var(&vars, "LD_PRELOAD").unwrap_or_default();
            assert!(lib.ends_with(picket_procs::tools::LIBFAKETIME_MT), "{lib}");
            assert!(faketime.starts_with(['+', '-']), "{faketime}");
        }
    }

    #[test]
    fn rate_skew_fakes_the_monotonic_clock_at_a_rate() {
        let mut rng = StdRng::seed_from_u64(2);
        let n = ClockNemesis::rate();
        assert_eq!(n.name(), "clock-rate");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let (faketime, vars) = n.environment(&mut rng);
            assert_eq!(var(&vars, "FAKETIME"), Some(faketime.as_str()));
            assert_eq!(var(&vars, "FAKETIME_DONT_FAKE_MONOTONIC"), None, "monotonic must be faked");
            let rate = faketime.strip_prefix("+0 x").expect("no offset, only a rate");
            assert!(MONOTONIC_RATES.contains(&rate), "{faketime}");
            seen.insert(rate.to_string());
        }
        assert_eq!(seen.len(), MONOTONIC_RATES.len(), "every rate is drawn: {seen:?}");
    }
}
