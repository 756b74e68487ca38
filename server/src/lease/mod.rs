//! Leases: a deterministic table of granted leases, changed only by applied Raft commands, and
//! the leader's clock that decides when they expire.
//!
//! The table ([`LeaseTable`]) knows ids and TTLs and never reads a clock. Deciding that a lease
//! has expired is the leader's job ([`LeaseClock`], driven by a task outside apply), which then
//! proposes a revoke, so every member deletes a lease's keys at the same revision.

mod keeper;
mod table;

pub use keeper::LeaseClock;
pub use table::{LeaseError, LeaseTable, MAX_TTL_SECONDS, MIN_TTL_SECONDS};
