//! One module per command family; `run` dispatches to them. Every command returns the exit
//! code to use on success (almost always 0; `lock -- CMD` passes CMD's through) or an error
//! that `crate::exit` maps to a code.

pub mod auth;
pub mod completion;
pub mod elect;
pub mod endpoint;
pub mod kv;
pub mod lease;
pub mod local_cluster;
pub mod lock;
pub mod member;
pub mod queue;
pub mod signals;
pub mod snapshot;
pub mod sub;
pub mod txn;
pub mod watch;

use anyhow::{Context, Result};
use picket_client::{Client, ConnectOptions};

use crate::args::{Cli, Command, Global};
use crate::output::Format;

/// What every command gets: the global options, and a way to connect.
pub struct Ctx {
    pub global: Global,
}

impl Ctx {
    pub fn format(&self) -> Format {
        self.global.write_out
    }

    pub fn connect_options(&self) -> ConnectOptions {
        let opts = ConnectOptions::default()
            .with_dial_timeout(self.global.dial_timeout)
            .with_request_timeout(self.global.command_timeout);
        let opts = match &self.global.tls {
            Some(tls) => opts.with_tls(tls.clone()),
            None => opts,
        };
        match &self.global.credentials {
            Some((user, password)) => opts.with_user(user.clone(), password.clone()),
            None => opts,
        }
    }

    /// Connects to the cluster through `--endpoints`; fails (exit code 5) if none answers
    /// within the dial timeout.
    pub async fn client(&self) -> Result<Client> {
        Client::connect_with(&self.global.endpoints, self.connect_options())
            .await
            .with_context(|| format!("connecting to {}", self.global.endpoints.join(",")))
    }
}

pub async fn run(cli: Cli) -> Result<u8> {
    let mut global = cli.global;
    global.tls = crate::tls::load(&global)?;
    // `--user name[:password]`, `--password`: etcdctl's precedence (the inline password wins).
    global.credentials = match global.user.clone() {
        Some(u) => Some(match u.split_once(':') {
            Some((name, pw)) => (name.to_string(), pw.to_string()),
            None => {
                let pw = match global.password.clone() {
                    Some(pw) => pw,
                    None => auth::read_password(&format!("Password of {u}:"))?,
                };
                (u, pw)
            }
        }),
        None => None,
    };
    let ctx = Ctx { global };
    // Commands that run until Ctrl-C catch it from the start (see `signals::install`).
    if matches!(
        cli.command,
        Command::Watch(_)
            | Command::Lease(_)
            | Command::Lock(_)
            | Command::Elect(_)
            | Command::LocalCluster(_)
            | Command::Sub(_)
    ) {
        signals::install()?;
    }
    match cli.command {
        Command::Put(a) => kv::put(&ctx, a).await,
        Command::Get(a) => kv::get(&ctx, a).await,
        Command::Del(a) => kv::del(&ctx, a).await,
        Command::Compact(a) => kv::compact(&ctx, a).await,
        Command::Txn(a) => txn::run(&ctx, a).await,
        Command::Watch(a) => watch::run(&ctx, a).await,
        Command::Lease(c) => lease::run(&ctx, c).await,
        Command::Lock(a) => lock::run(&ctx, a).await,
        Command::Elect(a) => elect::run(&ctx, a).await,
        Command::Member(c) => member::run(&ctx, c).await,
        Command::Endpoint(c) => endpoint::run(&ctx, c).await,
        Command::Defrag(a) => endpoint::defrag(&ctx, a).await,
        Command::MoveLeader(a) => endpoint::move_leader(&ctx, a).await,
        Command::Alarm(c) => endpoint::alarm(&ctx, c).await,
        Command::Snapshot(c) => snapshot::run(&ctx, c).await,
        Command::Sub(c) => sub::run(&ctx, c).await,
        Command::Queue(c) => queue::run(&ctx, c).await,
        Command::LocalCluster(a) => local_cluster::run(&ctx, a).await,
        Command::User(c) => auth::user(&ctx, c).await,
        Command::Role(c) => auth::role(&ctx, c).await,
        Command::Auth(c) => auth::auth(&ctx, c).await,
        Command::Completion(a) => completion::run(a),
    }
}
