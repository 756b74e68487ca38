//! [`FenceGate`]: the check a resource outside Picket makes before accepting a write.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::client::Client;
use crate::error::Error;
use crate::lock::Fence;

/// A stale token, refused by a [`FenceGate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fencing token {token} is older than {highest}, the highest seen")]
pub struct StaleToken {
    /// The token that was refused.
    pub token: i64,
    /// The highest token the gate has accepted.
    pub highest: i64,
}

/// Guards a resource that Picket does not store (a file, a database row, an external API):
/// it accepts a write only with a token at least as high as any it has accepted before. A lock
/// holder that was paused past its lease and wakes up still carrying its old token is refused,
/// because the next holder's token is higher. This is the check Redlock cannot offer.
///
/// The gate must live with the resource (in the process that owns it), and must be consulted
/// in the same critical section as the write it guards.
///
/// # Examples
/// ```
/// use picket_client::FenceGate;
///
/// let gate = FenceGate::new();
/// assert!(gate.admit(7).is_ok());
/// assert!(gate.admit(9).is_ok());
/// let stale = gate.admit(7).unwrap_err(); // the paused holder of token 7 wakes up
/// assert_eq!(stale.highest, 9);
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicI64,
}

impl FenceGate {
    /// A gate that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    /// A gate that starts from a persisted highest token.
    pub fn starting_at(highest: i64) -> Self {
        Self { highest: AtomicI64::new(highest) }
    }

    /// The highest token accepted so far.
    pub fn highest(&self) -> i64 {
        self.highest.load(Ordering::Acquire)
    }

    /// Accepts `token` if it is at least the highest seen (and records it), else refuses it.
    pub fn admit(&self, token: i64) -> Result<(), StaleToken> {
        let mut seen = self.highest.load(Ordering::Acquire);
        loop {
            if token < seen {
                return Err(StaleToken { token, highest: seen });
            }
            match self.highest.compare_exchange_weak(
                seen,
                token,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => seen = now,
            }
        }
    }

    /// Like [`FenceGate::admit`], but first asks Picket whether the token is still the lock's
    /// current one (`CheckToken`), so a stale holder is refused even before any newer holder
    /// has written. [`Error::Fenced`] when either check fails.
    pub async fn admit_checked(&self, client: &Client, fence: &Fence) -> Result<(), Error> {
        if !client.check_token(fence.name.clone(), fence.token).await? {
            return Err(Error::Fenced(format!(
                "token {} is not the current holder's of lock {}",
                fence.token,
                String::from_utf8_lossy(&fence.name)
            )));
        }
        self.admit(fence.token).map_err(|e| Error::Fenced(e.to_string()))
    }
}
