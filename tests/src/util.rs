//! Small helpers shared by the end-to-end tests: bounded polling, gRPC status assertions and
//! key-value summaries that compare and print well.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use etcd_client::{GetResponse, KeyValue};
use tonic::Code;

/// Pause between attempts of every polling loop in this crate: short enough that tests do not
/// idle, long enough that a loop cannot saturate the 2-core machine.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Calls `f` until it returns `Ok`, for at most `timeout` and at most `timeout / POLL_INTERVAL + 1`
/// attempts; returns the last error, labelled with `what`, if it never succeeds. Each attempt must
/// itself be bounded (every client in this crate has a request timeout), so the total wait is at
/// most `timeout` plus one attempt.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + timeout;
    let max_attempts = timeout.as_millis() / POLL_INTERVAL.as_millis() + 1;
    let mut attempts = 0u128;
    loop {
        attempts += 1;
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if Instant::now() >= deadline || attempts >= max_attempts {
                    bail!(
                        "{what}: still failing after {attempts} attempts over {timeout:?}: {e:#}"
                    );
                }
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The gRPC status inside an `etcd-client` error, if the server answered with one.
pub fn grpc_status(e: &etcd_client::Error) -> Option<&tonic::Status> {
    match e {
        etcd_client::Error::GRpcStatus(s) => Some(s),
        _ => None,
    }
}

/// Asserts that `res` failed with exactly gRPC `code` and `message` (etcd clients match errors by
/// code and exact text, so both are part of the interface).
#[track_caller]
pub fn assert_status<T: fmt::Debug>(res: Result<T, etcd_client::Error>, code: Code, message: &str) {
    match res {
        Ok(v) => panic!("expected error {code:?} {message:?}, got success: {v:?}"),
        Err(e) => match grpc_status(&e) {
            Some(s) => assert_eq!(
                (s.code(), s.message()),
                (code, message),
                "wrong gRPC status (left: got, right: expected)"
            ),
            None => {
                panic!("expected gRPC status {code:?} {message:?}, got a non-status error: {e}")
            }
        },
    }
}

/// A key-value pair with every field, comparable and printable (keys and short values are shown
/// escaped; long values by length and a checksum, so a failing 1 MiB comparison stays readable).
#[derive(Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl Kv {
    /// An expected pair without a lease.
    pub fn new(
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        create: i64,
        modr: i64,
        version: i64,
    ) -> Kv {
        Kv {
            key: key.as_ref().to_vec(),
            value: value.as_ref().to_vec(),
            create_revision: create,
            mod_revision: modr,
            version,
            lease: 0,
        }
    }
}

impl From<&KeyValue> for Kv {
    fn from(kv: &KeyValue) -> Kv {
        Kv {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            version: kv.version(),
            lease: kv.lease(),
        }
    }
}

/// Shows bytes as an escaped string, or by length and a checksum when long.
pub fn show_bytes(b: &[u8]) -> String {
    if b.len() <= 64 {
        format!("\"{}\"", b.escape_ascii())
    } else {
        let sum = b.iter().fold(0u64, |acc, &x| acc.wrapping_mul(31).wrapping_add(u64::from(x)));
        format!("<{} bytes, sum {sum:#x}, starts \"{}\">", b.len(), b[..16].escape_ascii())
    }
}

impl fmt::Debug for Kv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} (create {}, mod {}, ver {}, lease {})",
            show_bytes(&self.key),
            show_bytes(&self.value),
            self.create_revision,
            self.mod_revision,
            self.version,
            self.lease
        )
    }
}

/// All pairs of a range response, in the server's order.
pub fn kvs(resp: &GetResponse) -> Vec<Kv> {
    resp.kvs().iter().map(Kv::from).collect()
}

/// Just the keys of a range response, as strings (lossy), in the server's order.
pub fn keys(resp: &GetResponse) -> Vec<String> {
    resp.kvs().iter().map(|kv| String::from_utf8_lossy(kv.key()).into_owned()).collect()
}

/// The header revision of a response that must have a header.
#[track_caller]
pub fn rev(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("response without a header").revision()
}

/// Standard base64 (RFC 4648, with padding), as `etcdctl -w json` prints bytes.
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
    }
}
