//! Auth tokens that any member can verify on its own.
//!
//! A token is `v2.<user>.<auth revision>.<issued>.<expiry>.<signature>`: the user name
//! (base64url), the auth revision it was issued at, when it was issued and when it expires in
//! Unix seconds, and an HMAC-SHA256 over all of them plus the user's stored password hash, keyed
//! with the cluster's signing key. The signing key is replicated state (chosen at random by the
//! member that proposed AuthEnable), so every member checks a token with no round trip. Binding
//! the password hash means that deleting a user, re-adding it, or changing its password (each
//! stores a new, freshly salted hash) invalidates every token issued before, as etcd's simple
//! tokens are invalidated. A forged signature, a token past its expiry (`--auth-token-ttl`) or one
//! for a user that no longer exists is "etcdserver: invalid auth token".
//!
//! Clocks: both times come from the issuing member's wall clock, so a member whose clock runs an
//! hour ahead would issue tokens that every other member accepts for an hour longer than
//! `--auth-token-ttl`. A verifier therefore refuses a token issued more than
//! [`CLOCK_TOLERANCE_SECS`] ahead of its own clock: a skewed clock can extend a token's life by
//! at most that much. (A clock running behind only shortens it: the client authenticates again.)
//! Earlier builds issued `v1.<user>.<auth revision>.<expiry>.<signature>`, with no issue time;
//! those are still accepted (with the old rule, expiry only) so that a rolling upgrade does not
//! log every client out; they stop existing `--auth-token-ttl` after the last old member is gone.
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

const VERSION: &str = "v2";
/// Tokens of builds before the issue time was signed (see the module docs).
const V1: &str = "v1";

/// How far ahead of a verifying member's clock a token's issue time may be. Members' clocks are
/// kept within milliseconds by NTP; this leaves room for a member whose clock is being slewed
/// back, while bounding how long past its TTL a skewed member's token can live (by this much).
pub const CLOCK_TOLERANCE_SECS: u64 = 30;

/// The issue time and expiry, in Unix seconds, of a token signed at `now_ms` (Unix
/// milliseconds, the issuing member's clock) that must live `ttl` (at least 1 s).
///
/// A verifier reads its clock in whole seconds, rounded down, and refuses the token from its
/// expiry second on. So the expiry is rounded up: the token lives at least `ttl`, and less than
/// `ttl` + 1 s. An expiry counted from the issue second rounded down let a 1 s token signed at
/// x.999 s live 1 ms. The issue time is rounded down, as a verifier's clock is, for the skew
/// check.
pub fn lifetime(now_ms: u64, ttl: std::time::Duration) -> (u64, u64) {
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1000);
    (now_ms / 1000, now_ms.saturating_add(ttl_ms).div_ceil(1000))
}

/// What a token says, before its signature is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    pub auth_revision: u64,
    /// Unix seconds at which the issuing member signed it (by its clock); `None` for a v1 token.
    pub issued: Option<u64>,
    /// Unix seconds after which the token is refused.
    pub expires: u64,
    signature: Vec<u8>,
}

impl Claims {
    /// How many seconds ahead of `now` the token says it was issued, if it is beyond
    /// [`CLOCK_TOLERANCE_SECS`] (the issuer's clock is ahead of this member's).
    pub fn issued_ahead(&self, now: u64) -> Option<u64> {
        let issued = self.issued?;
        (issued > now.saturating_add(CLOCK_TOLERANCE_SECS)).then(|| issued - now)
    }
}

fn mac(
    key: &[u8],
    user: &str,
    auth_revision: u64,
    issued: Option<u64>,
    expires: u64,
    password_hash: &[u8],
) -> HmacSha256 {
    // HMAC accepts keys of any length; the error arm is unreachable for HMAC.
    let mut m = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    // Length-prefix each field, so no two field tuples share an encoding. A v2 token's fields
    // start with its version, so its MAC never equals a v1 token's (whose first field is the
    // user name, and which has no issue time).
    let issued = issued.map(u64::to_be_bytes);
    let head: &[&[u8]] = match &issued {
        Some(at) => &[VERSION.as_bytes(), user.as_bytes(), &auth_revision.to_be_bytes(), at],
        None => &[user.as_bytes(), &auth_revision.to_be_bytes()],
    };
    for field in head.iter().copied().chain([&expires.to_be_bytes()[..], password_hash]) {
        m.update(&(field.len() as u64).to_be_bytes());
        m.update(field);
    }
    m
}

/// Issues a token for `user` (whose stored hash is `password_hash`), signed at `issued` by this
/// member's clock.
pub fn sign(
    key: &[u8],
    user: &str,
    password_hash: &[u8],
    auth_revision: u64,
    issued: u64,
    expires: u64,
) -> String {
    let sig =
        mac(key, user, auth_revision, Some(issued), expires, password_hash).finalize().into_bytes();
    format!(
        "{VERSION}.{}.{auth_revision}.{issued}.{expires}.{}",
        URL_SAFE_NO_PAD.encode(user.as_bytes()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// A token as builds before v2 issued it (tests of the upgrade path).
#[cfg(test)]
pub fn sign_v1(
    key: &[u8],
    user: &str,
    password_hash: &[u8],
    auth_revision: u64,
    expires: u64,
) -> String {
    let sig = mac(key, user, auth_revision, None, expires, password_hash).finalize().into_bytes();
    format!(
        "{V1}.{}.{auth_revision}.{expires}.{}",
        URL_SAFE_NO_PAD.encode(user.as_bytes()),
        URL_SAFE_NO_PAD.encode(sig)
    )
}

/// Parses a token's fields; the signature is checked by [`verify`].
pub fn parse(token: &str) -> Result<Claims, AuthError> {
    let bad = || AuthError::InvalidAuthToken;
    let mut parts = token.split('.');
    let v2 = match parts.next() {
        Some(VERSION) => true,
        Some(V1) => false,
        _ => return Err(bad()),
    };
    let mut next = || parts.next().ok_or_else(bad);
    let user = String::from_utf8(URL_SAFE_NO_PAD.decode(next()?).map_err(|_| bad())?)
        .map_err(|_| bad())?;
    let auth_revision = next()?.parse().map_err(|_| bad())?;
    let issued = if v2 { Some(next()?.parse().map_err(|_| bad())?) } else { None };
    let expires = next()?.parse().map_err(|_| bad())?;
    let signature = URL_SAFE_NO_PAD.decode(next()?).map_err(|_| bad())?;
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(Claims { user, auth_revision, issued, expires, signature })
}

/// Checks the signature (in constant time), the issue time against this member's clock and the
/// expiry against `now` (Unix seconds, this member's clock).
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
    mac(key, &claims.user, claims.auth_revision, claims.issued, claims.expires, password_hash)
        .verify_slice(&claims.signature)
        .map_err(|_| AuthError::InvalidAuthToken)?;
    // Issued by a clock running ahead of ours: its expiry is just as far ahead (module docs).
    if claims.issued_ahead(now).is_some() {
        return Err(AuthError::InvalidAuthToken);
    }
    if now >= claims.expires {
        return Err(AuthError::InvalidAuthToken);
    }
    Ok(())
}
