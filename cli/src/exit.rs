//! Exit codes, and the mapping of errors onto them.
//!
//! Scripts branch on these, so they are part of the interface: never renumber one. A command
//! run by `picket lock NAME -- CMD` passes its own exit code through instead (see `HELP`).

use std::fmt;

use picket_client::Error as ClientError;

/// Success.
pub const OK: u8 = 0;
/// Any failure without a more specific code (a server error, a compacted revision, I/O).
pub const ERROR: u8 = 1;
/// Bad flags or arguments, or a request the server rejected as malformed. Clap uses 2 as well.
pub const USAGE: u8 = 2;
/// The key, lease or member named does not exist.
pub const NOT_FOUND: u8 = 3;
/// `lock --try` found the lock held, or `lock --timeout` ran out.
pub const NOT_ACQUIRED: u8 = 4;
/// No endpoint answered in time (down, partitioned, no leader); nothing was applied.
pub const UNAVAILABLE: u8 = 5;
/// A write may or may not have been applied (the answer was lost); read back before retrying.
pub const OUTCOME_UNKNOWN: u8 = 6;
/// A held lock or leadership was lost (lease revoked or expired, key deleted).
pub const LOST: u8 = 7;

/// The exit-code table printed by `picket --help`.
pub const HELP: &str = "\
Exit codes:
  0  success
  1  error (server error, compacted revision, I/O, ...)
  2  usage error (bad flags or arguments, request rejected as invalid)
  3  not found (get of a single key that does not exist, unknown lease or member)
  4  lock not acquired (lock --try found it held, or lock --timeout ran out)
  5  unavailable (no endpoint answered in time; nothing was applied)
  6  outcome unknown (a write may or may not have been applied; read back)
  7  lock or leadership lost while held
`picket lock NAME -- CMD` exits with CMD's own code (128+N if a signal N ended it), except
that it exits 7 if the lock was lost while CMD ran.

Environment: PICKET_ENDPOINTS sets --endpoints (comma-separated).";

/// An error that carries its exit code. `message: None` exits silently (the command already
/// printed what the user needs, e.g. nothing for a key that does not exist).
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: Option<String>,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.message {
            Some(m) => f.write_str(m),
            None => write!(f, "exit code {}", self.code),
        }
    }
}

impl std::error::Error for Exit {}

/// An error that exits with `code` and prints `message`.
pub fn fail(code: u8, message: impl Into<String>) -> anyhow::Error {
    Exit { code, message: Some(message.into()) }.into()
}

/// An error that exits with `code` and prints nothing.
pub fn quiet(code: u8) -> anyhow::Error {
    Exit { code, message: None }.into()
}

/// The exit code for `err`: its own if it is an [`Exit`], else by the client error anywhere in
/// its chain, else [`ERROR`].
pub fn code_of(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<Exit>() {
            return e.code;
        }
        if let Some(e) = cause.downcast_ref::<ClientError>() {
            return client_code(e);
        }
    }
    ERROR
}

/// Whether `err` should print a message (a quiet [`Exit`] does not).
pub fn should_print(err: &anyhow::Error) -> bool {
    !matches!(err.downcast_ref::<Exit>(), Some(Exit { message: None, .. }))
}

fn client_code(e: &ClientError) -> u8 {
    match e {
        ClientError::Unavailable(_) | ClientError::Timeout(_) => UNAVAILABLE,
        ClientError::OutcomeUnknown(_) => OUTCOME_UNKNOWN,
        ClientError::LeaseNotFound(_) => NOT_FOUND,
        ClientError::NotAcquired { .. } => NOT_ACQUIRED,
        ClientError::LockLost { .. } | ClientError::SessionLost(_) => LOST,
        ClientError::InvalidArgument(_) | ClientError::InvalidEndpoint { .. } => USAGE,
        ClientError::Server { code: tonic::Code::NotFound, .. } => NOT_FOUND,
        _ => ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_errors_map_to_documented_codes() {
        let cases = [
            (ClientError::Unavailable("x".into()), UNAVAILABLE),
            (ClientError::Timeout(std::time::Duration::from_secs(1)), UNAVAILABLE),
            (ClientError::OutcomeUnknown("x".into()), OUTCOME_UNKNOWN),
            (ClientError::LeaseNotFound(7), NOT_FOUND),
            (ClientError::NotAcquired { name: "a".into() }, NOT_ACQUIRED),
            (ClientError::LockLost { key: "a/1".into() }, LOST),
            (ClientError::InvalidArgument("x".into()), USAGE),
            (ClientError::FutureRevision, ERROR),
        ];
        for (e, want) in cases {
            let e = anyhow::Error::from(e).context("while doing something");
            assert_eq!(code_of(&e), want, "{e:#}");
        }
        assert_eq!(code_of(&quiet(NOT_FOUND)), NOT_FOUND);
        assert!(!should_print(&quiet(NOT_FOUND)));
        assert!(should_print(&fail(LOST, "lost")));
    }
}
