//! `clock`: restart one node under a skewed wall clock with libfaketime (Debian `faketime` /
//! `libfaketime`), hold it, then restart it with the true clock.
//!
//! The skew (`FAKETIME`, see faketime(1) and libfaketime's README) is one of:
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
//! 1/rate late when a poll is stretched. A slow or fast *monotonic* clock is a different fault
//! (lease safety in Picket, as in etcd, assumes bounded clock-rate drift between the leader and
//! the clients) and is not injected.
//!
//! etcd is a Go program: Go reads clocks through the vDSO without libc, so libfaketime has no
//! effect on it; against `--target etcd` the fault is only the restart.
//!
//! The fault is recorded with the node, the `FAKETIME` value and the hold; the heal restarts
//! the node without the library (`restart` with `clock: "true"`).

use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{
    between, FaultContext, FaultError, FaultEvent, FaultFuture, Faults, Injected, Nemesis,
    NodeState,
};

/// The multi-threaded build of libfaketime (picketd is multi-threaded), from Debian's
/// `libfaketime`.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// How long the node runs with the skewed clock.
const HOLD_MIN: Duration = Duration::from_secs(5);
const HOLD_MAX: Duration = Duration::from_secs(10);

/// Wall-clock offsets, in seconds (either sign), and rates of the skewed runs.
const OFFSET_S: (u64, u64) = (30, 3600);
const RATES: &[&str] = &["0.5", "0.8", "1.5", "2"];

/// Share of faults that hit the leader (the rest a random node).
const LEADER_SHARE: f64 = 0.4;

/// Why the clock nemesis cannot run here, or `None` when libfaketime is installed.
pub fn unavailable_reason() -> Option<String> {
    (!Path::new(LIBFAKETIME).is_file())
        .then(|| format!("{LIBFAKETIME} is missing (Debian: apt-get install faketime libfaketime)"))
}

#[derive(Debug, Default)]
pub struct ClockNemesis {
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
        let offset = rng.random_range(OFFSET_S.0..=OFFSET_S.1);
        let sign = if rng.random_bool(0.5) { "+" } else { "-" };
        let faketime = if rng.random_bool(0.5) {
            format!("{sign}{offset}s")
        } else {
            format!("{sign}{offset}s x{}", RATES[rng.random_range(0..RATES.len())])
        };
        let vars = vec![
            ("LD_PRELOAD".to_string(), LIBFAKETIME.to_string()),
            ("FAKETIME".to_string(), faketime.clone()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()),
        ];
        // Marked before the restart, so a failure half-way is still healed.
        self.skewed = Some(target);
        restart_with(env, target, vars)?;
        let hold = between(rng, HOLD_MIN, HOLD_MAX);
        Ok(Some(Injected {
            event: FaultEvent {
                f: "clock".to_string(),
                value: json!({
                    "nodes": [env.node_name(target)],
                    "leader": leader_target,
                    "faketime": faketime,
                    "monotonic": "real",
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

impl Nemesis for ClockNemesis {
    fn name(&self) -> &'static str {
        "clock"
    }

    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>> {
        let r = self.skew(env, ctx, rng);
        Box::pin(std::future::ready(r))
    }

    fn heal<'a>(&'a mut self, env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>> {
        let r = self.unskew(env);
        Box::pin(std::future::ready(r))
    }
}
