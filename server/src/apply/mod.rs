//! The apply rules: what one committed command does to the replicated state, decided from
//! that state and the command alone, so every member reaches the same result.
//!
//! The order follows etcd's appliers (`quota -> auth -> backend`): the storage quota refuses
//! commands that grow the store while NOSPACE is active; an `AuthChecked` command is refused if
//! the auth store changed since it was judged; a `FencedTxn` applies only while its token is
//! the lock's current holder; then the command goes to [`crate::mvcc`], [`crate::lease`],
//! [`crate::auth`], [`crate::quota`], [`crate::subscription`], [`crate::concurrency`] or
//! [`crate::queue`].
//! Leader-decided commands (`LeaseExpire`) are checked against the term of the entry that
//! carries them.
//!
//! Nothing here knows openraft: `crate::storage::state_machine` decodes log entries, calls
//! [`command`] for each inside one [`ApplyBatch`], and commits. The rules run on any
//! [`Engine`], so `tests.rs` drives them on the in-memory engine.

use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{
    AuthCommand, BatchResult, CommandBatch, CommandResult, Empty,
};
use prost::Message;

use crate::auth::replicated::Checked;
use crate::auth::AuthError;
use crate::lease::LeaseTable;
use crate::mvcc::{ApplyBatch, MvccError};
use crate::storage::engine::{Cf, Engine};

pub mod refusal;
pub use refusal::Refusal;

/// A failure that is not a deterministic outcome of the command (I/O failure, corruption): the
/// member must stop rather than answer, or its state would diverge from the others'.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Fatal(String);

impl Fatal {
    fn new(e: impl std::fmt::Display) -> Self {
        Self(e.to_string())
    }
}

/// Converts an MVCC error into a command result, or into a storage error that stops the node
/// when it is not a deterministic outcome of the command (I/O failure, corruption).
fn outcome<T>(
    res: Result<T, MvccError>,
    wrap: impl FnOnce(T) -> CmdResult,
) -> Result<CmdResult, Fatal> {
    match res {
        Ok(v) => Ok(wrap(v)),
        Err(e) if e.is_fatal() => Err(Fatal::new(e)),
        Err(e) => Ok(Refusal::Mvcc(e).into_result()),
    }
}

/// Applies the command of one log entry (or of one slot of a batch): `None` is a command that
/// decoded empty (a field of a newer build, or a corrupt one), refused the same on every member.
pub fn maybe_command<E: Engine>(
    batch: &mut ApplyBatch<'_, E>,
    leases: &mut LeaseTable,
    cmd: Option<&Cmd>,
    entry_term: u64,
) -> Result<CmdResult, Fatal> {
    match cmd {
        Some(c) => command(batch, leases, c, entry_term),
        None => Ok(Refusal::Malformed("empty raft command").into_result()),
    }
}

/// Applies one committed command of an entry of term `entry_term` inside `batch`: the rules in
/// the order the module docs give. `Err` only for a non-deterministic failure (see [`Fatal`]).
pub fn command<E: Engine>(
    batch: &mut ApplyBatch<'_, E>,
    leases: &mut LeaseTable,
    cmd: &Cmd,
    entry_term: u64,
) -> Result<CmdResult, Fatal> {
    // Storage quota (`crate::quota`): while a NOSPACE alarm is active, commands that grow the
    // store get etcd's "database space exceeded", decided from replicated state only.
    if let Err(crate::quota::NoSpace) = crate::quota::gate(batch, cmd).map_err(Fatal::new)? {
        return Ok(Refusal::NoSpace.into_result());
    }
    match cmd {
        Cmd::LeaseExpire(e) if e.term != entry_term => {
            // Decided by a leader of an earlier term (see `LeaseExpire` in the proto): the
            // current leader renewed every lease when it took over, so this expiry is stale.
            Ok(Refusal::StaleLeaseExpiry { decided: e.term, applied: entry_term }.into_result())
        }
        Cmd::LeaseExpire(e) => command(
            batch,
            leases,
            &Cmd::LeaseRevoke(picket_proto::etcdserverpb::LeaseRevokeRequest { id: e.id }),
            entry_term,
        ),
        // A put under the subscription group prefix must store a well-formed record
        // (`crate::subscription::check_put`).
        Cmd::Put(req) => match crate::subscription::check_put(req) {
            Ok(()) => outcome(batch.put(req, leases), CmdResult::Put),
            Err(e) => Ok(Refusal::Group(e).into_result()),
        },
        Cmd::DeleteRange(req) => outcome(batch.delete_range(req), CmdResult::DeleteRange),
        Cmd::Txn(req) => match crate::subscription::check_txn(req) {
            Ok(()) => outcome(batch.txn(req, leases), CmdResult::Txn),
            Err(e) => Ok(Refusal::Group(e).into_result()),
        },
        // Subscription groups may clamp a compaction (see `crate::subscription::guard`).
        Cmd::Compaction(req) => {
            outcome(crate::subscription::guard::compact(batch, req), CmdResult::Compaction)
        }
        Cmd::LeaseGrant(req) => match leases.grant(req.id, req.ttl) {
            Ok(record) => {
                batch.put_raw(Cf::Lease, &record.id.to_be_bytes(), &record.encode_to_vec());
                Ok(CmdResult::LeaseGrant(picket_proto::etcdserverpb::LeaseGrantResponse {
                    header: None,
                    id: record.id,
                    ttl: record.ttl,
                    error: String::new(),
                }))
            }
            Err(e) => Ok(Refusal::Lease(e).into_result()),
        },
        Cmd::LeaseRevoke(req) => match leases.revoke(req.id) {
            Ok(_) => {
                batch.delete_raw(Cf::Lease, &req.id.to_be_bytes());
                outcome(batch.revoke_lease_keys(req.id), |_| {
                    CmdResult::LeaseRevoke(picket_proto::etcdserverpb::LeaseRevokeResponse {
                        header: None,
                    })
                })
            }
            Err(e) => Ok(Refusal::Lease(e).into_result()),
        },
        Cmd::LeaseCheckpoint(_) => Ok(CmdResult::Empty(Empty {})),
        // The leader's physical-compaction driver (`crate::api::compact_steps`).
        Cmd::CompactStep(_) => outcome(batch.run_compact_step(), |_| CmdResult::Empty(Empty {})),
        // Authentication and RBAC (`crate::auth`): store mutations, and commands whose
        // permissions were checked at an auth revision that apply re-validates.
        Cmd::Auth(AuthCommand { op: None }) => {
            Ok(Refusal::Malformed("empty auth command").into_result())
        }
        Cmd::Auth(AuthCommand { op: Some(op) }) => {
            outcome(crate::auth::replicated::apply(batch, op.clone()), |r| match r {
                Ok(r) => CmdResult::Auth(r),
                Err(e) => Refusal::Auth(e).into_result(),
            })
        }
        Cmd::AuthChecked(c) => match crate::auth::replicated::check_revision(batch, c) {
            Ok(Checked::Current(inner)) => command(batch, leases, inner, entry_term),
            Ok(Checked::Stale) => Ok(Refusal::Auth(AuthError::AuthOldRevision).into_result()),
            Ok(Checked::NoUser) => Ok(Refusal::Auth(AuthError::UserEmpty).into_result()),
            Ok(Checked::Malformed(what)) => Ok(Refusal::Malformed(what).into_result()),
            Err(e) => outcome::<()>(Err(e), |_| CmdResult::Empty(Empty {})),
        },
        Cmd::Alarm(req) => crate::quota::apply_alarm(batch, req).map_err(Fatal::new),
        Cmd::Batch(b) => self::batch(batch, leases, b, entry_term),
        // Queue claims and acks, decided here so no two claimers race for a job.
        Cmd::Queue(q) => outcome(crate::queue::decide::apply(batch, leases, q), CmdResult::Queue),
        Cmd::FencedTxn(f) => {
            let Some(txn) = &f.txn else {
                return Ok(Refusal::Malformed("fenced txn without a txn").into_result());
            };
            let owner = match batch.range(&crate::concurrency::holder_range(&f.name)) {
                Ok(r) => r.kvs.into_iter().next(),
                Err(e) => return outcome::<()>(Err(e), |_| CmdResult::Empty(Empty {})),
            };
            match owner {
                Some(kv) if kv.create_revision == f.token => {
                    match crate::subscription::check_txn(txn) {
                        Ok(()) => outcome(batch.txn(txn, leases), CmdResult::Txn),
                        Err(e) => Ok(Refusal::Group(e).into_result()),
                    }
                }
                other => Ok(Refusal::StaleToken {
                    name: f.name.clone(),
                    token: f.token,
                    holder: other.map(|kv| kv.create_revision),
                }
                .into_result()),
            }
        }
    }
}

/// Applies a group-committed batch (`raft::batcher`): each command in order, exactly as if it
/// were its own entry of term `entry_term` (own revision, own result, own watch events; a command
/// that fails deterministically leaves the others alone). A batch nested in a batch is never
/// built by the leader, so one in the log is corrupt or hostile: it gets an error result, the
/// same on every member, and nothing it holds is applied.
fn batch<E: Engine>(
    batch: &mut ApplyBatch<'_, E>,
    leases: &mut LeaseTable,
    cmds: &CommandBatch,
    entry_term: u64,
) -> Result<CmdResult, Fatal> {
    let mut results = Vec::with_capacity(cmds.commands.len());
    for cmd in &cmds.commands {
        let result = match &cmd.cmd {
            Some(Cmd::Batch(_)) => {
                Refusal::Malformed("a command batch may not contain another batch").into_result()
            }
            other => maybe_command(batch, leases, other.as_ref(), entry_term)?,
        };
        results.push(CommandResult { result: Some(result) });
    }
    Ok(CmdResult::Batch(BatchResult { results }))
}

#[cfg(test)]
mod tests;
