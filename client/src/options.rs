//! Connection options.

use std::time::Duration;

/// How a [`Client`](crate::Client) connects and how long it waits.
///
/// The defaults suit a cluster on one network: a dead endpoint is noticed within a few seconds
/// and a request gives up after five.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use picket_client::ConnectOptions;
///
/// let opts = ConnectOptions::default()
///     .with_request_timeout(Duration::from_secs(10))
///     .with_dial_timeout(Duration::from_millis(500));
/// assert_eq!(opts.request_timeout, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Bound on establishing one TCP + HTTP/2 connection to one endpoint.
    pub dial_timeout: Duration,
    /// Bound on one whole request, across every endpoint tried.
    pub request_timeout: Duration,
    /// Bound on one attempt of a request that is safe to retry (a read, a keep-alive), after
    /// which the next endpoint is tried. Writes get the whole request timeout on one endpoint,
    /// since they cannot be retried once sent.
    pub attempt_timeout: Duration,
    /// Interval of HTTP/2 pings on idle connections; with `keep_alive_timeout` this bounds how
    /// long a silently dead connection (a partitioned or paused node) goes unnoticed.
    pub keep_alive_interval: Duration,
    /// How long a ping may go unanswered before the connection is dropped.
    pub keep_alive_timeout: Duration,
    /// How long an endpoint that failed is tried only after the others.
    pub avoid_failed_for: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            dial_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(2),
            keep_alive_interval: Duration::from_secs(2),
            keep_alive_timeout: Duration::from_secs(2),
            avoid_failed_for: Duration::from_secs(2),
        }
    }
}

impl ConnectOptions {
    /// Sets [`ConnectOptions::dial_timeout`].
    pub fn with_dial_timeout(mut self, d: Duration) -> Self {
        self.dial_timeout = d;
        self
    }

    /// Sets [`ConnectOptions::request_timeout`] (and caps the attempt timeout by it).
    pub fn with_request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self.attempt_timeout = self.attempt_timeout.min(d);
        self
    }

    /// Sets [`ConnectOptions::attempt_timeout`].
    pub fn with_attempt_timeout(mut self, d: Duration) -> Self {
        self.attempt_timeout = d;
        self
    }

    /// Sets the HTTP/2 keep-alive ping interval and timeout.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive_interval = interval;
        self.keep_alive_timeout = timeout;
        self
    }
}
