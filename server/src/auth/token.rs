//! Auth tokens that any member can verify on its own.
//!
//! A token is `v1.<user>.<auth revision>.<expiry>.<signature>`: the user name (base64url), the
//! auth revision it was issued at, its expiry in Unix seconds, and an HMAC-SHA256 over all three
//! plus the user's stored password hash, keyed with the cluster's signing key. The signing key is
//! replicated state (chosen at random by the member that proposed AuthEnable), so every member
//! checks a token with no round trip. Binding the password hash means that deleting a user,
//! re-adding it, or changing its password (each stores a new, freshly salted hash) invalidates
//! every token issued before, as etcd's simple tokens are invalidated. A forged signature, a
//! token past its expiry (`--auth-token-ttl`) or one for a user that no longer exists is
//! "etcdserver: invalid auth token".
//!
//! The auth revision in the token is not what permissions are checked against (they are always
//! checked against the member's current auth store); it tells a lagging member that it must
//! catch up before it can judge the token.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::AuthError;

type HmacSha256 = Hmac<Sha256>;

const VERSION: &str = "v1";

/// What a token says, before its signature is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    pub auth_revision: u64,
    /// Unix seconds after which the token is refused.
    pub expires: u64,
    signature: Vec<u8>,
}

fn mac(
    key: &[u8],
    user: &str,
    auth_revision: u64,
    expires: u64,
    password_hash: &[u8],
) -> HmacSha256 {
    // HMAC accepts keys of any length; the error arm is unreachable for HMAC.
    let mut m = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    // Length-prefix each field, so no two field tuples share an encoding.
    for field in
        [user.as_bytes(), &auth_revision.to_be_bytes(), &expires.to_be_bytes(), password_hash]
    {
        m.update(&(field.len() as u64).to_be_bytes());
        m.update(field);
    }
    m
}

/// Issues a token for `user` (whose stored hash is `password_hash`).
pub fn sign(
    key: &[u8],
    user: &str,
    password_hash: &[u8],
    auth_revision: u64,
    expires: u64,
) -> String {
    let sig = mac(key, user, auth_revision, expires, password_hash).finalize().into_bytes();
    format!(
        "{VERSION}.{}.{auth_revision}.{expires}.{}",
        URL_SAFE_NO_PAD.encode(user.as_bytes()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// Parses a token's fields; the signature is checked by [`verify`].
pub fn parse(token: &str) -> Result<Claims, AuthError> {
    let bad = || AuthError::InvalidAuthToken;
    let mut parts = token.split('.');
    if parts.next() != Some(VERSION) {
        return Err(bad());
    }
    let mut next = || parts.next().ok_or_else(bad);
    let user = String::from_utf8(URL_SAFE_NO_PAD.decode(next()?).map_err(|_| bad())?)
        .map_err(|_| bad())?;
    let auth_revision = next()?.parse().map_err(|_| bad())?;
    let expires = next()?.parse().map_err(|_| bad())?;
    let signature = URL_SAFE_NO_PAD.decode(next()?).map_err(|_| bad())?;
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(Claims { user, auth_revision, expires, signature })
}

/// Checks the signature (in constant time) and the expiry against `now` (Unix seconds).
pub fn verify(
    key: &[u8],
    claims: &Claims,
    password_hash: &[u8],
    now: u64,
) -> Result<(), AuthError> {
    if key.is_empty() {
        // No key yet (a store restored from etcd before its first Authenticate): no token was
        // issued, and anyone could compute a MAC under the empty key.
        return Err(AuthError::InvalidAuthToken);
    }
    mac(key, &claims.user, claims.auth_revision, claims.expires, password_hash)
        .verify_slice(&claims.signature)
        .map_err(|_| AuthError::InvalidAuthToken)?;
    if now >= claims.expires {
        return Err(AuthError::InvalidAuthToken);
    }
    Ok(())
}
