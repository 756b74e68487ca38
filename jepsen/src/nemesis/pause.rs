//! `pause`: SIGSTOP the leader, one node or a minority, and SIGCONT them when healed.
//!
//! A paused process keeps its sockets: clients and peers see requests that hang instead of
//! connections that are refused, and a paused leader wakes up still believing it leads. Pauses
//! last longer than the election timeout (1-2 s randomized by default) so the rest of the cluster
//! elects a new leader meanwhile. Pausing every node would only stop time, so it is not done.

use std::time::Duration;

use super::process::{Heal, ProcessFault, ProcessNemesis};
use super::{NodeState, Targets};

/// Pause length: from past one maximal election timeout (2 s) to several.
const PAUSE_MIN: Duration = Duration::from_millis(2500);
const PAUSE_MAX: Duration = Duration::from_secs(6);

const PAUSE: ProcessFault = ProcessFault {
    f: "pause",
    weights: &[(45, Targets::Leader), (80, Targets::One), (100, Targets::Minority)],
    applies_to: |s| s == NodeState::Running,
    hold: (PAUSE_MIN, PAUSE_MAX),
    apply: |env, i| env.pause(i),
};

/// The `pause` nemesis: SIGSTOP, then SIGCONT when healed.
pub fn nemesis() -> ProcessNemesis {
    let heal = Heal { state: NodeState::Paused, apply: |env, i| env.resume(i), f: "resume" };
    ProcessNemesis::new(PAUSE, heal)
}
