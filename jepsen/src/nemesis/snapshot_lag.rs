//! `snapshot-lag`: keep one member away from the cluster long enough that, when it comes back,
//! the log it needs has been purged and it must install a snapshot from the leader.
//!
//! Every node runs with `--snapshot-count` [`SNAPSHOT_COUNT`] (picketd takes a snapshot every
//! that many applied entries and keeps as many entries behind it, see `raft/bootstrap.rs`), so a
//! member that misses more than about twice that many entries can only catch up by snapshot.
//! The workload at its default rate commits some tens of entries a second (writes, lease grants
//! and revokes), so a [`HOLD_MIN`]-[`HOLD_MAX`] absence is several snapshots behind.
//!
//! Each fault picks the target: the leader [`LEADER_PERCENT`] % of the time (a deposed leader
//! comes back with a log that diverges from the new leader's and must install a snapshot too),
//! else a random running node; and the way: SIGSTOP (the node keeps its sockets and wakes up
//! believing nothing happened), or, in network-namespace mode, half of the time a cut of every
//! link to and from it (it keeps running and serving its clients, campaigning alone). Heal:
//! SIGCONT, or remove the rules. Faults repeat on the runner's schedule.
//!
//! The history records `{targets, how, nodes, leader_known, hold_ms}`. Whether installs really
//! happened is in the node logs: the runner counts picketd's "installing snapshot" lines per
//! node (`cluster.json`, `snapshot_installs`) and notes a run of this nemesis without any.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde_json::json;

use super::partition::links_between_groups;
use super::{
    between, names, FaultContext, FaultError, FaultEvent, Faults, Injected, NodeState, SyncNemesis,
};

/// `--snapshot-count` for every node: small, so a few seconds of absence outruns the kept log.
pub const SNAPSHOT_COUNT: u64 = 50;
/// How long the member stays away: past the election timeout and the lease TTL, and long
/// enough for a few snapshots at the workload's write rate.
pub const HOLD_MIN: Duration = Duration::from_secs(6);
pub const HOLD_MAX: Duration = Duration::from_secs(10);
/// How often the target is the leader (when it is known).
pub const LEADER_PERCENT: u32 = 40;

/// How the member is kept away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Pause,
    Cut,
}

#[derive(Debug, Default)]
pub struct SnapshotLagNemesis {
    /// The node kept away and how, until healed.
    active: Option<(usize, How)>,
}

impl SyncNemesis for SnapshotLagNemesis {
    fn name(&self) -> &'static str {
        "snapshot-lag"
    }

    fn node_args(&self) -> Vec<String> {
        vec!["--snapshot-count".to_string(), SNAPSHOT_COUNT.to_string()]
    }

    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError> {
        let n = env.node_count();
        let running: Vec<usize> =
            (0..n).filter(|&i| env.node_state(i) == NodeState::Running).collect();
        // Keeping the only running node away would stop the cluster, not lag one member.
        if running.len() < 2 {
            return Ok(None);
        }
        let leader = ctx.leader.filter(|l| running.contains(l));
        let (target, leader_known) = match leader {
            Some(l) if rng.random_range(0..100) < LEADER_PERCENT => (l, true),
            _ => match running.choose(rng) {
                Some(&i) => (i, false),
                None => return Ok(None),
            },
        };
        let how = if env.supports_network_faults() && rng.random_bool(0.5) {
            How::Cut
        } else {
            How::Pause
        };
        match how {
            How::Pause => {
                env.pause(target)?;
                self.active = Some((target, how));
            }
            How::Cut => {
                // Set before cutting, so a half-applied cut is still healed.
                self.active = Some((target, how));
                let rest: Vec<usize> = (0..n).filter(|&i| i != target).collect();
                env.cut(&links_between_groups(n, &[vec![target], rest]))?;
            }
        }
        let hold = between(rng, HOLD_MIN, HOLD_MAX);
        Ok(Some(Injected {
            event: FaultEvent {
                f: "snapshot-lag".to_string(),
                value: json!({
                    "targets": if leader_known { "leader" } else { "one" },
                    "how": match how { How::Pause => "pause", How::Cut => "cut" },
                    "leader_known": leader_known,
                    "is_leader": Some(target) == ctx.leader,
                    "nodes": names(env, &[target]),
                    "hold_ms": hold.as_millis() as u64,
                    "snapshot_count": SNAPSHOT_COUNT,
                }),
            },
            hold,
        }))
    }

    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError> {
        let Some((i, how)) = self.active.take() else { return Ok(Vec::new()) };
        match how {
            How::Pause => {
                // Another nemesis may have killed it meanwhile; only a paused node is resumed.
                if env.node_state(i) != NodeState::Paused {
                    return Ok(Vec::new());
                }
                env.resume(i)?;
                Ok(vec![FaultEvent {
                    f: "resume".to_string(),
                    value: json!({ "nodes": names(env, &[i]) }),
                }])
            }
            How::Cut => {
                env.heal_network()?;
                Ok(vec![FaultEvent {
                    f: "heal-network".to_string(),
                    value: json!({ "nodes": names(env, &[i]), "rules": "flushed" }),
                }])
            }
        }
    }
}
