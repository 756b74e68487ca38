//! openraft's storage conformance suite (`openraft::testing::log::Suite`) on Picket's RocksDB
//! log store and state machine: every test of the suite gets a fresh database in a temp dir.

use openraft::testing::log::{StoreBuilder, Suite};
use openraft::{ErrorSubject, ErrorVerb};
use picket_server::raft::types::TypeConfig;
use picket_server::storage::log_store::LogStore;
use picket_server::storage::rocks::RocksEngine;
use picket_server::storage::state_machine::StateMachine;
use tempfile::TempDir;

type StorageError = openraft::StorageError<TypeConfig>;

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        let dir = TempDir::new().expect("temp dir");
        let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
        let log = LogStore::new(engine.db().clone())
            .map_err(|e| StorageError::from_io_error(ErrorSubject::Logs, ErrorVerb::Write, e))?;
        let sm = StateMachine::open(engine, dir.path().join("snapshots")).map_err(|e| {
            StorageError::from_io_error(ErrorSubject::StateMachine, ErrorVerb::Read, e)
        })?;
        Ok((dir, log, sm))
    }
}

#[tokio::test]
async fn openraft_storage_suite() -> Result<(), StorageError> {
    Suite::test_all(RocksBuilder).await
}
