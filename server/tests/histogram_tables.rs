//! openraft 0.10 creates a `base2histogram::Histogram` whenever a `Raft` starts. The crate's
//! published 0.2.3 then builds its lookup tables for all 16 widths at once, ~26 MiB written and
//! so resident in every member, where openraft uses only the default width's few KiB. Picket
//! builds the crate with one table per width made on first use (third_party/README.md); this
//! fails if the eager tables come back (a dependency update that drops the patch).
//!
//! One test in its own file, so it runs in a process of its own under `cargo test` as under
//! nextest: nothing else in the process has built the tables before it measures.

use base2histogram::Histogram;

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

#[test]
fn the_first_histogram_builds_only_the_tables_it_uses() {
    let before = rss_kib();
    let mut h = Histogram::<()>::new();
    h.record(42);
    let grown = rss_kib().saturating_sub(before);
    // The default width's tables are about 6 KiB; the eager ones were ~26 MiB. 2 MiB leaves
    // room for the allocator mapping a fresh page run, and none for the eager tables.
    assert!(grown < 2048, "the first histogram grew the process by {grown} KiB");
}
