//! Leases: a deterministic table of granted leases, changed only by applied Raft commands.
//!
//! The table knows ids and TTLs; it never reads a clock. Deciding that a lease has expired is
//! the leader's job (a clock-driven task outside apply that proposes a revoke), so every member
//! deletes a lease's keys at the same revision.

mod table;

pub use table::{LeaseError, LeaseTable};
