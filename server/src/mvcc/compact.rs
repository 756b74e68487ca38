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
//! being dropped, not to the size of the store. Everything happens inside the apply batch, so
//! compaction is atomic with the compact request that ordered it.

use std::collections::BTreeSet;

use picket_proto::picket::storage::v1::RevisionEvents;
use prost::Message;

use super::error::MvccError;
use super::keys;
use super::overlay::Overlay;
use crate::storage::engine::{Cf, ReadView};

/// The deletes that compact `view` from compaction point `old` to `new` (`old < new`).
pub(crate) fn compaction_deletes(
    view: &dyn ReadView,
    old: i64,
    new: i64,
) -> Result<Overlay, MvccError> {
    let mut out = Overlay::default();
    let mut touched: BTreeSet<Vec<u8>> = BTreeSet::new();

    let start = keys::changelog_key(old);
    let end = keys::changelog_key(new.saturating_add(1));
    for item in view.scan(Cf::Changelog, &start, Some(&end)) {
        let (k, v) = item?;
        let rev = keys::decode_changelog_key(&k)
            .ok_or_else(|| MvccError::Corrupt(format!("malformed changelog key {k:02x?}")))?;
        if rev > old {
            for ev in RevisionEvents::decode(v.as_slice())?.events {
                if let Some(kv) = ev.kv {
                    touched.insert(kv.key);
                }
            }
        }
        if rev < new {
            out.delete(Cf::Changelog, k);
        }
    }

    for key in &touched {
        let enc = keys::encode_user_key(key);
        let from = keys::kv_key_encoded(&enc, new);
        let to = keys::versions_end(&enc);
        let mut newest = true;
        for item in view.scan(Cf::Kv, &from, Some(&to)) {
            let (k, v) = item?;
            if std::mem::take(&mut newest) && !v.is_empty() {
                // The version visible at `new` stays.
                continue;
            }
            out.delete(Cf::Kv, k);
        }
    }
    tracing::debug!(revision = new, keys = touched.len(), "compaction computed");
    Ok(out)
}
