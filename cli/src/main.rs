//! `picket`: the command-line tool for Picket (and any etcd v3 cluster).
//!
//! `main` only parses flags, runs the command on a Tokio runtime and turns the outcome into an
//! exit code. Each command family lives in `cmd/`; everything printed to stdout goes through
//! `output`; the exit codes are in `exit` (and in `picket --help`). See `cli/README.md`.

mod args;
mod cmd;
mod exit;
mod output;
mod tls;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// How long exiting waits for leftover background work (a blocking stdin read, a best-effort
/// release spawned on drop). Commands release what they hold before returning, so this only
/// bounds the exit: nothing correct depends on it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let rt =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("picket: cannot start the async runtime: {e}");
                return ExitCode::from(exit::ERROR);
            }
        };
    let result = rt.block_on(cmd::run(cli));
    rt.shutdown_timeout(SHUTDOWN_GRACE);
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if exit::should_print(&e) {
                eprintln!("picket: {e:#}");
            }
            ExitCode::from(exit::code_of(&e))
        }
    }
}
