//! Reads at a revision: the visible version of each key, etcd's Range, the revision counters.
//!
//! Everything here takes a `&dyn ReadView`, so the same code serves client reads (an engine
//! snapshot), reads inside an apply batch (overlays over the engine) and ranges inside a txn
//! (which must see the txn's own earlier writes).

use picket_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use picket_proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use picket_proto::mvccpb::KeyValue;
use prost::Message;

use super::error::MvccError;
use super::keys;
use crate::storage::engine::{Cf, KvIter, ReadView};

/// After this many consecutive versions newer than the read revision, re-seek to the read
/// revision instead of stepping. Keeps reads of keys with long histories from costing one step
/// per version.
const RESEEK_AFTER: usize = 16;

/// After this many versions older than a key's visible one, re-seek past the key. Smaller than
/// [`RESEEK_AFTER`]: every remaining version of a resolved key is skipped, so once a key shows
/// more than one older version a seek (about as costly as a handful of steps) is the cheaper
/// way past the rest. A lock's contender key, put and deleted once per hand-off, has one
/// version per acquire, and its queueing txn ranges over the lock's prefix: stepping 16 of them
/// per txn was a tenth of an uncontended lock's CPU (docs/benchmarks.md, "Issue 20, session 26").
const RESEEK_RESOLVED_AFTER: usize = 2;

/// The revision counters as stored: current revision and compacted revision, with etcd's
/// initial values 1 and -1 (never compacted) when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Revisions {
    pub current: i64,
    pub compacted: i64,
}

pub const INITIAL_REVISION: i64 = 1;
pub const NEVER_COMPACTED: i64 = -1;

fn decode_i64(v: &[u8], what: &str) -> Result<i64, MvccError> {
    let buf: [u8; 8] = v
        .try_into()
        .map_err(|_| MvccError::Corrupt(format!("{what} is {} bytes, not 8", v.len())))?;
    Ok(i64::from_be_bytes(buf))
}

/// Reads the revision counters from `Cf::Meta`.
pub fn read_revisions(view: &dyn ReadView) -> Result<Revisions, MvccError> {
    let current = match view.get(Cf::Meta, keys::META_REVISION)? {
        Some(v) => decode_i64(&v, "current revision")?,
        None => INITIAL_REVISION,
    };
    let compacted = match view.get(Cf::Meta, keys::META_COMPACT_REVISION)? {
        Some(v) => decode_i64(&v, "compact revision")?,
        None => NEVER_COMPACTED,
    };
    Ok(Revisions { current, compacted })
}

/// Iterates the live version at `at_rev` of every key in an encoded range: for each user key,
/// the newest record with revision `<= at_rev`, unless that record is a tombstone. Yields the
/// raw `KeyValue` bytes.
pub struct Visible<'v> {
    at_rev: i64,
    inner: KvIter<'v>,
    /// Encoded user key of the record last looked at, and whether its visible version (or
    /// tombstone) has been found already.
    current: Option<(Vec<u8>, bool)>,
    skipped: usize,
}

impl<'v> Visible<'v> {
    pub fn new(view: &'v dyn ReadView, start: &[u8], end: Option<Vec<u8>>, at_rev: i64) -> Self {
        let inner = view.scan(Cf::Kv, start, end.as_deref());
        Self { at_rev, inner, current: None, skipped: 0 }
    }

    /// Live versions of the keys selected by an etcd `(key, range_end)` pair.
    pub fn etcd_range(view: &'v dyn ReadView, key: &[u8], range_end: &[u8], at_rev: i64) -> Self {
        let (start, end) = keys::kv_bounds(key, range_end);
        Self::new(view, &start, end, at_rev)
    }

    fn reseek(&mut self, from: &[u8]) {
        self.inner.seek(from);
        self.skipped = 0;
    }
}

impl Iterator for Visible<'_> {
    type Item = Result<Vec<u8>, MvccError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (k, v) = match self.inner.next()? {
                Ok(kv) => kv,
                Err(e) => return Some(Err(e.into())),
            };
            let Some((enc, rev)) = keys::split_kv_key(&k) else {
                return Some(Err(MvccError::Corrupt(format!("malformed kv key {k:02x?}"))));
            };
            let same_key = self.current.as_ref().is_some_and(|(c, _)| c.as_slice() == enc);
            if !same_key {
                self.current = Some((enc.to_vec(), false));
                self.skipped = 0;
            }
            let resolved = self.current.as_ref().is_some_and(|(_, r)| *r);
            if resolved || rev > self.at_rev {
                self.skipped += 1;
                let limit = if resolved { RESEEK_RESOLVED_AFTER } else { RESEEK_AFTER };
                if self.skipped >= limit {
                    let target = if resolved {
                        keys::versions_end(enc)
                    } else {
                        keys::kv_key_encoded(enc, self.at_rev)
                    };
                    self.reseek(&target);
                }
                continue;
            }
            if let Some((_, r)) = self.current.as_mut() {
                *r = true;
            }
            if v.is_empty() {
                // A tombstone: the key does not exist at `at_rev`.
                continue;
            }
            return Some(Ok(v));
        }
    }
}

pub fn decode_kv(bytes: &[u8]) -> Result<KeyValue, MvccError> {
    Ok(KeyValue::decode(bytes)?)
}

/// The fields of a stored `KeyValue` that a put carries over from the key's previous version.
/// Decoding only these skips the key and the value (prost steps over fields it does not
/// declare), so a put that returns no previous pair allocates and copies neither (issue 20:
/// the previous record's full decode was ~2 % of the members' CPU under 64-client puts). Tags
/// are `mvccpb.KeyValue`'s.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct KvMeta {
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

impl KvMeta {
    pub fn of(kv: &KeyValue) -> Self {
        Self { create_revision: kv.create_revision, version: kv.version, lease: kv.lease }
    }
}

pub fn decode_meta(bytes: &[u8]) -> Result<KvMeta, MvccError> {
    Ok(KvMeta::decode(bytes)?)
}

/// The live version of `key` at `at_rev`, if any.
pub fn get_at(view: &dyn ReadView, key: &[u8], at_rev: i64) -> Result<Option<KeyValue>, MvccError> {
    get_encoded_at(view, &keys::encode_user_key(key), key, at_rev, decode_kv)
}

/// The live version at `at_rev` of the user key `key`, whose encoding is `enc`, decoded by
/// `decode` (a whole [`KeyValue`], or only its [`KvMeta`]).
pub fn get_encoded_at<T>(
    view: &dyn ReadView,
    enc: &[u8],
    key: &[u8],
    at_rev: i64,
    decode: fn(&[u8]) -> Result<T, MvccError>,
) -> Result<Option<T>, MvccError> {
    // The apply path's view knows each key's newest record without a scan (`mvcc::newest`);
    // it answers a read at a revision at or after that record.
    if let Some(known) = view.first_known(Cf::Kv, enc, &keys::versions_end(enc)) {
        match known? {
            None => return Ok(None),
            Some((k, v)) => {
                let Some((_, rev)) = keys::split_kv_key(&k) else {
                    return Err(MvccError::Corrupt(format!("malformed kv key {k:02x?}")));
                };
                if rev <= at_rev {
                    // An empty value is a tombstone: the key does not exist at `at_rev`.
                    return if v.is_empty() { Ok(None) } else { Ok(Some(decode(&v)?)) };
                }
            }
        }
    }
    match Visible::etcd_range(view, key, &[], at_rev).next() {
        Some(v) => Ok(Some(decode(&v?)?)),
        None => Ok(None),
    }
}

/// Every live key-value in an etcd `(key, range_end)` range at `at_rev`, in key order.
pub fn range_at(
    view: &dyn ReadView,
    key: &[u8],
    range_end: &[u8],
    at_rev: i64,
) -> Result<Vec<KeyValue>, MvccError> {
    if range_end.is_empty() {
        // One key: `get_at` may know it without a scan.
        return Ok(get_at(view, key, at_rev)?.into_iter().collect());
    }
    Visible::etcd_range(view, key, range_end, at_rev).map(|v| decode_kv(&v?)).collect()
}

/// etcd's Range (`applierV3backend.Range` over `rangeKeys`), served from `view` whose current
/// revision is `current` and compacted revision `compacted`.
pub fn range(
    view: &dyn ReadView,
    req: &RangeRequest,
    current: i64,
    compacted: i64,
) -> Result<RangeResponse, MvccError> {
    if req.revision > current {
        return Err(MvccError::FutureRevision);
    }
    let at_rev = if req.revision <= 0 { current } else { req.revision };
    // Reading exactly at the compaction point is allowed: compaction keeps what it shows.
    if at_rev < compacted {
        return Err(MvccError::Compacted);
    }

    let sort_order = SortOrder::try_from(req.sort_order).ok();
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // As etcd: with sorting or filtering every key is fetched, then sorted and truncated;
    // otherwise one more than the limit is decoded to learn whether there is `more`.
    let fetch_all = req.sort_order != SortOrder::None as i32 || filtered;
    let cap = if !fetch_all && req.limit > 0 {
        usize::try_from(req.limit).unwrap_or(usize::MAX).saturating_add(1)
    } else {
        usize::MAX
    };

    // `count` is the number of live keys in the range, ignoring limit and filters (etcd).
    let mut count: i64 = 0;
    let mut kvs = Vec::new();
    if req.range_end.is_empty() {
        // One key: `get_at` answers from the apply path's newest-record cache when it can
        // (`mvcc::newest`), without the engine iterator a scan opens. Apply's own point reads
        // (a queue claim checking each in-flight job's claim, a Txn's Get) come here.
        if let Some(kv) = get_at(view, &req.key, at_rev)? {
            count = 1;
            if !req.count_only {
                kvs.push(kv);
            }
        }
    } else {
        for v in Visible::etcd_range(view, &req.key, &req.range_end, at_rev) {
            let v = v?;
            count += 1;
            if !req.count_only && kvs.len() < cap {
                kvs.push(decode_kv(&v)?);
            }
        }
    }

    let keep = |kv: &KeyValue| {
        (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
    };
    if filtered {
        kvs.retain(keep);
    }

    // etcd sorts ascending by default when the target is not the key (keys already come in key
    // order). It does so after the fetch above, which looked at the raw sort order: a non-key
    // target with order NONE and a limit sorts only the first limit + 1 keys (etcd quirk, kept;
    // clients asking for a real sort send ASCEND or DESCEND). Go's sort.Sort is not stable, so
    // etcd leaves the order of ties unspecified; we use a stable sort, so ties stay in key order
    // in both directions. Unknown enum values sort nothing (etcd rejects them in the API layer
    // or panics).
    let target = SortTarget::try_from(req.sort_target).ok();
    let order = match (sort_order, target) {
        (Some(SortOrder::None), Some(t)) if t != SortTarget::Key => Some(SortOrder::Ascend),
        (o, _) => o,
    };
    if let (Some(order @ (SortOrder::Ascend | SortOrder::Descend)), Some(target)) = (order, target)
    {
        let cmp = |a: &KeyValue, b: &KeyValue| match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        };
        if order == SortOrder::Ascend {
            kvs.sort_by(cmp);
        } else {
            kvs.sort_by(|a, b| cmp(b, a));
        }
    }

    let mut more = false;
    if req.limit > 0 {
        let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
        if kvs.len() > limit {
            kvs.truncate(limit);
            more = true;
        }
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header: Some(ResponseHeader { revision: current, ..Default::default() }),
        kvs,
        more,
        count,
    })
}
