//! `picket-jepsen`: a Jepsen-style harness for Picket and any etcd-API cluster.
//!
//! It runs real server processes, drives them with concurrent clients, injects faults, records
//! every operation in `history.jsonl`, and checks the history offline. The specification is
//! `shared/specs/harness.md`; `README.md` in this crate says how to run it.
//!
//! Layers, from the bottom:
//! - [`history`]: the event format, the shared writer, the reader and operation pairing.
//! - [`checker`]: offline checkers (linearizability with a WGL search, etcd revisions, locks,
//!   sets), each returning valid / invalid / unknown.
//! - [`cluster`]: starts, kills, pauses and restarts `picketd` (or `etcd`) processes.
//! - [`netns`]: network-namespace mode: one namespace per node, a bridge in the control
//!   namespace where the harness runs, iptables chains for partitions, and the sweep of leftovers.
//! - [`nemesis`]: fault injection behind the [`nemesis::Faults`] and [`nemesis::Nemesis`]
//!   traits, so network faults (namespaces, iptables) can be added beside the process faults.
//! - [`client`]: etcd client calls with bounded time, and the mapping of errors to `fail`
//!   (definitely not applied) or `info` (unknown outcome).
//! - [`workload`]: operation generators (register, set, lock family, lease, watch).
//! - [`runner`]: one test run end to end, and the result folder.
//! - [`availability`]: the end-of-run availability checks (member probes, the healed window).
//! - [`report`]: the self-contained `report.html` of a result folder.

pub mod availability;
pub mod checker;
pub mod client;
pub mod cluster;
pub mod history;
pub mod nemesis;
pub mod netns;
pub mod report;
pub mod runner;
pub mod workload;
