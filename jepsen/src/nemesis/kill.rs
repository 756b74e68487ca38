//! `kill`: SIGKILL the leader, one node, a minority or every node; restart them when healed.
//!
//! Killing every node at once tests crash recovery of the whole cluster (everything
//! acknowledged must have been fsynced by a majority). It is chosen less often than the
//! others, because the cluster needs an election after it and the run makes less progress.

use std::time::Duration;

use rand::rngs::StdRng;

use super::process::{self, ProcessFault};
use super::{FaultContext, FaultEvent, FaultFuture, Faults, Injected, Nemesis, NodeState, Targets};

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

impl Nemesis for KillNemesis {
    fn name(&self) -> &'static str {
        "kill"
    }

    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>> {
        let r = KILL.inject(env, ctx, rng, &mut self.down);
        Box::pin(std::future::ready(r))
    }

    fn heal<'a>(&'a mut self, env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>> {
        let down = std::mem::take(&mut self.down);
        let r = process::undo(env, down, NodeState::Down, |env, i| env.restart(i), "restart");
        Box::pin(std::future::ready(r))
    }
}
