//! In-memory write overlays over a [`ReadView`].
//!
//! An apply batch collects every write of one Raft `apply()` call in an [`Overlay`] and reads
//! through [`Layered`] (overlay over the engine), so later commands see earlier ones before
//! anything reaches the engine. Each request adds a second overlay on top that is merged into
//! the batch only when the request succeeds, which is how a failed request leaves no trace.

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;

use crate::storage::engine::{
    Cf, Cursor, EmptyCursor, EngineError, Known, KvIter, Pair, ReadView, WriteBatch,
};

/// Pending writes per column family: `Some(value)` is a put, `None` a delete.
#[derive(Debug, Default, Clone)]
pub struct Overlay {
    tables: [BTreeMap<Vec<u8>, Option<Vec<u8>>>; Cf::ALL.len()],
}

impl Overlay {
    pub fn put(&mut self, cf: Cf, key: Vec<u8>, value: Vec<u8>) {
        self.tables[cf.index()].insert(key, Some(value));
    }

    pub fn delete(&mut self, cf: Cf, key: Vec<u8>) {
        self.tables[cf.index()].insert(key, None);
    }

    /// The pending writes of one column family, in key order.
    pub fn table(&self, cf: Cf) -> &BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        &self.tables[cf.index()]
    }

    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(BTreeMap::is_empty)
    }

    /// Applies `top`'s writes on top of ours.
    pub fn absorb(&mut self, top: Overlay) {
        for (mine, theirs) in self.tables.iter_mut().zip(top.tables) {
            mine.extend(theirs);
        }
    }

    pub fn into_write_batch(self) -> WriteBatch {
        let mut batch = WriteBatch::new();
        for (cf, table) in Cf::ALL.into_iter().zip(self.tables) {
            for (k, v) in table {
                match v {
                    Some(v) => batch.put(cf, k, v),
                    None => batch.delete(cf, k),
                }
            }
        }
        batch
    }
}

/// `top` over `base`: reads see `top`'s writes first.
pub struct Layered<'a> {
    pub base: &'a dyn ReadView,
    pub top: &'a Overlay,
}

impl ReadView for Layered<'_> {
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        match self.top.tables[cf.index()].get(key) {
            Some(v) => Ok(v.clone()),
            None => self.base.get(cf, key),
        }
    }

    fn scan(&self, cf: Cf, start: &[u8], end: Option<&[u8]>) -> KvIter<'_> {
        if let Some(e) = end {
            // BTreeMap::range panics on an inverted range, which callers may legitimately ask
            // for (etcd's range_end < key): it is simply empty.
            if start >= e {
                return Box::new(EmptyCursor);
            }
        }
        let table = &self.top.tables[cf.index()];
        let end = end.map(<[u8]>::to_vec);
        let top = top_from(table, start, end.as_deref()).peekable();
        let base = self.base.scan(cf, start, end.as_deref());
        Box::new(Merge { base, base_next: None, top, table, start: start.to_vec(), end })
    }

    /// Known when the base knows its first pair and no pending delete of ours could hide it:
    /// our first put wins if it comes at or before the base's first pair, which wins if it comes
    /// before everything of ours.
    fn first_known(&self, cf: Cf, start: &[u8], end: &[u8]) -> Known {
        let base = match self.base.first_known(cf, start, end)? {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        let top = if start < end {
            self.top.tables[cf.index()]
                .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
                .next()
        } else {
            None
        };
        match (top, base) {
            (None, base) => Some(Ok(base)),
            (Some((tk, Some(tv))), base)
                if base.as_ref().is_none_or(|(bk, _)| tk.as_slice() <= bk.as_slice()) =>
            {
                Some(Ok(Some((tk.clone(), tv.clone()))))
            }
            (Some((tk, _)), Some((bk, bv))) if bk.as_slice() < tk.as_slice() => {
                Some(Ok(Some((bk, bv))))
            }
            // A pending delete at or before the base's first pair: scan.
            _ => None,
        }
    }
}

/// The overlay's entries from `start` up to `end`.
fn top_from<'a>(
    table: &'a BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    start: &[u8],
    end: Option<&[u8]>,
) -> TopRange<'a> {
    let upper = match end {
        Some(e) => Bound::Excluded(e),
        None => Bound::Unbounded,
    };
    // An empty range when a seek went past the end (BTreeMap::range would panic).
    let lower = match end {
        Some(e) if start >= e => e,
        _ => start,
    };
    table.range::<[u8], _>((Bound::Included(lower), upper))
}

type TopRange<'a> = std::collections::btree_map::Range<'a, Vec<u8>, Option<Vec<u8>>>;

/// Merges a base stream with overlay entries, the overlay winning on equal keys.
struct Merge<'a> {
    base: KvIter<'a>,
    /// The base's next pair, once looked at (`Some(None)`: the base is over).
    base_next: Option<Option<Result<Pair, EngineError>>>,
    top: Peekable<TopRange<'a>>,
    /// What a seek re-reads the overlay's entries from.
    table: &'a BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Merge<'_> {
    fn next_base(&mut self) -> Option<Result<Pair, EngineError>> {
        match self.base_next.take() {
            Some(peeked) => peeked,
            None => self.base.next(),
        }
    }
}

impl Iterator for Merge<'_> {
    type Item = Result<Pair, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let base = &mut self.base;
            let base_next = self.base_next.get_or_insert_with(|| base.next());
            let take_top = match (base_next.as_ref(), self.top.peek()) {
                (None, None) => return None,
                (Some(Err(_)), _) => return self.next_base(),
                (None, Some(_)) => true,
                (Some(_), None) => false,
                (Some(Ok((bk, _))), Some((tk, _))) => {
                    if bk == *tk {
                        // The overlay shadows the base entry.
                        self.base_next = None;
                        true
                    } else {
                        *tk < bk
                    }
                }
            };
            if !take_top {
                return self.next_base();
            }
            match self.top.next() {
                Some((k, Some(v))) => return Some(Ok((k.clone(), v.clone()))),
                // A pending delete: skip the key.
                Some((_, None)) => continue,
                None => return None,
            }
        }
    }
}

impl Cursor for Merge<'_> {
    fn seek(&mut self, key: &[u8]) {
        let key = key.max(self.start.as_slice()).to_vec();
        // A pair already looked at belongs to the position being left.
        self.base_next = None;
        self.base.seek(&key);
        self.top = top_from(self.table, &key, self.end.as_deref()).peekable();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::engine::{Engine, MemEngine};

    #[test]
    fn layered_reads_merge_puts_and_deletes() {
        let engine = MemEngine::new();
        let mut b = WriteBatch::new();
        for k in [b"a", b"c", b"e"] {
            b.put(Cf::Kv, k.to_vec(), b"base".to_vec());
        }
        engine.write(b, false).unwrap();

        let mut lower = Overlay::default();
        lower.put(Cf::Kv, b"b".to_vec(), b"lower".to_vec());
        lower.delete(Cf::Kv, b"c".to_vec());
        let mut upper = Overlay::default();
        upper.put(Cf::Kv, b"c".to_vec(), b"upper".to_vec());
        upper.delete(Cf::Kv, b"e".to_vec());
        upper.put(Cf::Kv, b"f".to_vec(), b"upper".to_vec());

        let l1 = Layered { base: &engine, top: &lower };
        let l2 = Layered { base: &l1, top: &upper };
        let all: Vec<(Vec<u8>, Vec<u8>)> =
            l2.scan(Cf::Kv, b"", None).collect::<Result<_, _>>().unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"a".to_vec(), b"base".to_vec()),
            (b"b".to_vec(), b"lower".to_vec()),
            (b"c".to_vec(), b"upper".to_vec()),
            (b"f".to_vec(), b"upper".to_vec()),
        ];
        assert_eq!(all, want);
        assert_eq!(l1.get(Cf::Kv, b"c").unwrap(), None);
        assert_eq!(l2.get(Cf::Kv, b"c").unwrap(), Some(b"upper".to_vec()));
        assert_eq!(l2.get(Cf::Kv, b"a").unwrap(), Some(b"base".to_vec()));
        assert_eq!(l2.scan(Cf::Kv, b"b", Some(b"a")).count(), 0);
        assert_eq!(l2.scan(Cf::Kv, b"b", Some(b"d")).count(), 2);

        lower.absorb(upper);
        engine.write(lower.into_write_batch(), false).unwrap();
        let keys: Vec<Vec<u8>> = engine.scan(Cf::Kv, b"", None).map(|r| r.unwrap().0).collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"f".to_vec()]);
    }

    /// Overlays with puts and deletes, stacked twice on RocksDB and on the memory engine:
    /// random steps and seeks through the stack read what the merged pairs say.
    #[test]
    fn layered_cursors_step_and_seek_like_a_fresh_scan() {
        use crate::storage::engine::cursor_tests::{fill, random_key, walk_matches_model};
        use crate::storage::rocks::RocksEngine;
        use crate::test_rng::XorShift;

        let mut rng = XorShift(0x0abe_71a7);
        let dir = tempfile::tempdir().unwrap();
        let rocks = RocksEngine::open(dir.path()).unwrap();
        let mem = MemEngine::new();
        let engines: [&dyn ReadView; 2] = [&rocks, &mem];
        let models = [fill(&rocks, Cf::Kv, &mut rng), fill(&mem, Cf::Kv, &mut rng)];
        for (base, mut model) in engines.into_iter().zip(models) {
            let mut layers = [Overlay::default(), Overlay::default()];
            for layer in &mut layers {
                for _ in 0..30 {
                    let k = random_key(&mut rng);
                    if rng.below(3) == 0 {
                        layer.delete(Cf::Kv, k.clone());
                        model.remove(&k);
                    } else {
                        let v = format!("o{}", rng.below(1000)).into_bytes();
                        layer.put(Cf::Kv, k.clone(), v.clone());
                        model.insert(k, v);
                    }
                }
            }
            let l1 = Layered { base, top: &layers[0] };
            let l2 = Layered { base: &l1, top: &layers[1] };
            walk_matches_model(&l2, Cf::Kv, &model, &mut rng, 400);
        }
    }
}
