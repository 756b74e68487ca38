//! The claimed run: what a claim's scan of the index learned, kept for the next claim.
//!
//! Claims take jobs in index order, so a busy queue's jobs in flight sit at the head of its
//! index, and every claim passed each of them (a page read of its entry and a point read of its
//! claim) before it reached the first claimable job: with 16 workers, two thirds of a claim's
//! work in apply (issue 20, session 22's profile). The run is the stretch of the index from
//! the scan floor up to `end` in which the claims' own scans found every live entry claimed;
//! the next claim starts at `end`.
//!
//! A claim must decide exactly what a scan from the floor decides (members without the run,
//! after a restart or a snapshot, must agree), so the run holds every live entry of its
//! stretch, with its job id, ready time and claim deadline, and follows every write under the
//! queue ([`crate::mvcc::follow`]):
//! - an index entry put inside the stretch (a new or re-put entry) cuts the run there;
//! - an index entry deleted (ack, dead letter, a nack's move) leaves it;
//! - a claim deleted whose entry is in the run (lease end, a reap, a nack in place, a foreign
//!   delete) cuts the run at that entry, once the request's index writes are counted (an ack
//!   deletes claim and entry together);
//! - a claim rewritten (Extend) updates its deadline; one that does not decode cuts the run.
//!
//! A claim may use the run only when a scan from the floor would pass every entry of it:
//! none waiting at the claim's clock reading (every ready time at or before it) and no claim
//! deadline reached (else the scan reaps it). The scan's page accounting continues where the
//! run ends (the run's entries are the first live entries past the floor), and its wake time
//! starts at the run's earliest deadline, so an empty answer is the same too.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::Event;
use picket_proto::picket::v1::QueueClaimRecord;
use prost::Message;

use super::keys;
use crate::mvcc::follow::Follower;

/// Longest run kept, in entries: a claim that uses a run still reads at least one page of the
/// index after it within the claim's page budget (`decide`'s `CLAIM_PAGES`).
pub const MAX_RUN: usize = 63 * 128;

struct Entry {
    id: String,
    deadline_ms: u64,
}

/// One entry a claim's scan passed (claimed, not expiring) or claimed itself.
pub struct Passed {
    pub key: Vec<u8>,
    pub id: String,
    pub ready_at_ms: u64,
    pub deadline_ms: u64,
}

/// Where a claim may start scanning, from a run that holds at its clock reading.
pub struct Start {
    /// The first key past the run.
    pub end: Vec<u8>,
    /// The run's entries: the live entries a scan from the floor passes before `end`.
    pub len: usize,
    /// The run's first entry (the first live entry past the floor), if any.
    pub first: Option<Vec<u8>>,
    /// The earliest claim deadline in the run, if any claim has one.
    pub wake: Option<u64>,
    /// The run's version: [`ClaimedRun::extend`] appends only if nothing changed it since.
    pub version: u64,
}

/// The claimed run of one queue; see the module docs.
pub struct ClaimedRun {
    pending: Vec<u8>,
    claims: Vec<u8>,
    /// `None`: no run (every claim scans from the floor, and builds one).
    end: Option<Vec<u8>>,
    entries: BTreeMap<Vec<u8>, Entry>,
    ids: HashMap<String, Vec<u8>>,
    deadlines: BTreeSet<(u64, Vec<u8>)>,
    /// At or above every entry's ready time (not lowered when entries leave).
    max_ready: u64,
    version: u64,
}

impl ClaimedRun {
    /// An empty run of `queue` (no run yet).
    pub fn new(queue: &str) -> Self {
        Self {
            pending: keys::pending_prefix(queue),
            claims: keys::claim_prefix(queue),
            end: None,
            entries: BTreeMap::new(),
            ids: HashMap::new(),
            deadlines: BTreeSet::new(),
            max_ready: 0,
            version: 0,
        }
    }

    /// Where a claim with clock reading `now_ms` may start, or `None`: no run, or a scan from
    /// the floor would not pass all of it (an entry still waiting, a deadline reached).
    pub fn start(&self, now_ms: u64) -> Option<Start> {
        let end = self.end.as_ref()?;
        if now_ms < self.max_ready {
            return None;
        }
        let wake = self.deadlines.first().map(|(d, _)| *d);
        if wake.is_some_and(|d| d <= now_ms) {
            return None;
        }
        Some(Start {
            end: end.clone(),
            len: self.entries.len(),
            first: self.entries.keys().next().cloned(),
            wake,
            version: self.version,
        })
    }

    /// Records what a claim's scan found: `passed`, in key order, every live entry it passed
    /// or claimed from where it started up to `end` (exclusive). `from` is the [`Start`] it
    /// began at, or `None` for a scan from the floor (which replaces the run). An append is
    /// dropped if the run changed since `from` was taken: no write a claim makes after taking
    /// its start can change the run today (its reaps and dead letters touch only entries past
    /// the run, whose claims have not expired), so this guard is a safety net for later
    /// changes to the claim, not a path the tests reach.
    pub fn extend(&mut self, from: Option<&Start>, passed: Vec<Passed>, end: Vec<u8>) {
        match from {
            Some(s) if s.version != self.version || self.end.as_ref() != Some(&s.end) => return,
            Some(_) => {}
            None => self.clear(),
        }
        self.version += 1;
        for p in passed {
            // A job id twice in the index (foreign writes) or a run at its limit: the run ends
            // before the entry, which a scan then passes as it always did.
            if self.ids.contains_key(&p.id) || self.entries.len() >= MAX_RUN {
                self.end = Some(p.key);
                return;
            }
            self.max_ready = self.max_ready.max(p.ready_at_ms);
            if p.deadline_ms > 0 {
                self.deadlines.insert((p.deadline_ms, p.key.clone()));
            }
            self.ids.insert(p.id.clone(), p.key.clone());
            self.entries.insert(p.key, Entry { id: p.id, deadline_ms: p.deadline_ms });
        }
        self.end = Some(end);
    }

    fn clear(&mut self) {
        self.end = None;
        self.entries.clear();
        self.ids.clear();
        self.deadlines.clear();
        self.max_ready = 0;
        self.version += 1;
    }

    /// Ends the run at `at` if it reaches past it.
    fn cut(&mut self, at: &[u8]) {
        if self.end.as_ref().is_none_or(|e| e.as_slice() <= at) {
            return;
        }
        self.version += 1;
        self.end = Some(at.to_vec());
        for (key, e) in self.entries.split_off(at) {
            self.ids.remove(&e.id);
            self.deadlines.remove(&(e.deadline_ms, key));
        }
    }

    fn remove(&mut self, key: &[u8]) {
        if let Some(e) = self.entries.remove(key) {
            self.version += 1;
            self.ids.remove(&e.id);
            self.deadlines.remove(&(e.deadline_ms, key.to_vec()));
            if self.entries.is_empty() {
                self.max_ready = 0;
            }
        }
    }

    fn set_deadline(&mut self, key: Vec<u8>, deadline_ms: u64) {
        let Some(e) = self.entries.get_mut(&key) else { return };
        let old = std::mem::replace(&mut e.deadline_ms, deadline_ms);
        if old != deadline_ms {
            self.version += 1;
            self.deadlines.remove(&(old, key.clone()));
            if deadline_ms > 0 {
                self.deadlines.insert((deadline_ms, key));
            }
        }
    }

    /// The run's entries (key order), for tests.
    #[cfg(test)]
    pub fn entries(&self) -> Vec<Vec<u8>> {
        self.entries.keys().cloned().collect()
    }
}

impl Follower for ClaimedRun {
    fn follow(&mut self, events: &[Event]) {
        let put = |e: &Event| e.r#type == EventType::Put as i32;
        // The index first: an ack deletes a job's claim and its entry in one request, and the
        // entry's delete must be counted before the claim's.
        for e in events {
            let Some(kv) = e.kv.as_ref().filter(|kv| kv.key.starts_with(&self.pending)) else {
                continue;
            };
            if put(e) {
                self.cut(&kv.key);
            } else {
                self.remove(&kv.key);
            }
        }
        for e in events {
            let Some(kv) = e.kv.as_ref() else { continue };
            let Some(id) = kv.key.strip_prefix(self.claims.as_slice()) else { continue };
            let Some(key) = std::str::from_utf8(id).ok().and_then(|id| self.ids.get(id)).cloned()
            else {
                continue;
            };
            match put(e).then(|| QueueClaimRecord::decode(kv.value.as_slice())) {
                Some(Ok(rec)) => self.set_deadline(key, rec.deadline_ms),
                // Deleted, or a record a scan would refuse as corrupt: the entry is no longer
                // one a scan passes.
                _ => self.cut(&key),
            }
        }
    }
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
