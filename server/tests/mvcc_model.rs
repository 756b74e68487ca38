//! Model test of the MVCC store: random sequences of puts, deletes, txns, compactions, lease
//! revocations, ranges (at current, historical, compacted and future revisions), changelog
//! reads and restarts, checked response by response against a deliberately naive model that
//! keeps a full copy of the key space for every revision.
//!
//! The model shares no code with the store. It runs on `MemEngine` (many cases) and on
//! `RocksEngine` in a temporary directory (fewer cases; a restart drops and reopens the
//! database). The key alphabet is small and contains `0x00` and `0xFF` bytes, so keys collide,
//! prefixes nest and the key encoding is exercised.

use std::collections::BTreeMap;

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::response_op::Response;
use picket_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, DeleteRangeResponse,
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp,
    TxnRequest, TxnResponse,
};
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::{Event, KeyValue};
use picket_server::mvcc::{validate, MvccError, MvccStore};
use picket_server::storage::engine::{Cf, Engine, MemEngine};
use picket_server::storage::rocks::RocksEngine;
use proptest::prelude::*;
use proptest::sample::select;

const KEYS: &[&[u8]] =
    &[b"a", b"a\x00", b"a\x00\x00", b"ab", b"b", b"\x00", b"\x00\xff", b"\xff", b"\xff\x00"];
const RANGE_ENDS: &[&[u8]] = &[b"", b"", b"\x00", b"a\x01", b"b", b"c", b"\xff", b"\xff\x01", b"a"];
const VALUES: &[&[u8]] = &[b"", b"x", b"y", b"zz"];
/// 7 and 8 exist; 99 does not.
const LEASE_IDS: &[i64] = &[0, 0, 7, 8, 99];

fn lease_exists(id: i64) -> bool {
    id == 7 || id == 8
}

// ------------------------------------------------------------------------------------------
// The model.
// ------------------------------------------------------------------------------------------

type State = BTreeMap<Vec<u8>, KeyValue>;

#[derive(Clone, Debug)]
struct Model {
    /// `history[r]` is the key space at revision `r` (index 0 is unused).
    history: Vec<State>,
    /// `events[r]` are the events of revision `r`.
    events: Vec<Vec<Event>>,
    compacted: i64,
}

fn hdr(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader { revision, ..Default::default() })
}

fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    match end {
        [] => k == key,
        [0] => k >= key,
        e => k >= key && k < e,
    }
}

fn select_kvs(state: &State, key: &[u8], end: &[u8]) -> Vec<KeyValue> {
    state.values().filter(|kv| in_range(&kv.key, key, end)).cloned().collect()
}

fn model_range(state: &State, req: &RangeRequest, header_rev: i64) -> RangeResponse {
    let mut kvs = select_kvs(state, &req.key, &req.range_end);
    let count = kvs.len() as i64;
    if req.count_only {
        kvs.clear();
    }
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    if req.sort_order == 0 && !filtered && req.limit > 0 {
        // etcd decides whether to fetch everything from the raw sort order, before it turns
        // NONE into ASCEND for a non-key target: such a sort only sees limit + 1 keys.
        kvs.truncate(req.limit as usize + 1);
    }
    kvs.retain(|kv| {
        (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
    });
    let target = SortTarget::try_from(req.sort_target).ok();
    let mut order = SortOrder::try_from(req.sort_order).ok();
    if order == Some(SortOrder::None) && target.is_some_and(|t| t != SortTarget::Key) {
        order = Some(SortOrder::Ascend);
    }
    if let (Some(o), Some(t)) = (order, target) {
        let field = |kv: &KeyValue| -> Vec<u8> {
            let int = |i: i64| (i as u64 ^ (1 << 63)).to_be_bytes().to_vec();
            match t {
                SortTarget::Key => kv.key.clone(),
                SortTarget::Version => int(kv.version),
                SortTarget::Create => int(kv.create_revision),
                SortTarget::Mod => int(kv.mod_revision),
                SortTarget::Value => kv.value.clone(),
            }
        };
        match o {
            SortOrder::Ascend => kvs.sort_by_key(field),
            SortOrder::Descend => kvs.sort_by_key(|kv| std::cmp::Reverse(field(kv))),
            SortOrder::None => {}
        }
    }
    let mut more = false;
    if req.limit > 0 && kvs.len() as i64 > req.limit {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        kvs.iter_mut().for_each(|kv| kv.value.clear());
    }
    RangeResponse { header: hdr(header_rev), kvs, more, count }
}

fn model_compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let int = |v: i64| -> i64 {
        match (CompareTarget::try_from(c.target), &c.target_union) {
            (Ok(CompareTarget::Version), Some(TargetUnion::Version(x)))
            | (Ok(CompareTarget::Create), Some(TargetUnion::CreateRevision(x)))
            | (Ok(CompareTarget::Mod), Some(TargetUnion::ModRevision(x)))
            | (Ok(CompareTarget::Lease), Some(TargetUnion::Lease(x))) => v - *x,
            _ => v,
        }
    };
    let diff: i64 = match CompareTarget::try_from(c.target).unwrap() {
        CompareTarget::Version => int(kv.version).signum(),
        CompareTarget::Create => int(kv.create_revision).signum(),
        CompareTarget::Mod => int(kv.mod_revision).signum(),
        CompareTarget::Lease => int(kv.lease).signum(),
        CompareTarget::Value => {
            let v: &[u8] = match &c.target_union {
                Some(TargetUnion::Value(v)) => v,
                _ => b"",
            };
            kv.value.as_slice().cmp(v) as i64
        }
    };
    match CompareResult::try_from(c.result).unwrap() {
        CompareResult::Equal => diff == 0,
        CompareResult::NotEqual => diff != 0,
        CompareResult::Greater => diff > 0,
        CompareResult::Less => diff < 0,
    }
}

fn model_compare(state: &State, c: &Compare) -> bool {
    let kvs = select_kvs(state, &c.key, &c.range_end);
    if kvs.is_empty() {
        return c.target != CompareTarget::Value as i32
            && model_compare_kv(c, &KeyValue::default());
    }
    kvs.iter().all(|kv| model_compare_kv(c, kv))
}

/// One request in progress: a working copy of the current state.
struct Work<'m> {
    model: &'m Model,
    state: State,
    changes: Vec<Event>,
}

impl<'m> Work<'m> {
    fn new(model: &'m Model) -> Self {
        Self { model, state: model.current().clone(), changes: Vec::new() }
    }

    fn begin(&self) -> i64 {
        self.model.rev()
    }

    fn read_rev(&self) -> i64 {
        self.begin() + i64::from(!self.changes.is_empty())
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        let cur = self.read_rev();
        if req.revision > cur {
            return Err(MvccError::FutureRevision);
        }
        let at = if req.revision <= 0 { cur } else { req.revision };
        if at < self.model.compacted {
            return Err(MvccError::Compacted);
        }
        let snap = if at > self.begin() { &self.state } else { &self.model.history[at as usize] };
        Ok(model_range(snap, req, cur))
    }

    fn put(&mut self, p: &PutRequest, check_lease: bool) -> Result<PutResponse, MvccError> {
        if check_lease && p.lease != 0 && !lease_exists(p.lease) {
            return Err(MvccError::LeaseNotFound(p.lease));
        }
        let rev = self.begin() + 1;
        let prev = self.state.get(&p.key).cloned();
        if (p.ignore_value || p.ignore_lease) && prev.is_none() {
            return Err(MvccError::KeyNotFound);
        }
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: prev.as_ref().map_or(rev, |k| k.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(0, |k| k.version) + 1,
            value: if p.ignore_value {
                prev.as_ref().unwrap().value.clone()
            } else {
                p.value.clone()
            },
            lease: if p.ignore_lease { prev.as_ref().unwrap().lease } else { p.lease },
        };
        self.state.insert(p.key.clone(), kv.clone());
        self.changes.push(Event { r#type: EventType::Put as i32, kv: Some(kv), prev_kv: None });
        Ok(PutResponse { header: hdr(rev), prev_kv: if p.prev_kv { prev } else { None } })
    }

    fn delete(&mut self, d: &DeleteRangeRequest) -> DeleteRangeResponse {
        let rev = self.begin() + 1;
        let gone = select_kvs(&self.state, &d.key, &d.range_end);
        for kv in &gone {
            self.state.remove(&kv.key);
            self.changes.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(KeyValue { key: kv.key.clone(), mod_revision: rev, ..Default::default() }),
                prev_kv: None,
            });
        }
        DeleteRangeResponse {
            header: hdr(self.read_rev()),
            deleted: gone.len() as i64,
            prev_kvs: if d.prev_kv { gone } else { vec![] },
        }
    }

    fn txn(&mut self, t: &TxnRequest) -> Result<TxnResponse, MvccError> {
        let pre = self.model.current();
        let mut path = Vec::new();
        path_of(pre, t, &mut path);
        let mut put_err = None;
        walk(t, &mut path.iter().copied(), &mut |op| {
            if let Op::RequestPut(p) = op {
                if put_err.is_none() {
                    if (p.ignore_value || p.ignore_lease) && !pre.contains_key(&p.key) {
                        put_err = Some(MvccError::KeyNotFound);
                    } else if p.lease != 0 && !lease_exists(p.lease) {
                        put_err = Some(MvccError::LeaseNotFound(p.lease));
                    }
                }
            }
        });
        if let Some(e) = put_err {
            return Err(e);
        }
        let (begin, compacted) = (self.begin(), self.model.compacted);
        let mut range_err = None;
        walk(t, &mut path.iter().copied(), &mut |op| {
            if let Op::RequestRange(r) = op {
                if range_err.is_none() && r.revision != 0 {
                    if r.revision > begin {
                        range_err = Some(MvccError::FutureRevision);
                    } else if r.revision < compacted {
                        range_err = Some(MvccError::Compacted);
                    }
                }
            }
        });
        if let Some(e) = range_err {
            return Err(e);
        }
        let mut resp = self.exec(t, &mut path.into_iter())?;
        resp.header = hdr(self.read_rev());
        Ok(resp)
    }

    fn exec(
        &mut self,
        t: &TxnRequest,
        path: &mut impl Iterator<Item = bool>,
    ) -> Result<TxnResponse, MvccError> {
        let ok = path.next().unwrap();
        let mut responses = vec![];
        for op in if ok { &t.success } else { &t.failure } {
            let response = match op.request.as_ref().unwrap() {
                Op::RequestRange(r) => Response::ResponseRange(self.range(r)?),
                Op::RequestPut(p) => Response::ResponsePut(self.put(p, false)?),
                Op::RequestDeleteRange(d) => Response::ResponseDeleteRange(self.delete(d)),
                Op::RequestTxn(n) => Response::ResponseTxn(self.exec(n, path)?),
            };
            responses.push(ResponseOp { response: Some(response) });
        }
        Ok(TxnResponse { header: Some(ResponseHeader::default()), succeeded: ok, responses })
    }

    fn finish(self) -> (State, Vec<Event>) {
        (self.state, self.changes)
    }
}

fn path_of(pre: &State, t: &TxnRequest, path: &mut Vec<bool>) {
    let ok = t.compare.iter().all(|c| model_compare(pre, c));
    path.push(ok);
    for op in if ok { &t.success } else { &t.failure } {
        if let Some(Op::RequestTxn(n)) = &op.request {
            path_of(pre, n, path);
        }
    }
}

fn walk(t: &TxnRequest, path: &mut impl Iterator<Item = bool>, f: &mut impl FnMut(&Op)) {
    let ok = path.next().unwrap();
    for op in if ok { &t.success } else { &t.failure } {
        match op.request.as_ref().unwrap() {
            Op::RequestTxn(n) => walk(n, path, f),
            other => f(other),
        }
    }
}

impl Model {
    fn new() -> Self {
        Self {
            history: vec![State::new(), State::new()],
            events: vec![vec![], vec![]],
            compacted: -1,
        }
    }

    fn rev(&self) -> i64 {
        self.history.len() as i64 - 1
    }

    fn current(&self) -> &State {
        self.history.last().unwrap()
    }

    /// Runs one request; keeps its effects (and takes a revision) only on success with changes.
    fn request<T>(
        &mut self,
        f: impl FnOnce(&mut Work<'_>) -> Result<T, MvccError>,
    ) -> Result<T, MvccError> {
        let mut w = Work::new(self);
        let out = f(&mut w)?;
        let (state, changes) = w.finish();
        if !changes.is_empty() {
            self.history.push(state);
            self.events.push(changes);
        }
        Ok(out)
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        Work::new(self).range(req)
    }

    fn compact(&mut self, rev: i64) -> Result<CompactionResponse, MvccError> {
        if rev <= self.compacted {
            return Err(MvccError::Compacted);
        }
        if rev > self.rev() {
            return Err(MvccError::FutureRevision);
        }
        self.compacted = rev;
        Ok(CompactionResponse { header: hdr(self.rev()) })
    }

    fn revoke(&mut self, lease: i64) -> Vec<Vec<u8>> {
        let keys = self.keys_of_lease(lease);
        self.request(|w| {
            for k in &keys {
                w.delete(&DeleteRangeRequest { key: k.clone(), ..Default::default() });
            }
            Ok(())
        })
        .unwrap();
        keys
    }

    /// How many records each MVCC column family must hold if compaction dropped everything it
    /// may: `(kv, changelog, lease_keys)`. With compaction point `C` (at least 1), `kv` holds
    /// one record per key live at `C` plus one per (key, revision) changed after `C`.
    fn expected_records(&self) -> (usize, usize, usize) {
        let c = self.compacted.max(1);
        let mut kv = self.history[c as usize].len();
        for r in (c + 1)..=self.rev() {
            let keys: std::collections::BTreeSet<&Vec<u8>> =
                self.events[r as usize].iter().map(|e| &e.kv.as_ref().unwrap().key).collect();
            kv += keys.len();
        }
        let changelog = (self.compacted.max(2)..=self.rev()).count();
        let leased = self.current().values().filter(|kv| kv.lease != 0).count();
        (kv, changelog, leased)
    }

    fn keys_of_lease(&self, lease: i64) -> Vec<Vec<u8>> {
        self.current().values().filter(|kv| kv.lease == lease).map(|kv| kv.key.clone()).collect()
    }

    #[allow(clippy::type_complexity)]
    fn events(&self, from: i64, to: i64) -> Result<Vec<(i64, Vec<Event>)>, MvccError> {
        if from < self.compacted {
            return Err(MvccError::Compacted);
        }
        Ok((from.max(2)..=to.min(self.rev()))
            .map(|r| (r, self.events[r as usize].clone()))
            .collect())
    }
}

// ------------------------------------------------------------------------------------------
// Operations and their generators.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum WriteOp {
    Put(PutRequest),
    Delete(DeleteRangeRequest),
    Txn(TxnRequest),
    /// Compact at `current - back`, or at an absolute revision when `abs` is set.
    Compact {
        back: i64,
        abs: Option<i64>,
    },
    Revoke(i64),
    /// A range inside the batch, which must see the batch's earlier writes.
    Range(RangeRequest),
}

#[derive(Clone, Debug)]
enum Step {
    Batch { ops: Vec<WriteOp>, commit: bool, sync: bool },
    Range(RangeRequest),
    Events { from: i64, len: i64 },
    KeysOfLease(i64),
    Restart,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    select(KEYS).prop_map(<[u8]>::to_vec)
}

fn range_end() -> impl Strategy<Value = Vec<u8>> {
    select(RANGE_ENDS).prop_map(<[u8]>::to_vec)
}

fn put_req() -> impl Strategy<Value = PutRequest> {
    (
        key(),
        select(VALUES),
        select(LEASE_IDS),
        any::<bool>(),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(key, value, lease, prev_kv, ignore_value, ignore_lease)| PutRequest {
            key,
            value: if ignore_value { vec![] } else { value.to_vec() },
            lease: if ignore_lease { 0 } else { lease },
            prev_kv,
            ignore_value,
            ignore_lease,
        })
}

fn delete_req() -> impl Strategy<Value = DeleteRangeRequest> {
    (key(), range_end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

fn revision() -> impl Strategy<Value = i64> {
    prop_oneof![4 => Just(0i64), 1 => -2i64..0, 6 => 1i64..30]
}

fn range_req() -> impl Strategy<Value = RangeRequest> {
    let filters = prop_oneof![
        6 => Just((0, 0, 0, 0)),
        1 => (0i64..20, 0i64..20, 0i64..20, 0i64..20),
    ];
    (
        (key(), range_end(), prop_oneof![3 => Just(0i64), 1 => -1i64..5], revision()),
        (
            prop_oneof![8 => 0i32..3, 1 => Just(3i32)],
            prop_oneof![8 => 0i32..5, 1 => Just(7i32)],
            any::<bool>(),
            prop::bool::weighted(0.2),
        ),
        filters,
    )
        .prop_map(
            |((key, range_end, limit, revision), (order, target, keys_only, count_only), f)| {
                RangeRequest {
                    key,
                    range_end,
                    limit,
                    revision,
                    sort_order: order,
                    sort_target: target,
                    serializable: false,
                    keys_only,
                    count_only,
                    min_mod_revision: f.0,
                    max_mod_revision: f.1,
                    min_create_revision: f.2,
                    max_create_revision: f.3,
                }
            },
        )
}

fn compare() -> impl Strategy<Value = Compare> {
    let operand = prop_oneof![
        (0i64..4).prop_map(TargetUnion::Version),
        (0i64..12).prop_map(TargetUnion::CreateRevision),
        (0i64..12).prop_map(TargetUnion::ModRevision),
        select(VALUES).prop_map(|v| TargetUnion::Value(v.to_vec())),
        select(LEASE_IDS).prop_map(TargetUnion::Lease),
    ];
    (0i32..4, 0i32..5, key(), operand, prop_oneof![3 => Just(vec![]), 1 => range_end()]).prop_map(
        |(result, target, key, operand, range_end)| Compare {
            result,
            target,
            key,
            range_end,
            target_union: Some(operand),
        },
    )
}

fn leaf_op() -> impl Strategy<Value = RequestOp> {
    prop_oneof![
        3 => put_req().prop_map(Op::RequestPut),
        2 => delete_req().prop_map(Op::RequestDeleteRange),
        2 => range_req().prop_map(Op::RequestRange),
    ]
    .prop_map(|r| RequestOp { request: Some(r) })
}

fn txn_req() -> impl Strategy<Value = TxnRequest> {
    let nested = (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(leaf_op(), 0..3),
        prop::collection::vec(leaf_op(), 0..3),
    )
        .prop_map(|(compare, success, failure)| RequestOp {
            request: Some(Op::RequestTxn(TxnRequest { compare, success, failure })),
        });
    let op = prop_oneof![2 => leaf_op(), 1 => nested];
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(op.clone(), 0..4),
        prop::collection::vec(op, 0..4),
    )
        .prop_map(|(compare, success, failure)| TxnRequest { compare, success, failure })
}

fn write_op() -> impl Strategy<Value = WriteOp> {
    prop_oneof![
        6 => put_req().prop_map(WriteOp::Put),
        2 => delete_req().prop_map(WriteOp::Delete),
        3 => txn_req().prop_map(WriteOp::Txn),
        1 => (0i64..6, prop::option::weighted(0.2, -2i64..40))
            .prop_map(|(back, abs)| WriteOp::Compact { back, abs }),
        1 => select(&[7i64, 8, 99][..]).prop_map(WriteOp::Revoke),
        1 => range_req().prop_map(WriteOp::Range),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (
            prop::collection::vec(write_op(), 1..5),
            prop::bool::weighted(0.9),
            any::<bool>(),
        )
            .prop_map(|(ops, commit, sync)| Step::Batch { ops, commit, sync }),
        5 => range_req().prop_map(Step::Range),
        1 => (-1i64..30, 0i64..8).prop_map(|(from, len)| Step::Events { from, len }),
        1 => select(&[7i64, 8][..]).prop_map(Step::KeysOfLease),
        1 => Just(Step::Restart),
    ]
}

// ------------------------------------------------------------------------------------------
// Running a sequence against a store and the model.
// ------------------------------------------------------------------------------------------

trait Harness {
    type E: Engine;
    fn store(&mut self) -> &mut MvccStore<Self::E>;
    fn restart(&mut self);
}

struct MemHarness {
    engine: MemEngine,
    store: MvccStore<MemEngine>,
}

impl Harness for MemHarness {
    type E = MemEngine;
    fn store(&mut self) -> &mut MvccStore<MemEngine> {
        &mut self.store
    }
    fn restart(&mut self) {
        self.store = MvccStore::open(self.engine.clone()).unwrap();
    }
}

struct RocksHarness {
    dir: tempfile::TempDir,
    store: Option<MvccStore<RocksEngine>>,
}

impl Harness for RocksHarness {
    type E = RocksEngine;
    fn store(&mut self) -> &mut MvccStore<RocksEngine> {
        self.store.as_mut().unwrap()
    }
    fn restart(&mut self) {
        // Close the database completely before reopening it.
        self.store = None;
        let engine = RocksEngine::open(self.dir.path()).unwrap();
        self.store = Some(MvccStore::open(engine).unwrap());
    }
}

fn records<E: Engine>(store: &MvccStore<E>) -> (usize, usize, usize) {
    let count = |cf| store.engine().scan(cf, b"", None).count();
    (count(Cf::Kv), count(Cf::Changelog), count(Cf::LeaseKeys))
}

fn run<H: Harness>(h: &mut H, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut model = Model::new();
    let lookup = lease_exists;
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Batch { ops, commit, sync } => {
                let before = model.clone();
                let first_new = model.rev() + 1;
                let mut batch = h.store().begin_apply();
                for op in ops {
                    match op {
                        WriteOp::Put(p) => {
                            let got = batch.put(p, &lookup);
                            let want = model.request(|w| w.put(p, true));
                            prop_assert_eq!(got, want, "step {} put {:?}", i, p);
                        }
                        WriteOp::Delete(d) => {
                            let got = batch.delete_range(d);
                            let want = model.request(|w| Ok(w.delete(d)));
                            prop_assert_eq!(got, want, "step {} delete {:?}", i, d);
                        }
                        WriteOp::Txn(t) => {
                            // Validation must not panic on anything; the store must match the
                            // model even on txns the API would reject.
                            let _ = validate::txn(t, 128);
                            let got = batch.txn(t, &lookup);
                            let want = model.request(|w| w.txn(t));
                            prop_assert_eq!(got, want, "step {} txn {:?}", i, t);
                        }
                        WriteOp::Compact { back, abs } => {
                            let rev = abs.unwrap_or(model.rev() - back);
                            let got = batch
                                .compact(&CompactionRequest { revision: rev, physical: false });
                            prop_assert_eq!(got, model.compact(rev), "step {} compact {}", i, rev);
                        }
                        WriteOp::Revoke(lease) => {
                            let got = batch.revoke_lease_keys(*lease);
                            prop_assert_eq!(got, Ok(model.revoke(*lease)), "step {} revoke", i);
                        }
                        WriteOp::Range(r) => {
                            prop_assert_eq!(
                                batch.range(r),
                                model.range(r),
                                "step {} batch range",
                                i
                            );
                        }
                    }
                    prop_assert_eq!(batch.revision(), model.rev());
                }
                if *commit {
                    let events = batch.commit(*sync).unwrap();
                    let want: Vec<(i64, Vec<Event>)> = (first_new..=model.rev())
                        .map(|r| (r, model.events[r as usize].clone()))
                        .collect();
                    prop_assert_eq!(events, want, "step {} commit events", i);
                } else {
                    drop(batch);
                    model = before;
                }
                prop_assert_eq!(h.store().revision(), model.rev());
                prop_assert_eq!(h.store().compact_revision(), model.compacted);
                // Nothing stale is left behind: compaction removed every record it may, and
                // the lease index has exactly the live leased keys.
                prop_assert_eq!(records(h.store()), model.expected_records(), "step {} records", i);
            }
            Step::Range(r) => {
                prop_assert_eq!(h.store().range(r), model.range(r), "step {} range {:?}", i, r);
            }
            Step::Events { from, len } => {
                let got = h.store().events(*from, from + len);
                prop_assert_eq!(got, model.events(*from, from + len), "step {} events", i);
            }
            Step::KeysOfLease(lease) => {
                let got = h.store().keys_of_lease(*lease);
                prop_assert_eq!(got, Ok(model.keys_of_lease(*lease)), "step {} lease keys", i);
            }
            Step::Restart => {
                h.restart();
                prop_assert_eq!(h.store().revision(), model.rev());
                prop_assert_eq!(h.store().compact_revision(), model.compacted);
            }
        }
    }
    // Finally every readable revision must match the model exactly.
    for rev in model.compacted.max(1)..=model.rev() {
        let r =
            RangeRequest { key: vec![0], range_end: vec![0], revision: rev, ..Default::default() };
        prop_assert_eq!(h.store().range(&r), model.range(&r), "final range at {}", rev);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mem_engine_matches_model(steps in prop::collection::vec(step(), 1..40)) {
        let engine = MemEngine::new();
        let store = MvccStore::open(engine.clone()).unwrap();
        run(&mut MemHarness { engine, store }, &steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn rocks_engine_matches_model(steps in prop::collection::vec(step(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        let store = Some(MvccStore::open(engine).unwrap());
        run(&mut RocksHarness { dir, store }, &steps)?;
    }
}

/// Deterministic regression for the sequence the model test is built around: history,
/// compaction at the current revision, restart, and reads at the compaction point.
#[test]
fn compaction_then_restart_keeps_the_compaction_point_readable() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = RocksHarness {
        store: Some(MvccStore::open(RocksEngine::open(dir.path()).unwrap()).unwrap()),
        dir,
    };
    let put = |k: &[u8], v: &[u8]| Step::Batch {
        ops: vec![WriteOp::Put(PutRequest {
            key: k.to_vec(),
            value: v.to_vec(),
            ..Default::default()
        })],
        commit: true,
        sync: true,
    };
    let steps = vec![
        put(b"a", b"1"),
        put(b"a\x00", b"1"),
        put(b"a", b"2"),
        Step::Batch {
            ops: vec![
                WriteOp::Delete(DeleteRangeRequest {
                    key: b"a\x00".to_vec(),
                    ..Default::default()
                }),
                WriteOp::Compact { back: 0, abs: None },
            ],
            commit: true,
            sync: false,
        },
        Step::Restart,
        Step::Range(RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            revision: 5,
            ..Default::default()
        }),
        Step::Events { from: 5, len: 3 },
    ];
    run(&mut h, &steps).unwrap();
}
