//! [`Session`]: a lease kept alive in the background, with a signal that fires as soon as the
//! session can no longer be trusted — before the server expires it.
//!
//! The client cannot see the server's clock, but it can bound it: a keep-alive sent at `t` and
//! answered with TTL `ttl` renewed the lease at some moment after `t`, so the server will not
//! expire it before `t + ttl` (Picket also gives every lease a full TTL again after a leader
//! change, so no later event shortens that). The session therefore declares itself lost at
//! `t + ttl - margin`, measured from the **send** time of the last successful keep-alive. The
//! margin absorbs clock-rate differences between machines and the time the holder needs to stop
//! acting; it defaults to a tenth of the TTL, at least 500 ms.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::Error;
use crate::lease::KeepAliveStream;

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The server answered a keep-alive with TTL 0: the lease expired or was revoked.
    Expired,
    /// No keep-alive succeeded before the safety deadline (partition, dead cluster, paused
    /// process). The lease may still exist on the server, but the holder must act as if not.
    KeepAliveDeadline,
    /// [`Session::close`] was called.
    Closed,
}

/// Options of a [`Session`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// Lease TTL in seconds.
    pub ttl: i64,
    /// How long before the earliest possible server-side expiry the session declares itself
    /// lost. `None`: a tenth of the TTL, at least 500 ms (at most half the TTL).
    pub safety_margin: Option<Duration>,
    /// Use this existing lease instead of granting one (it is not revoked on close).
    pub lease: Option<i64>,
}

impl SessionOptions {
    /// A session with a fresh lease of `ttl` seconds.
    pub fn new(ttl: i64) -> Self {
        Self { ttl, safety_margin: None, lease: None }
    }
    /// Sets the safety margin.
    pub fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }
}

/// A lease kept alive in the background. Locks and elections taken with a session are held
/// only while the session lives. Cheap to clone; the lease is revoked (best effort) when the
/// last clone is dropped, or explicitly with [`Session::close`].
///
/// # Examples
/// ```no_run
/// # async fn demo(client: picket_client::Client) -> Result<(), picket_client::Error> {
/// use picket_client::Session;
///
/// let session = Session::new(&client, 10).await?;
/// tokio::select! {
///     reason = session.lost() => eprintln!("session lost: {reason:?}; stop working"),
///     _ = tokio::time::sleep(std::time::Duration::from_secs(30)) => {}
/// }
/// session.close().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    lease: i64,
    ttl: i64,
    owned: bool,
    state: watch::Receiver<State>,
    keeper: JoinHandle<()>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// When the session will declare itself lost unless a keep-alive succeeds first.
    deadline: Instant,
    lost: Option<LostReason>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &format_args!("{:x}", self.inner.lease))
            .field("ttl", &self.inner.ttl)
            .field("lost", &self.inner.state.borrow().lost)
            .finish()
    }
}

impl Session {
    /// Grants a lease of `ttl` seconds and keeps it alive.
    pub async fn new(client: &Client, ttl: i64) -> Result<Self, Error> {
        Self::with_options(client, SessionOptions::new(ttl)).await
    }

    /// A session with options.
    pub async fn with_options(client: &Client, opts: SessionOptions) -> Result<Self, Error> {
        let sent = Instant::now();
        let (lease, ttl, owned) = match opts.lease {
            Some(id) => (id, client.lease_keep_alive_once(id).await?, false),
            None => {
                let resp = client.lease_grant(opts.ttl, 0).await?;
                (resp.id, resp.ttl, true)
            }
        };
        let ttl_d = Duration::from_secs(ttl.max(1) as u64);
        let margin = opts
            .safety_margin
            .unwrap_or_else(|| (ttl_d / 10).max(Duration::from_millis(500)))
            .min(ttl_d / 2);
        let (tx, rx) = watch::channel(State { deadline: sent + ttl_d - margin, lost: None });
        let keeper = tokio::spawn(keep_alive(client.clone(), lease, ttl_d, margin, tx));
        Ok(Session {
            inner: Arc::new(Inner { client: client.clone(), lease, ttl, owned, state: rx, keeper }),
        })
    }

    /// The lease id. Attach keys to it with [`PutOptions::lease`](crate::PutOptions::lease).
    pub fn lease_id(&self) -> i64 {
        self.inner.lease
    }

    /// The TTL the server granted, in seconds.
    pub fn ttl(&self) -> i64 {
        self.inner.ttl
    }

    /// The client this session belongs to.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Whether the session is lost.
    pub fn is_lost(&self) -> bool {
        self.inner.state.borrow().lost.is_some()
    }

    /// When the session will declare itself lost unless a keep-alive succeeds before then.
    pub fn deadline(&self) -> Instant {
        self.inner.state.borrow().deadline
    }

    /// Resolves when the session is lost (at once if it already is). Cancellation-safe: drop
    /// it and call again freely.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.inner.state.clone();
        let reason = match rx.wait_for(|s| s.lost.is_some()).await {
            Ok(s) => s.lost.unwrap_or(LostReason::Closed),
            // The keeper task is gone without saying why: treat as lost.
            Err(_) => LostReason::Closed,
        };
        reason
    }

    /// Fails with [`Error::SessionLost`] if the session is lost.
    pub fn check(&self) -> Result<(), Error> {
        if self.is_lost() {
            Err(Error::SessionLost(self.inner.lease))
        } else {
            Ok(())
        }
    }

    /// Stops the keep-alives and revokes the lease (unless it was given in
    /// [`SessionOptions::lease`]), which deletes every key attached to it, locks included.
    pub async fn close(self) -> Result<(), Error> {
        self.inner.keeper.abort();
        if self.inner.owned {
            match self.inner.client.lease_revoke(self.inner.lease).await {
                Ok(_) | Err(Error::LeaseNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.keeper.abort();
        if !self.owned {
            return;
        }
        // Best effort: revoke now rather than let the lease run out its TTL, so locks held
        // under it are handed over at once. Without a runtime, the TTL does it.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let lease = self.lease;
            rt.spawn(async move {
                let _ = client.lease_revoke(lease).await;
            });
        }
    }
}

/// Pause after a failed keep-alive attempt before the next. Short compared with any TTL (the
/// minimum is 2 s), so a failover to another endpoint fits well inside the safety deadline.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The keeper: renews every third of the TTL, moves the deadline on each success, and
/// declares the session lost on a TTL-0 answer or when the deadline passes.
async fn keep_alive(
    client: Client,
    lease: i64,
    ttl: Duration,
    margin: Duration,
    tx: watch::Sender<State>,
) {
    let period = ttl / 3;
    let mut stream: Option<(usize, KeepAliveStream)> = None;
    let mut next = Instant::now() + period;
    loop {
        let deadline = tx.borrow().deadline;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                tx.send_modify(|s| s.lost = Some(LostReason::KeepAliveDeadline));
                return;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        // Bounded by the attempt timeout (so a silent endpoint costs one attempt, then the
        // next endpoint is tried) and by the deadline (an attempt must not outlive the
        // session's validity; the select above then declares it lost).
        let budget =
            deadline.saturating_duration_since(sent).min(client.inner.opts.attempt_timeout);
        let attempt = tokio::time::timeout(budget, renew(&client, &mut stream, lease)).await;
        match attempt {
            Ok(Ok(granted)) if granted > 0 => {
                let ttl_now = Duration::from_secs(granted as u64);
                tx.send_modify(|s| s.deadline = sent + ttl_now - margin.min(ttl_now / 2));
                next = sent + period;
            }
            Ok(Ok(_)) => {
                tx.send_modify(|s| s.lost = Some(LostReason::Expired));
                return;
            }
            Ok(Err(_)) | Err(_) => {
                if let Some((idx, _)) = stream.take() {
                    client.inner.pool.avoid(idx);
                }
                next = Instant::now() + RETRY_PAUSE;
            }
        }
    }
}

/// One keep-alive on the open stream, opening one (on the client's current endpoint order) if
/// needed. Errors drop the stream; the next call opens one on the next endpoint.
async fn renew(
    client: &Client,
    stream: &mut Option<(usize, KeepAliveStream)>,
    lease: i64,
) -> Result<i64, ()> {
    let pool = &client.inner.pool;
    if let Some((idx, s)) = stream.as_mut() {
        return match s.keep_alive(lease).await {
            Ok(ttl) => Ok(ttl),
            Err(_) => {
                pool.avoid(*idx);
                *stream = None;
                Err(())
            }
        };
    }
    for idx in pool.order() {
        let Ok(ch) = pool.channel(idx).await else {
            pool.avoid(idx);
            continue;
        };
        match KeepAliveStream::open(ch, lease).await {
            Ok((s, ttl)) => {
                *stream = Some((idx, s));
                return Ok(ttl);
            }
            Err(_) => pool.avoid(idx),
        }
    }
    Err(())
}
