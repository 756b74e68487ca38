//! `partition`: cut network links between nodes with iptables DROP rules, and remove every rule
//! when healed. Needs network-namespace mode ([`Faults::supports_network_faults`]).
//!
//! Shapes (weights out of 100):
//! - `one` (20): one random node is cut off from every other node;
//! - `majority-minority` (25): a random minority (at least one node) against the majority;
//! - `leader` (25): the leader is cut off (a random node when the leader is unknown), so it may
//!   keep believing it leads while the others elect a new one;
//! - `bridge` (15): two halves that cannot talk to each other, and one node that talks to both
//!   (Jepsen's bridge; with fewer than 3 nodes it degrades to `one`);
//! - `asymmetric` (15): everything one node (the leader half of the time) *sends* to the others is
//!   dropped, while it still receives from them. TCP needs both directions, so connections from
//!   and to it stall, but the two sides see different symptoms (e.g. the node keeps receiving
//!   vote requests and heartbeats it cannot answer).
//!
//! Clients in the control namespace always reach every node: a partitioned node keeps serving
//! its clients, which is what makes stale reads possible.
//!
//! Partitions last 5-10 s. Followers of openraft 0.9 wait `leader_lease + election_timeout`
//! (2 s + 1-2 s with Picket's defaults) after the last heartbeat of a committed leader before
//! they campaign, and 4 s more after losing a vote to a node with a longer log; a partition must
//! outlast that for the majority side to elect a new leader while the old one is still cut off,
//! which is the interesting case. (A 5-node run with 4-8 s holds isolated the leader three times
//! without the majority electing anyone.) Etcd campaigns after 1 s.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::json;

use super::{between, names, FaultContext, FaultError, FaultEvent, Faults, Injected, SyncNemesis};

const HOLD_MIN: Duration = Duration::from_secs(5);
const HOLD_MAX: Duration = Duration::from_secs(10);

/// The shape of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    One,
    MajorityMinority,
    Leader,
    Bridge,
    Asymmetric,
}

impl Shape {
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::One => "one",
            Shape::MajorityMinority => "majority-minority",
            Shape::Leader => "leader",
            Shape::Bridge => "bridge",
            Shape::Asymmetric => "asymmetric",
        }
    }

    fn draw(rng: &mut StdRng) -> Shape {
        match rng.random_range(0..100) {
            0..20 => Shape::One,
            20..45 => Shape::MajorityMinority,
            45..70 => Shape::Leader,
            70..85 => Shape::Bridge,
            _ => Shape::Asymmetric,
        }
    }
}

/// Every directed link `(from, to)` between nodes that share no group. Nodes in no group are
/// cut off from everyone.
pub fn links_between_groups(n: usize, groups: &[Vec<usize>]) -> Vec<(usize, usize)> {
    let together = |a: usize, b: usize| groups.iter().any(|g| g.contains(&a) && g.contains(&b));
    let mut links = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if a != b && !together(a, b) {
                links.push((a, b));
            }
        }
    }
    links
}

/// A planned partition: what the history says about it and the links to cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub shape: Shape,
    /// Groups of nodes that can talk among themselves (empty for `asymmetric`).
    pub groups: Vec<Vec<usize>>,
    pub links: Vec<(usize, usize)>,
    pub leader_known: bool,
}

/// Plans a partition of `n` nodes (node indices `0..n`).
pub fn plan(shape: Shape, n: usize, leader: Option<usize>, rng: &mut StdRng) -> Plan {
    let mut all: Vec<usize> = (0..n).collect();
    all.shuffle(rng);
    let leader = leader.filter(|&l| l < n);
    let isolate =
        |x: usize| -> Vec<Vec<usize>> { vec![vec![x], (0..n).filter(|&i| i != x).collect()] };
    let (shape, groups, leader_known) = match shape {
        Shape::Bridge if n < 3 => (Shape::One, isolate(all[0]), false),
        Shape::One => (shape, isolate(all[0]), false),
        Shape::Leader => match leader {
            Some(l) => (shape, isolate(l), true),
            None => (shape, isolate(all[0]), false),
        },
        Shape::MajorityMinority => {
            let k = rng.random_range(1..=((n.saturating_sub(1)) / 2).max(1));
            (shape, vec![all[..k].to_vec(), all[k..].to_vec()], false)
        }
        Shape::Bridge => {
            // all[m] is in both halves: all[..=m] and all[m..].
            let m = (n - 1) / 2;
            (shape, vec![all[..=m].to_vec(), all[m..].to_vec()], false)
        }
        Shape::Asymmetric => {
            let (x, known) = match leader {
                Some(l) if rng.random_bool(0.5) => (l, true),
                _ => (all[0], false),
            };
            let links = (0..n).filter(|&o| o != x).map(|o| (x, o)).collect();
            return Plan { shape, groups: Vec::new(), links, leader_known: known };
        }
    };
    let links = links_between_groups(n, &groups);
    Plan { shape, groups, links, leader_known }
}

#[derive(Debug, Default)]
pub struct PartitionNemesis {
    /// Whether rules may be in place (set before cutting, so a half-applied cut is healed).
    active: bool,
}

impl SyncNemesis for PartitionNemesis {
    fn name(&self) -> &'static str {
        "partition"
    }

    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        if !env.supports_network_faults() {
            return Err(FaultError::Unsupported { fault: "partition", mode: env.mode() });
        }
        let n = env.node_count();
        if n < 2 {
            return Ok(None);
        }
        let shape = Shape::draw(rng);
        let p = plan(shape, n, ctx.leader, rng);
        self.active = true;
        env.cut(&p.links)?;
        let hold = between(rng, HOLD_MIN, HOLD_MAX);
        let groups: Vec<Vec<String>> = p.groups.iter().map(|g| names(env, g)).collect();
        let links: Vec<[String; 2]> =
            p.links.iter().map(|&(a, b)| [env.node_name(a), env.node_name(b)]).collect();
        Ok(Some(Injected {
            event: FaultEvent {
                f: "partition".to_string(),
                value: json!({
                    "targets": p.shape.as_str(),
                    "leader_known": p.leader_known,
                    "groups": groups,
                    "dropped": links,
                    "hold_ms": hold.as_millis() as u64,
                }),
            },
            hold,
        }))
    }

    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        if !self.active {
            return Ok(Vec::new());
        }
        env.heal_network()?;
        self.active = false;
        Ok(vec![FaultEvent { f: "heal-network".to_string(), value: json!({"rules": "flushed"}) }])
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn connected(p: &Plan, a: usize, b: usize) -> bool {
        !p.links.contains(&(a, b))
    }

    #[test]
    fn every_shape_cuts_what_it_says() {
        for seed in 0..50 {
            let mut rng = StdRng::seed_from_u64(seed);
            for n in [3usize, 5] {
                let one = plan(Shape::One, n, None, &mut rng);
                assert_eq!(one.links.len(), 2 * (n - 1), "{one:?}");

                let leader = plan(Shape::Leader, n, Some(1), &mut rng);
                assert!(leader.leader_known);
                assert!((0..n).filter(|&o| o != 1).all(|o| !connected(&leader, 1, o)));
                assert!((0..n).filter(|&o| o != 1).all(|o| !connected(&leader, o, 1)));
                assert!(connected(&leader, 0, 2));

                let mm = plan(Shape::MajorityMinority, n, None, &mut rng);
                let (minority, majority) = (&mm.groups[0], &mm.groups[1]);
                assert!(!minority.is_empty() && minority.len() < majority.len(), "{mm:?}");
                assert_eq!(mm.links.len(), 2 * minority.len() * majority.len());

                let bridge = plan(Shape::Bridge, n, None, &mut rng);
                let b: Vec<usize> =
                    (0..n).filter(|&x| bridge.groups.iter().all(|g| g.contains(&x))).collect();
                assert_eq!(b.len(), 1, "one node sees both sides: {bridge:?}");
                assert!((0..n).all(|o| connected(&bridge, b[0], o) && connected(&bridge, o, b[0])));
                assert!(!bridge.links.is_empty());

                let asym = plan(Shape::Asymmetric, n, Some(0), &mut rng);
                assert_eq!(asym.links.len(), n - 1);
                let x = asym.links[0].0;
                assert!(asym.links.iter().all(|&(from, _)| from == x), "one direction only");
            }
        }
    }

    #[test]
    fn bridge_needs_three_nodes() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(plan(Shape::Bridge, 2, None, &mut rng).shape, Shape::One);
    }
}
