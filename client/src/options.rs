//! Connection options, TLS included.

use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

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
    /// TLS for `https://` endpoints; `None` allows `http://` endpoints only. When set, an
    /// endpoint given as a bare `host:port` means `https://host:port`, as in etcdctl.
    pub tls: Option<TlsOptions>,
    /// Who to authenticate as (`Authenticate`) when the cluster has auth enabled; see
    /// [`ConnectOptions::with_user`].
    pub credentials: Option<crate::Credentials>,
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
            tls: None,
            credentials: None,
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

    /// Authenticates as `name` with `password` on connect, and sends the token on every
    /// request; an expired token is replaced transparently (see the `auth` module).
    ///
    /// # Examples
    /// ```
    /// use picket_client::ConnectOptions;
    ///
    /// let opts = ConnectOptions::default().with_user("alice", "s3cret");
    /// assert_eq!(opts.credentials.unwrap().user, "alice");
    /// ```
    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(crate::Credentials::new(name, password));
        self
    }

    /// Sets [`ConnectOptions::tls`]: connect to `https://` endpoints (and bare `host:port`
    /// ones) with `tls`.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the HTTP/2 keep-alive ping interval and timeout.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive_interval = interval;
        self.keep_alive_timeout = timeout;
        self
    }
}

/// TLS settings for `https://` endpoints: which CA verifies the servers, which certificate this
/// client presents, and which name the servers' certificates must carry.
///
/// Certificates and keys are PEM bytes, as in the files `openssl`, `cfssl` or etcd's docs
/// produce; read them with [`std::fs::read`].
///
/// # Examples
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use picket_client::{Client, ConnectOptions, TlsOptions};
///
/// let tls = TlsOptions::new()
///     .with_ca_cert(std::fs::read("ca.crt")?)
///     .with_client_cert(std::fs::read("client.crt")?, std::fs::read("client.key")?);
/// let opts = ConnectOptions::default().with_tls(tls);
/// let client = Client::connect_with(["https://10.0.0.1:2379"], opts).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct TlsOptions {
    /// PEM certificate(s) of the CA that signed the servers' certificates. `None` verifies the
    /// servers against the system's trusted roots.
    pub ca_cert: Option<Vec<u8>>,
    /// PEM certificate and PEM private key this client presents, for servers started with
    /// `--client-cert-auth`. `None` presents no certificate.
    pub client_cert_and_key: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the servers' certificates must be valid for, instead of each endpoint's host
    /// (for example when connecting by IP address to servers whose certificates name a DNS
    /// name).
    pub domain: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    // Never prints the private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_cert", &self.ca_cert.as_ref().map(|c| c.len()))
            .field("client_cert", &self.client_cert_and_key.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsOptions {
    /// TLS verified against the system's roots, without a client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`TlsOptions::ca_cert`].
    pub fn with_ca_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_cert = Some(pem.into());
        self
    }

    /// Sets [`TlsOptions::client_cert_and_key`].
    pub fn with_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_cert_and_key = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Sets [`TlsOptions::domain`].
    pub fn with_domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// tonic's form of these settings.
    pub(crate) fn to_tonic(&self) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new();
        cfg = match &self.ca_cert {
            Some(pem) => cfg.ca_certificate(Certificate::from_pem(pem)),
            None => cfg.with_native_roots(),
        };
        if let Some((cert, key)) = &self.client_cert_and_key {
            cfg = cfg.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            cfg = cfg.domain_name(domain.clone());
        }
        cfg
    }
}
