//! Watches: which events a watcher wants and how they are cut into responses.
//!
//! Events come from apply only (etcd's `watchable_store`): the state machine publishes each
//! revision's events after its batch is written, and a watcher that falls behind, or starts in
//! the past, reads the same events back from the MVCC changelog. This module holds the pure
//! parts (matching, filtering, fragmenting); `api::watch` runs the streams.

use picket_proto::etcdserverpb::watch_create_request::FilterType;
use picket_proto::etcdserverpb::WatchCreateRequest;
use picket_proto::mvccpb::event::EventType;
use picket_proto::mvccpb::Event;
use prost::Message;

/// What one watcher selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// First key of the range.
    pub key: Vec<u8>,
    /// etcd's `range_end`: empty for one key, `[0]` for every key `>= key`.
    pub range_end: Vec<u8>,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
    pub fragment: bool,
    pub progress_notify: bool,
}

impl WatchSpec {
    pub fn from_request(req: &WatchCreateRequest) -> Self {
        let has = |f: FilterType| req.filters.contains(&(f as i32));
        // etcd treats an empty key as the smallest key, "\0".
        let key = if req.key.is_empty() { vec![0] } else { req.key.clone() };
        Self {
            key,
            range_end: req.range_end.clone(),
            no_put: has(FilterType::Noput),
            no_delete: has(FilterType::Nodelete),
            prev_kv: req.prev_kv,
            fragment: req.fragment,
            progress_notify: req.progress_notify,
        }
    }

    /// Whether `key` falls in the watched range.
    pub fn matches(&self, key: &[u8]) -> bool {
        match self.range_end.as_slice() {
            [] => key == self.key.as_slice(),
            [0] => key >= self.key.as_slice(),
            end => key >= self.key.as_slice() && key < end,
        }
    }

    /// Whether the watcher wants `event` (range and filters).
    pub fn wants(&self, event: &Event) -> bool {
        let Some(kv) = &event.kv else { return false };
        if !self.matches(&kv.key) {
            return false;
        }
        match EventType::try_from(event.r#type) {
            Ok(EventType::Put) => !self.no_put,
            Ok(EventType::Delete) => !self.no_delete,
            Err(_) => false,
        }
    }
}

/// Splits `events` into groups whose encoded size stays under `limit` bytes (each group holds
/// at least one event, so a single oversized event still goes out alone). etcd fragments a
/// response larger than the request size limit when the watcher asked for it.
pub fn fragment(events: Vec<Event>, limit: usize) -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut size = 0usize;
    for e in events {
        // Field tag and length prefix of a repeated message field: at most 1 + 10 bytes.
        let len = e.encoded_len() + 11;
        if !cur.is_empty() && size + len > limit {
            out.push(std::mem::take(&mut cur));
            size = 0;
        }
        size += len;
        cur.push(e);
    }
    if !cur.is_empty() || out.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use picket_proto::mvccpb::KeyValue;

    fn ev(t: EventType, key: &[u8], value_len: usize) -> Event {
        Event {
            r#type: t as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                value: vec![7; value_len],
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn spec(key: &[u8], end: &[u8]) -> WatchSpec {
        WatchSpec::from_request(&WatchCreateRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            ..Default::default()
        })
    }

    #[test]
    fn key_prefix_and_from_key_ranges() {
        assert!(spec(b"a", b"").matches(b"a"));
        assert!(!spec(b"a", b"").matches(b"ab"));
        assert!(spec(b"a", b"b").matches(b"ab"));
        assert!(!spec(b"a", b"b").matches(b"b"));
        assert!(spec(b"m", &[0]).matches(b"z"));
        assert!(!spec(b"m", &[0]).matches(b"a"));
        assert!(spec(&[0], &[0]).matches(&[0xff, 0xff]));
    }

    #[test]
    fn filters() {
        let mut s = WatchSpec::from_request(&WatchCreateRequest {
            key: b"k".to_vec(),
            filters: vec![FilterType::Noput as i32],
            ..Default::default()
        });
        assert!(!s.wants(&ev(EventType::Put, b"k", 1)));
        assert!(s.wants(&ev(EventType::Delete, b"k", 0)));
        s.no_put = false;
        s.no_delete = true;
        assert!(s.wants(&ev(EventType::Put, b"k", 1)));
        assert!(!s.wants(&ev(EventType::Delete, b"k", 0)));
    }

    #[test]
    fn fragments_respect_limit_and_keep_order() {
        let events: Vec<Event> = (0..10).map(|i| ev(EventType::Put, &[b'a' + i], 100)).collect();
        let groups = fragment(events.clone(), 300);
        assert!(groups.len() > 1);
        assert!(groups.iter().all(|g| !g.is_empty()));
        assert_eq!(groups.concat(), events);
        let big = vec![ev(EventType::Put, b"x", 1000)];
        assert_eq!(fragment(big.clone(), 10), vec![big]);
        assert_eq!(fragment(Vec::new(), 10), vec![Vec::<Event>::new()]);
    }
}
