//! openraft's storage conformance suite (`openraft::testing::Suite`) on Picket's RocksDB log
//! store and state machine: every test of the suite gets a fresh database in a temp dir.

use openraft::testing::{StoreBuilder, Suite};
use picket_server::raft::types::{StorageError, TypeConfig};
use picket_server::storage::log_store::LogStore;
use picket_server::storage::rocks::RocksEngine;
use picket_server::storage::state_machine::StateMachine;
use tempfile::TempDir;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = TempDir::new().expect("temp dir");
        let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
        let log = LogStore::new(engine.db().clone());
        let sm = StateMachine::open(engine, dir.path().join("snapshots"))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(RocksBuilder)
}
