//! One client request being applied: Put, DeleteRange and the ops inside a Txn.
//!
//! A [`Request`] writes into its own overlay on top of the apply batch. All its writes share
//! one revision (`begin + 1`), taken only if it changes something. On success the batch absorbs
//! the overlay; on error the overlay is dropped, so a failed request leaves no trace.
//! The semantics are etcd v3.5's `storeTxnWrite` (`put`, `deleteRange`) and the
//! `applierV3backend` methods above it.

use picket_proto::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse,
    ResponseHeader,
};
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::{Event, KeyValue};
use prost::Message;

use super::error::MvccError;
use super::keys;
use super::overlay::{Layered, Overlay};
use super::read;
use super::LeaseLookup;
use crate::storage::engine::{Cf, ReadView};

pub(crate) struct Request<'a> {
    /// The state before this request (engine plus earlier requests of the batch).
    base: &'a dyn ReadView,
    /// This request's writes.
    pub(crate) layer: Overlay,
    /// The store revision before this request.
    pub(crate) begin: i64,
    pub(crate) compacted: i64,
    /// Events of this request, in the order they happened.
    pub(crate) changes: Vec<Event>,
}

pub(crate) fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader { revision, ..Default::default() })
}

impl<'a> Request<'a> {
    pub(crate) fn new(base: &'a dyn ReadView, begin: i64, compacted: i64) -> Self {
        Self { base, layer: Overlay::default(), begin, compacted, changes: Vec::new() }
    }

    /// The state including this request's writes so far.
    pub(crate) fn view(&self) -> Layered<'_> {
        Layered { base: self.base, top: &self.layer }
    }

    /// The revision this request writes at.
    pub(crate) fn write_rev(&self) -> i64 {
        self.begin + 1
    }

    /// The store revision as seen from inside the request: the new one once it wrote
    /// (etcd `storeTxnWrite.Range`).
    pub(crate) fn read_rev(&self) -> i64 {
        if self.changes.is_empty() {
            self.begin
        } else {
            self.begin + 1
        }
    }

    pub(crate) fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        read::range(&self.view(), req, self.read_rev(), self.compacted)
    }

    /// etcd's Put. `check_lease` is set for a standalone Put, which checks the lease before
    /// anything else; inside a txn every put's lease was checked before the first op ran.
    pub(crate) fn put(
        &mut self,
        req: &PutRequest,
        leases: &dyn LeaseLookup,
        check_lease: bool,
    ) -> Result<PutResponse, MvccError> {
        if check_lease && req.lease != 0 && !leases.exists(req.lease) {
            return Err(MvccError::LeaseNotFound(req.lease));
        }
        let rev = self.write_rev();
        let enc = keys::encode_user_key(&req.key);
        // The whole previous pair only when the request returns it or keeps its value;
        // otherwise the three fields a put carries over (`read::KvMeta`).
        let (prev, meta) = if req.prev_kv || req.ignore_value {
            let prev = read::get_encoded_at(&self.view(), &enc, &req.key, rev, read::decode_kv)?;
            let meta = prev.as_ref().map(read::KvMeta::of);
            (prev, meta)
        } else {
            (None, read::get_encoded_at(&self.view(), &enc, &req.key, rev, read::decode_meta)?)
        };
        let (value, lease) = if req.ignore_value || req.ignore_lease {
            let Some(m) = meta.as_ref() else {
                return Err(MvccError::KeyNotFound);
            };
            (
                match prev.as_ref() {
                    Some(p) if req.ignore_value => p.value.clone(),
                    _ => req.value.clone(),
                },
                if req.ignore_lease { m.lease } else { req.lease },
            )
        } else {
            (req.value.clone(), req.lease)
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: meta.as_ref().map_or(rev, |m| m.create_revision),
            mod_revision: rev,
            version: meta.as_ref().map_or(1, |m| m.version + 1),
            value,
            lease,
        };
        self.layer.put(Cf::Kv, keys::kv_key_encoded(&enc, rev), kv.encode_to_vec());
        let old_lease = meta.as_ref().map_or(0, |m| m.lease);
        if old_lease != lease {
            if old_lease != 0 {
                self.layer.delete(Cf::LeaseKeys, keys::lease_key(old_lease, &req.key));
            }
            if lease != 0 {
                self.layer.put(Cf::LeaseKeys, keys::lease_key(lease, &req.key), Vec::new());
            }
        }
        self.changes.push(Event { r#type: EventType::Put as i32, kv: Some(kv), prev_kv: None });
        Ok(PutResponse { header: header(rev), prev_kv: prev.filter(|_| req.prev_kv) })
    }

    /// etcd's DeleteRange: writes a tombstone for every live key in the range.
    pub(crate) fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, MvccError> {
        let rev = self.write_rev();
        let kvs = read::range_at(&self.view(), &req.key, &req.range_end, rev)?;
        for kv in &kvs {
            self.layer.put(Cf::Kv, keys::kv_key(&kv.key, rev), Vec::new());
            if kv.lease != 0 {
                self.layer.delete(Cf::LeaseKeys, keys::lease_key(kv.lease, &kv.key));
            }
            self.changes.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue { key: kv.key.clone(), mod_revision: rev, ..Default::default() }),
                prev_kv: None,
            });
        }
        let deleted = i64::try_from(kvs.len()).unwrap_or(i64::MAX);
        Ok(DeleteRangeResponse {
            // etcd answers the new revision if this or an earlier op of the txn wrote.
            header: header(self.read_rev()),
            deleted,
            prev_kvs: if req.prev_kv { kvs } else { Vec::new() },
        })
    }

    /// Deletes every key attached to `lease` (etcd's lessor revoke: one DeleteRange per key,
    /// in key order, in one write txn).
    pub(crate) fn revoke_lease_keys(&mut self, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
        let user_keys = lease_keys(&self.view(), lease)?;
        for key in &user_keys {
            self.delete_range(&DeleteRangeRequest { key: key.clone(), ..Default::default() })?;
        }
        Ok(user_keys)
    }
}

/// Every user key attached to `lease`, in key order.
pub(crate) fn lease_keys(view: &dyn ReadView, lease: i64) -> Result<Vec<Vec<u8>>, MvccError> {
    let (start, end) = keys::lease_bounds(lease);
    view.scan(Cf::LeaseKeys, &start, end.as_ref().map(|e| e.as_slice()))
        .map(|item| {
            let (k, _) = item?;
            Ok(k[8..].to_vec())
        })
        .collect()
}
