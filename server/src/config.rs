//! Server configuration: one clap struct whose flag names match etcd's, so operators and
//! scripts that start etcd can start Picket the same way. Every flag can also come from an
//! environment variable `PICKET_<FLAG>` (etcd uses `ETCD_<FLAG>`).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use thiserror::Error;

use crate::mvcc::retention::Retention;

/// etcd's default member name.
pub const DEFAULT_NAME: &str = "default";
pub const DEFAULT_CLIENT_URL: &str = "http://localhost:2379";
pub const DEFAULT_PEER_URL: &str = "http://localhost:2380";
/// etcd's default `--max-request-bytes`: 1.5 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's defaults: 100 ms heartbeat, 1000 ms election timeout.
pub const DEFAULT_HEARTBEAT_MS: u64 = 100;
pub const DEFAULT_ELECTION_MS: u64 = 1000;
/// Applied entries between snapshots (`--snapshot-count`; etcd 3.2-3.5 default to 100,000, and
/// etcd's snapshot does not copy its store as Picket's does). 100,000 was measured here and not
/// adopted: no gain beyond the spread of rounds (docs/benchmarks.md, "Issue 20, session 24").
pub const DEFAULT_SNAPSHOT_COUNT: u64 = 10_000;
/// The most `--runtime-threads` accepted: far past any core count a member can use, low enough
/// that a typo (an extra digit) is refused instead of starting thousands of threads.
pub const MAX_RUNTIME_THREADS: i64 = 1024;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "picketd",
    version,
    about = "Picket: a Raft-replicated coordination service speaking the etcd v3 API"
)]
pub struct Config {
    /// A YAML file of flags with etcd's key names (`name`, `data-dir`, `initial-cluster`, ...),
    /// read by `crate::config_file`. Flags on the command line override the file.
    #[arg(long = "config-file", env = "PICKET_CONFIG_FILE")]
    pub config_file: Option<PathBuf>,

    /// Human-readable name of this member; also determines its member id.
    #[arg(long, env = "PICKET_NAME", default_value = DEFAULT_NAME)]
    pub name: String,

    /// Where this member keeps its data (Raft log, state machine, snapshots).
    /// Defaults to `<name>.picket` in the working directory.
    #[arg(long = "data-dir", env = "PICKET_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Comma-separated URLs to serve clients on.
    #[arg(long = "listen-client-urls", env = "PICKET_LISTEN_CLIENT_URLS", default_value = DEFAULT_CLIENT_URL)]
    pub listen_client_urls: String,

    /// Comma-separated client URLs advertised to the rest of the cluster and to clients.
    /// Defaults to the listen client URLs.
    #[arg(long = "advertise-client-urls", env = "PICKET_ADVERTISE_CLIENT_URLS")]
    pub advertise_client_urls: Option<String>,

    /// Comma-separated URLs to serve peers (Raft traffic) on.
    #[arg(long = "listen-peer-urls", env = "PICKET_LISTEN_PEER_URLS", default_value = DEFAULT_PEER_URL)]
    pub listen_peer_urls: String,

    /// Comma-separated peer URLs advertised to the rest of the cluster.
    /// Defaults to the listen peer URLs.
    #[arg(long = "initial-advertise-peer-urls", env = "PICKET_INITIAL_ADVERTISE_PEER_URLS")]
    pub initial_advertise_peer_urls: Option<String>,

    /// Initial cluster configuration for bootstrapping: `name1=url1,name2=url2,...`.
    /// Defaults to `<name>=<initial-advertise-peer-urls>` (a single-node cluster).
    #[arg(long = "initial-cluster", env = "PICKET_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,

    /// `new` to bootstrap a new cluster, `existing` to join one (used with member add).
    #[arg(
        long = "initial-cluster-state",
        env = "PICKET_INITIAL_CLUSTER_STATE",
        default_value = "new"
    )]
    pub initial_cluster_state: String,

    /// Token mixed into the cluster id so separate clusters with the same members differ.
    #[arg(
        long = "initial-cluster-token",
        env = "PICKET_INITIAL_CLUSTER_TOKEN",
        default_value = "picket-cluster"
    )]
    pub initial_cluster_token: String,

    /// Raft heartbeat interval in milliseconds.
    #[arg(long = "heartbeat-interval", env = "PICKET_HEARTBEAT_INTERVAL", default_value_t = DEFAULT_HEARTBEAT_MS)]
    pub heartbeat_interval_ms: u64,

    /// Raft election timeout in milliseconds (randomized between this and twice this).
    #[arg(long = "election-timeout", env = "PICKET_ELECTION_TIMEOUT", default_value_t = DEFAULT_ELECTION_MS)]
    pub election_timeout_ms: u64,

    /// Pre-Vote (etcd's `--pre-vote`; on by default, as in etcd 3.5): a member whose election
    /// timer ran out first asks whether it would win, without raising its term, so a member
    /// back from a pause or a partition does not depose a healthy leader. `--pre-vote=false`
    /// turns it off.
    #[arg(long = "pre-vote", env = "PICKET_PRE_VOTE", num_args = 0..=1, default_value_t = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub pre_vote: bool,

    /// Number of applied entries after which a snapshot is taken and the log purged behind it.
    #[arg(long = "snapshot-count", env = "PICKET_SNAPSHOT_COUNT", default_value_t = DEFAULT_SNAPSHOT_COUNT)]
    pub snapshot_count: u64,

    /// Largest client request accepted, in bytes.
    #[arg(long = "max-request-bytes", env = "PICKET_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Largest size of the backend (the state machine's store, not the Raft log) before a
    /// NOSPACE alarm makes the cluster refuse writes that grow it, in bytes. 0 means the
    /// default, 2 GiB (etcd's semantics). See `docs/operations.md`, "Storage quota".
    #[arg(long = "quota-backend-bytes", env = "PICKET_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: u64,

    /// Largest number of operations in one transaction (each branch counted separately).
    #[arg(long = "max-txn-ops", env = "PICKET_MAX_TXN_OPS", default_value_t = DEFAULT_MAX_TXN_OPS)]
    pub max_txn_ops: usize,

    /// Lifetime of an auth token from `Authenticate`, in seconds (etcd's `--auth-token-ttl`,
    /// default 300). Clients re-authenticate when a token expires. See `docs/operations.md`,
    /// "Auth".
    #[arg(long = "auth-token-ttl", env = "PICKET_AUTH_TOKEN_TTL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub auth_token_ttl: u64,

    /// bcrypt cost of stored password hashes, 4 to 31 (etcd's `--bcrypt-cost`, default 10).
    /// Each step doubles the time of every UserAdd, password change and Authenticate; tests use
    /// 4. Hashes keep the cost they were made with.
    #[arg(long = "bcrypt-cost", env = "PICKET_BCRYPT_COST", default_value_t = crate::auth::password::DEFAULT_COST, value_parser = clap::value_parser!(u32).range(4..=31))]
    pub bcrypt_cost: u32,

    /// Default lag bound of subscription groups created without one: a group more than this
    /// many revisions behind the store stops holding compaction back and may lose history.
    /// Written into each group at creation, so members with different flags still apply the
    /// same bound.
    #[arg(long = "sub-max-lag-revisions", env = "PICKET_SUB_MAX_LAG_REVISIONS", default_value_t = crate::subscription::DEFAULT_MAX_LAG_REVISIONS)]
    pub sub_max_lag_revisions: i64,

    /// How `--auto-compaction-retention` is read, as in etcd: `periodic` (a time window) or
    /// `revision` (a number of revisions). See docs/operations.md, "Storage".
    #[arg(
        long = "auto-compaction-mode",
        env = "PICKET_AUTO_COMPACTION_MODE",
        default_value = "periodic"
    )]
    pub auto_compaction_mode: String,

    /// History the leader keeps when it compacts on its own, as in etcd: `0` never (the
    /// default); in periodic mode a whole number of hours (`1`) or a duration (`30m`, `72h`);
    /// in revision mode a number of revisions (`1000`).
    #[arg(
        long = "auto-compaction-retention",
        env = "PICKET_AUTO_COMPACTION_RETENTION",
        default_value = "0"
    )]
    pub auto_compaction_retention: String,

    /// How often a watcher that asked for progress notifications gets one when idle
    /// (etcd's default is 10 minutes). Accepts `500ms`, `30s`, `10m`.
    #[arg(long = "watch-progress-notify-interval", env = "PICKET_WATCH_PROGRESS_NOTIFY_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub watch_progress_notify_interval: Duration,

    /// Watchers one watch stream may hold at once. A create beyond it is answered created and
    /// canceled with a reason, as etcd answers a refused create. Bounds one client's memory on
    /// this member (issue 19); etcd has no such limit.
    #[arg(
        long = "max-watchers-per-stream",
        env = "PICKET_MAX_WATCHERS_PER_STREAM",
        default_value_t = 10_000
    )]
    pub max_watchers_per_stream: usize,

    /// Watch streams this member serves at once; a stream beyond it is refused with
    /// RESOURCE_EXHAUSTED. Each stream buffers at most 4 MiB of responses its client has not
    /// read yet, so this bounds the memory watches can hold.
    #[arg(long = "max-watch-streams", env = "PICKET_MAX_WATCH_STREAMS", default_value_t = 2_048)]
    pub max_watch_streams: usize,

    /// Runtime worker threads serving this member (gRPC, Raft, apply); 0, the default, means
    /// one per core (or `TOKIO_WORKER_THREADS`). Set 1 where several members share a few cores
    /// (a test cluster, the benchmarks): a member then wakes no idle second worker per message,
    /// which cut its CPU per request by 6-11 % with three members on 2 cores, and runs on
    /// tokio's current-thread scheduler, whose task order lets a Raft entry's responses leave
    /// together (up to 20 % less again, session 33). Leave the default on a machine of its
    /// own: one worker cost a lone member a fifth of its reads (`docs/operations.md`, "Tune";
    /// `docs/benchmarks.md`, "Issue 20, session 17").
    #[arg(
        long = "runtime-threads",
        env = "PICKET_RUNTIME_THREADS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u16).range(0..=MAX_RUNTIME_THREADS)
    )]
    pub runtime_threads: u16,

    /// Log filter, in `tracing_subscriber::EnvFilter` syntax (e.g. `info`, `picket_server=debug`).
    /// `rustls` logs at `error` unless this filter names it (see [`Config::log_filter`]).
    #[arg(long = "log-level", env = "PICKET_LOG_LEVEL", default_value = DEFAULT_LOG_LEVEL)]
    pub log_level: String,

    /// `text` for human-readable log lines, `json` for one JSON object per line (for log
    /// shippers). Logs go to stderr either way.
    #[arg(long = "log-format", env = "PICKET_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Comma-separated URLs to serve `/metrics` (Prometheus), `/health`, `/readyz` and `/livez`
    /// on, e.g. `http://127.0.0.1:2381`. None by default, as in etcd. Port 0 picks a free port,
    /// which is logged ("serving metrics").
    #[arg(long = "listen-metrics-urls", env = "PICKET_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,

    /// How long a SIGTERMed leader may spend handing leadership to another member before it
    /// stops anyway. Accepts `500ms`, `5s`. Defaults to 2 s plus 3 election timeouts: a
    /// transfer takes one leader lease (3/4 of an election timeout) plus one election.
    #[arg(long = "shutdown-transfer-timeout", env = "PICKET_SHUTDOWN_TRANSFER_TIMEOUT", value_parser = parse_duration)]
    pub shutdown_transfer_timeout: Option<Duration>,

    /// Certificate (PEM) that client listeners on `https://` URLs present. See `crate::tls`
    /// and `docs/operations.md`, "TLS".
    #[arg(long = "cert-file", env = "PICKET_CERT_FILE")]
    pub cert_file: Option<PathBuf>,

    /// Private key (PEM) of `--cert-file`.
    #[arg(long = "key-file", env = "PICKET_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// CA bundle (PEM) that client certificates must chain to under `--client-cert-auth`.
    #[arg(long = "trusted-ca-file", env = "PICKET_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Refuse TLS clients without a certificate signed by `--trusted-ca-file`.
    /// `--client-cert-auth` and `--client-cert-auth=true` both turn it on.
    #[arg(long = "client-cert-auth", env = "PICKET_CLIENT_CERT_AUTH", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub client_cert_auth: bool,

    /// Certificate (PEM) that peer listeners on `https://` URLs present, and that this member
    /// presents when it dials an `https://` peer.
    #[arg(long = "peer-cert-file", env = "PICKET_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,

    /// Private key (PEM) of `--peer-cert-file`.
    #[arg(long = "peer-key-file", env = "PICKET_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,

    /// CA bundle (PEM) that verifies peers: their server certificates when this member dials
    /// them, and their client certificates under `--peer-client-cert-auth`. Without it, dials
    /// to `https://` peers are verified against the system's roots.
    #[arg(long = "peer-trusted-ca-file", env = "PICKET_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,

    /// Refuse peers that do not present a certificate signed by `--peer-trusted-ca-file`.
    #[arg(long = "peer-client-cert-auth", env = "PICKET_PEER_CLIENT_CERT_AUTH", num_args = 0..=1, default_value_t = false, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub peer_client_cert_auth: bool,
}

/// The format of log lines (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("invalid URL {url:?} in --{flag}: {reason}")]
    BadUrl { flag: &'static str, url: String, reason: String },
    #[error("invalid --initial-cluster entry {0:?}: expected name=url")]
    BadClusterEntry(String),
    #[error("--initial-cluster does not contain this member's name {0:?}")]
    NameNotInCluster(String),
    #[error("--initial-cluster names {0:?} twice")]
    DuplicateName(String),
    #[error("--initial-cluster-state must be `new` or `existing`, not {0:?}")]
    BadClusterState(String),
    #[error("--auto-compaction-mode must be `periodic` or `revision`, not {0:?}")]
    BadCompactionMode(String),
    #[error("--auto-compaction-retention {value:?} in {mode} mode: {reason}")]
    BadCompactionRetention { mode: &'static str, value: String, reason: String },
    #[error("--election-timeout ({election} ms) must be at least 5 times --heartbeat-interval ({heartbeat} ms)")]
    BadTimeouts { heartbeat: u64, election: u64 },
    #[error("--{0} must be greater than zero")]
    Zero(&'static str),
    #[error(
        "{url} in --{url_flag} is https://, which needs --{cert_flag} and --{key_flag} \
         (or use an http:// URL to serve plain text)"
    )]
    TlsWithoutCert {
        url_flag: &'static str,
        url: String,
        cert_flag: &'static str,
        key_flag: &'static str,
    },
    #[error("--{flag} needs --{needs}")]
    FlagNeeds { flag: &'static str, needs: &'static str },
}

/// One member of the initial cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// Parses a duration written as a number and a unit: `ms`, `s`, `m` or `h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?}: missing unit (ms, s, m, h)"))?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("{s:?}: not a whole number"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if d.is_zero() {
        return Err(format!("{s:?}: must be greater than zero"));
    }
    Ok(d)
}

pub(crate) fn split_urls(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_string).collect()
}

/// Resolves an `http://host:port` URL to a socket address to bind.
pub fn url_to_addr(flag: &'static str, url: &str) -> Result<SocketAddr, ConfigError> {
    let bad = |reason: &str| ConfigError::BadUrl {
        flag,
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    match parsed.scheme() {
        "http" => {}
        // TLS listeners and peers; `crate::tls::validate` checks the certificate flags.
        "https" if flag != "listen-metrics-urls" => {}
        "https" => return Err(bad("metrics are served over http:// only")),
        _ => return Err(bad("only http:// and https:// are supported")),
    }
    let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
    let port = parsed.port().ok_or_else(|| bad("no port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(&e.to_string()))?
        .next()
        .ok_or_else(|| bad("host does not resolve"))
}

impl Config {
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| PathBuf::from(format!("{}.picket", self.name)))
    }

    pub fn client_listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        split_urls(&self.listen_client_urls)
            .iter()
            .map(|u| url_to_addr("listen-client-urls", u))
            .collect()
    }

    pub fn peer_listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        split_urls(&self.listen_peer_urls)
            .iter()
            .map(|u| url_to_addr("listen-peer-urls", u))
            .collect()
    }

    pub fn metrics_listen_addrs(&self) -> Result<Vec<SocketAddr>, ConfigError> {
        split_urls(&self.listen_metrics_urls)
            .iter()
            .map(|u| url_to_addr("listen-metrics-urls", u))
            .collect()
    }

    /// The bound on leader transfer at shutdown (see `--shutdown-transfer-timeout`).
    pub fn shutdown_transfer_timeout(&self) -> Duration {
        self.shutdown_transfer_timeout
            .unwrap_or_else(|| Duration::from_secs(2) + 3 * self.election_timeout())
    }

    /// How long `/health`'s linearizable read may take: one election timeout. A healthy leader
    /// confirms a read index in one heartbeat round trip, far below that; a member that cannot
    /// do so within an election timeout is about to see an election or cut off from a quorum.
    pub fn health_read_timeout(&self) -> Duration {
        self.election_timeout()
    }

    pub fn advertise_client_urls(&self) -> Vec<String> {
        split_urls(self.advertise_client_urls.as_deref().unwrap_or(&self.listen_client_urls))
    }

    pub fn advertise_peer_urls(&self) -> Vec<String> {
        split_urls(self.initial_advertise_peer_urls.as_deref().unwrap_or(&self.listen_peer_urls))
    }

    /// Parses `--initial-cluster`, in its order. A name may appear with several URLs
    /// (`a=u1,a=u2`), as in etcd.
    pub fn initial_members(&self) -> Result<Vec<InitialMember>, ConfigError> {
        let spec = match &self.initial_cluster {
            Some(s) => s.clone(),
            None => format!(
                "{}={}",
                self.name,
                self.advertise_peer_urls().join(&format!(",{}=", self.name))
            ),
        };
        let mut members: Vec<InitialMember> = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, url) = entry
                .split_once('=')
                .ok_or_else(|| ConfigError::BadClusterEntry(entry.to_string()))?;
            if name.is_empty() || url.is_empty() {
                return Err(ConfigError::BadClusterEntry(entry.to_string()));
            }
            url_to_addr("initial-cluster", url)?;
            match members.iter_mut().find(|m| m.name == name) {
                Some(m) => m.peer_urls.push(url.to_string()),
                None => members.push(InitialMember {
                    name: name.to_string(),
                    peer_urls: vec![url.to_string()],
                }),
            }
        }
        Ok(members)
    }

    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.election_timeout_ms)
    }

    /// How long a client request may wait for Raft before failing with `request timed out`:
    /// etcd's `5s + 2 * election timeout`, enough to ride out one leader election.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(5) + 2 * self.election_timeout()
    }

    /// Checks everything that can be checked before touching the disk or the network.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.client_listen_addrs()?;
        self.peer_listen_addrs()?;
        self.metrics_listen_addrs()?;
        for u in self.advertise_peer_urls() {
            url_to_addr("initial-advertise-peer-urls", &u)?;
        }
        let members = self.initial_members()?;
        if !members.iter().any(|m| m.name == self.name) {
            return Err(ConfigError::NameNotInCluster(self.name.clone()));
        }
        let mut names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::DuplicateName(w[0].to_string()));
        }
        if self.initial_cluster_state != "new" && self.initial_cluster_state != "existing" {
            return Err(ConfigError::BadClusterState(self.initial_cluster_state.clone()));
        }
        if self.heartbeat_interval_ms == 0 {
            return Err(ConfigError::Zero("heartbeat-interval"));
        }
        if self.election_timeout_ms < 5 * self.heartbeat_interval_ms {
            return Err(ConfigError::BadTimeouts {
                heartbeat: self.heartbeat_interval_ms,
                election: self.election_timeout_ms,
            });
        }
        if self.snapshot_count == 0 {
            return Err(ConfigError::Zero("snapshot-count"));
        }
        if self.max_request_bytes == 0 {
            return Err(ConfigError::Zero("max-request-bytes"));
        }
        if self.max_txn_ops == 0 {
            return Err(ConfigError::Zero("max-txn-ops"));
        }
        if self.max_watchers_per_stream == 0 {
            return Err(ConfigError::Zero("max-watchers-per-stream"));
        }
        if self.max_watch_streams == 0 {
            return Err(ConfigError::Zero("max-watch-streams"));
        }
        crate::tls::validate(self)?;
        if self.sub_max_lag_revisions <= 0 {
            return Err(ConfigError::Zero("sub-max-lag-revisions"));
        }
        self.auto_compaction()?;
        Ok(())
    }

    /// The automatic compaction policy of `--auto-compaction-mode` and
    /// `--auto-compaction-retention`, read as etcd 3.4 reads them: in periodic mode a bare
    /// number is hours.
    pub fn auto_compaction(&self) -> Result<Retention, ConfigError> {
        let value = self.auto_compaction_retention.trim();
        let bad = |mode, reason: String| ConfigError::BadCompactionRetention {
            mode,
            value: value.to_string(),
            reason,
        };
        match self.auto_compaction_mode.trim() {
            "periodic" => {
                if let Ok(hours) = value.parse::<u64>() {
                    return Ok(match hours {
                        0 => Retention::Off,
                        h => Retention::Periodic(Duration::from_secs(h.saturating_mul(3600))),
                    });
                }
                match parse_duration(value) {
                    Ok(d) => Ok(Retention::Periodic(d)),
                    Err(e) => Err(bad("periodic", format!("{e}; or a whole number of hours"))),
                }
            }
            "revision" => match value.parse::<i64>() {
                Ok(0) => Ok(Retention::Off),
                Ok(n) if n > 0 => Ok(Retention::Revisions(n)),
                _ => Err(bad("revision", "expected a whole number of revisions".to_string())),
            },
            other => Err(ConfigError::BadCompactionMode(other.to_string())),
        }
    }
}

/// `--log-level` when none is given: lifecycle and warnings, without openraft's per-step info.
/// openraft 0.10's heartbeat worker warns on every failed heartbeat, ten times a second per
/// unreachable peer; a peer that is down already shows in the replication errors and in the
/// metrics, so by default only its errors are kept.
pub const DEFAULT_LOG_LEVEL: &str = "info,openraft=warn,openraft::core::heartbeat=error";

/// Directives added under every `--log-level` that does not name their target. rustls warns,
/// once per connection, about each TLS client that sends an IP address as SNI (which TLS
/// forbids, and which many clients do when dialled by address); the handshake goes on
/// regardless, so at `warn` those lines only bury the ones an operator must read.
const QUIET_TARGETS: &[(&str, &str)] = &[("rustls", "error")];

impl Config {
    /// The tracing filter `picketd` runs with: `--log-level`, plus [`QUIET_TARGETS`] for the
    /// targets it does not mention (a user who writes `rustls=warn` gets rustls' warnings).
    pub fn log_filter(&self) -> String {
        let mut filter = self.log_level.trim().to_string();
        for (target, level) in QUIET_TARGETS {
            let named = filter.split(',').any(|d| {
                let t = d.trim().split(['=', '[']).next().unwrap_or("");
                t == *target || t.starts_with(&format!("{target}::"))
            });
            if !named {
                if !filter.is_empty() {
                    filter.push(',');
                }
                filter.push_str(&format!("{target}={level}"));
            }
        }
        filter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a `warn` event of `target` gets through `filter` (as `picketd` installs it).
    fn warns(filter: &str, target_is_rustls: bool) -> bool {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        use tracing_subscriber::layer::SubscriberExt;

        struct Count(Arc<AtomicUsize>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
            fn on_event(
                &self,
                _: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let seen = Arc::new(AtomicUsize::new(0));
        let filter = tracing_subscriber::EnvFilter::try_new(filter).expect("valid filter");
        let sub = tracing_subscriber::registry().with(filter).with(Count(seen.clone()));
        tracing::subscriber::with_default(sub, || {
            // rustls' own target for its SNI warning (`log` records keep the module path).
            if target_is_rustls {
                tracing::warn!(target: "rustls::msgs::handshake", "illegal SNI");
            } else {
                tracing::warn!(target: "picket_server::net", "a warning we keep");
            }
        });
        seen.load(Ordering::SeqCst) > 0
    }

    /// Issue 21, gap 4: by default rustls' per-connection warnings are filtered out, our own
    /// warnings are not, and a filter that names rustls is the user's to keep.
    #[test]
    fn rustls_is_quiet_unless_asked_for() {
        // What `picketd` installed before: `--log-level` verbatim, under which rustls warned.
        assert!(warns(DEFAULT_LOG_LEVEL, true), "the old filter was expected to let rustls warn");
        let default = parse(&[]).log_filter();
        assert_eq!(default, "info,openraft=warn,openraft::core::heartbeat=error,rustls=error");
        assert!(!warns(&default, true), "rustls warns under {default:?}");
        assert!(warns(&default, false), "our warnings are filtered under {default:?}");
        let asked = parse(&["--log-level", "info,rustls=warn"]).log_filter();
        assert_eq!(asked, "info,rustls=warn");
        assert!(warns(&asked, true));
        let module = parse(&["--log-level", "debug,rustls::server=trace"]).log_filter();
        assert_eq!(module, "debug,rustls::server=trace");
        assert_eq!(parse(&["--log-level", "warn"]).log_filter(), "warn,rustls=error");
    }

    fn parse(args: &[&str]) -> Config {
        Config::parse_from(std::iter::once("picketd").chain(args.iter().copied()))
    }

    #[test]
    fn runtime_threads_default_to_one_per_core_and_are_bounded() {
        assert_eq!(parse(&[]).runtime_threads, 0, "0 means tokio's default, one per core");
        assert_eq!(parse(&["--runtime-threads", "1"]).runtime_threads, 1);
        let refused = |v: &str| {
            let flag = format!("--runtime-threads={v}");
            Config::try_parse_from(["picketd", flag.as_str()]).expect_err(v).to_string()
        };
        assert!(refused("1025").contains("--runtime-threads"), "{}", refused("1025"));
        assert!(refused("-1").contains("--runtime-threads"));
        assert!(refused("two").contains("--runtime-threads"));
    }

    #[test]
    fn pre_vote_is_on_unless_turned_off_as_in_etcd() {
        assert!(parse(&[]).pre_vote);
        assert!(parse(&["--pre-vote"]).pre_vote);
        assert!(parse(&["--pre-vote=true"]).pre_vote);
        assert!(!parse(&["--pre-vote=false"]).pre_vote);
        assert!(Config::try_parse_from(["picketd", "--pre-vote=maybe"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn defaults_form_a_single_node_cluster() {
        let c = parse(&[]);
        c.validate().expect("defaults are valid");
        let m = c.initial_members().expect("members");
        assert_eq!(
            m,
            vec![InitialMember {
                name: "default".into(),
                peer_urls: vec![DEFAULT_PEER_URL.into()]
            }]
        );
        assert_eq!(c.data_dir(), PathBuf::from("default.picket"));
    }

    #[test]
    fn three_node_cluster_and_errors() {
        let c = parse(&[
            "--name",
            "b",
            "--initial-cluster",
            "a=http://127.0.0.1:1,b=http://127.0.0.1:2,c=http://127.0.0.1:3",
            "--listen-peer-urls",
            "http://127.0.0.1:2",
        ]);
        c.validate().expect("valid");
        assert_eq!(c.initial_members().expect("members").len(), 3);
        let bad = parse(&["--name", "z", "--initial-cluster", "a=http://127.0.0.1:1"]);
        assert!(matches!(bad.validate(), Err(ConfigError::NameNotInCluster(_))));
        let bad = parse(&["--initial-cluster", "default"]);
        assert!(matches!(bad.validate(), Err(ConfigError::BadClusterEntry(_))));
        let bad = parse(&["--listen-client-urls", "ftp://127.0.0.1:5"]);
        assert!(matches!(bad.validate(), Err(ConfigError::BadUrl { .. })));
        let bad = parse(&["--election-timeout", "200"]);
        assert!(matches!(bad.validate(), Err(ConfigError::BadTimeouts { .. })));
        let bad = parse(&["--listen-metrics-urls", "http://127.0.0.1"]);
        assert!(matches!(bad.validate(), Err(ConfigError::BadUrl { .. })));
    }

    #[test]
    fn observability_flags() {
        let c = parse(&[]);
        assert!(c.metrics_listen_addrs().expect("none").is_empty());
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.shutdown_transfer_timeout(), Duration::from_secs(5));
        let c = parse(&[
            "--listen-metrics-urls",
            "http://127.0.0.1:2381,http://127.0.0.1:0",
            "--log-format",
            "json",
            "--shutdown-transfer-timeout",
            "1s",
        ]);
        c.validate().expect("valid");
        assert_eq!(c.metrics_listen_addrs().expect("addrs").len(), 2);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.shutdown_transfer_timeout(), Duration::from_secs(1));
    }

    /// etcd's readings of the two flags, and a clear refusal of everything else.
    #[test]
    fn auto_compaction_reads_the_flags_as_etcd_does() {
        let policy = |args: &[&str]| parse(args).auto_compaction();
        let hour = Duration::from_secs(3600);
        assert_eq!(policy(&[]).unwrap(), Retention::Off);
        // `--flag=value`: clap would take a value of `-1` for a flag.
        let periodic = |v: &str| policy(&[format!("--auto-compaction-retention={v}").as_str()]);
        assert_eq!(periodic("0").unwrap(), Retention::Off);
        assert_eq!(periodic("1").unwrap(), Retention::Periodic(hour));
        assert_eq!(periodic("72").unwrap(), Retention::Periodic(72 * hour));
        assert_eq!(periodic("30m").unwrap(), Retention::Periodic(hour / 2));
        assert_eq!(periodic("5s").unwrap(), Retention::Periodic(Duration::from_secs(5)));
        let revision = |v: &str| {
            let retention = format!("--auto-compaction-retention={v}");
            policy(&["--auto-compaction-mode", "revision", retention.as_str()])
        };
        assert_eq!(revision("1000").unwrap(), Retention::Revisions(1000));
        assert_eq!(revision("0").unwrap(), Retention::Off);
        for (e, want) in [
            (periodic("soon").unwrap_err(), "\"soon\" in periodic mode"),
            (periodic("-1").unwrap_err(), "periodic mode"),
            (revision("30m").unwrap_err(), "whole number of revisions"),
            (revision("-5").unwrap_err(), "whole number of revisions"),
            (
                policy(&["--auto-compaction-mode", "hourly"]).unwrap_err(),
                "`periodic` or `revision`",
            ),
        ] {
            assert!(e.to_string().contains(want), "{e}");
        }
        // `validate` refuses what `auto_compaction` refuses, so a bad value stops the start.
        let c = parse(&["--auto-compaction-retention", "soon"]);
        assert!(c.validate().unwrap_err().to_string().contains("auto-compaction-retention"));
    }
}
