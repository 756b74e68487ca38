//! Results of the commands this member tagged (forwarded to the leader, or proposed for its own
//! clients while it led), handed to their waiters when this member applies them (etcd's wait
//! registry).
//!
//! A client write that reaches a follower is proposed by the leader, and the follower answers
//! only once it has applied the entry itself (`raft::proposer`, "applied here"), so a read on
//! the member that acknowledged a write sees it. Without this registry the follower learned the
//! result from the leader's answer, which leaves the leader only after the leader applied the
//! entry, and then learned of its own apply from openraft's metrics, a few task hand-offs
//! later: on a lone write both came 0.2-0.3 ms after this member had applied the entry
//! (docs/benchmarks.md, "Issue 20, session 19"). Apply is deterministic, so the result this
//! member computes is the one the leader computes: the follower tags each command it forwards
//! ([`ForwardedResults::tag`]) and apply hands a tagged command's result straight to its waiter
//! ([`ForwardedResults::deliver`]), after the batch that applied it is committed.
//!
//! The leader's own clients are answered the same way (`raft::proposer`, "propose_here"): its
//! apply hands a tagged command's result to the waiting client before openraft's answer to the
//! entry has come back through the state machine's responder, the batcher and openraft's core
//! (docs/benchmarks.md, "Session 38"). A leader's tag reaches the followers' logs too, where it
//! matches no waiter, as a forwarding follower's tag does on the leader.
//!
//! A tag is `(origin, ticket)`. `origin` is drawn at random when the member starts, so a tag
//! written by another member, or by an earlier run of this one (replayed from the log after a
//! restart), matches no waiter here; `ticket` counts this run's tagged commands. The leader's
//! answer still comes and is still used when this member does not apply the entry itself (it
//! installs a snapshot that covers it), so a missed hand-over only costs the old wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{CommandResult, ForwardTag, RaftCommand};
use tokio::sync::oneshot;

/// The waiters of this member's forwarded commands, by ticket.
pub struct ForwardedResults {
    origin: u64,
    next_ticket: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<CommandResult>>>,
    /// Forwarded commands answered with the result this member's apply handed over, and with
    /// the leader's result (`picket_server_forwarded_answers_total`).
    forwarded: Answers,
    /// Commands proposed here while this member led, answered with the result its apply handed
    /// over, and with openraft's answer to the entry (`picket_server_local_answers_total`).
    local: Answers,
}

/// Callers answered with the result this member's apply handed over, and otherwise.
#[derive(Default)]
struct Answers {
    by_apply: AtomicU64,
    other: AtomicU64,
}

impl Answers {
    fn count(&self, by_apply: bool) {
        let counter = if by_apply { &self.by_apply } else { &self.other };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> (u64, u64) {
        (self.by_apply.load(Ordering::Relaxed), self.other.load(Ordering::Relaxed))
    }
}

impl Default for ForwardedResults {
    fn default() -> Self {
        Self::new()
    }
}

impl ForwardedResults {
    // Not apply's randomness (which clippy.toml forbids): drawn once when the member starts,
    // and apply only compares it, never writes it.
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        Self {
            origin: rand::random(),
            next_ticket: AtomicU64::new(0),
            waiting: Mutex::default(),
            forwarded: Answers::default(),
            local: Answers::default(),
        }
    }

    /// Counts one forwarded command answered: with the result this member's apply handed over
    /// (`by_apply`), or with the leader's.
    pub fn answered(&self, by_apply: bool) {
        self.forwarded.count(by_apply);
    }

    /// Forwarded commands answered so far: (by this member's apply, by the leader's answer).
    pub fn answers(&self) -> (u64, u64) {
        self.forwarded.get()
    }

    /// Counts one command proposed here while this member led, answered with the result its
    /// apply handed over (`by_apply`), or with openraft's answer to the entry.
    pub fn answered_local(&self, by_apply: bool) {
        self.local.count(by_apply);
    }

    /// Local commands answered so far: (by this member's apply, by openraft's answer).
    pub fn local_answers(&self) -> (u64, u64) {
        self.local.get()
    }

    /// Tags `cmd` with a new ticket and registers its waiter. The waiter stays registered until
    /// it is dropped.
    pub fn tag(self: &Arc<Self>, mut cmd: RaftCommand) -> (RaftCommand, Waiter) {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().insert(ticket, tx);
        cmd.forwarded = Some(ForwardTag { origin: self.origin, ticket });
        (cmd, Waiter { results: self.clone(), ticket, rx })
    }

    /// What of `cmd` (one log entry's command) was forwarded from this run of this member:
    /// checked before apply consumes the command. Takes no lock (it runs for every entry): a
    /// ticket of ours whose caller gave up is dropped by [`Self::deliver`].
    pub fn ours(&self, cmd: &RaftCommand) -> Ours {
        if let Some(Cmd::Batch(batch)) = &cmd.cmd {
            let slots: Vec<(usize, u64)> = batch
                .commands
                .iter()
                .enumerate()
                .filter_map(|(i, c)| self.ticket(c).map(|t| (i, t)))
                .collect();
            return if slots.is_empty() { Ours::None } else { Ours::Slots(slots) };
        }
        self.ticket(cmd).map_or(Ours::None, Ours::Whole)
    }

    /// Whether another member tagged `cmd` (or a command of its batch: it forwarded it, or
    /// proposed it while leading) and so waits for this member's commit index to reach it
    /// before it can apply and answer its client.
    pub fn forwarded_elsewhere(&self, cmd: &RaftCommand) -> bool {
        let elsewhere =
            |c: &RaftCommand| c.forwarded.as_ref().is_some_and(|t| t.origin != self.origin);
        match &cmd.cmd {
            Some(Cmd::Batch(batch)) => batch.commands.iter().any(elsewhere),
            _ => elsewhere(cmd),
        }
    }

    fn ticket(&self, cmd: &RaftCommand) -> Option<u64> {
        cmd.forwarded.as_ref().filter(|t| t.origin == self.origin).map(|t| t.ticket)
    }

    /// Hands each result to its waiter, if it still waits. Call only after the batch that
    /// produced the results is committed: the waiter answers a client at once, and that client's
    /// next read on this member must see the write.
    pub fn deliver(&self, results: Vec<(u64, CommandResult)>) {
        if results.is_empty() {
            return;
        }
        let mut waiting = self.waiting.lock();
        for (ticket, result) in results {
            if let Some(tx) = waiting.remove(&ticket) {
                // The waiter may have given up meanwhile; then nobody needs the result.
                let _ = tx.send(result);
            }
        }
    }
}

/// The part of one entry's command this member forwarded.
pub enum Ours {
    None,
    /// The entry's command itself.
    Whole(u64),
    /// Commands of the entry's batch: (slot in the batch, ticket).
    Slots(Vec<(usize, u64)>),
}

impl Ours {
    /// Adds the results owed to waiters, given the entry's result.
    pub fn collect(self, result: &CmdResult, out: &mut Vec<(u64, CommandResult)>) {
        match self {
            Ours::None => {}
            Ours::Whole(ticket) => {
                out.push((ticket, CommandResult { result: Some(result.clone()) }));
            }
            Ours::Slots(slots) => {
                // A batch's result is one result per slot, in order (`crate::apply`); anything
                // else was refused as a whole, and the waiters keep waiting for the leader's
                // answer, which carries the same refusal.
                let CmdResult::Batch(batch) = result else { return };
                for (slot, ticket) in slots {
                    if let Some(r) = batch.results.get(slot) {
                        out.push((ticket, r.clone()));
                    }
                }
            }
        }
    }
}

/// One forwarded command's waiter: resolves with the command's result once this member applied
/// it. Unregisters itself when dropped.
pub struct Waiter {
    results: Arc<ForwardedResults>,
    ticket: u64,
    rx: oneshot::Receiver<CommandResult>,
}

impl Waiter {
    /// The result, once this member applied the command. Never resolves if it is not applied
    /// here (the caller bounds the wait, and has the leader's answer to fall back on).
    pub async fn applied(&mut self) -> CommandResult {
        match (&mut self.rx).await {
            Ok(result) => result,
            // Unreachable while `self` is registered (only `deliver` takes the sender, and it
            // sends); wait for the caller's other branch or deadline rather than invent a result.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.results.waiting.lock().remove(&self.ticket);
    }
}

#[cfg(test)]
#[path = "forwarded_tests.rs"]
mod tests;
