//! The auth store as replicated state: applying auth commands inside an apply batch, and the
//! in-memory copy that the API layer reads.
//!
//! The store is two records in the meta column family, so it is in every snapshot, survives
//! restarts and offline restores, and is not part of HashKV (which covers only the keyspace, as
//! etcd's does): `auth/state` (the whole [`AuthState`], rewritten by each mutation) and
//! `auth/revision` (`enabled` as one byte, then the auth revision big-endian), which
//! [`check_revision`] and [`AuthCache::refresh`] read without decoding users and roles.

use std::sync::Arc;

use parking_lot::RwLock;
use picket_proto::picket::raft::v1::auth_command::Op;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{AuthChecked, AuthResult, RaftCommand};
use picket_proto::picket::storage::v1::AuthState;
use prost::Message;

use super::{store, AuthError};
use crate::mvcc::{ApplyBatch, MvccError};
use crate::storage::engine::{Cf, Engine, ReadView};

pub const KEY_STATE: &[u8] = b"auth/state";
pub const KEY_REVISION: &[u8] = b"auth/revision";

fn decode_state(bytes: Option<Vec<u8>>) -> Result<AuthState, MvccError> {
    match bytes {
        Some(b) => AuthState::decode(b.as_slice())
            .map_err(|e| MvccError::Corrupt(format!("auth state record: {e}"))),
        None => Ok(AuthState::default()),
    }
}

/// `(enabled, auth revision)` as stored under [`KEY_REVISION`].
fn decode_revision(bytes: Option<Vec<u8>>) -> Result<(bool, u64), MvccError> {
    match bytes.as_deref() {
        None => Ok((false, 0)),
        Some([enabled, rev @ ..]) if rev.len() == 8 => {
            let mut be = [0u8; 8];
            be.copy_from_slice(rev);
            Ok((*enabled != 0, u64::from_be_bytes(be)))
        }
        Some(_) => Err(MvccError::Corrupt("auth revision record has the wrong length".into())),
    }
}

fn encode_revision(enabled: bool, revision: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(9);
    out.push(u8::from(enabled));
    out.extend_from_slice(&revision.to_be_bytes());
    out
}

/// The two meta records that hold `state` (for an offline restore that builds a store from
/// another source: `crate::restore`).
pub fn stored_records(state: &AuthState) -> [(&'static [u8], Vec<u8>); 2] {
    [
        (KEY_STATE, state.encode_to_vec()),
        (KEY_REVISION, encode_revision(state.enabled, state.revision)),
    ]
}

/// Applies one auth mutation in `batch`. A refused mutation is the inner `Err` (a command result,
/// the same on every member); only storage failures are the outer one.
pub fn apply<E: Engine>(
    batch: &mut ApplyBatch<'_, E>,
    op: Op,
) -> Result<Result<AuthResult, AuthError>, MvccError> {
    let mut state = decode_state(batch.get_raw(Cf::Meta, KEY_STATE)?)?;
    Ok(match store::mutate(&mut state, op) {
        Ok(()) => {
            batch.put_raw(Cf::Meta, KEY_STATE, &state.encode_to_vec());
            batch.put_raw(Cf::Meta, KEY_REVISION, &encode_revision(state.enabled, state.revision));
            Ok(AuthResult { auth_revision: state.revision })
        }
        Err(e) => Err(e),
    })
}

/// What opening an [`AuthChecked`] command found.
#[derive(Debug)]
pub enum Checked<'a> {
    /// The auth store is where the command was judged (or auth is now off): apply `Cmd`.
    Current(&'a Cmd),
    /// The auth store changed since: "revision of auth store is old" (the client retries, and
    /// is checked again).
    Stale,
    /// Judged while auth was off, applied after it was enabled: the request carried no user,
    /// "user name is empty", as etcd answers it.
    NoUser,
    /// A wrapper the API layer never builds (nested or empty), by what is wrong. One whose
    /// command does not decode fails to decode with its entry, where it is read or received.
    Malformed(&'static str),
}

/// Opens an [`AuthChecked`] command. A command judged while auth was off names that disabled
/// store's revision; AuthEnable bumps the revision, so such a command applied after an enable
/// is [`Checked::Stale`] (issue 19).
pub fn check_revision<'a, E: Engine>(
    batch: &ApplyBatch<'_, E>,
    checked: &'a AuthChecked,
) -> Result<Checked<'a>, MvccError> {
    let (enabled, revision) = decode_revision(batch.get_raw(Cf::Meta, KEY_REVISION)?)?;
    if enabled && revision != checked.auth_revision {
        return Ok(if checked.judged_with_auth_off { Checked::NoUser } else { Checked::Stale });
    }
    Ok(match checked.command.as_deref() {
        // Nesting is never built by the API layer; refusing it bounds apply's recursion.
        Some(RaftCommand { cmd: Some(Cmd::AuthChecked(_)), .. }) => {
            Checked::Malformed("auth-checked command nested in another")
        }
        Some(RaftCommand { cmd: Some(c), .. }) => Checked::Current(c),
        Some(RaftCommand { cmd: None, .. }) | None => {
            Checked::Malformed("empty auth-checked command")
        }
    })
}

/// The auth store a request was judged against: its revision, and whether auth was on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judgement {
    pub revision: u64,
    pub auth_on: bool,
}

/// Wraps `cmd` as judged against `judged`.
pub fn checked(judged: Judgement, cmd: Cmd) -> Cmd {
    Cmd::AuthChecked(Box::new(AuthChecked {
        auth_revision: judged.revision,
        command: Some(Box::new(RaftCommand { cmd: Some(cmd), forwarded: None })),
        judged_with_auth_off: !judged.auth_on,
    }))
}

/// The applied auth store, as the API layer reads it. Refreshed by the state machine after
/// every applied batch and snapshot install, before clients see the results, so a client that
/// saw its auth change succeed is checked against it on its next request to the same member.
pub struct AuthCache {
    state: RwLock<Arc<AuthState>>,
}

impl AuthCache {
    /// Loads the store from the engine.
    pub fn load(view: &dyn ReadView) -> Result<Self, MvccError> {
        let state = decode_state(view.get(Cf::Meta, KEY_STATE)?)?;
        Ok(Self { state: RwLock::new(Arc::new(state)) })
    }

    /// The current applied state (cheap: an `Arc` clone).
    pub fn get(&self) -> Arc<AuthState> {
        self.state.read().clone()
    }

    /// Reloads the state unconditionally (after a snapshot install replaced the store).
    pub fn reload(&self, view: &dyn ReadView) -> Result<(), MvccError> {
        let state = decode_state(view.get(Cf::Meta, KEY_STATE)?)?;
        *self.state.write() = Arc::new(state);
        Ok(())
    }

    /// Reloads the state if its revision record changed (one point read otherwise).
    pub fn refresh(&self, view: &dyn ReadView) -> Result<(), MvccError> {
        let (enabled, revision) = decode_revision(view.get(Cf::Meta, KEY_REVISION)?)?;
        {
            let cur = self.state.read();
            if cur.enabled == enabled && cur.revision == revision {
                return Ok(());
            }
        }
        let state = decode_state(view.get(Cf::Meta, KEY_STATE)?)?;
        *self.state.write() = Arc::new(state);
        Ok(())
    }
}

#[cfg(test)]
#[path = "replicated_tests.rs"]
mod tests;
