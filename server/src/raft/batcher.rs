//! Group commit: concurrent proposals on the leader share one Raft entry, so they share one log
//! append, one fsync and one replication round.
//!
//! openraft 0.9's core appends and flushes client writes one at a time (`RaftCore` awaits the
//! log flush of each `client_write` before it takes the next), so without grouping the leader
//! does one fdatasync per put and throughput is bounded by fsync latency (docs/benchmarks.md).
//! A [`ProposalBatcher`] queues proposals and keeps at most `max_in_flight` entries in flight
//! (one more while those carry no more than `light_commands`, a lone client's calls); while
//! they are in flight new proposals queue, and the next entry takes everything queued (up
//! to `max_commands` commands and `max_bytes` encoded bytes; a single larger command goes
//! alone). A batch of several commands is one `RaftCommand.batch` entry, which apply runs
//! command by command as if each were its own entry (`storage::state_machine::apply_batch`); a
//! batch of one is proposed as the plain command, so an idle cluster writes exactly the log it
//! wrote before batching existed.
//!
//! # Outcomes
//!
//! Every caller gets the result of its own command. A failure of the entry as a whole (not the
//! leader, Raft stopped) reaches every caller of that entry unchanged, so the proposer's rules
//! hold per caller exactly as they did for one command per entry: `NotLeader` means "never
//! appended, safe to retry", and anything whose outcome is unknown is never retried.
//!
//! Entries are proposed from spawned tasks, not from any caller: a caller that gives up (its
//! deadline passed, its client went away) must not cancel an entry that carries other callers'
//! commands. A caller that gave up before its command was taken from the queue is dropped from
//! the queue instead: it already reported an indeterminate outcome (or nothing at all), and not
//! proposing is one of the outcomes it allowed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use parking_lot::Mutex;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{BatchResult, CommandBatch, CommandResult, RaftCommand};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::Status;

use super::proposer::ProposeError;
use super::types::Command;

/// Most commands in one entry. Bounds the work of one apply step (which holds the state
/// machine's write lock) and the size of one AppendEntries; under 64 concurrent writers a batch
/// rarely holds more than a few dozen.
pub const MAX_BATCH_COMMANDS: usize = 256;

/// Most encoded bytes of commands in one entry (a command larger than this goes alone). Keeps an
/// entry, and so an AppendEntries RPC and one RocksDB write, within a few MiB.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Entries in flight at once: the depth of the group-commit pipeline. One, measured against 2
/// and 4 under openraft 0.9 (docs/benchmarks.md, "Pipeline depth K") and again under 0.10,
/// whose flush off the core task could have let entries overlap (same file, "Issue 20, session
/// 14"): no row gained, put x64 lost up to 18 % at 4, and CPU per operation rose with depth on
/// every row. The members are CPU-bound when many writes are queued, so a second entry in flight
/// only splits the commands the next, larger batch would have carried into more entries, each
/// paying the per-entry costs.
pub const MAX_IN_FLIGHT: usize = 1;

/// Commands in flight at or below which one more entry may start beyond `max_in_flight`, on the
/// leader's own writes (`proposer::batch_limits`). A lone client that sends two independent
/// calls together (a queue worker's enqueue and its ack-and-claim, `picket-bench`'s
/// `queue-overlap`) otherwise waits a whole commit for the second. A second entry always
/// allowed bought that client +23 % but cost 16 workers 12 % (more, smaller entries); with this
/// rule, alternating A/B over 8 rounds: 1 worker +27 %, 16 workers +4 %, put x64 even
/// (docs/benchmarks.md, "Issue 20, session 24"). Under load an entry carries many commands, so
/// the extra entry is not taken and batches stay whole.
pub const LIGHT_COMMANDS: usize = 1;

/// Bound on one entry in flight, from its start to its callers' answers: the request timeout at
/// the default timings (`Config::request_timeout`, 5 s + 2 x the 1 s election timeout); the
/// proposer passes the configured one, so this default only serves tests and tools. Without a bound an
/// entry whose writer openraft never answers (0.9 purges instead of truncating an entry that a
/// follower's snapshot install covers) holds its slot forever and every later write on the
/// member queues behind it (issue 19). Safe: every caller in the entry has a deadline no later
/// than this (they joined before it started), and callers of an entry that runs out are told
/// "outcome unknown" (`ProposeError::Timeout`), never "failed", so none retries a command that
/// may yet apply.
pub const DEFAULT_ENTRY_TIMEOUT: Duration = Duration::from_secs(7);

/// A command's applied result and the index of the Raft entry that carried it (shared by every
/// command of a batch). A member that did not apply the entry itself (a follower that forwarded
/// the command) waits until it has before answering, so it serves its own acknowledged writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub result: CommandResult,
    /// 0 when unknown (a leader from before `ForwardOutcome.log_index`): nothing to wait for.
    pub log_index: u64,
}

/// Where a batcher's entries go: on the leader, openraft's `client_write`.
pub trait EntrySink: Send + Sync + 'static {
    /// Proposes one entry and resolves with its applied result.
    fn write(&self, cmd: Command) -> BoxFuture<'static, Result<Applied, ProposeError>>;
}

/// Where a batcher's groups of commands go, with one outcome per command, in order. Every
/// [`EntrySink`] is one (a group becomes one Raft entry); a follower's forwarding to the leader
/// (`super::forward`) is another (a group becomes one ForwardBatch RPC).
pub trait BatchSink: Send + Sync + 'static {
    /// Sends `cmds` and resolves with exactly one outcome per command, in the same order.
    fn send(
        &self,
        cmds: Vec<RaftCommand>,
    ) -> BoxFuture<'static, Vec<Result<Applied, ProposeError>>>;
}

impl<S: EntrySink> BatchSink for S {
    fn send(
        &self,
        mut cmds: Vec<RaftCommand>,
    ) -> BoxFuture<'static, Vec<Result<Applied, ProposeError>>> {
        let n = cmds.len();
        if n == 1 {
            // A batch of one is the plain command, so an idle cluster writes the log it wrote
            // before batching existed.
            let write = self.write(Command::new(cmds.remove(0)));
            return async move { vec![write.await] }.boxed();
        }
        let entry = Command::new(RaftCommand {
            cmd: Some(Cmd::Batch(CommandBatch { commands: cmds })),
            forwarded: None,
        });
        tracing::trace!(commands = n, "proposing batch");
        let write = self.write(entry);
        async move {
            match write.await {
                Ok(Applied {
                    result:
                        CommandResult { result: Some(CmdResult::Batch(BatchResult { results })) },
                    log_index,
                }) if results.len() == n => {
                    results.into_iter().map(|result| Ok(Applied { result, log_index })).collect()
                }
                Ok(Applied { result: other, .. }) => {
                    // Apply answers a batch with one result per command; anything else is a
                    // bug. The commands were applied, so the callers must not retry: report a
                    // non-retryable error rather than a retryable one.
                    tracing::error!(commands = n, result = ?other.result, "malformed batch result");
                    let status = Status::internal(format!(
                        "picket: a batch of {n} commands was applied but its result is malformed"
                    ));
                    vec![Err(ProposeError::Remote(status)); n]
                }
                Err(e) => vec![Err(e); n],
            }
        }
        .boxed()
    }
}

/// The batcher's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_commands: usize,
    pub max_bytes: usize,
    pub max_in_flight: usize,
    /// One entry beyond `max_in_flight` may start while the entries in flight carry at most
    /// this many commands in all; 0: never ([`LIGHT_COMMANDS`]).
    pub light_commands: usize,
    /// Bound on one entry in flight ([`DEFAULT_ENTRY_TIMEOUT`]).
    pub entry_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_commands: MAX_BATCH_COMMANDS,
            max_bytes: MAX_BATCH_BYTES,
            max_in_flight: MAX_IN_FLIGHT,
            light_commands: 0,
            entry_timeout: DEFAULT_ENTRY_TIMEOUT,
        }
    }
}

type Reply = oneshot::Sender<Result<Applied, ProposeError>>;

struct Pending {
    cmd: RaftCommand,
    bytes: usize,
    reply: Reply,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Pending>,
    /// Commands carried by the entries in flight.
    in_flight_commands: usize,
    /// When each entry now in flight started, oldest first (for the stall metric); its length
    /// is the number in flight, which `Shared::gauge` mirrors for readers without the lock.
    started: VecDeque<Instant>,
    /// Entries proposed so far, for tests and metrics.
    entries: u64,
}

struct Shared<S> {
    sink: S,
    limits: Limits,
    state: Mutex<State>,
    gauge: EntriesInFlight,
}

/// How many entries a batcher has in flight, readable without its lock; cheap to clone. The
/// leader's write batcher shares it with its replication sessions (`append_pipeline`): a second
/// entry in flight is one the light rule ([`LIGHT_COMMANDS`]) started so that a lone client's
/// next call need not wait a whole commit, and the pipeline sends it at once rather than hold
/// it behind the first one's answer.
#[derive(Clone, Debug, Default)]
pub struct EntriesInFlight(Arc<AtomicUsize>);

impl EntriesInFlight {
    pub fn get(&self) -> usize {
        // Relaxed: a hint for when to send, never for what; a stale value only sends a request
        // one answer earlier or later.
        self.0.load(Ordering::Relaxed)
    }
}

/// Groups concurrent proposals into entries; cheap to clone (one shared queue).
pub struct ProposalBatcher<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for ProposalBatcher<S> {
    fn clone(&self) -> Self {
        Self { shared: self.shared.clone() }
    }
}

impl<S: BatchSink> ProposalBatcher<S> {
    pub fn new(sink: S, limits: Limits) -> Self {
        Self::with_gauge(sink, limits, EntriesInFlight::default())
    }

    /// A batcher that counts its entries in flight in `gauge` (see [`EntriesInFlight`]).
    pub fn with_gauge(sink: S, limits: Limits, gauge: EntriesInFlight) -> Self {
        // Zero would never propose anything; treat it as one.
        let limits = Limits {
            max_commands: limits.max_commands.max(1),
            max_bytes: limits.max_bytes,
            max_in_flight: limits.max_in_flight.max(1),
            light_commands: limits.light_commands,
            entry_timeout: limits.entry_timeout,
        };
        let state = Mutex::new(State::default());
        Self { shared: Arc::new(Shared { sink, limits, state, gauge }) }
    }

    /// Queues `cmd` for the next entry and resolves with its own result.
    pub async fn propose(&self, cmd: Command) -> Result<Applied, ProposeError> {
        let (tx, rx) = oneshot::channel();
        let bytes = cmd.encoded_len();
        let cmd = cmd.into_inner();
        self.shared.state.lock().queue.push_back(Pending { cmd, bytes, reply: tx });
        pump(&self.shared);
        // Every queued sender is answered, or dropped because its entry's task was aborted by a
        // runtime shutting down: then Raft is stopping too.
        rx.await.unwrap_or(Err(ProposeError::Stopped))
    }

    /// Entries proposed so far.
    pub fn entries(&self) -> u64 {
        self.shared.state.lock().entries
    }

    /// How long the oldest entry now in flight has been waiting for its outcome; `None` when
    /// nothing is in flight. Bounded by the entry timeout; a value near it means writes on this
    /// member are stalling (exported as `picket_server_proposal_oldest_in_flight_seconds`).
    pub fn oldest_in_flight(&self) -> Option<Duration> {
        self.shared.state.lock().started.front().map(Instant::elapsed)
    }
}

/// Whether another entry may start: fewer than `max_in_flight` are in flight, or exactly that
/// many carrying at most `light_commands` commands in all.
fn room(s: &State, limits: &Limits) -> bool {
    let in_flight = s.started.len();
    in_flight < limits.max_in_flight
        || (in_flight == limits.max_in_flight
            && limits.light_commands > 0
            && s.in_flight_commands <= limits.light_commands)
}

/// Starts entries while there is [`room`] and commands are queued.
fn pump<S: BatchSink>(shared: &Arc<Shared<S>>) {
    let mut ready = Vec::new();
    {
        let mut s = shared.state.lock();
        while room(&s, &shared.limits) {
            let batch = take_batch(&mut s.queue, &shared.limits);
            if batch.is_empty() {
                break;
            }
            shared.gauge.0.fetch_add(1, Ordering::Relaxed);
            s.in_flight_commands += batch.len();
            s.entries += 1;
            let now = Instant::now();
            s.started.push_back(now);
            ready.push((batch, now));
        }
    }
    for (batch, started) in ready {
        let shared = shared.clone();
        tokio::spawn(async move {
            let in_flight = InFlight(shared.clone(), started, batch.len());
            run(&shared.sink, batch, shared.limits.entry_timeout).await;
            drop(in_flight);
            pump(&shared);
        });
    }
}

/// Releases an in-flight slot, also when the entry's task is aborted.
struct InFlight<S>(Arc<Shared<S>>, Instant, usize);

impl<S> Drop for InFlight<S> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        self.0.gauge.0.fetch_sub(1, Ordering::Relaxed);
        s.in_flight_commands -= self.2;
        // `pump` pushed this entry's start time before it spawned the task that made this
        // guard, and each guard removes one copy of its own, so it is there (two entries
        // started in the same instant remove one copy each).
        let i = s.started.iter().position(|t| *t == self.1);
        debug_assert!(i.is_some(), "an entry in flight without its start time");
        if let Some(i) = i {
            s.started.remove(i);
        }
    }
}

/// Takes the next entry's commands from the front of `queue`, in order: at least one (however
/// large), then more while both bounds hold. Skips callers that already gave up.
fn take_batch(queue: &mut VecDeque<Pending>, limits: &Limits) -> Vec<Pending> {
    let mut batch: Vec<Pending> = Vec::new();
    let mut bytes = 0usize;
    while let Some(next) = queue.front() {
        if next.reply.is_closed() {
            queue.pop_front();
            continue;
        }
        let fits = batch.is_empty()
            || (batch.len() < limits.max_commands && bytes + next.bytes <= limits.max_bytes);
        if !fits {
            break;
        }
        bytes += next.bytes;
        if let Some(p) = queue.pop_front() {
            batch.push(p);
        }
    }
    batch
}

/// Sends `batch` through the sink and answers each caller with its own outcome, within `bound`.
async fn run<S: BatchSink>(sink: &S, batch: Vec<Pending>, bound: Duration) {
    let n = batch.len();
    let mut replies = Vec::with_capacity(n);
    let mut commands = Vec::with_capacity(n);
    for p in batch {
        replies.push(p.reply);
        commands.push(p.cmd);
    }
    let Ok(outcomes) = tokio::time::timeout(bound, sink.send(commands)).await else {
        // The entry may still commit (or may have been dropped by openraft without an answer):
        // its outcome is unknown, so every caller hears exactly that, and the slot is freed
        // for the writes queued behind it.
        tracing::warn!(commands = n, ?bound, "entry unanswered within its bound; outcome unknown");
        for reply in replies {
            let _ = reply.send(Err(ProposeError::Timeout));
        }
        return;
    };
    if outcomes.len() != n {
        // A sink answers every command; anything else is a bug. Whether the commands were
        // applied is unknown, so report the indeterminate outcome, never a retryable one.
        tracing::error!(commands = n, outcomes = outcomes.len(), "batch sink miscounted");
        for reply in replies {
            let _ = reply.send(Err(ProposeError::Timeout));
        }
        return;
    }
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        // A caller that gave up dropped its receiver; nothing to do for it.
        let _ = reply.send(outcome);
    }
}

#[cfg(test)]
#[path = "batcher_tests.rs"]
mod tests;
