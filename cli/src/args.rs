//! The command line: global options, the subcommand list, and value parsers shared by
//! several commands (durations, hex ids). Each command's own flags live next to its code in
//! `cmd/`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::cmd;
use crate::output::Format;

/// The default endpoint, etcd's default client URL.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:2379";

/// The command-line tool for Picket, a Raft-replicated coordination service that speaks the
/// etcd v3 API (so it also works against etcd).
#[derive(Debug, Parser)]
#[command(name = "picket", version, after_long_help = crate::exit::HELP, after_help = crate::exit::HELP)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// Client URLs of some members (host:port, http://host:port or https://host:port),
    /// comma-separated.
    #[arg(
        long,
        global = true,
        env = "PICKET_ENDPOINTS",
        value_delimiter = ',',
        default_value = DEFAULT_ENDPOINT
    )]
    pub endpoints: Vec<String>,
    /// Bound on connecting to one endpoint (e.g. 500ms, 2s).
    #[arg(long, global = true, default_value = "2s", value_parser = parse_duration)]
    pub dial_timeout: Duration,
    /// Bound on one request, across every endpoint tried (e.g. 5s, 1m).
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration)]
    pub command_timeout: Duration,
    /// Output format: human tables, JSON for scripts, or etcdctl-like plain lines.
    #[arg(short = 'w', long = "write-out", global = true, value_enum, default_value_t = Format::Table)]
    pub write_out: Format,
    /// Verify TLS servers with this CA bundle (PEM); turns on TLS for bare host:port endpoints.
    #[arg(long = "cacert", id = "tls_cacert", global = true, env = "PICKET_CACERT")]
    pub cacert: Option<PathBuf>,
    /// Client certificate (PEM) to present to servers that require one (with --key).
    #[arg(long = "cert", id = "tls_cert", global = true, env = "PICKET_CERT")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long = "key", id = "tls_key", global = true, env = "PICKET_KEY")]
    pub key: Option<PathBuf>,
    /// Authenticate as this user: `name` or `name:password` (etcdctl's `--user`). Without a
    /// password here or in --password, it is read from stdin.
    #[arg(long, global = true, env = "PICKET_USER")]
    pub user: Option<String>,
    /// The password of --user (etcdctl's `--password`).
    #[arg(long, global = true, env = "PICKET_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
    /// The TLS options read from --cacert/--cert/--key (filled in by `cmd::run`).
    #[arg(skip)]
    pub tls: Option<picket_client::TlsOptions>,
    /// `(user, password)` from --user/--password (filled in by `cmd::run`).
    #[arg(skip)]
    pub credentials: Option<(String, String)>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Set a key (the value is read from stdin when omitted).
    Put(cmd::kv::PutArgs),
    /// Read a key, a prefix or a range.
    Get(cmd::kv::GetArgs),
    /// Delete a key, a prefix or a range.
    #[command(alias = "delete")]
    Del(cmd::kv::DelArgs),
    /// Run a transaction: compares, then success ops, then failure ops (etcdctl's syntax).
    Txn(cmd::txn::TxnArgs),
    /// Discard the history before a revision.
    #[command(alias = "compaction")]
    Compact(cmd::kv::CompactArgs),
    /// Print changes to a key, a prefix or a range as they happen (resumes across failures).
    Watch(cmd::watch::WatchArgs),
    /// Grant, revoke, renew and inspect leases.
    #[command(subcommand)]
    Lease(cmd::lease::LeaseCmd),
    /// Take a distributed lock; hold it until Ctrl-C, or while a command runs.
    Lock(cmd::lock::LockArgs),
    /// Campaign for leadership of an election, or watch its leaders with --listen.
    Elect(cmd::elect::ElectArgs),
    /// List and change cluster membership.
    #[command(subcommand)]
    Member(cmd::member::MemberCmd),
    /// Per-endpoint status, health and store hash.
    #[command(subcommand)]
    Endpoint(cmd::endpoint::EndpointCmd),
    /// Save a snapshot of a member's store, or restore one into a new data dir.
    #[command(subcommand)]
    Snapshot(cmd::snapshot::SnapshotCmd),
    /// Compact the storage files of each endpoint.
    Defrag(cmd::endpoint::DefragArgs),
    /// Transfer Raft leadership to another member.
    MoveLeader(cmd::endpoint::MoveLeaderArgs),
    /// Cluster alarms.
    #[command(subcommand)]
    Alarm(cmd::endpoint::AlarmCmd),
    /// Durable subscriptions: consumer groups with a committed position.
    #[command(subcommand)]
    Sub(cmd::sub::SubCmd),
    /// Durable work queues: enqueue, claim (fenced, lease-tied), ack, nack, inspect, dead letters.
    #[command(subcommand)]
    Queue(cmd::queue::QueueCmd),
    /// Add, delete, list and inspect users; change passwords; grant and revoke roles.
    #[command(subcommand)]
    User(cmd::auth::UserCmd),
    /// Add, delete, list and inspect roles; grant and revoke key-range permissions.
    #[command(subcommand)]
    Role(cmd::auth::RoleCmd),
    /// Turn authentication on or off, or show whether it is on.
    #[command(subcommand)]
    Auth(cmd::auth::AuthCmd),
    /// Run a three-member cluster on this machine until Ctrl-C.
    LocalCluster(cmd::local_cluster::LocalClusterArgs),
    /// Print a shell completion script (e.g. `picket completion bash > /etc/bash_completion.d/picket`).
    Completion(cmd::completion::CompletionArgs),
}

/// Parses `1500ms`, `2s`, `1.5s`, `3m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration (try 500ms, 2s, 1m)"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        u => return Err(format!("unknown unit {u:?} in {s:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a member or lease id: hexadecimal, as etcdctl prints and takes them (an optional
/// `0x` prefix is accepted).
pub fn parse_hex_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_start_matches("0x");
    u64::from_str_radix(t, 16).map_err(|_| format!("{s:?} is not a hexadecimal id"))
}

/// A lease id in hex (leases are positive `i64`s on the wire).
pub fn parse_lease(s: &str) -> Result<i64, String> {
    let v = parse_hex_u64(s)?;
    i64::try_from(v).map_err(|_| format!("{s:?} is out of range for a lease id"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_and_ids_parse() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("s").is_err());
        assert_eq!(parse_hex_u64("0x1f"), Ok(31));
        assert_eq!(parse_lease("694d5765fc71500b"), Ok(0x694d5765fc71500b));
        assert!(parse_lease("ffffffffffffffff").is_err());
    }
}
