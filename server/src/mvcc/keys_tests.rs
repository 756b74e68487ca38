use super::*;

#[test]
fn encoding_preserves_order_and_round_trips() {
    let keys: Vec<&[u8]> = vec![
        b"",
        b"\x00",
        b"\x00\x00",
        b"\x00\x01",
        b"\x00\xff",
        b"\x01",
        b"a",
        b"a\x00",
        b"a\x00\x00",
        b"a\x00b",
        b"a\x01",
        b"ab",
        b"a\xff",
        b"b",
        b"\xff",
        b"\xff\x00",
        b"\xff\xff",
    ];
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "test keys are listed in byte order");
    for w in keys.windows(2) {
        let (a, b) = (encode_user_key(w[0]), encode_user_key(w[1]));
        assert!(a < b, "{:?} < {:?}", w[0], w[1]);
        // Versions of `a`, even the oldest, sort before the newest version of `b`.
        assert!(kv_key(w[0], 1) < kv_key(w[1], i64::MAX));
        assert!(versions_end(&a) <= b);
        assert!(!b.starts_with(&a), "prefix-free");
    }
    for k in &keys {
        let enc = encode_user_key(k);
        assert_eq!(decode_user_key(&enc).as_deref(), Some(*k));
        let kk = kv_key(k, 42);
        assert_eq!(split_kv_key(&kk), Some((enc.as_slice(), 42)));
        assert!(kk < versions_end(&enc));
    }
    assert_eq!(decode_user_key(b"a\x00"), None);
    assert_eq!(decode_user_key(b"a\x00\x01b"), None);
}

#[test]
fn newer_versions_sort_first() {
    assert!(kv_key(b"k", 10) < kv_key(b"k", 9));
    assert!(kv_key(b"k", i64::MAX) < kv_key(b"k", 1));
    // A seek at revision 0 or below lands after every version.
    assert!(kv_key(b"k", 1) < kv_key(b"k", 0));
    assert_eq!(kv_key(b"k", -5), kv_key(b"k", 0));
}

#[test]
fn etcd_range_bounds() {
    let (s, e) = kv_bounds(b"a", b"");
    assert_eq!(s, encode_user_key(b"a"));
    let e = e.unwrap();
    assert!(kv_key(b"a", 1) < e && e <= encode_user_key(b"a\x00"));
    let (_, e) = kv_bounds(b"a", b"\x00");
    assert_eq!(e, None);
    let (_, e) = kv_bounds(b"a", b"b");
    assert_eq!(e, Some(encode_user_key(b"b")));
}

#[test]
fn lease_and_changelog_keys() {
    let (s, e) = lease_bounds(7);
    let k = lease_key(7, b"\xff\xff");
    assert!(k.as_slice() >= s.as_slice() && k.as_slice() < e.unwrap().as_slice());
    assert!(lease_key(8, b"") >= e.unwrap().to_vec());
    assert_eq!(lease_bounds(-1).1, None);
    assert!(changelog_key(2) > changelog_key(1));
    assert_eq!(decode_changelog_key(&changelog_key(300)), Some(300));
}

#[test]
fn a_versions_range_is_recognised_without_building_it() {
    for key in [&b""[..], b"k", b"a\0b", b"\0"] {
        let enc = encode_user_key(key);
        assert!(is_versions_range(&enc, &versions_end(&enc)), "{key:?}");
        // Any other range is not one key's versions.
        assert!(!is_versions_range(&enc, &enc));
        assert!(!is_versions_range(&versions_end(&enc), &enc));
        assert!(!is_versions_range(&enc, &versions_end(&encode_user_key(b"other"))));
    }
    assert!(!is_versions_range(b"", b""));
}
