//! A lock waiter that gives up removes its key even if auth changed while it waited (issue 19).
//!
//! Every write a Lock request makes carries the auth revision the request was checked at, and
//! apply refuses it once auth has changed since ("revision of auth store is old", or "user name
//! is empty" when it was judged with auth off and so carried no user). The waiter's
//! clean-up delete is made after an unbounded wait, so it is judged again
//! (`Backend::for_cleanup`) and carries the revision of that judgment; otherwise it would be
//! refused and the abandoned key would delay every later waiter until its lease expired.
//!
//! The tier: one real state machine over RocksDB, and a `Backend` that wraps its txns as the
//! gRPC services' `CtxBackend` does (`AuthChecked` at the revision it was judged at; here the
//! judgment is "auth off", so re-judging is reading the current revision).

use std::sync::Arc;
use std::time::Duration;

use openraft::EntryPayload;
use picket_proto::etcdserverpb::{
    AuthUserAddRequest, AuthUserGrantRoleRequest, LeaseGrantRequest, RangeRequest, RangeResponse,
    TxnRequest, TxnResponse,
};
use picket_proto::picket::raft::v1::auth_command::Op;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{AuthCommand, AuthEnable, RaftCommand};
use picket_server::auth::replicated::Judgement;
use picket_server::concurrency::{contender_key, mutex, Backend, StoreError};
use picket_server::raft::types::log_id;
use picket_server::raft::types::{Command, Entry};
use picket_server::storage::rocks::RocksEngine;
use picket_server::storage::state_machine::{FeedItem, StateMachine};
use tokio::sync::{broadcast, Mutex};

/// A liveness bound (everything is in process), not a performance target.
const PROMPT: Duration = Duration::from_secs(5);

const HOLDER: i64 = 0x11;
const WAITER: i64 = 0x22;

#[derive(Clone)]
struct Member {
    sm: Arc<Mutex<(StateMachine, u64)>>,
    shared: Arc<picket_server::storage::state_machine::Shared>,
    /// The auth revision this backend's writes carry (what the request was judged at).
    checked: Judgement,
    _dir: Arc<tempfile::TempDir>,
}

impl Member {
    fn new() -> Self {
        let dir = tempfile::TempDir::new().expect("dir");
        let engine = RocksEngine::open(dir.path().join("db")).expect("open rocksdb");
        let sm = StateMachine::open(engine, dir.path().join("snapshots")).expect("open sm");
        let shared = sm.shared().clone();
        Self {
            sm: Arc::new(Mutex::new((sm, 0))),
            shared,
            checked: Judgement { revision: 0, auth_on: false },
            _dir: Arc::new(dir),
        }
    }

    async fn apply(&self, cmd: Cmd) -> CmdResult {
        let mut g = self.sm.lock().await;
        g.1 += 1;
        let entry = Entry {
            log_id: log_id(1, 1, g.1),
            payload: EntryPayload::Normal(Command::new(RaftCommand {
                cmd: Some(cmd),
                forwarded: None,
            })),
        };
        let mut out = g.0.apply_entries(vec![entry]).expect("apply");
        out.pop().and_then(|a| a.0.result).expect("one result")
    }

    async fn auth(&self, op: Op) {
        let r = self.apply(Cmd::Auth(AuthCommand { op: Some(op) })).await;
        assert!(matches!(r, CmdResult::Auth(_)), "{r:?}");
    }

    /// A request judged now, with auth off: its writes carry the current auth revision.
    fn judged_now(&self) -> Self {
        let state = self.shared.auth();
        assert!(!state.enabled);
        Self { checked: judged(&state), ..self.clone() }
    }

    fn exists(&self, key: &[u8]) -> bool {
        let req = RangeRequest { key: key.to_vec(), ..Default::default() };
        !self.shared.reader().range(&req).expect("read").kvs.is_empty()
    }
}

impl Backend for Member {
    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, StoreError> {
        let cmd = picket_server::auth::replicated::checked(self.checked, Cmd::Txn(req));
        match self.apply(cmd).await {
            CmdResult::Txn(r) => Ok(r),
            CmdResult::Error(e) => Err(StoreError::Backend(e.message.into())),
            other => Err(StoreError::Backend(format!("txn: {other:?}").into())),
        }
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse, StoreError> {
        self.shared.reader().range(&req).map_err(|e| StoreError::Backend(Box::new(e)))
    }

    fn subscribe(&self) -> broadcast::Receiver<FeedItem> {
        self.shared.subscribe()
    }

    async fn for_cleanup(&self, _key: &[u8]) -> Result<Self, StoreError> {
        // What `CtxBackend` does: judge again; the caller may write its key (root here stands
        // for "still permitted"), so the delete carries the current revision.
        Ok(Self { checked: judged(&self.shared.auth()), ..self.clone() })
    }
}

#[tokio::test]
async fn a_waiter_that_gives_up_after_auth_enable_still_removes_its_key() {
    let m = Member::new();
    for id in [HOLDER, WAITER] {
        let r = m.apply(Cmd::LeaseGrant(LeaseGrantRequest { ttl: 60, id })).await;
        assert!(matches!(r, CmdResult::LeaseGrant(_)), "{r:?}");
    }
    m.auth(Op::UserAdd(AuthUserAddRequest {
        name: "root".into(),
        hashed_password: "hash".into(),
        ..Default::default()
    }))
    .await;
    m.auth(Op::UserGrantRole(AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    }))
    .await;

    let holder = m.judged_now();
    mutex::lock(&holder, b"lk", HOLDER).await.expect("first lock");
    let waiter = m.judged_now();
    let waiting = tokio::spawn(async move { mutex::lock(&waiter, b"lk", WAITER).await });
    let key = contender_key(b"lk", WAITER);
    tokio::time::timeout(PROMPT, async {
        while !m.exists(&key) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the waiter queued");

    // Auth is enabled while it waits; the waiter's own revision is now old.
    m.auth(Op::Enable(AuthEnable { signing_key: vec![7; 32] })).await;
    let stale = mutex::unlock(&m.judged_at_old(), &key).await;
    assert!(
        // Judged with auth off, so it carried no user: etcd's answer for that once auth is on.
        stale.as_ref().is_err_and(|e| e.to_string().contains("user name is empty")),
        "a delete carrying the old revision is refused: {stale:?}"
    );
    assert!(m.exists(&key));

    // The client gives up: the dropped call removes its key, judged again.
    waiting.abort();
    let _ = waiting.await;
    tokio::time::timeout(PROMPT, async {
        while m.exists(&key) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the abandoned waiter's key was not removed after auth changed while it waited");
}

impl Member {
    /// A backend still carrying the revision of the judgment made before AuthEnable.
    fn judged_at_old(&self) -> Self {
        Self {
            checked: Judgement { revision: self.shared.auth().revision - 1, auth_on: false },
            ..self.clone()
        }
    }
}

/// The judgment a request gets against `state` (what `Ctx::authorize` returns).
fn judged(state: &picket_proto::picket::storage::v1::AuthState) -> Judgement {
    Judgement { revision: state.revision, auth_on: state.enabled }
}
