//! Compaction: dropping history that no readable revision can show any more.
//!
//! After compacting at revision `C`, reads at revisions `>= C` must still work, so for each key
//! the newest version `<= C` stays unless it is a tombstone (then it and everything older go,
//! which reads the same as "absent"), versions `> C` stay, and older versions go. Changelog
//! entries below `C` go too; the entry at `C` stays so a watch may start at `C`.
//!
//! etcd walks its whole in-memory key index for this. Picket is incremental: a key can only
//! have something to drop if it changed after the previous compaction point, and the changelog
//! between the two points lists exactly those keys. The cost is proportional to the history
//! being dropped, not to the size of the store.
//!
//! # Logical at once, physical in bounded steps
//! A Compact request only moves the compaction point (`mvcc/compact_revision`): from then on
//! reads, watches and hashes below it are refused, exactly as in etcd. Dropping the old records
//! (the *physical* compaction) used to happen in the same apply step, every delete buffered in
//! memory under the state-machine lock, on every member at once: compacting a million revisions
//! stalled apply and held all those deletes in memory (issue 19). Now the physical work runs in
//! [`step`]s of at most about [`DELETES_PER_STEP`] deletes. The compact request runs one step,
//! every later request applied through the MVCC store runs one more while work remains, and
//! while no write comes the leader proposes `CompactStep` commands that run one each
//! (`crate::api::compact_steps`; a `physical` Compact and a defrag wait for the steps), so
//! the steps are tied to log entries and every member's store is the same after the same entry
//! (`Maintenance.Hash` stays comparable). The physical point `P` (`mvcc/compact_physical`,
//! absent when it equals the compaction point) records how far the steps have come: the
//! history up to `P` is compacted as of the compaction point, the changelog still holds the
//! entries from `P` on, and those after `P` list the keys still to visit.
//!
//! Records left below the compaction point change no answer: a read at `R >= C` sees, per key,
//! the newest version `<= R`, which compaction never drops, and `hash::hash_kv` skips what
//! compaction will drop. A later compaction while steps remain simply moves the target; the
//! steps compact against the current compaction point, and the result is the same as if each
//! compaction had run to the end at once (see `compact_tests`).

use std::collections::BTreeSet;

use picket_proto::picket::storage::v1::RevisionEvents;
use prost::Message;

use super::error::MvccError;
use super::keys;
use super::overlay::Overlay;
use crate::storage::engine::{Cf, ReadView};

/// About how many deletes one step buffers (see [`step`] for the exact bound). Small enough
/// that the step adds little to the apply it rides on (a delete is a key of some tens of
/// bytes), large enough that the steps outpace the history writes add: each request adds at
/// most a few records per key it writes and removes up to this many.
pub(crate) const DELETES_PER_STEP: usize = 256;

/// The physical compaction point stored in `view`, given the compaction point `compacted`.
pub(crate) fn read_physical(view: &dyn ReadView, compacted: i64) -> Result<i64, MvccError> {
    match view.get(Cf::Meta, keys::META_COMPACT_PHYSICAL)? {
        Some(v) => {
            let buf: [u8; 8] = v.as_slice().try_into().map_err(|_| {
                MvccError::Corrupt(format!("compact physical point is {} bytes", v.len()))
            })?;
            Ok(i64::from_be_bytes(buf))
        }
        None => Ok(compacted),
    }
}

/// One bounded step of physical compaction.
#[derive(Debug, Default)]
pub(crate) struct Step {
    /// The deletes of this step.
    pub deletes: Overlay,
    /// How many deletes `deletes` holds.
    pub count: usize,
    /// The physical point after this step (`<= target`; equal when the work is done).
    pub reached: i64,
}

/// The next step of compacting `view`, whose history is compacted up to `physical`, towards the
/// compaction point `target` (`physical < target`).
///
/// The step takes changelog revisions after `physical` in order, at least one, and stops before
/// the revision that would take it past `limit` deletes. It deletes the changelog entries from
/// `physical` up to (not including) the last revision taken, and, for each key those revisions
/// touched, every version up to that revision except the one visible at `target` (unless that
/// is a tombstone). Each event accounts for at most two deletes (its own version, and the one
/// version a key may keep from before `physical`), each revision for one changelog entry, so a
/// step deletes at most `limit + 1` records, or the cost of its first revision if that alone
/// is larger (a revision's events are bounded by the request size and txn limits).
pub(crate) fn step(
    view: &dyn ReadView,
    physical: i64,
    target: i64,
    limit: usize,
) -> Result<Step, MvccError> {
    let mut out = Step { reached: physical, ..Step::default() };
    let mut touched: BTreeSet<Vec<u8>> = BTreeSet::new();
    // The changelog entries this step may delete (revision, key), the last one taken excepted.
    let mut entries: Vec<(i64, Vec<u8>)> = Vec::new();
    let mut budget_used = 0usize;

    let start = keys::changelog_key(physical);
    let end = keys::changelog_key(target.saturating_add(1));
    for item in view.scan(Cf::Changelog, &start, Some(&end)) {
        let (k, v) = item?;
        let rev = keys::decode_changelog_key(&k)
            .ok_or_else(|| MvccError::Corrupt(format!("malformed changelog key {k:02x?}")))?;
        if rev <= physical {
            // The entry at the previous point, kept so far for watches starting there.
            budget_used += 1;
            entries.push((rev, k));
            continue;
        }
        let events = RevisionEvents::decode(v.as_slice())?.events;
        let cost = 2 * events.len() + 1;
        if out.reached > physical && budget_used + cost > limit {
            break;
        }
        budget_used += cost;
        touched.extend(events.into_iter().filter_map(|ev| ev.kv).map(|kv| kv.key));
        entries.push((rev, k));
        out.reached = rev;
    }
    if out.reached == physical {
        // No changelog entry in (physical, target]: nothing was written in between, so nothing
        // is left to drop but the entry at the previous point.
        out.reached = target;
    }
    for (rev, k) in entries {
        if rev < out.reached {
            out.deletes.delete(Cf::Changelog, k);
            out.count += 1;
        }
    }

    for key in &touched {
        let enc = keys::encode_user_key(key);
        let to = keys::versions_end(&enc);
        // The version visible at the compaction point stays, unless it is a tombstone.
        let kept = match view.scan(Cf::Kv, &keys::kv_key_encoded(&enc, target), Some(&to)).next() {
            Some(item) => {
                let (k, v) = item?;
                (!v.is_empty()).then_some(k)
            }
            None => None,
        };
        // Versions after `reached` are left to the steps that take their revisions.
        for item in view.scan(Cf::Kv, &keys::kv_key_encoded(&enc, out.reached), Some(&to)) {
            let (k, _) = item?;
            if kept.as_ref() != Some(&k) {
                out.deletes.delete(Cf::Kv, k);
                out.count += 1;
            }
        }
    }
    tracing::debug!(
        revision = target,
        from = physical,
        reached = out.reached,
        keys = touched.len(),
        deletes = out.count,
        "compaction step"
    );
    Ok(out)
}
