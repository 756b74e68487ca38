//! `kill`: SIGKILL the leader, one node, a minority or every node; restart them when healed.
//!
//! Killing every node at once tests crash recovery of the whole cluster (everything
//! acknowledged must have been fsynced by a majority). It is chosen less often than the
//! others, because the cluster needs an election after it and the run makes less progress.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{
    between, names, FaultContext, FaultError, FaultEvent, Faults, Injected, Nemesis, NodeState,
    Targets,
};

/// How long killed nodes stay down: long enough for the survivors to notice (an election
/// timeout is 1-2 s by default) and to move on, short enough to leave time for more faults.
const DOWN_MIN: Duration = Duration::from_secs(2);
const DOWN_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
pub struct KillNemesis {
    down: Vec<usize>,
}

impl Nemesis for KillNemesis {
    fn name(&self) -> &'static str {
        "kill"
    }

    fn inject(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        let n = env.node_count();
        // Killing a paused node works too (SIGKILL ends a stopped process).
        let candidates: Vec<usize> =
            (0..n).filter(|&i| env.node_state(i) != NodeState::Down).collect();
        let targets = match rng.random_range(0..100) {
            0..35 => Targets::Leader,
            35..70 => Targets::One,
            70..90 => Targets::Minority,
            _ => Targets::All,
        };
        let (nodes, leader_known) = targets.pick(&candidates, n, ctx.leader, rng);
        if nodes.is_empty() {
            return Ok(None);
        }
        for &i in &nodes {
            env.kill(i)?;
            self.down.push(i);
        }
        let hold = between(rng, DOWN_MIN, DOWN_MAX);
        Ok(Some(Injected {
            event: FaultEvent {
                f: "kill".to_string(),
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
        let mut restarted = Vec::new();
        for i in std::mem::take(&mut self.down) {
            if env.node_state(i) == NodeState::Down {
                env.restart(i)?;
                restarted.push(i);
            }
        }
        if restarted.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![FaultEvent {
            f: "restart".to_string(),
            value: json!({ "nodes": names(env, &restarted) }),
        }])
    }
}
