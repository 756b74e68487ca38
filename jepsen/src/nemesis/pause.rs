//! `pause`: SIGSTOP the leader, one node or a minority, and SIGCONT them when healed.
//!
//! A paused process keeps its sockets: clients and peers see requests that hang instead of
//! connections that are refused, and a paused leader wakes up still believing it leads. Pauses
//! last longer than the election timeout (1-2 s randomized by default) so the rest of the cluster
//! elects a new leader meanwhile. Pausing every node would only stop time, so it is not done.

use std::time::Duration;

use rand::rngs::StdRng;

use super::process::{self, ProcessFault};
use super::{
    FaultContext, FaultError, FaultEvent, Faults, Injected, NodeState, SyncNemesis, Targets,
};

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

#[derive(Debug, Default)]
pub struct PauseNemesis {
    paused: Vec<usize>,
}

impl SyncNemesis for PauseNemesis {
    fn name(&self) -> &'static str {
        "pause"
    }

    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        PAUSE.inject(env, ctx, rng, &mut self.paused)
    }

    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let paused = std::mem::take(&mut self.paused);
        process::undo(env, paused, NodeState::Paused, |env, i| env.resume(i), "resume")
    }
}
