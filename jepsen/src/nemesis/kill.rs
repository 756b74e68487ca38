//! `kill`: SIGKILL the leader, one node, a minority or every node; restart them when healed.
//!
//! Killing every node at once tests crash recovery of the whole cluster (everything
//! acknowledged must have been fsynced by a majority). It is chosen less often than the
//! others, because the cluster needs an election after it and the run makes less progress.

use std::time::Duration;

use rand::rngs::StdRng;

use super::process::{self, ProcessFault};
use super::{
    FaultContext, FaultError, FaultEvent, Faults, Injected, NodeState, SyncNemesis, Targets,
};

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

#[derive(Debug, Default)]
pub struct KillNemesis {
    down: Vec<usize>,
}

impl SyncNemesis for KillNemesis {
    fn name(&self) -> &'static str {
        "kill"
    }

    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        KILL.inject(env, ctx, rng, &mut self.down)
    }

    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let down = std::mem::take(&mut self.down);
        process::undo(env, down, NodeState::Down, |env, i| env.restart(i), "restart")
    }
}
