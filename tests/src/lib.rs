//! End-to-end test harness for Picket (test pyramid tier 5 in `STYLE.md`).
//!
//! Tests in `tests/tests/` start **real** `picketd` processes and talk to them only the way a
//! third-party client would: through the `etcd-client` crate and Debian's `etcdctl` 3.4. Nothing
//! here imports server code, so a passing suite means the wire protocol works, not merely that the
//! library does.
//!
//! - [`binary`]: finds the `picketd` executable (`PICKETD_BIN`, else next to the test binary).
//! - [`cluster`]: [`Cluster`] starts N members on free loopback ports in a temporary directory and
//!   controls them as processes (SIGKILL, SIGTERM, SIGSTOP/SIGCONT, restart).
//! - [`etcdctl`]: runs `etcdctl` with a bounded wait and captures its output.
//! - [`http`]: a plain HTTP/1.1 client for the JSON gateway: unary calls and streamed lines.
//! - [`util`]: bounded polling, gRPC status assertions and readable key-value summaries.
//! - [`watch`]: bounded reads of watch streams and readable watch responses and events.
//! - [`writer`]: a background write load whose acknowledged, refused and indeterminate writes
//!   are checked exactly afterwards, and a HashKV agreement check.
//!
//! Because the flags are etcd's, the same suite runs against the reference implementation with
//! `PICKETD_BIN=$(command -v etcd)`; that is how the expectations in these tests were checked.
//!
//! Every wait in this crate is bounded in time, and every retry loop is bounded in count and time,
//! so a wedged server fails a test with a message instead of hanging the suite.

pub mod binary;
pub mod cluster;
pub mod etcdctl;
pub mod http;
pub mod util;
pub mod watch;
pub mod writer;

pub use cluster::{Cluster, ClusterOptions};
pub use util::{assert_status, eventually, kvs, Kv};

/// Installs a `tracing` subscriber that writes through the test harness's captured output, once
/// per test process. `RUST_LOG` selects the level (default `info`).
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // `try_init` fails only if another subscriber is already installed, which is harmless.
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    });
}
