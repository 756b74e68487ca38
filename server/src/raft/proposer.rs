//! Turns client requests into Raft proposals and linearizable read points on any member.
//!
//! On the leader a proposal goes straight to `client_write`. On a follower it is forwarded to
//! the leader over the peer service; reads ask the leader for a read index and wait until the
//! local state machine has applied it (etcd's ReadIndex on followers). Retries are limited to
//! cases where the outcome is known: a request the leader refused before appending it, or one
//! that never left this node. Anything else is reported as indeterminate, never retried.
//!
//! Proposals on the leader are group-committed ([`super::batcher`]): concurrent proposals, local
//! or forwarded from followers, share one Raft entry and so one log fsync.
//!
//! Read indexes are batched ([`super::read_index`]): concurrent reads and lease keep-alives on
//! the leader share one leadership confirmation, and concurrent reads on a follower share one
//! ReadIndex RPC to the leader.

use openraft::async_runtime::WatchReceiver;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use openraft::error::{ClientWriteError, LinearizableReadError, RaftError};
use parking_lot::Mutex;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::raft_service_client::RaftServiceClient;
use picket_proto::picket::raft::v1::CommandResult;
use thiserror::Error;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::batcher::{Applied, EntriesInFlight, EntrySink, Limits, ProposalBatcher};
use super::forward::{Forwarder, LeaderLink};
use super::leader_contact::LeaderContact;
use super::network::{peer_channel, peer_client};
use super::read_index::{ReadIndexBatcher, ReadIndexSource};
use super::relay::{LeaderRelay, RelaySlot};
use super::types::{Command, NodeId, Raft, TypeConfig};
use crate::storage::forwarded::ForwardedResults;
use crate::tls::PeerDialer;

/// Marker at the start of the status message a member returns when it refused a forwarded
/// request because it is not the leader. The request was not appended, so it is safe to retry.
pub(super) const NOT_LEADER: &str = "picket: not leader";

/// Pause between attempts while the cluster has no known leader. Short, because an election
/// takes a few hundred milliseconds; bounded overall by the request deadline.
const NO_LEADER_BACKOFF: Duration = Duration::from_millis(50);

/// Bound on one read-index round (a leadership confirmation on the leader, a ReadIndex RPC from
/// a follower). A round normally takes one loopback round trip; the bound only matters when the
/// leader stops answering (paused, partitioned), where every read on this member would otherwise
/// queue behind a round that never ends. Giving up is safe: a read index changes nothing, and
/// the callers of an abandoned round retry with a new round until their own deadline. Two
/// seconds is a fraction of the request timeout (7 s by default), so callers still get a retry.
const ROUND_TIMEOUT: Duration = Duration::from_secs(2);

/// Overrides the number of group-commit entries in flight ([`super::batcher::MAX_IN_FLIGHT`]).
/// For benchmarks comparing pipeline depths only; unset in every deployment.
const IN_FLIGHT_ENV: &str = "PICKET_BATCH_IN_FLIGHT";
/// Overrides [`super::batcher::LIGHT_COMMANDS`] (0 turns the extra entry off). For benchmarks
/// only, like [`IN_FLIGHT_ENV`].
const LIGHT_ENV: &str = "PICKET_BATCH_LIGHT";
/// Overrides [`super::forward::MAX_IN_FLIGHT`], the forwarded groups a follower keeps in flight
/// to the leader. For benchmarks only, like [`IN_FLIGHT_ENV`].
const FORWARD_IN_FLIGHT_ENV: &str = "PICKET_FORWARD_IN_FLIGHT";

#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum ProposeError {
    /// This member is not the leader; the hint names the leader if known. Not applied.
    #[error("{NOT_LEADER}")]
    NotLeader(Option<NodeId>),
    /// No leader could be found before the deadline. Not applied.
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The deadline passed with the outcome unknown: the request may or may not be applied.
    #[error("etcdserver: request timed out")]
    Timeout,
    /// The leader answered with an error (for example a forwarded request it could not finish).
    #[error("{0}")]
    Remote(Status),
    /// Raft stopped on this node (shutdown or a fatal storage error).
    #[error("etcdserver: server stopped")]
    Stopped,
}

impl ProposeError {
    pub fn into_status(self) -> Status {
        match self {
            ProposeError::Remote(s) => s,
            e => Status::new(Code::Unavailable, e.to_string()),
        }
    }
}

#[derive(Clone)]
pub struct Proposer {
    inner: Arc<Inner>,
}

struct Inner {
    raft: Raft,
    node_id: NodeId,
    request_timeout: Duration,
    /// How peers are dialed (plain or TLS, `crate::tls`); also used by `raft::membership`.
    dialer: PeerDialer,
    peers: Mutex<HashMap<String, RaftServiceClient<Channel>>>,
    /// The relay stream to the current leader (`super::relay`), used while another member leads.
    relays: Arc<RelaySlot>,
    /// Where this member's apply hands over the results of the commands it forwards.
    forwarded: Arc<ForwardedResults>,
    /// While set and in the future, this member acts as if it were not the leader: a leader
    /// transfer (`raft::transfer`) stops all leader traffic so the followers' leader leases run
    /// out and the chosen member can win an election.
    paused_until: Mutex<Option<Instant>>,
    /// Leadership confirmations on this member (used while it leads).
    local_reads: ReadIndexBatcher<LocalReads>,
    /// Leadership confirmations for lease keep-alives on this member, by the leader's
    /// quorum-acknowledged lease ([`Proposer::lease_read_index`]).
    lease_reads: ReadIndexBatcher<LocalReads>,
    /// ReadIndex RPCs to the leader (used while another member leads).
    leader_reads: ReadIndexBatcher<LeaderReads>,
    /// Group commit of this member's proposals (see [`super::batcher`]).
    writes: ProposalBatcher<LocalWrites>,
    /// When a leader was last heard from (`super::leader_contact`).
    contact: LeaderContact,
    /// Grouped forwarding of proposals to the leader while another member leads
    /// ([`super::forward`]).
    forwards: ProposalBatcher<Forwarder<Inner>>,
}

impl Proposer {
    /// `forwarded` is the state machine's registry (`storage::forwarded`): this member's own
    /// apply hands the results of the commands it forwards to their callers.
    pub fn new(
        raft: Raft,
        node_id: NodeId,
        request_timeout: Duration,
        dialer: PeerDialer,
        forwarded: Arc<ForwardedResults>,
        entries: EntriesInFlight,
    ) -> Self {
        // The batchers' sources need the proposer (pause flag, peer clients) and live inside it,
        // so they hold a weak reference: no cycle, and a source outliving the proposer (a round
        // still running at shutdown) just reports `Stopped`.
        // A follower without Pre-Vote campaigns 1.25-1.5 election timeouts after the last
        // heartbeat (`bootstrap::raft_config`): leader lease (election_timeout_max) plus a
        // randomized timeout below election_timeout_max. Past that, no leader is named.
        let contact =
            LeaderContact::new(Duration::from_millis(2 * raft.config().election_timeout_max));
        let lease_age = keep_alive_lease_age(raft.config());
        let inner = Arc::new_cyclic(|me: &Weak<Inner>| Inner {
            contact,
            raft,
            node_id,
            request_timeout,
            dialer,
            peers: Mutex::new(HashMap::new()),
            relays: Arc::default(),
            forwarded,
            paused_until: Mutex::new(None),
            local_reads: ReadIndexBatcher::new(LocalReads(me.clone(), Confirm::Quorum)),
            lease_reads: ReadIndexBatcher::new(LocalReads(me.clone(), Confirm::Lease(lease_age))),
            leader_reads: ReadIndexBatcher::new(LeaderReads(me.clone())),
            // Its entries in flight pace the append pipeline (`append_pipeline`).
            writes: ProposalBatcher::with_gauge(
                LocalWrites(me.clone()),
                batch_limits(request_timeout),
                entries,
            ),
            forwards: ProposalBatcher::new(
                Forwarder::new(me.clone()),
                forward_limits(request_timeout),
            ),
        });
        Self { inner }
    }

    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// The leader this member follows (or itself, when it leads), while it hears from it; see
    /// `super::leader_contact`. What `Status`, `hasleader` and the health checks report.
    pub fn leader(&self) -> Option<NodeId> {
        let current = self.inner.raft.metrics().borrow_watched().current_leader;
        self.inner.contact.leader(current, self.inner.node_id)
    }

    /// Records an append or snapshot chunk from `leader` that Raft accepted.
    pub(crate) fn heard_from(&self, leader: NodeId) {
        self.inner.contact.heard(leader);
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.node_id
    }

    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// How this member dials its peers (plain text or TLS).
    pub fn dialer(&self) -> &PeerDialer {
        &self.inner.dialer
    }

    /// Refuses local proposals and read indexes until `until` (or [`Proposer::resume`]), as a
    /// non-leader would: callers retry, and find the new leader once the transfer is done.
    pub fn pause_until(&self, until: Instant) {
        *self.inner.paused_until.lock() = Some(until);
    }

    /// Ends a pause started by [`Proposer::pause_until`].
    pub fn resume(&self) {
        *self.inner.paused_until.lock() = None;
    }

    fn paused(&self) -> bool {
        self.inner.paused()
    }

    /// Proposes on this member only; fails with `NotLeader` if it is not the leader. The
    /// command shares an entry with concurrent proposals (group commit) and gets its own result,
    /// with the index of that entry.
    pub async fn propose_local(&self, cmd: Command) -> Result<Applied, ProposeError> {
        self.refuse_local(&cmd)?;
        self.inner.writes.propose(cmd).await
    }

    /// Why [`Self::propose_local`] would refuse `cmd` without proposing it, if it would.
    fn refuse_local(&self, cmd: &Command) -> Result<(), ProposeError> {
        if self.paused() {
            // Nothing was appended, so the caller may retry (elsewhere) safely.
            return Err(ProposeError::NotLeader(None));
        }
        if let Some(other) = self.inner.other_leader() {
            // Never queue into the local batcher while this member is not the leader: its
            // entries could only be refused (or, after a step-down, left unanswered), and they
            // would hold the slot every later write needs. Nothing was appended: retry safely.
            return Err(ProposeError::NotLeader(other));
        }
        if matches!(cmd.get().cmd, Some(Cmd::Batch(_))) {
            // Batches are built by the batcher from single commands; one arriving from outside
            // (a forwarded request) would nest once batched, which apply refuses.
            return Err(ProposeError::Remote(Status::invalid_argument(
                "picket: a command batch cannot be proposed; propose its commands one by one",
            )));
        }
        Ok(())
    }

    /// A client's command proposed on this member, which leads: answered by this member's own
    /// apply (`storage::forwarded`, as a forwarded command is on the member that forwarded it)
    /// or by openraft's answer to the entry, whichever comes first. Apply hands the result over
    /// as soon as the entry's batch is committed; openraft's answer reaches the caller later,
    /// through the state machine's responder, the batcher's task and whatever openraft's core
    /// queued meanwhile on the same runtime (on a lone write ~40 us more, docs/benchmarks.md
    /// "Session 38"). Both carry the same result: apply is deterministic and runs once per
    /// entry. A refusal or a lost leadership still comes from openraft's side.
    async fn propose_here(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        self.refuse_local(&cmd)?;
        let registry = &self.inner.forwarded;
        let (tagged, mut here) = registry.tag(cmd.into_inner());
        let (result, by_apply) = tokio::select! {
            biased;
            result = here.applied() => (Ok(result), true),
            answer = self.inner.writes.propose(Command::new(tagged)) => {
                (answer.map(|a| a.result), false)
            }
        };
        if result.is_ok() {
            registry.answered_local(by_apply);
        }
        result
    }

    /// Proposes a command from any member and returns its deterministic result, within the
    /// request timeout.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        let deadline = Instant::now() + self.inner.request_timeout;
        match tokio::time::timeout_at(deadline, self.propose_until(cmd, deadline)).await {
            Ok(r) => r,
            Err(_) => Err(ProposeError::Timeout),
        }
    }

    async fn propose_until(
        &self,
        cmd: Command,
        deadline: Instant,
    ) -> Result<CommandResult, ProposeError> {
        loop {
            match self.propose_here(cmd.clone()).await {
                Err(ProposeError::NotLeader(Some(leader))) if leader != self.inner.node_id => {
                    match self.forward(cmd.clone()).await {
                        // Refused before appending, or never sent: safe to retry after a pause
                        // in which the cluster settles on a leader.
                        Err(ProposeError::NotLeader(_)) => {
                            tokio::time::sleep(NO_LEADER_BACKOFF).await;
                        }
                        other => return other,
                    }
                }
                Err(ProposeError::NotLeader(_)) => {
                    if Instant::now() + NO_LEADER_BACKOFF >= deadline {
                        return Err(ProposeError::NoLeader);
                    }
                    tokio::time::sleep(NO_LEADER_BACKOFF).await;
                }
                other => return other,
            }
        }
    }

    /// Forwards `cmd` to the leader (grouped with concurrent forwarded proposals into one call)
    /// and returns its result once this member has applied it too. Whichever comes first: this
    /// member's own apply hands the result over (`storage::forwarded`: apply is deterministic,
    /// so it is the leader's result), or the leader answers and the wait for the local apply
    /// follows. Unbounded here: [`Self::propose`] bounds it with the request timeout.
    async fn forward(&self, cmd: Command) -> Result<CommandResult, ProposeError> {
        let registry = &self.inner.forwarded;
        let (tagged, mut here) = registry.tag(cmd.into_inner());
        let answer = tokio::select! {
            result = here.applied() => {
                registry.answered(true);
                return Ok(result);
            }
            answer = self.inner.forwards.propose(Command::new(tagged)) => answer?,
        };
        let (result, by_apply) = tokio::select! {
            result = here.applied() => (Ok(result), true),
            // Also covers a snapshot install on this member that skips the entry's apply.
            result = self.applied_here(answer) => (result, false),
        };
        if result.is_ok() {
            registry.answered(by_apply);
        }
        result
    }

    /// Forwarded writes answered so far: (with the result this member's apply handed over,
    /// with the leader's result).
    pub fn forwarded_answers(&self) -> (u64, u64) {
        self.inner.forwarded.answers()
    }

    /// Writes proposed here while this member led, answered so far: (with the result this
    /// member's apply handed over, with openraft's answer to the entry).
    pub fn local_answers(&self) -> (u64, u64) {
        self.inner.forwarded.local_answers()
    }

    /// A forwarded command's result, once this member has applied the entry that carried it
    /// too (issue 21): etcd answers a write only after the member the client asked applied it,
    /// so a serializable read there right after the reply sees the write. The wait is bounded
    /// by the request timeout (the caller's deadline cuts it shorter); when it runs out, say
    /// "outcome unknown", as etcd does, rather than acknowledge a write this member's reads
    /// would not show. Safe: the write did commit, and no caller retries an unknown outcome on
    /// the strength of it having failed.
    async fn applied_here(&self, applied: Applied) -> Result<CommandResult, ProposeError> {
        if applied.log_index > 0 && !applied_at(&self.inner, applied.log_index) {
            wait_applied_at(&self.inner, applied.log_index).await?;
        }
        Ok(applied.result)
    }

    /// On the leader: confirms leadership with a quorum in a round that starts after this call
    /// (shared with concurrent callers), waits until the local state machine has applied
    /// everything committed before the call, and returns that index. Fails with `NotLeader` on
    /// any other member.
    pub async fn local_read_index(&self) -> Result<u64, ProposeError> {
        if self.paused() {
            return Err(ProposeError::NotLeader(None));
        }
        self.inner.local_reads.read_index().await
    }

    /// [`Self::local_read_index`] for a lease keep-alive: the same answer, but leadership is
    /// confirmed by a quorum's acknowledgement of any message this leader sent at most
    /// [`keep_alive_lease_age`] ago (a heartbeat or an append), and only when there is none
    /// does the round send a heartbeat. Under writes or between heartbeats it costs no
    /// messages. Why that is safe, and why only keep-alives use it, is
    /// [`keep_alive_lease_age`]'s doc.
    pub async fn lease_read_index(&self) -> Result<u64, ProposeError> {
        if self.paused() {
            return Err(ProposeError::NotLeader(None));
        }
        self.inner.lease_reads.read_index().await
    }

    /// Waits until a read served from the local state machine afterwards is linearizable.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let deadline = Instant::now() + self.inner.request_timeout;
        match tokio::time::timeout_at(deadline, self.read_barrier_until(deadline)).await {
            Ok(r) => r,
            Err(_) => Err(ProposeError::Timeout),
        }
    }

    async fn read_barrier_until(&self, deadline: Instant) -> Result<(), ProposeError> {
        let me = self.inner.node_id;
        loop {
            let leader = self.inner.raft.metrics().borrow_watched().current_leader;
            let result = match leader {
                Some(l) if l != me => self.inner.leader_reads.read_index().await,
                _ => match self.local_read_index().await {
                    // Leadership just moved and the metrics have not caught up: ask the leader
                    // the core named rather than waiting a backoff.
                    Err(ProposeError::NotLeader(Some(l))) if l != me => {
                        self.inner.leader_reads.read_index().await
                    }
                    r => r,
                },
            };
            match result {
                Ok(_) => return Ok(()),
                Err(ProposeError::Stopped) => return Err(ProposeError::Stopped),
                // Reads change nothing, so every other failure (no leader yet, a stale leader,
                // a failed or abandoned RPC) is safe to retry until the deadline.
                Err(e) => {
                    tracing::debug!(error = %e, "read index failed; retrying");
                    if Instant::now() + NO_LEADER_BACKOFF >= deadline {
                        return Err(ProposeError::NoLeader);
                    }
                    tokio::time::sleep(NO_LEADER_BACKOFF).await;
                }
            }
        }
    }

    /// How long the oldest group-commit entry on this member has waited for its outcome
    /// (`None`: none in flight); see [`ProposalBatcher::oldest_in_flight`].
    pub fn oldest_in_flight(&self) -> Option<Duration> {
        self.inner.writes.oldest_in_flight()
    }

    /// A follower's calls to the leader so far: (on the relay stream, as unary RPCs).
    pub fn relay_calls(&self) -> (u64, u64) {
        self.inner.relays.calls()
    }

    /// Read-index rounds started so far: on this member's own core (for reads and for
    /// keep-alives, [`Self::lease_read_index`]), and by asking the leader.
    pub fn read_index_rounds(&self) -> (u64, u64) {
        let local = self.inner.local_reads.rounds() + self.inner.lease_reads.rounds();
        (local, self.inner.leader_reads.rounds())
    }

    /// The current leader's relay (`super::relay`), if one is known and it is not this member.
    pub fn leader_relay(&self) -> Option<LeaderRelay> {
        self.inner.leader_relay()
    }
}

impl LeaderLink for Inner {
    fn leader(&self) -> Option<LeaderRelay> {
        self.leader_relay()
    }

    fn timeout(&self) -> Duration {
        self.request_timeout
    }
}

impl Inner {
    fn paused(&self) -> bool {
        self.paused_until.lock().is_some_and(|t| Instant::now() < t)
    }

    /// `Some(leader hint)` when this member does not lead according to its Raft metrics (the
    /// hint is another member, or `None` while no leader is known); `None` when it leads.
    fn other_leader(&self) -> Option<Option<NodeId>> {
        let leader = self.raft.metrics().borrow_watched().current_leader;
        (leader != Some(self.node_id)).then_some(leader)
    }

    /// The current leader's relay, when another member leads.
    fn leader_relay(&self) -> Option<LeaderRelay> {
        let leader = self.raft.metrics().borrow_watched().current_leader?;
        if leader == self.node_id {
            return None;
        }
        let (url, client) = self.peer_url_client(leader)?;
        Some(self.relays.get(&url, client, self.request_timeout))
    }

    /// The peer URL of `node_id` according to the current membership, with a cached client.
    fn peer_url_client(&self, node_id: NodeId) -> Option<(String, RaftServiceClient<Channel>)> {
        let url = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.membership_config.membership().get_node(&node_id)?.peer_urls.first()?.clone()
        };
        let mut peers = self.peers.lock();
        if let Some(c) = peers.get(&url) {
            return Some((url, c.clone()));
        }
        let client = peer_client(peer_channel(&url, &self.dialer).ok()?);
        peers.insert(url.clone(), client.clone());
        Some((url, client))
    }
}

/// The batcher's limits: the defaults, each entry bounded by the request timeout, with the
/// pipeline depth overridable for benchmarks.
fn batch_limits(request_timeout: Duration) -> Limits {
    let mut limits = Limits {
        entry_timeout: request_timeout,
        light_commands: super::batcher::LIGHT_COMMANDS,
        ..Limits::default()
    };
    if let Some(k) = env_count(IN_FLIGHT_ENV) {
        limits.max_in_flight = k;
    }
    if let Some(k) = env_count(LIGHT_ENV) {
        limits.light_commands = k;
    }
    limits
}

/// The forwarding batcher's limits: each group bounded by the request timeout, and
/// [`super::forward::MAX_IN_FLIGHT`] groups in flight, overridable for benchmarks (never 0,
/// which would send nothing).
fn forward_limits(request_timeout: Duration) -> Limits {
    let max_in_flight = env_count(FORWARD_IN_FLIGHT_ENV)
        .filter(|k| *k > 0)
        .unwrap_or(super::forward::MAX_IN_FLIGHT);
    Limits { max_in_flight, entry_timeout: request_timeout, ..Limits::default() }
}

/// A count from the environment variable `name`, if it is set to one. Each such variable
/// overrides a default for a benchmark, so a member that reads one says so.
fn env_count(name: &str) -> Option<usize> {
    let k = std::env::var(name).ok().and_then(|v| v.parse().ok())?;
    tracing::info!(value = k, "{name} overrides a default (for benchmarks only)");
    Some(k)
}

/// Proposes entries through this member's own Raft core (the group-commit batcher's sink).
struct LocalWrites(Weak<Inner>);

impl EntrySink for LocalWrites {
    fn write(&self, cmd: Command) -> BoxFuture<'static, Result<Applied, ProposeError>> {
        let inner = self.0.upgrade();
        async move {
            let inner = inner.ok_or(ProposeError::Stopped)?;
            if inner.paused() {
                // A leader transfer began while these commands were queued. Nothing was
                // appended, so every caller may retry (elsewhere) safely.
                return Err(ProposeError::NotLeader(None));
            }
            if let Some(other) = inner.other_leader() {
                // Leadership moved while these commands were queued: not proposed, so every
                // caller may retry (elsewhere) safely.
                return Err(ProposeError::NotLeader(other));
            }
            match inner.raft.client_write(cmd).await {
                Ok(resp) => Ok(Applied { result: resp.data.0, log_index: resp.log_id.index }),
                Err(e) => Err(write_error(e)),
            }
        }
        .boxed()
    }
}

/// What a failed `client_write` means for every caller of its entry.
fn write_error(e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> ProposeError {
    match e {
        // openraft 0.10 answers ForwardToLeader only for a write its core refused before
        // appending it ("rejected before its entry was appended", `ClientWriteError`;
        // `RaftCore::write_entries` checks leadership and the leader lease first): not this
        // member's leadership any more, a transfer under way, or its leader lease expired
        // (partitioned). Nothing was appended, so every caller may retry safely, which they do
        // until their deadline (on the new leader once one is known). Under 0.9 this error also
        // came for an entry a new leader had truncated, which could still commit (issue 19,
        // finding 5); 0.10 reports that case as LogEntryDiscarded, below.
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            tracing::debug!(leader = ?f.leader_id, reason = ?f.reason, "write refused before its append");
            ProposeError::NotLeader(f.leader_id)
        }
        // The entry was appended here and then dropped for another leader's log: another
        // member that holds it may still commit it, so its outcome is unknown, never a
        // retryable refusal.
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => {
            tracing::warn!(leader = ?f.leader_id, "entry discarded by a new leader; outcome unknown");
            ProposeError::Timeout
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ProposeError::Remote(Status::internal(e.to_string()))
        }
        // Picket proposes without preconditions; should one ever be refused, nothing was
        // appended.
        RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => {
            ProposeError::Remote(Status::internal(e.to_string()))
        }
        RaftError::Fatal(e) => {
            tracing::error!(error = %e, "raft stopped");
            ProposeError::Stopped
        }
    }
}

/// Read indexes from this member's own Raft core: one openraft `get_read_log_id` per round,
/// confirmed as [`Confirm`] says.
struct LocalReads(Weak<Inner>, Confirm);

/// How a round on the leader confirms that no other member leads.
#[derive(Clone, Copy)]
enum Confirm {
    /// ReadIndex: a heartbeat to every voter, sent after the round started, acknowledged by a
    /// quorum. Depends on no clock.
    Quorum,
    /// A quorum acknowledged a message this leader sent less than this long before the round
    /// asked; a heartbeat round as for `Quorum` when none did.
    Lease(Duration),
}

/// How recent a quorum's acknowledgement must be for [`Proposer::lease_read_index`]: half the
/// shortest election timeout.
///
/// A follower that acknowledges a leader's message refuses every vote and Pre-Vote for one
/// leader lease (`election_timeout_max`) after it received it (openraft's leader lease), and a
/// member that restarted refuses them for one leader lease after its start
/// (`super::vote_hold`), which covers a promise made before it crashed. A restarted member's
/// own campaign starts an election timeout (at least `election_timeout_min`) after its start.
/// So while a quorum acknowledged, at most `election_timeout_min / 2` ago, a message this
/// leader sent, no other member can have won an election: every quorum holds one of those
/// followers. The margin (half of the shortest timeout, a third of the lease) absorbs clock
/// rates differing by up to 2x between members.
///
/// Only keep-alives use it. A keep-alive's safety already rests on bounded clock-rate drift
/// (the lease itself is a duration measured by the leader's clock and the holder's), so this
/// adds no new assumption to it; reads keep ReadIndex, which rests on none.
pub fn keep_alive_lease_age(config: &openraft::Config) -> Duration {
    Duration::from_millis(config.election_timeout_min / 2)
}

/// Read indexes from the leader: one ReadIndex RPC per round. The leader serves it from its own
/// batcher, in a round that starts after the RPC arrives, so the chain "caller arrived, round
/// started, RPC sent, leader round started" keeps the batching invariant.
struct LeaderReads(Weak<Inner>);

/// Whether `inner`'s state machine has applied `index`, without waiting.
fn applied(inner: &Weak<Inner>, index: u64) -> bool {
    inner.upgrade().is_some_and(|inner| applied_at(&inner, index))
}

fn applied_at(inner: &Inner, index: u64) -> bool {
    let applied = inner.raft.metrics().borrow_watched().last_applied.map(|l| l.index);
    applied.is_some_and(|a| a >= index)
}

/// Waits, bounded by the request timeout, until `inner`'s state machine has applied `index`.
fn wait_applied(inner: &Weak<Inner>, index: u64) -> BoxFuture<'static, Result<(), ProposeError>> {
    let inner = inner.upgrade();
    async move {
        let inner = inner.ok_or(ProposeError::Stopped)?;
        wait_applied_at(&inner, index).await
    }
    .boxed()
}

async fn wait_applied_at(inner: &Inner, index: u64) -> Result<(), ProposeError> {
    inner
        .raft
        .wait(Some(inner.request_timeout))
        .applied_index_at_least(Some(index), "applied index")
        .await
        .map(|_| ())
        .map_err(|e| match e {
            openraft::metrics::WaitError::ShuttingDown => ProposeError::Stopped,
            _ => ProposeError::Timeout,
        })
}

impl ReadIndexSource for LocalReads {
    fn confirm(&self) -> BoxFuture<'static, Result<u64, ProposeError>> {
        let inner = self.0.upgrade();
        let confirm = self.1;
        async move {
            let inner = inner.ok_or(ProposeError::Stopped)?;
            if inner.paused() {
                return Err(ProposeError::NotLeader(None));
            }
            // ReadIndex for reads: leadership confirmed by a heartbeat round for every read
            // index. Keep-alives accept a recent enough quorum acknowledgement and send a
            // heartbeat only without one (`keep_alive_lease_age`).
            let option = match confirm {
                Confirm::Quorum => openraft::ReadPolicy::ReadIndex.into(),
                Confirm::Lease(age) => openraft::LinearizerOption::new(Some(age), true),
            };
            let confirmed = tokio::time::timeout(ROUND_TIMEOUT, inner.raft.get_read_log_id(option))
                .await
                .map_err(|_| ProposeError::Timeout)?;
            match confirmed {
                Ok((read_log_id, _applied)) => Ok(read_log_id.index()),
                Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
                    Err(ProposeError::NotLeader(f.leader_id))
                }
                Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {
                    Err(ProposeError::NoLeader)
                }
                Err(RaftError::Fatal(_)) => Err(ProposeError::Stopped),
            }
        }
        .boxed()
    }

    fn applied(&self, index: u64) -> bool {
        applied(&self.0, index)
    }

    fn wait_applied(&self, index: u64) -> BoxFuture<'static, Result<(), ProposeError>> {
        wait_applied(&self.0, index)
    }
}

impl ReadIndexSource for LeaderReads {
    fn confirm(&self) -> BoxFuture<'static, Result<u64, ProposeError>> {
        let inner = self.0.upgrade();
        async move {
            let inner = inner.ok_or(ProposeError::Stopped)?;
            let leader = inner.leader_relay().ok_or(ProposeError::NoLeader)?;
            match tokio::time::timeout(ROUND_TIMEOUT, leader.read_index()).await {
                Err(_) => Err(ProposeError::Timeout),
                Ok(Ok(resp)) => Ok(resp.read_index),
                Ok(Err(s)) if s.message().starts_with(NOT_LEADER) => {
                    Err(ProposeError::NotLeader(None))
                }
                Ok(Err(s)) => {
                    tracing::debug!(error = %s, "read index from the leader failed");
                    Err(ProposeError::Remote(s))
                }
            }
        }
        .boxed()
    }

    fn applied(&self, index: u64) -> bool {
        applied(&self.0, index)
    }

    fn wait_applied(&self, index: u64) -> BoxFuture<'static, Result<(), ProposeError>> {
        wait_applied(&self.0, index)
    }
}

/// True when tonic failed before the request left this node (no connection could be made).
pub(super) fn never_sent(s: &Status) -> bool {
    use std::error::Error as _;
    let mut source = s.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use openraft::errors::{ForwardReason, ForwardToLeader};

    use super::*;

    /// openraft 0.10 answers a write with `ForwardToLeader` only when its core refused it before
    /// appending (`ClientWriteError`'s contract; `RaftCore::write_entries` checks leadership and
    /// the leader lease first), and with `LogEntryDiscarded` when an appended entry was dropped
    /// for another leader's log. The first is safe to retry; the second may still commit.
    #[test]
    fn a_write_refused_before_its_append_is_retryable_and_a_discarded_one_is_unknown() {
        let refused =
            ForwardToLeader::<TypeConfig>::empty().with_reason(ForwardReason::LeaseExpired);
        let e = RaftError::APIError(ClientWriteError::ForwardToLeader(refused));
        assert!(matches!(write_error(e), ProposeError::NotLeader(None)));

        let mut elsewhere = ForwardToLeader::<TypeConfig>::empty();
        elsewhere.leader_id = Some(3);
        let e = RaftError::APIError(ClientWriteError::ForwardToLeader(elsewhere.clone()));
        assert!(matches!(write_error(e), ProposeError::NotLeader(Some(3))));

        let e = RaftError::APIError(ClientWriteError::LogEntryDiscarded(elsewhere));
        assert!(matches!(write_error(e), ProposeError::Timeout));
    }
}
