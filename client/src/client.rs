//! [`Client`]: the connection pool and the one retry loop every unary request goes through.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use picket_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use picket_proto::etcdserverpb::StatusRequest;
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::auth::{token_refused, Chan};
use crate::error::{classify, Error, Failure};
use crate::options::ConnectOptions;
use crate::pool::Pool;

/// Pause between passes over the endpoint list when every endpoint failed. An election takes a
/// few hundred milliseconds, so a shorter pause only burns requests; the request deadline bounds
/// the total.
const PASS_PAUSE: Duration = Duration::from_millis(100);

/// Whether a request may be sent again after it may have reached a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads, keep-alives, deletes of one exact key, lock acquisition for a given lease: doing
    /// them twice has the same effect as doing them once.
    Idempotent,
    /// Everything else: retried only when the request was certainly not applied.
    Write,
}

/// A handle to a Picket (or etcd) cluster. Cheap to clone; clones share connections.
///
/// # Examples
/// ```no_run
/// # async fn demo() -> Result<(), picket_client::Error> {
/// use picket_client::Client;
///
/// let client = Client::connect(["127.0.0.1:2379", "127.0.0.1:22379", "127.0.0.1:32379"]).await?;
/// client.put("greeting", "hello").await?;
/// let kv = client.get("greeting").await?.expect("just written");
/// assert_eq!(kv.value, b"hello");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) opts: ConnectOptions,
    /// Set while a leader discovery runs, so failures do not start one each.
    discovering: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("endpoints", &self.inner.pool.urls()).finish()
    }
}

impl Client {
    /// Connects with default [`ConnectOptions`]. See [`Client::connect_with`].
    pub async fn connect<I, S>(endpoints: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_with(endpoints, ConnectOptions::default()).await
    }

    /// Connects to a cluster given some of its members' client URLs (`http://host:port` or
    /// `host:port`). Succeeds once at least one endpoint answers `Status`; prefers the leader.
    /// Fails with [`Error::Unavailable`] if none answers within the dial timeout.
    pub async fn connect_with<I, S>(endpoints: I, opts: ConnectOptions) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = endpoints.into_iter().map(|s| s.as_ref().to_string()).collect();
        let pool = Pool::new(&urls, &opts)?;
        let client =
            Client { inner: Arc::new(Inner { pool, opts, discovering: AtomicBool::new(false) }) };
        client.discover_leader().await?;
        // With credentials, fetch a token before the first request (etcd's clients do too).
        client.authenticate().await?;
        Ok(client)
    }

    /// The endpoints this client was given, normalised to URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.pool.urls()
    }

    /// The endpoint requests go to first right now (the leader when known).
    pub fn current_endpoint(&self) -> String {
        self.inner.pool.url(self.inner.pool.preferred()).to_string()
    }

    /// The options this client was made with.
    pub fn options(&self) -> &ConnectOptions {
        &self.inner.opts
    }

    /// Asks every endpoint for `Status` at once and prefers the one that says it is the leader
    /// (else the first that answered). Errors only if no endpoint answered.
    async fn discover_leader(&self) -> Result<(), Error> {
        let pool = &self.inner.pool;
        let dial = self.inner.opts.dial_timeout;
        let probes = (0..pool.len()).map(|idx| async move {
            // Bounded by the dial timeout twice over (connect, then the answer): a member that
            // does not answer `Status` that fast is not one to prefer anyway.
            let answer = tokio::time::timeout(dial * 2, async {
                let ch = pool.channel(idx).await.map_err(Status::unavailable)?;
                MaintenanceClient::new(ch).status(StatusRequest {}).await
            })
            .await;
            (idx, answer)
        });
        let answers = futures::future::join_all(probes).await;
        let mut first_ok = None;
        let mut errors = Vec::new();
        for (idx, answer) in answers {
            match answer {
                Ok(Ok(resp)) => {
                    let resp = resp.into_inner();
                    let me = resp.header.map(|h| h.member_id).unwrap_or(0);
                    if resp.leader != 0 && resp.leader == me {
                        pool.prefer(idx);
                        return Ok(());
                    }
                    first_ok.get_or_insert(idx);
                }
                Ok(Err(s)) => {
                    pool.avoid(idx);
                    errors.push(format!("{}: {}", pool.url(idx), s.message()));
                }
                Err(_) => {
                    pool.avoid(idx);
                    errors.push(format!("{}: no answer within {:?}", pool.url(idx), dial * 2));
                }
            }
        }
        match first_ok {
            Some(idx) => {
                pool.prefer(idx);
                Ok(())
            }
            None => Err(Error::Unavailable(errors.join("; "))),
        }
    }

    /// Starts a background leader discovery unless one is running. Called after failures so
    /// the next requests go to the new leader without the caller waiting for the probe.
    pub(crate) fn rediscover(&self) {
        if self.inner.discovering.swap(true, Ordering::AcqRel) {
            return;
        }
        let client = self.clone();
        tokio::spawn(async move {
            let _ = client.discover_leader().await;
            client.inner.discovering.store(false, Ordering::Release);
        });
    }

    /// Runs one unary request with failover. `f` builds and sends the request on a channel.
    ///
    /// Every endpoint is tried in [`Pool::order`]; passes repeat until the request timeout.
    /// After an attempt that may have reached a server, only [`Retry::Idempotent`] requests
    /// continue: a write is reported as [`Error::OutcomeUnknown`] instead, because sending it
    /// again could apply it twice.
    pub(crate) async fn call<T, F, Fut>(&self, retry: Retry, f: F) -> Result<T, Error>
    where
        F: Fn(Chan) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        if self.inner.opts.credentials.is_none() {
            return self.call_unauthenticated(retry, f).await;
        }
        let refused = AtomicBool::new(false);
        let watch = |ch: Chan| {
            let fut = f(ch);
            let refused = &refused;
            async move {
                let r = fut.await;
                if let Err(s) = &r {
                    refused.store(token_refused(s), Ordering::Relaxed);
                }
                r
            }
        };
        let first = self.call_unauthenticated(retry, &watch).await;
        if first.is_ok() || !refused.load(Ordering::Relaxed) {
            return first;
        }
        // The token expired, or the auth store changed under the request. The server refused
        // the request before it took effect (see `auth::token_refused`), so fetching a new
        // token and sending it once more cannot apply it twice. Once: a second refusal means
        // the credentials themselves are the problem, and is returned.
        self.authenticate().await?;
        self.call_unauthenticated(retry, f).await
    }

    /// [`Client::call`] without re-authentication (for `Authenticate` itself).
    pub(crate) async fn call_unauthenticated<T, F, Fut>(
        &self,
        retry: Retry,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Chan) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let opts = &self.inner.opts;
        let deadline = Instant::now() + opts.request_timeout;
        let mut last = String::from("no endpoint tried");
        let mut maybe_sent = false;
        loop {
            for idx in self.inner.pool.order() {
                let now = Instant::now();
                if now >= deadline {
                    return Err(give_up(retry, maybe_sent, opts.request_timeout, last));
                }
                let channel = match self.inner.pool.channel(idx).await {
                    Ok(ch) => ch,
                    Err(e) => {
                        // Never connected: nothing was sent, any request may go elsewhere.
                        last = format!("{}: {e}", self.inner.pool.url(idx));
                        self.inner.pool.avoid(idx);
                        continue;
                    }
                };
                let budget = match retry {
                    Retry::Idempotent => (deadline - now).min(opts.attempt_timeout),
                    Retry::Write => deadline - now,
                };
                // Bounded by `budget`: a silent endpoint (paused, partitioned) must not hold the
                // request past its deadline. What an abandoned attempt means is decided below.
                match tokio::time::timeout(budget, f(channel)).await {
                    Ok(Ok(v)) => {
                        self.inner.pool.prefer(idx);
                        return Ok(v);
                    }
                    Ok(Err(status)) => match classify(&status) {
                        Failure::Final(e) => return Err(e),
                        Failure::NotApplied(m) => {
                            last = format!("{}: {m}", self.inner.pool.url(idx));
                            self.inner.pool.avoid(idx);
                            self.rediscover();
                        }
                        Failure::MaybeApplied(m) => {
                            last = format!("{}: {m}", self.inner.pool.url(idx));
                            self.inner.pool.avoid(idx);
                            self.rediscover();
                            if retry == Retry::Write {
                                return Err(Error::OutcomeUnknown(last));
                            }
                            maybe_sent = true;
                        }
                    },
                    Err(_) => {
                        last = format!("{}: no answer within {budget:?}", self.inner.pool.url(idx));
                        self.inner.pool.avoid(idx);
                        self.rediscover();
                        if retry == Retry::Write {
                            return Err(Error::OutcomeUnknown(last));
                        }
                        maybe_sent = true;
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(give_up(retry, maybe_sent, opts.request_timeout, last));
            }
            // Every endpoint failed this pass; wait a little for an election or a restart.
            tokio::time::sleep(PASS_PAUSE.min(deadline - now)).await;
        }
    }

    /// A channel to one endpoint (by index), for requests that must go to a specific member
    /// (`Status`, `HashKV`, `Defragment`, snapshots).
    pub(crate) async fn channel_to(&self, endpoint: &str) -> Result<Chan, Error> {
        let want = crate::pool::normalize(endpoint, self.inner.opts.tls.is_some());
        let pool = &self.inner.pool;
        let idx = (0..pool.len()).find(|i| pool.url(*i) == want);
        match idx {
            Some(idx) => {
                pool.channel(idx).await.map_err(|e| Error::Unavailable(format!("{want}: {e}")))
            }
            None => {
                let ep = crate::pool::endpoint(&want, &self.inner.opts)?;
                let ch = ep.connect().await.map_err(|e| {
                    Error::Unavailable(format!("{want}: {}", crate::pool::error_chain(&e)))
                })?;
                Ok(tonic::service::interceptor::InterceptedService::new(ch, pool.token().clone()))
            }
        }
    }
}

fn give_up(retry: Retry, maybe_sent: bool, timeout: Duration, last: String) -> Error {
    match (retry, maybe_sent) {
        (Retry::Idempotent, true) => Error::Timeout(timeout),
        _ => Error::Unavailable(last),
    }
}

/// Wraps a message in a request that asks the server to fail fast when it has no leader
/// (etcd's `hasleader` metadata), instead of waiting out its own timeout.
pub(crate) fn request<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert("hasleader", MetadataValue::from_static("true"));
    req
}
