//! `pause`: SIGSTOP the leader, one node or a minority, and SIGCONT them when healed.
//!
//! A paused process keeps its sockets: clients and peers see requests that hang instead of
//! connections that are refused, and a paused leader wakes up still believing it leads. Pauses
//! last longer than the election timeout (1-2 s randomized by default) so the rest of the cluster
//! elects a new leader meanwhile. Pausing every node would only stop time, so it is not done.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{
    between, names, FaultContext, FaultError, FaultEvent, Faults, Injected, Nemesis, NodeState,
    Targets,
};

/// Pause length: from past one maximal election timeout (2 s) to several.
const PAUSE_MIN: Duration = Duration::from_millis(2500);
const PAUSE_MAX: Duration = Duration::from_secs(6);

#[derive(Debug, Default)]
pub struct PauseNemesis {
    paused: Vec<usize>,
}

impl Nemesis for PauseNemesis {
    fn name(&self) -> &'static str {
        "pause"
    }

    fn inject(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        let n = env.node_count();
        let candidates: Vec<usize> =
            (0..n).filter(|&i| env.node_state(i) == NodeState::Running).collect();
        let targets = match rng.random_range(0..100) {
            0..45 => Targets::Leader,
            45..80 => Targets::One,
            _ => Targets::Minority,
        };
        let (nodes, leader_known) = targets.pick(&candidates, n, ctx.leader, rng);
        if nodes.is_empty() {
            return Ok(None);
        }
        for &i in &nodes {
            env.pause(i)?;
            self.paused.push(i);
        }
        let hold = between(rng, PAUSE_MIN, PAUSE_MAX);
        Ok(Some(Injected {
            event: FaultEvent {
                f: "pause".to_string(),
                value: json!({
                    "targets": targets.as_str(),
                    "leader_known": leader_known,
                    "nodes": names(env, &nodes),
                    "hold_ms": hold.as_millis() as u64,
                }),
            },
            hold,
        }))
    }

    fn heal(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let mut resumed = Vec::new();
        for i in std::mem::take(&mut self.paused) {
            if env.node_state(i) == NodeState::Paused {
                env.resume(i)?;
                resumed.push(i);
            }
        }
        if resumed.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![FaultEvent {
            f: "resume".to_string(),
            value: json!({ "nodes": names(env, &resumed) }),
        }])
    }
}
