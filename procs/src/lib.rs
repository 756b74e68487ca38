//! Process plumbing shared by everything that starts `picketd` (or etcd) as a child process: the
//! end-to-end tests (`tests/`), the fault harness (`jepsen/`) and the test suites of the client
//! and the CLI.
//!
//! - [`signal`]: signals by PID through kill(2), so nothing depends on a `kill` binary (a new
//!   machine without `procps` has none) and nothing is ever addressed by name.
//! - [`ports`]: loopback ports below the ephemeral range, reserved across processes with a lock
//!   file, so two test processes never pick the same port and no test ever takes etcd's default
//!   2379/2380 (those belong to whatever etcd the developer runs).
//! - [`tools`]: the system tools the tests need (etcd, etcdctl, libfaketime, iptables, `ip`), found
//!   the way `scripts/setup-deps.sh` installs them. A missing tool is an error that names the tool
//!   and its Debian package: a test that cannot run fails, it never passes by skipping.
//! - [`guard`]: children that die with the process that started them, even when it is SIGKILLed.
//! - [`logs`]: the tail of a member's log file, for failure reports.
//! - [`child`]: one managed server process: start with the guard, pause, resume, SIGTERM with a
//!   bounded wait, SIGKILL, by PID only; and the bounded readiness loop. The tests' `Cluster`,
//!   the harness's `ProcessCluster` and `picket local-cluster` are built on it.

pub mod child;
pub mod guard;
pub mod logs;
pub mod ports;
pub mod signal;
pub mod tools;
