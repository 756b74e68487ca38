//! `kill`: SIGKILL the leader, one node, a minority or every node; restart them when healed.
//!
//! Killing every node at once tests crash recovery of the whole cluster (everything
//! acknowledged must have been fsynced by a majority). It is chosen less often than the
//! others, because the cluster needs an election after it and the run makes less progress.

use std::time::Duration;

use super::process::{Heal, ProcessFault, ProcessNemesis};
use super::{NodeState, Targets};

/// How long killed nodes stay down: long enough for the survivors to notice (an election
/// timeout is 1-2 s by default) and to move on, short enough to leave time for more faults.
const DOWN_MIN: Duration = Duration::from_secs(2);
const DOWN_MAX: Duration = Duration::from_secs(5);

const KILL: ProcessFault = ProcessFault {
    f: "kill",
    weights: &[
        (35, Targets::Leader),
        (70, Targets::One),
        (90, Targets::Minority),
        (100, Targets::All),
    ],
    // Killing a paused node works too (SIGKILL ends a stopped process). A node the `member`
    // nemesis removed has no process.
    applies_to: |s| matches!(s, NodeState::Running | NodeState::Paused),
    hold: (DOWN_MIN, DOWN_MAX),
    apply: |env, i| env.kill(i),
};

/// The `kill` nemesis: SIGKILL, then restart when healed.
pub fn nemesis() -> ProcessNemesis {
    let heal = Heal { state: NodeState::Down, apply: |env, i| env.restart(i), f: "restart" };
    ProcessNemesis::new(KILL, heal)
}
