//! `pause`: SIGSTOP the leader, one node or a minority, and SIGCONT them when healed.
//!
//! A paused process keeps its sockets: clients and peers see requests that hang instead of
//! connections that are refused, and a paused leader wakes up still believing it leads. Pauses
//! last longer than the election timeout (1-2 s randomized by default) so the rest of the cluster
//! elects a new leader meanwhile. Pausing every node would only stop time, so it is not done.

use std::time::Duration;

use rand::rngs::StdRng;

use super::process::{self, ProcessFault};
use super::{FaultContext, FaultEvent, FaultFuture, Faults, Injected, Nemesis, NodeState, Targets};

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

impl Nemesis for PauseNemesis {
    fn name(&self) -> &'static str {
        "pause"
    }

    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>> {
        let r = PAUSE.inject(env, ctx, rng, &mut self.paused);
        Box::pin(std::future::ready(r))
    }

    fn heal<'a>(&'a mut self, env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>> {
        let paused = std::mem::take(&mut self.paused);
        let r = process::undo(env, paused, NodeState::Paused, |env, i| env.resume(i), "resume");
        Box::pin(std::future::ready(r))
    }
}
