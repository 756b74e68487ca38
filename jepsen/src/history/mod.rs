//! The history: every operation's invocation and completion, one JSON line per event
//! (`history.jsonl`, format in `shared/specs/harness.md`).
//!
//! - [`event`]: the [`Event`] line type ([`EventType`], [`Process`], [`Header`], [`ErrorInfo`]).
//! - [`io`]: [`HistoryWriter`] (shared by workers and the nemesis) and [`read_history`].
//! - [`ops`]: pairs invocations with completions into [`Op`]s for the checkers.
//! - [`builder`]: [`HistoryBuilder`] for hand-made histories in checker tests.

pub mod builder;
pub mod event;
pub mod io;
pub mod ops;

use std::path::{Path, PathBuf};

use thiserror::Error;

pub use builder::HistoryBuilder;
pub use event::{ErrorInfo, Event, EventDraft, EventType, Header, Process};
pub use io::{read_history, validate_order, HistoryWriter};
pub use ops::{pair, Op, Outcome};

/// Why a history could not be written or read. A history that cannot be read cannot be
/// checked: callers report it as a harness failure, never as a verdict.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HistoryError {
    // The cause is part of the message (and deliberately not a `#[source]`, so it is not
    // printed twice by error reporters that walk the chain).
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("{path}: cannot append to the history: {message}")]
    Write { path: PathBuf, message: String },
    #[error("{path}:{line}: not a history event: {message}")]
    Parse { path: PathBuf, line: usize, message: String },
    #[error("event #{index}: {reason}")]
    Malformed { index: u64, reason: String },
}

impl HistoryError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        HistoryError::Io { path: path.to_path_buf(), cause: source }
    }
}
