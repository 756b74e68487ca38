//! Authentication and role-based access control (etcd's `auth` package): users, roles, key-range
//! permissions, tokens and the replicated auth store.
//!
//! Layers, from the wire down:
//! - `crate::api::auth` serves `etcdserverpb.Auth`, reads the `token` metadata of every request
//!   and checks permissions before anything is proposed.
//! - [`perm`]: what a request needs (READ or WRITE on key ranges) and whether a user's roles
//!   cover it. Pure functions.
//! - [`token`]: HMAC-SHA256 signed tokens that every member can verify without a round trip.
//! - [`password`]: bcrypt hashing and verification. Only ever called on the API layer, on the
//!   member that received the request: apply never hashes (it would be slow and random).
//! - [`store`]: the auth store (`picket.storage.v1.AuthState`) and its deterministic mutations.
//! - [`replicated`]: glue to the state machine: applying `AuthCommand` and `AuthChecked` inside an
//!   apply batch, and the in-memory copy the API layer reads.
//!
//! No openraft imports and no clocks or randomness here outside `token` and `password` (which
//! the API layer calls), so apply stays deterministic.

pub mod error;
pub mod password;
pub mod perm;
pub mod replicated;
pub mod store;
pub mod token;

#[cfg(test)]
mod tests;

pub use error::AuthError;
pub use perm::{KeyRange, Need};
pub use replicated::AuthCache;

/// The role that has every permission (etcd's `root` role), and the user that must hold it
/// before auth can be enabled.
pub const ROOT: &str = "root";
