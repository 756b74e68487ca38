//! Password hashing with bcrypt, as etcd does (so an etcd client's pre-hashed `hashedPassword`
//! is accepted unchanged). Called only on the API layer, on the member that received the
//! request, never inside apply: hashing is slow by design and salts are random.
//!
//! The cost is `--bcrypt-cost` (etcd's default 10, the same flag name as etcd). Measured on the
//! 2-core development machine in a debug build, cost 10 takes several hundred milliseconds per
//! hash and per check; tests use 4, the minimum, which takes a few milliseconds.

use super::AuthError;

/// bcrypt's cost bounds.
pub const MIN_COST: u32 = 4;
pub const MAX_COST: u32 = 31;
/// etcd's default (`bcrypt.DefaultCost` in Go).
pub const DEFAULT_COST: u32 = 10;
/// bcrypt hashes only the first 72 bytes; refusing longer passwords avoids silently ignoring
/// their tail.
pub const MAX_PASSWORD_BYTES: usize = 72;

/// Hashes `password` with a random salt.
pub fn hash(password: &str, cost: u32) -> Result<String, AuthError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AuthError::PasswordTooLong);
    }
    // The only failures are a cost out of range (validated at startup) and the OS random
    // source failing; both are reported as a failed hash rather than a panic.
    bcrypt::hash(password, cost).map_err(|_| AuthError::InvalidHash)
}

/// Whether `hash` is a bcrypt hash we can verify against.
pub fn is_bcrypt_hash(hash: &str) -> bool {
    hash.parse::<bcrypt::HashParts>().is_ok()
}

/// Whether `password` matches the stored `hash` (constant time in the crate).
pub fn verify(password: &str, hash: &[u8]) -> bool {
    match std::str::from_utf8(hash) {
        Ok(h) => bcrypt::verify(password, h).unwrap_or(false),
        Err(_) => false,
    }
}
