//! The endpoint list: one lazily made connection per endpoint, which endpoint to try first, and
//! which ones failed recently.
//!
//! Requests go to the preferred endpoint (the leader when known, since every write and every
//! linearizable read ends there anyway), then to the others in order. An endpoint that failed is
//! moved to the back of the order for [`ConnectOptions::avoid_failed_for`], so a dead or
//! partitioned member costs at most one attempt per that period instead of one per request.

pub(crate) use picket_proto::error_chain;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{Chan, TokenSlot};
use crate::error::Error;
use crate::options::ConnectOptions;

pub(crate) struct Pool {
    members: Vec<Member>,
    preferred: AtomicUsize,
    avoid_for: Duration,
    /// The auth token every connection sends (`crate::auth`); empty without credentials.
    token: TokenSlot,
}

struct Member {
    url: String,
    endpoint: Endpoint,
    /// The connection, made on first use. An async mutex so that concurrent first uses share one
    /// connect instead of racing to make several.
    channel: tokio::sync::Mutex<Option<Channel>>,
    /// Until when this endpoint is tried only after the others.
    avoid_until: Mutex<Option<Instant>>,
}

/// Adds a scheme to a bare `host:port`, as etcdctl does: `https://` when TLS is configured,
/// `http://` otherwise.
pub(crate) fn normalize(url: &str, tls: bool) -> String {
    if url.contains("://") {
        url.to_string()
    } else if tls {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    }
}

/// The endpoint for `url` (already normalised) with the connection options: TLS for an
/// `https://` URL, which therefore needs [`ConnectOptions::tls`]. Without it the endpoint is
/// refused here rather than left to fail at every connect.
pub(crate) fn endpoint(url: &str, opts: &ConnectOptions) -> Result<Endpoint, Error> {
    let invalid = |reason: String| Error::InvalidEndpoint { endpoint: url.to_string(), reason };
    let mut endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| invalid(e.to_string()))?
        .connect_timeout(opts.dial_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(opts.keep_alive_interval)
        .keep_alive_timeout(opts.keep_alive_timeout)
        .keep_alive_while_idle(true);
    if url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")) {
        let tls = opts.tls.as_ref().ok_or_else(|| {
            invalid("an https:// endpoint needs TLS options (ConnectOptions::with_tls)".into())
        })?;
        endpoint = endpoint
            .tls_config(tls.to_tonic())
            .map_err(|e| invalid(format!("TLS options: {}", error_chain(&e))))?;
    }
    Ok(endpoint)
}

impl Pool {
    pub(crate) fn new(urls: &[String], opts: &ConnectOptions) -> Result<Self, Error> {
        if urls.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoints given".into(),
            });
        }
        let mut members = Vec::with_capacity(urls.len());
        for url in urls {
            let url = normalize(url, opts.tls.is_some());
            let endpoint = endpoint(&url, opts)?;
            members.push(Member {
                url,
                endpoint,
                channel: tokio::sync::Mutex::new(None),
                avoid_until: Mutex::new(None),
            });
        }
        Ok(Self {
            members,
            preferred: AtomicUsize::new(0),
            avoid_for: opts.avoid_failed_for,
            token: TokenSlot::default(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    pub(crate) fn url(&self, idx: usize) -> &str {
        &self.members[idx].url
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.url.clone()).collect()
    }

    /// The order in which to try endpoints now: the preferred one first, then the rest in list
    /// order, with recently failed ones last (the longest-avoided one last of all).
    pub(crate) fn order(&self) -> Vec<usize> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let now = Instant::now();
        let mut order: Vec<(Option<Instant>, usize)> = (0..n)
            .map(|i| (first + i) % n)
            .map(|i| {
                let until = *lock(&self.members[i].avoid_until);
                (until.filter(|u| *u > now), i)
            })
            .collect();
        // Stable sort: healthy endpoints (None) keep their rotation order ahead of avoided ones.
        order.sort_by_key(|(until, _)| *until);
        order.into_iter().map(|(_, i)| i).collect()
    }

    pub(crate) fn prefer(&self, idx: usize) {
        self.preferred.store(idx, Ordering::Relaxed);
        *lock(&self.members[idx].avoid_until) = None;
    }

    pub(crate) fn preferred(&self) -> usize {
        self.preferred.load(Ordering::Relaxed) % self.members.len()
    }

    /// Moves `idx` to the back of the order for a while and, if it was preferred, prefers the
    /// next endpoint.
    pub(crate) fn avoid(&self, idx: usize) {
        *lock(&self.members[idx].avoid_until) = Some(Instant::now() + self.avoid_for);
        let n = self.members.len();
        let _ = self.preferred.compare_exchange(
            idx,
            (idx + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The connection to endpoint `idx`, made now if there is none. Connecting is bounded by
    /// the dial timeout; a failure here means no request was sent. The error does not name
    /// the endpoint; callers add it.
    pub(crate) fn token(&self) -> &TokenSlot {
        &self.token
    }

    /// The connection to endpoint `idx` (made on first use), sending the auth token.
    pub(crate) async fn channel(&self, idx: usize) -> Result<Chan, String> {
        let member = &self.members[idx];
        let mut slot = member.channel.lock().await;
        if let Some(ch) = slot.as_ref() {
            return Ok(Chan::new(ch.clone(), self.token.clone()));
        }
        match member.endpoint.connect().await {
            Ok(ch) => {
                *slot = Some(ch.clone());
                Ok(Chan::new(ch, self.token.clone()))
            }
            Err(e) => Err(error_chain(&e)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The guarded values are plain data written in one statement; a panic elsewhere cannot
    // leave them half-updated, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> Pool {
        let urls: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}", 1000 + i)).collect();
        Pool::new(&urls, &ConnectOptions::default()).unwrap()
    }

    #[test]
    fn bare_addresses_get_a_scheme() {
        assert_eq!(normalize("127.0.0.1:2379", false), "http://127.0.0.1:2379");
        assert_eq!(normalize("127.0.0.1:2379", true), "https://127.0.0.1:2379");
        assert_eq!(normalize("https://a:1", false), "https://a:1");
        assert_eq!(normalize("http://a:1", true), "http://a:1");
        assert!(Pool::new(&[], &ConnectOptions::default()).is_err());
    }

    #[test]
    fn https_endpoints_need_tls_options() {
        let err = Pool::new(&["https://127.0.0.1:1".to_string()], &ConnectOptions::default())
            .err()
            .expect("refused");
        assert!(err.to_string().contains("ConnectOptions::with_tls"), "{err}");
        let opts =
            ConnectOptions::default().with_tls(crate::TlsOptions::new().with_ca_cert(
                "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
            ));
        let err = Pool::new(&["https://127.0.0.1:1".to_string()], &opts).err().expect("bad CA");
        assert!(err.to_string().contains("TLS options"), "{err}");
    }

    #[tokio::test]
    async fn failed_endpoints_go_last_and_preference_moves_on() {
        let p = pool(3);
        assert_eq!(p.order(), vec![0, 1, 2]);
        p.avoid(0);
        assert_eq!(p.preferred(), 1);
        assert_eq!(p.order(), vec![1, 2, 0]);
        p.avoid(2);
        assert_eq!(p.order(), vec![1, 0, 2], "the longest-avoided endpoint goes last");
        p.prefer(2);
        assert_eq!(p.order(), vec![2, 1, 0]);
    }
}
