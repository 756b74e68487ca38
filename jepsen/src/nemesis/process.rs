//! What the process nemeses ([`super::kill`], [`super::pause`]) share: choose the target nodes
//! by weighted [`Targets`], apply a primitive fault to each, describe it for the history, and
//! undo it on the nodes still in the faulted state.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{
    between, names, FaultContext, FaultError, FaultEvent, Faults, Injected, NodeState, SyncNemesis,
    Targets,
};

/// A primitive fault on a node (`Faults::kill`, `Faults::pause`, ...).
pub type NodeFault = fn(&mut dyn Faults, usize) -> Result<(), FaultError>;

/// One kind of process fault.
#[derive(Debug, Clone, Copy)]
pub struct ProcessFault {
    /// The history's `f` for the fault.
    pub f: &'static str,
    /// Cumulative weights out of 100: a draw below `weights[k].0` (and not below an earlier
    /// bound) picks `weights[k].1`. The last bound must be 100.
    pub weights: &'static [(u32, Targets)],
    /// Which nodes the fault can hit, by state.
    pub applies_to: fn(NodeState) -> bool,
    /// How long to keep the fault, drawn uniformly.
    pub hold: (Duration, Duration),
    /// The primitive applied to each target.
    pub apply: NodeFault,
}

impl ProcessFault {
    fn targets(&self, rng: &mut StdRng) -> Targets {
        let draw = rng.random_range(0..100);
        self.weights
            .iter()
            .find(|(bound, _)| draw < *bound)
            .or(self.weights.last())
            .map_or(Targets::One, |(_, t)| *t)
    }

    /// Chooses the targets and applies the fault to each. Every node actually hit is pushed to
    /// `hit` as soon as it is hit, so a failure half-way still leaves the caller able to heal
    /// the nodes already faulted. `Ok(None)`: no node could be faulted.
    pub fn inject(
        &self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
        hit: &mut Vec<usize>,
    ) -> Result<Option<Injected>, FaultError> {
        let n = env.node_count();
        let candidates: Vec<usize> =
            (0..n).filter(|&i| (self.applies_to)(env.node_state(i))).collect();
        let targets = self.targets(rng);
        let (nodes, leader_known) = targets.pick(&candidates, n, ctx.leader, rng);
        if nodes.is_empty() {
            return Ok(None);
        }
        for &i in &nodes {
            (self.apply)(env, i)?;
            hit.push(i);
        }
        let hold = between(rng, self.hold.0, self.hold.1);
        Ok(Some(Injected {
            event: FaultEvent {
                f: self.f.to_string(),
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
}

/// Applies `undo` to every node of `nodes` still in `state` (a node may have changed state
/// meanwhile, e.g. a paused node that was also killed) and describes it as one `f` event.
pub fn undo(
    env: &mut dyn Faults,
    nodes: Vec<usize>,
    state: NodeState,
    undo: NodeFault,
    f: &str,
) -> Result<Vec<FaultEvent>, FaultError> {
    let mut done = Vec::new();
    for i in nodes {
        if env.node_state(i) == state {
            undo(env, i)?;
            done.push(i);
        }
    }
    if done.is_empty() {
        return Ok(Vec::new());
    }
    Ok(vec![FaultEvent { f: f.to_string(), value: json!({ "nodes": names(env, &done) }) }])
}

/// How a [`ProcessNemesis`] undoes its fault: `apply` to every node it hit that is still in
/// `state`, reported as one `f` event.
#[derive(Debug, Clone, Copy)]
pub struct Heal {
    pub state: NodeState,
    pub apply: NodeFault,
    pub f: &'static str,
}

/// A nemesis made of one process fault and its undo (`kill`: SIGKILL, restart; `pause`: SIGSTOP,
/// SIGCONT), named after the fault.
#[derive(Debug)]
pub struct ProcessNemesis {
    fault: ProcessFault,
    heal: Heal,
    /// Nodes hit and not healed yet.
    hit: Vec<usize>,
}

impl ProcessNemesis {
    pub fn new(fault: ProcessFault, heal: Heal) -> Self {
        Self { fault, heal, hit: Vec::new() }
    }
}

impl SyncNemesis for ProcessNemesis {
    fn name(&self) -> &'static str {
        self.fault.f
    }

    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        self.fault.inject(env, ctx, rng, &mut self.hit)
    }

    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let hit = std::mem::take(&mut self.hit);
        undo(env, hit, self.heal.state, self.heal.apply, self.heal.f)
    }
}
