//! Fault injection.
//!
//! Two traits keep *what* to break apart from *how*:
//! - [`Faults`] is the environment's set of primitive faults on nodes: kill and restart a
//!   process, pause and resume it, and (in network-namespace mode only) cut and heal network
//!   links. [`crate::cluster::ProcessCluster`] implements all of them; in loopback mode the link
//!   faults are unsupported.
//! - [`Nemesis`] chooses a fault (which node, how long) and undoes it. [`kill::nemesis`] and
//!   [`pause::nemesis`] are one [`process::ProcessNemesis`] each (a process fault and its
//!   undo); [`partition::PartitionNemesis`] uses [`Faults::cut`].
//!   The cluster-level nemeses talk to the cluster through the etcd API as well, which is why
//!   [`Nemesis`]'s methods return futures: [`member::MemberNemesis`] (MemberRemove, stop, wipe,
//!   MemberAdd, start as a joining member), [`admin::AdminNemesis`] (compaction, snapshots,
//!   defragmentation, leader transfer) and [`clock::ClockNemesis`] (a node restarted under
//!   libfaketime).
//!
//! The runner drives the schedule: warm-up, then one fault at a time (inject, hold, heal) every
//! 5-10 s, then heal everything. It records every fault and heal in the history as `nemesis`
//! events.

pub mod admin;
pub mod clock;
pub mod kill;
pub mod member;
pub mod partition;
pub mod pause;
pub mod process;
pub mod snapshot_lag;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// What the harness believes about a node's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Running,
    /// SIGSTOPped.
    Paused,
    /// Never started, killed, or exited.
    Down,
    /// Removed from the cluster by the `member` nemesis: process stopped, data wiped, not a
    /// member until it is added again.
    Removed,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FaultError {
    /// The environment cannot inject this fault (e.g. a partition in loopback mode).
    #[error("{fault} is not supported in {mode} mode")]
    Unsupported { fault: &'static str, mode: &'static str },
    #[error("unknown nemesis {0:?} (known: kill, pause, partition, member, admin, clock, clock-rate, snapshot-lag, none)")]
    UnknownNemesis(String),
    /// A primitive fault failed (a signal could not be sent, a process could not be spawned).
    #[error("{0}")]
    Failed(String),
}

/// Primitive faults an environment can inject on its nodes.
pub trait Faults {
    /// `loopback`, or `netns` for the network-namespace environment.
    fn mode(&self) -> &'static str;
    fn node_count(&self) -> usize;
    fn node_name(&self, i: usize) -> String;
    fn node_state(&self, i: usize) -> NodeState;
    /// SIGKILL the node's process.
    fn kill(&mut self, i: usize) -> Result<(), FaultError>;
    /// Start a killed node again with the same flags and data.
    fn restart(&mut self, i: usize) -> Result<(), FaultError>;
    /// SIGSTOP.
    fn pause(&mut self, i: usize) -> Result<(), FaultError>;
    /// SIGCONT.
    fn resume(&mut self, i: usize) -> Result<(), FaultError>;
    /// Whether [`Faults::cut`] works here (network-namespace mode).
    fn supports_network_faults(&self) -> bool {
        false
    }
    /// Drops every packet sent from `from` to `to`, for each `(from, to)` in `links`, on top of
    /// the links already cut. A symmetric partition lists both directions.
    fn cut(&mut self, links: &[(usize, usize)]) -> Result<(), FaultError> {
        let _ = links;
        Err(FaultError::Unsupported { fault: "partition", mode: self.mode() })
    }
    /// Removes every network fault. Nothing to do where there are none.
    fn heal_network(&mut self) -> Result<(), FaultError> {
        Ok(())
    }
    /// The node's client URL (for the nemeses that use the etcd API).
    fn client_url(&self, i: usize) -> String;
    /// The node's peer URL, by which membership identifies it.
    fn peer_url(&self, i: usize) -> String;
    /// The node's member id, as last reported by the node or the cluster.
    fn member_id(&self, i: usize) -> Option<u64>;
    /// Takes node `i` out of the cluster's processes after it was removed from the membership:
    /// SIGKILL if running, wipe its data directory, state [`NodeState::Removed`].
    fn remove(&mut self, i: usize) -> Result<(), FaultError> {
        let _ = i;
        Err(FaultError::Unsupported { fault: "member", mode: self.mode() })
    }
    /// Starts removed node `i` as a new member with id `member_id` joining the running cluster
    /// (`--initial-cluster-state existing --initial-cluster <initial_cluster>`). Later restarts
    /// use the same flags (both servers then ignore them in favour of the data directory).
    fn rejoin(
        &mut self,
        i: usize,
        initial_cluster: &str,
        member_id: u64,
    ) -> Result<(), FaultError> {
        let _ = (i, initial_cluster, member_id);
        Err(FaultError::Unsupported { fault: "member", mode: self.mode() })
    }
    /// Environment variables added to node `i`'s process from its next start on (an empty list
    /// removes them). Does not restart it.
    fn set_env(&mut self, i: usize, env: Vec<(String, String)>) -> Result<(), FaultError> {
        let _ = (i, env);
        Err(FaultError::Unsupported { fault: "clock", mode: self.mode() })
    }
}

/// Facts the runner gathers (asynchronously) before a fault is chosen.
#[derive(Debug, Clone, Default)]
pub struct FaultContext {
    /// The current leader, if the cluster can say.
    pub leader: Option<usize>,
}

/// A history record of one fault or heal: the nemesis event's `f` and `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultEvent {
    pub f: String,
    pub value: Value,
}

/// A fault that was injected, and how long to keep it before healing.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    pub event: FaultEvent,
    pub hold: Duration,
}

/// What [`Nemesis`] methods return: a future polled by the runner's schedule (on the main
/// thread, so it need not be `Send`).
pub type FaultFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, FaultError>> + 'a>>;

/// Chooses, injects and heals one kind of fault.
pub trait Nemesis: Send {
    fn name(&self) -> &'static str;
    /// Chooses and injects one fault. `Ok(None)` means there was nothing to break (for example
    /// every node is already down).
    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>>;
    /// Undoes every fault this nemesis injected and has not healed yet. Idempotent.
    fn heal<'a>(&'a mut self, env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>>;
    /// Server flags this nemesis needs on every node (e.g. a low `--snapshot-count`).
    fn node_args(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A nemesis whose faults are applied and undone at once (signals, iptables rules, faketime
/// files), with nothing to wait on: it implements this, and [`Nemesis`] follows. Only nemeses
/// that talk to the cluster (`member`, `admin`) implement [`Nemesis`] themselves.
pub trait SyncNemesis: Send {
    fn name(&self) -> &'static str;
    /// See [`Nemesis::inject`].
    fn inject_now(
        &mut self,
        env: &mut dyn Faults,
        ctx: &FaultContext,
        rng: &mut StdRng,
    ) -> Result<Option<Injected>, FaultError>;
    /// See [`Nemesis::heal`].
    fn heal_now(&mut self, env: &mut dyn Faults) -> Result<Vec<FaultEvent>, FaultError>;
    /// See [`Nemesis::node_args`].
    fn node_args(&self) -> Vec<String> {
        Vec::new()
    }
}

impl<T: SyncNemesis> Nemesis for T {
    fn name(&self) -> &'static str {
        SyncNemesis::name(self)
    }

    fn inject<'a>(
        &'a mut self,
        env: &'a mut dyn Faults,
        ctx: &'a FaultContext,
        rng: &'a mut StdRng,
    ) -> FaultFuture<'a, Option<Injected>> {
        Box::pin(std::future::ready(self.inject_now(env, ctx, rng)))
    }

    fn heal<'a>(&'a mut self, env: &'a mut dyn Faults) -> FaultFuture<'a, Vec<FaultEvent>> {
        Box::pin(std::future::ready(self.heal_now(env)))
    }

    fn node_args(&self) -> Vec<String> {
        SyncNemesis::node_args(self)
    }
}

/// Builds the nemeses named on the command line (`kill`, `pause`, `partition`, `member`,
/// `admin`, `clock`, `clock-rate`, `snapshot-lag`; `none` for no faults). `workload` decides whether `admin` may compact:
/// the lock and lease checkers need the key-event log from revision 1.
pub fn build(names: &[String], workload: &str) -> Result<Vec<Box<dyn Nemesis>>, FaultError> {
    let mut out: Vec<Box<dyn Nemesis>> = Vec::new();
    for n in names {
        match n.as_str() {
            "kill" => out.push(Box::new(kill::nemesis())),
            "pause" => out.push(Box::new(pause::nemesis())),
            "partition" => out.push(Box::new(partition::PartitionNemesis::default())),
            "member" => out.push(Box::new(member::MemberNemesis::default())),
            "admin" => {
                out.push(Box::new(admin::AdminNemesis::new(admin::compaction_allowed(workload))))
            }
            "clock" => out.push(Box::new(clock::ClockNemesis::default())),
            "clock-rate" => out.push(Box::new(clock::ClockNemesis::rate())),
            "snapshot-lag" => out.push(Box::new(snapshot_lag::SnapshotLagNemesis::default())),
            "none" => {}
            other => return Err(FaultError::UnknownNemesis(other.to_string())),
        }
    }
    Ok(out)
}

/// The server flags every nemesis of a run needs, as `--flag value` pairs. Two nemeses may ask
/// for the same flag (`admin` and `snapshot-lag` both set `--snapshot-count`, which a server
/// accepts once): the smaller number wins, since each asks for "at most this many", else the
/// first value.
pub fn merge_node_args(nemeses: &[Box<dyn Nemesis>]) -> Vec<String> {
    let mut flags: Vec<(String, String)> = Vec::new();
    for n in nemeses {
        let args = n.node_args();
        for pair in args.chunks(2) {
            let [flag, value] = pair else { continue };
            match flags.iter_mut().find(|(f, _)| f == flag) {
                Some((_, old)) => {
                    if let (Ok(a), Ok(b)) = (old.parse::<u64>(), value.parse::<u64>()) {
                        *old = a.min(b).to_string();
                    }
                }
                None => flags.push((flag.clone(), value.clone())),
            }
        }
    }
    flags.into_iter().flat_map(|(f, v)| [f, v]).collect()
}

/// Which nodes a process fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Targets {
    /// The leader (a random node if the leader is unknown).
    Leader,
    /// One random node.
    One,
    /// A random minority (at least one node).
    Minority,
    /// Every node.
    All,
}

impl Targets {
    pub fn as_str(self) -> &'static str {
        match self {
            Targets::Leader => "leader",
            Targets::One => "one",
            Targets::Minority => "minority",
            Targets::All => "all",
        }
    }

    /// Picks nodes among `candidates` (the nodes the fault can apply to). Returns the nodes and
    /// whether the leader was actually known (for `Leader`).
    pub fn pick(
        self,
        candidates: &[usize],
        n: usize,
        leader: Option<usize>,
        rng: &mut StdRng,
    ) -> (Vec<usize>, bool) {
        if candidates.is_empty() {
            return (Vec::new(), false);
        }
        let mut c = candidates.to_vec();
        c.shuffle(rng);
        match self {
            Targets::Leader => match leader.filter(|l| candidates.contains(l)) {
                Some(l) => (vec![l], true),
                None => (vec![c[0]], false),
            },
            Targets::One => (vec![c[0]], false),
            Targets::Minority => {
                let k = ((n - 1) / 2).max(1).min(c.len());
                let k = rng.random_range(1..=k);
                (c[..k].to_vec(), false)
            }
            Targets::All => (c, false),
        }
    }
}

/// Node names of `nodes`, for history records.
pub fn names(env: &dyn Faults, nodes: &[usize]) -> Vec<String> {
    nodes.iter().map(|&i| env.node_name(i)).collect()
}

/// A duration drawn uniformly from `[lo, hi]`.
pub fn between(rng: &mut StdRng, lo: Duration, hi: Duration) -> Duration {
    if hi <= lo {
        return lo;
    }
    let ms = rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64);
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_node_flags_are_given_once_with_the_smaller_value() {
        let n = build(&["admin".into(), "snapshot-lag".into(), "kill".into()], "register").unwrap();
        let args = merge_node_args(&n);
        assert_eq!(args, ["--snapshot-count", &snapshot_lag::SNAPSHOT_COUNT.to_string()]);
        const { assert!(snapshot_lag::SNAPSHOT_COUNT < admin::SNAPSHOT_COUNT) };
        assert!(merge_node_args(&build(&["kill".into()], "register").unwrap()).is_empty());
    }
}
