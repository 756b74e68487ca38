//! Test-only: one member's state machine on a temporary RocksDB, applying commands as
//! consecutive log entries, without openraft. Used by apply-tier tests in several modules
//! (`api/auth_tests.rs`, `subscription/record_tests.rs`), which add their own helpers to it.

use openraft::EntryPayload;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::RaftCommand;

use crate::raft::types::{Command, Entry};
use crate::storage::rocks::RocksEngine;
use crate::storage::state_machine::StateMachine;

pub(crate) struct Member {
    dir: tempfile::TempDir,
    pub(crate) sm: StateMachine,
    index: u64,
}

impl Member {
    pub(crate) fn new() -> Self {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
        let sm = StateMachine::open(engine, dir.path().join("snapshots")).expect("open sm");
        Self { dir, sm, index: 0 }
    }

    /// This member's snapshot directory.
    pub(crate) fn snapshot_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("snapshots")
    }

    /// This member's RocksDB directory.
    pub(crate) fn db_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("db")
    }

    /// Stops the member (its state machine and every handle of its database) and opens it
    /// again on the same directory, as a restart does.
    pub(crate) fn restart(self) -> Self {
        let Self { dir, sm, index } = self;
        drop(sm);
        let engine = RocksEngine::open(dir.path().join("db")).expect("reopen rocksdb");
        let sm = StateMachine::open(engine, dir.path().join("snapshots")).expect("reopen sm");
        Self { dir, sm, index }
    }

    /// Applies `cmd` as the next log entry (term 1) and returns its result.
    pub(crate) async fn apply(&mut self, cmd: Cmd) -> CmdResult {
        self.apply_command(RaftCommand { cmd: Some(cmd), forwarded: None })
    }

    /// Applies `cmd` as the next log entry (term 1) and returns its result.
    pub(crate) fn apply_command(&mut self, cmd: RaftCommand) -> CmdResult {
        self.index += 1;
        let entry = Entry {
            log_id: crate::raft::types::log_id(1, 1, self.index),
            payload: EntryPayload::Normal(Command::new(cmd)),
        };
        let mut out = self.sm.apply_entries(vec![entry]).expect("apply");
        out.pop().and_then(|a| a.0.result).expect("one result")
    }
}
