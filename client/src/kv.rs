//! Key-value requests: get, put, delete, compact, with etcd's options.

use picket_proto::etcdserverpb::kv_client::KvClient;
use picket_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use picket_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse,
};
use picket_proto::mvccpb::KeyValue;

use crate::client::{request, Client, Retry};
use crate::error::Error;

/// The range end that selects every key starting with `prefix` (etcd's `GetPrefixRangeEnd`):
/// the prefix with its last byte below 0xff incremented and the rest dropped, or `\0` ("every
/// key from here on") when the prefix is empty or all 0xff.
///
/// # Examples
/// ```
/// assert_eq!(picket_client::prefix_end(b"job/"), b"job0".to_vec());
/// assert_eq!(picket_client::prefix_end(b"a\xff"), b"b".to_vec());
/// assert_eq!(picket_client::prefix_end(b""), vec![0]);
/// ```
pub use picket_proto::prefix_end;

/// Which keys a request covers: its key alone, or a range starting at it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyRange {
    /// Only the key.
    #[default]
    Key,
    /// Every key starting with the key.
    Prefix,
    /// Every key greater than or equal to the key.
    FromKey,
    /// Keys in `[key, end)`.
    End(Vec<u8>),
}

impl KeyRange {
    /// The wire `range_end` for `key`.
    pub fn range_end(&self, key: &[u8]) -> Vec<u8> {
        match self {
            KeyRange::Key => Vec::new(),
            KeyRange::Prefix => prefix_end(key),
            KeyRange::FromKey => vec![0],
            KeyRange::End(end) => end.clone(),
        }
    }
}

/// The key-range setters shared by [`GetOptions`], [`DeleteOptions`] and
/// [`WatchOptions`](crate::WatchOptions); each has a `range: KeyRange` field.
macro_rules! key_range_setters {
    ($t:ty) => {
        impl $t {
            /// Selects the keys the request covers (see [`KeyRange`](crate::KeyRange)).
            pub fn range(mut self, range: $crate::KeyRange) -> Self {
                self.range = range;
                self
            }
            /// Every key starting with the key.
            pub fn prefix(self) -> Self {
                self.range($crate::KeyRange::Prefix)
            }
            /// Every key greater than or equal to the key.
            pub fn from_key(self) -> Self {
                self.range($crate::KeyRange::FromKey)
            }
            /// Keys in `[key, end)`.
            pub fn range_end(self, end: impl Into<Vec<u8>>) -> Self {
                self.range($crate::KeyRange::End(end.into()))
            }
        }
    };
}
pub(crate) use key_range_setters;

/// How results of a get are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SortBy {
    /// By key.
    Key,
    /// By version.
    Version,
    /// By create revision.
    CreateRevision,
    /// By mod revision.
    ModRevision,
    /// By value.
    Value,
}

/// Options of a get (etcd's `RangeRequest`).
///
/// # Examples
/// ```
/// use picket_client::{GetOptions, SortBy};
///
/// // The ten newest keys under "jobs/", by creation.
/// let opts = GetOptions::new().prefix().sort(SortBy::CreateRevision, false).limit(10);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
pub struct GetOptions {
    pub(crate) range: KeyRange,
    limit: i64,
    revision: i64,
    sort: Option<(SortBy, bool)>,
    serializable: bool,
    keys_only: bool,
    count_only: bool,
    min_mod_revision: i64,
    max_mod_revision: i64,
    min_create_revision: i64,
    max_create_revision: i64,
}

key_range_setters!(GetOptions);

impl GetOptions {
    /// Only the key itself, latest revision, linearizable.
    pub fn new() -> Self {
        Self::default()
    }
    /// At most `n` keys (0: no limit); the response's `more` says whether some were left out.
    pub fn limit(mut self, n: i64) -> Self {
        self.limit = n;
        self
    }
    /// Read the store as of `rev` (0: latest). Fails with [`Error::Compacted`] or
    /// [`Error::FutureRevision`] outside the kept history.
    pub fn revision(mut self, rev: i64) -> Self {
        self.revision = rev;
        self
    }
    /// Sort by `by`, ascending or not.
    pub fn sort(mut self, by: SortBy, ascending: bool) -> Self {
        self.sort = Some((by, ascending));
        self
    }
    /// Serve from the contacted member's local state without confirming leadership: faster,
    /// and possibly stale (never older than what that member has applied).
    pub fn serializable(mut self) -> Self {
        self.serializable = true;
        self
    }
    /// Return keys without values.
    pub fn keys_only(mut self) -> Self {
        self.keys_only = true;
        self
    }
    /// Return only the count.
    pub fn count_only(mut self) -> Self {
        self.count_only = true;
        self
    }
    /// Only keys whose mod revision is in `[min, max]` (0: unbounded).
    pub fn mod_revision_between(mut self, min: i64, max: i64) -> Self {
        self.min_mod_revision = min;
        self.max_mod_revision = max;
        self
    }
    /// Only keys whose create revision is in `[min, max]` (0: unbounded).
    pub fn create_revision_between(mut self, min: i64, max: i64) -> Self {
        self.min_create_revision = min;
        self.max_create_revision = max;
        self
    }

    pub(crate) fn to_request(&self, key: Vec<u8>) -> RangeRequest {
        let (sort_target, sort_order) = match self.sort {
            None => (SortTarget::Key, SortOrder::None),
            Some((by, asc)) => (
                match by {
                    SortBy::Key => SortTarget::Key,
                    SortBy::Version => SortTarget::Version,
                    SortBy::CreateRevision => SortTarget::Create,
                    SortBy::ModRevision => SortTarget::Mod,
                    SortBy::Value => SortTarget::Value,
                },
                if asc { SortOrder::Ascend } else { SortOrder::Descend },
            ),
        };
        RangeRequest {
            range_end: self.range.range_end(&key),
            key,
            limit: self.limit,
            revision: self.revision,
            sort_order: sort_order as i32,
            sort_target: sort_target as i32,
            serializable: self.serializable,
            keys_only: self.keys_only,
            count_only: self.count_only,
            min_mod_revision: self.min_mod_revision,
            max_mod_revision: self.max_mod_revision,
            min_create_revision: self.min_create_revision,
            max_create_revision: self.max_create_revision,
        }
    }
}

/// Options of a put.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    lease: i64,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

impl PutOptions {
    /// A plain put.
    pub fn new() -> Self {
        Self::default()
    }
    /// Attach the key to a lease: it is deleted when the lease ends.
    pub fn lease(mut self, id: i64) -> Self {
        self.lease = id;
        self
    }
    /// Return the previous key-value in the response.
    pub fn prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }
    /// Keep the current value (update only the lease); the key must exist.
    pub fn ignore_value(mut self) -> Self {
        self.ignore_value = true;
        self
    }
    /// Keep the current lease (update only the value); the key must exist.
    pub fn ignore_lease(mut self) -> Self {
        self.ignore_lease = true;
        self
    }

    pub(crate) fn to_request(&self, key: Vec<u8>, value: Vec<u8>) -> PutRequest {
        PutRequest {
            key,
            value,
            lease: self.lease,
            prev_kv: self.prev_kv,
            ignore_value: self.ignore_value,
            ignore_lease: self.ignore_lease,
        }
    }
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    range: KeyRange,
    prev_kv: bool,
}

key_range_setters!(DeleteOptions);

impl DeleteOptions {
    /// Delete only the key.
    pub fn new() -> Self {
        Self::default()
    }
    /// Return the deleted key-values.
    pub fn prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }

    pub(crate) fn to_request(&self, key: Vec<u8>) -> DeleteRangeRequest {
        DeleteRangeRequest { range_end: self.range.range_end(&key), key, prev_kv: self.prev_kv }
    }
}

impl Client {
    /// The key's current value, or `None`. Linearizable.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<KeyValue>, Error> {
        let resp = self.get_with(key, GetOptions::new()).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// Every key starting with `prefix`, in key order. Linearizable.
    pub async fn get_prefix(&self, prefix: impl Into<Vec<u8>>) -> Result<Vec<KeyValue>, Error> {
        Ok(self.get_with(prefix, GetOptions::new().prefix()).await?.kvs)
    }

    /// A get with options; the response carries the header (revision), the keys, `more` and
    /// `count`. Retried on other endpoints until the request timeout (reads are idempotent).
    pub async fn get_with(
        &self,
        key: impl Into<Vec<u8>>,
        opts: GetOptions,
    ) -> Result<RangeResponse, Error> {
        let req = opts.to_request(key.into());
        self.call(Retry::Idempotent, |ch| {
            let req = req.clone();
            async move { Ok(KvClient::new(ch).range(request(req)).await?.into_inner()) }
        })
        .await
    }

    /// Sets `key` to `value`; returns the header whose revision is the write's.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
    ) -> Result<PutResponse, Error> {
        self.put_with(key, value, PutOptions::new()).await
    }

    /// A put with options. Never retried once it may have reached a server: a lost answer is
    /// [`Error::OutcomeUnknown`].
    pub async fn put_with(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        opts: PutOptions,
    ) -> Result<PutResponse, Error> {
        let req = opts.to_request(key.into(), value.into());
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { Ok(KvClient::new(ch).put(request(req)).await?.into_inner()) }
        })
        .await
    }

    /// Deletes `key`; `deleted` in the response is 0 or 1.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<DeleteRangeResponse, Error> {
        self.delete_with(key, DeleteOptions::new()).await
    }

    /// A delete with options (prefix, range, prev_kv).
    pub async fn delete_with(
        &self,
        key: impl Into<Vec<u8>>,
        opts: DeleteOptions,
    ) -> Result<DeleteRangeResponse, Error> {
        let req = opts.to_request(key.into());
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { Ok(KvClient::new(ch).delete_range(request(req)).await?.into_inner()) }
        })
        .await
    }

    /// Discards history before `revision`. With `physical`, returns once the space is
    /// reclaimed.
    pub async fn compact(
        &self,
        revision: i64,
        physical: bool,
    ) -> Result<CompactionResponse, Error> {
        let req = CompactionRequest { revision, physical };
        self.call(Retry::Write, |ch| async move {
            Ok(KvClient::new(ch).compact(request(req)).await?.into_inner())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_options_build_etcds_request() {
        let r = GetOptions::new()
            .prefix()
            .limit(3)
            .revision(7)
            .sort(SortBy::ModRevision, false)
            .serializable()
            .to_request(b"a/".to_vec());
        assert_eq!(r.range_end, b"a0");
        assert_eq!((r.limit, r.revision), (3, 7));
        assert_eq!(r.sort_target, SortTarget::Mod as i32);
        assert_eq!(r.sort_order, SortOrder::Descend as i32);
        assert!(r.serializable);
        assert_eq!(GetOptions::new().from_key().to_request(b"k".to_vec()).range_end, vec![0]);
        assert!(GetOptions::new().to_request(b"k".to_vec()).range_end.is_empty());
    }

    #[test]
    fn prefix_end_handles_ff_bytes() {
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b"a\xff\xff"), b"b".to_vec());
    }
}
