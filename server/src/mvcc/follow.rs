//! Followers: in-memory state beside the store that follows every write under a key prefix.
//!
//! A reader that scans the same range over and over from apply (a queue's claim, which passes
//! every job in flight before the first claimable one) can keep what its last scan learned, if
//! it hears of every write that could change it. A [`Follower`] registered for a prefix is
//! handed the events of each request that writes under the prefix, in the request that writes
//! them, before any later request of the batch runs.
//!
//! Followers are this member's own: never replicated or persisted, empty at open and after a
//! snapshot install (which opens a new store). So a follower may only ever let its owner skip
//! work whose outcome it knows exactly; what apply decides must be the same with it as without
//! it, or members would diverge. The owner's tests check that by running every command twice,
//! once with the followers forgotten.

use std::any::Any;
use std::collections::BTreeMap;
use std::ops::Bound;

use picket_proto::mvccpb::Event;

/// State kept beside the store that must hear of every write under its prefix.
pub trait Follower: Any + Send + Sync {
    /// The events of one request, every one of them (not only those under the prefix the
    /// follower was registered for), in the request's order. A request is atomic: a follower
    /// may read its events in any order.
    fn follow(&mut self, events: &[Event]);
}

/// The followers of one store, by the prefix each follows. No prefix is a prefix of another
/// (each key has at most one follower), so the follower of a key is found in one lookup: the
/// greatest prefix at or below the key, if the key starts with it.
#[derive(Default)]
pub(super) struct Followers(BTreeMap<Vec<u8>, Box<dyn Follower>>);

impl Followers {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    fn owner(&self, key: &[u8]) -> Option<&[u8]> {
        let (prefix, _) =
            self.0.range::<[u8], _>((Bound::Unbounded, Bound::Included(key))).next_back()?;
        key.starts_with(prefix).then_some(prefix.as_slice())
    }

    /// Hands `events` to every follower with an event under its prefix, once each.
    pub(super) fn follow(&mut self, events: &[Event]) {
        // A request writes under few prefixes (one queue's keys, most often): a short list.
        let mut owners: Vec<Vec<u8>> = Vec::new();
        for e in events {
            let Some(kv) = e.kv.as_ref() else { continue };
            if let Some(p) = self.owner(&kv.key) {
                if !owners.iter().any(|o| o.as_slice() == p) {
                    owners.push(p.to_vec());
                }
            }
        }
        for p in owners {
            if let Some(f) = self.0.get_mut(&p) {
                f.follow(events);
            }
        }
    }

    /// The follower of `prefix`, made by `make` if there is none. A follower of another type
    /// under the same prefix is replaced (no two owners share a prefix).
    ///
    /// # Panics
    /// If `prefix` is a prefix of another follower's, or the other way round: a key would
    /// have two followers.
    pub(super) fn get_or_insert<T: Follower>(
        &mut self,
        prefix: &[u8],
        make: impl FnOnce() -> T,
    ) -> &mut T {
        let same = self.0.get(prefix).map(|f| (f.as_ref() as &dyn Any).is::<T>());
        if same != Some(true) {
            let nested = self.0.keys().any(|p| {
                p.as_slice() != prefix && (p.starts_with(prefix) || prefix.starts_with(p))
            });
            assert!(!nested, "follower prefixes may not nest");
            self.0.insert(prefix.to_vec(), Box::new(make()));
        }
        let f = self.0.get_mut(prefix).expect("inserted above");
        (f.as_mut() as &mut dyn Any).downcast_mut::<T>().expect("the type was checked")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use picket_proto::mvccpb::KeyValue;

    #[derive(Default)]
    struct Count(usize, Vec<Vec<u8>>);

    impl Follower for Count {
        fn follow(&mut self, events: &[Event]) {
            self.0 += 1;
            self.1.extend(events.iter().filter_map(|e| e.kv.as_ref().map(|kv| kv.key.clone())));
        }
    }

    fn ev(key: &str) -> Event {
        Event { kv: Some(KeyValue { key: key.into(), ..Default::default() }), ..Default::default() }
    }

    /// Each follower hears once of a request that writes under its prefix, with all of the
    /// request's events, and never of one that does not.
    #[test]
    fn a_follower_hears_each_request_under_its_prefix_once() {
        let mut f = Followers::default();
        f.get_or_insert(b"q/a/", Count::default);
        f.get_or_insert(b"q/b/", Count::default);
        f.follow(&[ev("q/a/1"), ev("q/a/2"), ev("other")]);
        f.follow(&[ev("q/ab"), ev("q/"), ev("r")]);
        f.follow(&[ev("q/b/x"), ev("q/a/3")]);
        let a = f.get_or_insert(b"q/a/", Count::default);
        assert_eq!(a.0, 2);
        assert_eq!(a.1.len(), 5, "every event of the requests it heard of");
        assert_eq!(f.get_or_insert(b"q/b/", Count::default).0, 1);
    }

    #[test]
    #[should_panic(expected = "may not nest")]
    fn nested_prefixes_are_refused() {
        let mut f = Followers::default();
        f.get_or_insert(b"q/a/", Count::default);
        f.get_or_insert(b"q/", Count::default);
    }
}
