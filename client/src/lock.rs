//! Distributed locks with fencing tokens.
//!
//! A lock is etcd's recipe: each contender puts `<name>/<lease hex>` under its session's lease
//! and holds the lock while its key is the oldest under `<name>/`. The **fencing token** is the
//! key's create revision: it increases with every grant, so a resource that remembers the
//! highest token it has seen (or checks it with a transaction, [`Client::fenced_put`]) refuses a
//! holder whose lock has since passed to someone else, even if that holder was paused and does
//! not know it yet.
//!
//! The guard also watches its own key and session, so [`LockGuard::lost`] fires as soon as the
//! lock is gone (key deleted, lease revoked or expired, session deadline passed).

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use picket_proto::etcdserverpb::{PutResponse, TxnResponse};
use picket_proto::mvccpb::event::EventType;
use picket_proto::picket::v1::locks_client::LocksClient;
use picket_proto::picket::v1::{CheckTokenRequest, FencedTxnRequest};
use picket_proto::v3lockpb::lock_client::LockClient;
use picket_proto::v3lockpb::{LockRequest, UnlockRequest};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::{request, Client, Retry};
use crate::error::Error;
use crate::kv::{GetOptions, PutOptions, SortBy};
use crate::session::Session;
use crate::txn::{Compare, CompareOp, Txn, TxnOp};
use crate::watch::WatchOptions;

/// Default lease TTL (seconds) of the session a lock makes for itself.
pub const DEFAULT_LOCK_TTL: i64 = 10;

/// The proof of holding a lock, to pass to whoever guards a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The lock name.
    pub name: Vec<u8>,
    /// The holder's key, `<name>/<lease hex>`.
    pub key: Vec<u8>,
    /// The fencing token: the key's create revision. Larger means granted later.
    pub token: i64,
}

/// Options of a lock acquisition.
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    session: Option<Session>,
    ttl: Option<i64>,
    timeout: Option<Duration>,
}

impl LockOptions {
    /// A fresh session with [`DEFAULT_LOCK_TTL`], waiting without a time limit.
    pub fn new() -> Self {
        Self::default()
    }
    /// Hold the lock under an existing session (it is not closed on unlock).
    pub fn session(mut self, s: Session) -> Self {
        self.session = Some(s);
        self
    }
    /// TTL in seconds of the session the lock makes for itself.
    pub fn ttl(mut self, ttl: i64) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Give up with [`Error::NotAcquired`] after waiting this long.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }
}

/// A held lock. Release it with [`LockGuard::unlock`]; dropping it releases it in the
/// background (best effort; the lease TTL is the backstop).
pub struct LockGuard {
    client: Client,
    fence: Fence,
    session: Session,
    owns_session: bool,
    lost: watch::Receiver<bool>,
    monitor: JoinHandle<()>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &String::from_utf8_lossy(&self.fence.key))
            .field("token", &self.fence.token)
            .field("lost", &*self.lost.borrow())
            .finish()
    }
}

impl LockGuard {
    /// The lock key, `<name>/<lease hex>`.
    pub fn key(&self) -> &[u8] {
        &self.fence.key
    }
    /// The fencing token (the key's create revision).
    pub fn token(&self) -> i64 {
        self.fence.token
    }
    /// Name, key and token, to hand to a fenced resource.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }
    /// The session the lock is held under.
    pub fn session(&self) -> &Session {
        &self.session
    }
    /// Whether the lock is known to be lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
    /// Resolves when the lock is lost: its key was deleted (unlocked elsewhere, lease revoked or
    /// expired) or its session was lost. Cancellation-safe.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        let _ = rx.wait_for(|l| *l).await;
    }
    /// Releases the lock: deletes the key (and revokes the session's lease if the lock made the
    /// session). Waiters are woken by the delete.
    pub async fn unlock(mut self) -> Result<(), Error> {
        self.released = true;
        self.monitor.abort();
        unlock_key(&self.client, self.fence.key.clone()).await?;
        if self.owns_session {
            self.session.clone().close().await?;
        }
        Ok(())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.monitor.abort();
        if self.released {
            return;
        }
        // Best effort; if it does not happen, the lease ends the lock within its TTL. When the
        // guard owns its session, dropping the session revokes the lease anyway.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let key = self.fence.key.clone();
            rt.spawn(async move {
                let _ = unlock_key(&client, key).await;
            });
        }
    }
}

async fn unlock_key(client: &Client, key: Vec<u8>) -> Result<(), Error> {
    // Deleting one exact key twice has the effect of deleting it once: idempotent. (The key
    // embeds the lease id, so nobody else can have re-created it.)
    client
        .call(Retry::Idempotent, |ch| {
            let key = key.clone();
            async move {
                LockClient::new(ch).unlock(request(UnlockRequest { key })).await?;
                Ok(())
            }
        })
        .await
}

/// Pause before asking another endpoint to continue a wait whose connection broke.
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(100);

impl Client {
    /// Waits for the lock `name` under a fresh session ([`DEFAULT_LOCK_TTL`]) and returns the
    /// guard with its fencing token. Waiters are served in arrival order.
    ///
    /// Every key under `<name>/` counts as a contender (that is etcd's recipe, and what makes
    /// the lock interoperable with etcdctl and other clients), so never store data under the
    /// lock's name: a data key there would be "the oldest contender" and nobody would ever get
    /// the lock.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
    /// let guard = client.lock("jobs/nightly").await?;
    /// println!("holding {} with token {}", String::from_utf8_lossy(guard.key()), guard.token());
    /// client.fenced_put(&guard.fence(), "jobs/nightly/state", "running").await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self, name: impl Into<Vec<u8>>) -> Result<LockGuard, Error> {
        self.lock_with(name, LockOptions::new()).await
    }

    /// Waits for the lock at most `timeout`; [`Error::NotAcquired`] after that.
    pub async fn lock_with_timeout(
        &self,
        name: impl Into<Vec<u8>>,
        timeout: Duration,
    ) -> Result<LockGuard, Error> {
        self.lock_with(name, LockOptions::new().timeout(timeout)).await
    }

    /// Waits for the lock with options.
    pub async fn lock_with(
        &self,
        name: impl Into<Vec<u8>>,
        opts: LockOptions,
    ) -> Result<LockGuard, Error> {
        let name = name.into();
        let (session, owns_session) = match opts.session {
            Some(s) => (s, false),
            None => (Session::new(self, opts.ttl.unwrap_or(DEFAULT_LOCK_TTL)).await?, true),
        };
        let key = contender_key(&name, session.lease_id());
        let acquire = self.acquire(&name, &session);
        let acquired = match opts.timeout {
            None => acquire.await,
            // Bounded by the caller's timeout. Cancelling the wait makes Picket remove our key;
            // it is deleted below as well, for etcd, which leaves it queued.
            Some(t) => match tokio::time::timeout(t, acquire).await {
                Ok(r) => r,
                Err(_) => Err(Error::NotAcquired { name: lossy(&name) }),
            },
        };
        if let Err(e) = acquired {
            if owns_session {
                let _ = session.clone().close().await;
            } else {
                let _ = unlock_key(self, key).await;
            }
            return Err(e);
        }
        self.guard(name, key, session, owns_session).await
    }

    /// Takes the lock `name` only if it is free now; `Ok(None)` if someone holds it. Uses plain
    /// KV transactions, so it works against etcd too.
    pub async fn try_lock(&self, name: impl Into<Vec<u8>>) -> Result<Option<LockGuard>, Error> {
        self.try_lock_with(name, LockOptions::new()).await
    }

    /// [`Client::try_lock`] with options: [`LockOptions::ttl`] sets the TTL of the session the
    /// lock makes for itself, [`LockOptions::session`] holds the lock under an existing session
    /// instead (it is not closed on unlock, nor when the lock is found held).
    /// [`LockOptions::timeout`] does not apply: a try never waits.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
    /// use picket_client::LockOptions;
    ///
    /// match client.try_lock_with("jobs/nightly", LockOptions::new().ttl(30)).await? {
    ///     Some(guard) => println!("got it, token {}", guard.token()),
    ///     None => println!("someone else is running the nightly job"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lock_with(
        &self,
        name: impl Into<Vec<u8>>,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, Error> {
        let name = name.into();
        let (session, owns_session) = match opts.session {
            Some(s) => (s, false),
            None => (Session::new(self, opts.ttl.unwrap_or(DEFAULT_LOCK_TTL)).await?, true),
        };
        let key = contender_key(&name, session.lease_id());
        let mut prefix = name.clone();
        prefix.push(b'/');
        let oldest = TxnOp::get_with(
            prefix.clone(),
            GetOptions::new().prefix().sort(SortBy::CreateRevision, true).limit(1),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put_with(key.clone(), "", PutOptions::new().lease(session.lease_id())),
                oldest.clone(),
            ])
            .or_else([oldest]);
        // The key embeds our lease, so nobody else writes it; a lost answer leaves at most a key
        // that the session's revoke (or, for a caller's session, the unlock) below removes.
        let resp = match self.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                if owns_session {
                    let _ = session.close().await;
                } else {
                    let _ = unlock_key(self, key).await;
                }
                return Err(e);
            }
        };
        let owner = resp.responses.last().and_then(|r| match &r.response {
            Some(picket_proto::etcdserverpb::response_op::Response::ResponseRange(rr)) => {
                rr.kvs.first().map(|kv| kv.key.clone())
            }
            _ => None,
        });
        if owner.as_deref() != Some(key.as_slice()) {
            if owns_session {
                session.close().await?;
            } else {
                unlock_key(self, key).await?;
            }
            return Ok(None);
        }
        self.guard(name, key, session, owns_session).await.map(Some)
    }

    /// Runs `f` while holding the lock `name`, then releases it. `f` receives the [`Fence`] to
    /// pass to the resources it writes. If the lock is lost while `f` runs, `f` is dropped at
    /// its next `.await` and the call fails with [`Error::LockLost`]: the work must be
    /// fenced (see [`Client::fenced_put`]) so that a late write from a holder that did not
    /// notice in time is refused by the resource.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
    /// let c = client.clone();
    /// let balance = client
    ///     .with_lock("accounts/42", |fence| async move {
    ///         let current = c.get("accounts/42/balance").await?;
    ///         let n: i64 = current
    ///             .map(|kv| String::from_utf8_lossy(&kv.value).parse().unwrap_or(0))
    ///             .unwrap_or(0);
    ///         c.fenced_put(&fence, "accounts/42/balance", (n + 10).to_string()).await?;
    ///         Ok::<_, picket_client::Error>(n + 10)
    ///     })
    ///     .await??;
    /// # let _ = balance; Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(&self, name: impl Into<Vec<u8>>, f: F) -> Result<T, Error>
    where
        F: FnOnce(Fence) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(name).await?;
        let out = tokio::select! {
            out = f(guard.fence()) => out,
            _ = guard.lost() => {
                return Err(Error::LockLost { key: lossy(guard.key()) });
            }
        };
        if let Err(e) = guard.unlock().await {
            // The work is done; the release failed (the guard's session revoke or the lease
            // TTL will end the lock). Report the work's result, not the release failure.
            tracing::warn!(error = %e, "lock release failed; the lease will end it");
        }
        Ok(out)
    }

    /// Puts `key = value` only if `fence` still holds its lock (the lock key still exists with
    /// the token as its create revision), in one transaction. [`Error::Fenced`] otherwise.
    /// Works against etcd too.
    pub async fn fenced_put(
        &self,
        fence: &Fence,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, Error> {
        let txn = Txn::new()
            .when([Compare::create_revision(fence.key.clone(), CompareOp::Equal, fence.token)])
            .and_then([TxnOp::put(key, value)]);
        let resp = self.txn(txn).await?;
        if !resp.succeeded {
            return Err(Error::Fenced(format!(
                "token {} no longer holds lock {}",
                fence.token,
                lossy(&fence.name)
            )));
        }
        let put = resp.responses.into_iter().next().and_then(|r| match r.response {
            Some(picket_proto::etcdserverpb::response_op::Response::ResponsePut(p)) => Some(p),
            _ => None,
        });
        Ok(put.unwrap_or(PutResponse { header: resp.header, prev_kv: None }))
    }

    /// Runs `txn` only if `fence`'s token is still the lock's current token, checked by the
    /// server in the same step as the transaction (Picket's `FencedTxn`; not available on
    /// etcd). [`Error::Fenced`] names the current token otherwise.
    pub async fn fenced_txn(&self, fence: &Fence, txn: Txn) -> Result<TxnResponse, Error> {
        let req = FencedTxnRequest {
            name: fence.name.clone(),
            token: fence.token,
            txn: Some(txn.into_request()),
        };
        let resp = self
            .call(Retry::Write, |ch| {
                let req = req.clone();
                async move { Ok(LocksClient::new(ch).fenced_txn(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(resp.txn.unwrap_or_default())
    }

    /// Whether `token` is the current holder's token of lock `name` (Picket's `CheckToken`).
    pub async fn check_token(&self, name: impl Into<Vec<u8>>, token: i64) -> Result<bool, Error> {
        let req = CheckTokenRequest { name: name.into(), token };
        let resp = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move { Ok(LocksClient::new(ch).check_token(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(resp.current)
    }

    /// Waits until our key is the oldest under `name/`. Retried on another endpoint after a
    /// broken connection: `Lock` with the same lease finds and reuses our key (it is named by
    /// the lease), so a retry neither duplicates the contender nor loses the queue position.
    async fn acquire(&self, name: &[u8], session: &Session) -> Result<(), Error> {
        let req = LockRequest { name: name.to_vec(), lease: session.lease_id() };
        loop {
            let mut last = String::from("no endpoint");
            for idx in self.inner.pool.order() {
                session.check()?;
                let Ok(ch) = self.inner.pool.channel(idx).await else {
                    self.inner.pool.avoid(idx);
                    continue;
                };
                // No time bound on the wait itself (the holder may hold the lock for long); the
                // session being lost ends it, and HTTP/2 keep-alive ends a dead connection.
                let mut locks = LockClient::new(ch);
                let attempt = locks.lock(request(req.clone()));
                let result = tokio::select! {
                    r = attempt => r,
                    _ = session.lost() => return Err(Error::SessionLost(session.lease_id())),
                };
                match result {
                    Ok(_) => return Ok(()),
                    Err(status) => match crate::error::classify(&status) {
                        crate::error::Failure::Final(e) => return Err(e),
                        crate::error::Failure::NotApplied(m)
                        | crate::error::Failure::MaybeApplied(m) => {
                            last = m;
                            self.inner.pool.avoid(idx);
                        }
                    },
                }
            }
            tracing::debug!(error = %last, "lock wait interrupted; retrying");
            tokio::time::sleep(LOCK_RETRY_PAUSE).await;
        }
    }

    /// Reads the token of a just-acquired key and starts the loss monitor.
    async fn guard(
        &self,
        name: Vec<u8>,
        key: Vec<u8>,
        session: Session,
        owns_session: bool,
    ) -> Result<LockGuard, Error> {
        let kv = match self.get(key.clone()).await? {
            Some(kv) if kv.lease == session.lease_id() => kv,
            _ => return Err(Error::LockLost { key: lossy(&key) }),
        };
        let (tx, rx) = watch::channel(false);
        let monitor = tokio::spawn(monitor(
            self.clone(),
            key.clone(),
            kv.create_revision,
            session.clone(),
            tx,
        ));
        Ok(LockGuard {
            client: self.clone(),
            fence: Fence { name, key, token: kv.create_revision },
            session,
            owns_session,
            lost: rx,
            monitor,
            released: false,
        })
    }
}

/// Sets `lost` when the session is lost or the key stops being the one created at `token`.
async fn monitor(
    client: Client,
    key: Vec<u8>,
    token: i64,
    session: Session,
    lost: watch::Sender<bool>,
) {
    let watch_key = async {
        let mut from = token;
        loop {
            let mut stream =
                match client.watch(key.clone(), WatchOptions::new().start_revision(from)).await {
                    Ok(s) => s,
                    Err(Error::Compacted { .. }) => {
                        // History before `from` is gone: check the key directly, then watch on.
                        match client.get_with(key.clone(), GetOptions::new()).await {
                            Ok(r) => {
                                let same = r.kvs.first().map(|kv| kv.create_revision == token);
                                if same != Some(true) {
                                    return;
                                }
                                from = r.header.map(|h| h.revision + 1).unwrap_or(from);
                                continue;
                            }
                            Err(_) => {
                                tokio::time::sleep(LOCK_RETRY_PAUSE).await;
                                continue;
                            }
                        }
                    }
                    Err(_) => {
                        // Could not create the watch within a request timeout; keep trying (the
                        // session's own deadline still bounds how long a loss can go unnoticed).
                        tokio::time::sleep(LOCK_RETRY_PAUSE).await;
                        continue;
                    }
                };
            while let Some(batch) = stream.next().await {
                let Ok(batch) = batch else { break };
                for ev in batch.events {
                    let gone = ev.r#type == EventType::Delete as i32
                        || ev.kv.as_ref().map(|kv| kv.create_revision != token).unwrap_or(true);
                    if gone {
                        return;
                    }
                    if let Some(kv) = ev.kv {
                        from = kv.mod_revision + 1;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = watch_key => {}
        _ = session.lost() => {}
    }
    let _ = lost.send(true);
}

/// `<name>/<lease hex>`, etcd's contender key.
pub(crate) fn contender_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut k = name.to_vec();
    k.push(b'/');
    k.extend_from_slice(format!("{lease:x}").as_bytes());
    k
}

pub(crate) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
