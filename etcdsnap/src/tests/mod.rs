//! Unit tests on files made by [`builder`]: an etcd-shaped database read back, and malformed
//! files, each of which must give its typed error and none of which may panic.

mod builder;

use builder::{file, leaf, set_root, with_trailer, Node, Val, PAGE};
use picket_proto::authpb::{Permission, Role, User};
use picket_proto::mvccpb::KeyValue;
use prost::Message;

use crate::crc32c::Crc32c;
use crate::{read, status, Error, Lease};

fn rev(main: u64, sub: u64) -> Vec<u8> {
    let mut v = main.to_be_bytes().to_vec();
    v.push(b'_');
    v.extend_from_slice(&sub.to_be_bytes());
    v
}

fn kv(key: &[u8], value: &[u8], create: i64, modr: i64, version: i64, lease: i64) -> Vec<u8> {
    KeyValue {
        key: key.to_vec(),
        value: value.to_vec(),
        create_revision: create,
        mod_revision: modr,
        version,
        lease,
    }
    .encode_to_vec()
}

fn lease_value(id: i64, ttl: i64) -> Vec<u8> {
    // leasepb.Lease: ID = 1, TTL = 2 (both varint int64).
    let mut v = vec![0x08];
    prost::encoding::encode_varint(id as u64, &mut v);
    v.push(0x10);
    prost::encoding::encode_varint(ttl as u64, &mut v);
    v
}

/// The `key` bucket's records: a, a again, b with a lease (and a large value on an overflow
/// page), c, then a deleted; as two leaves under a branch.
fn key_bucket() -> Node {
    let big = vec![b'x'; 3 * PAGE];
    let mut tomb = rev(6, 0);
    tomb.push(b't');
    Node::Branch(vec![
        leaf(vec![
            (rev(2, 0), kv(b"a", b"1", 2, 2, 1, 0)),
            (rev(3, 0), kv(b"a", b"2", 2, 3, 2, 0)),
        ]),
        leaf(vec![
            (rev(4, 0), kv(b"b\x00\xff", &big, 4, 4, 1, 7)),
            (rev(5, 0), kv(b"c", b"3", 5, 5, 1, 0)),
            (tomb, kv(b"a", b"", 0, 0, 0, 0)),
        ]),
    ])
}

fn etcd_like(key: Node) -> Node {
    let root = User {
        name: b"root".to_vec(),
        password: b"$2a$hash".to_vec(),
        roles: vec!["root".into()],
        options: None,
    };
    let role = Role {
        name: b"reader".to_vec(),
        key_permission: vec![Permission {
            perm_type: 0,
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
        }],
    };
    Node::Leaf(vec![
        (b"alarm".to_vec(), Val::Inline(vec![])),
        (
            b"auth".to_vec(),
            Val::Inline(vec![
                (b"authEnabled".to_vec(), vec![1]),
                (b"authRevision".to_vec(), 9u64.to_be_bytes().to_vec()),
            ]),
        ),
        (
            b"authRoles".to_vec(),
            Val::Bucket(leaf(vec![(b"reader".to_vec(), role.encode_to_vec())])),
        ),
        (b"authUsers".to_vec(), Val::Bucket(leaf(vec![(b"root".to_vec(), root.encode_to_vec())]))),
        (b"cluster".to_vec(), Val::Inline(vec![(b"clusterVersion".to_vec(), b"3.4.0".to_vec())])),
        (b"key".to_vec(), Val::Bucket(key)),
        (
            b"lease".to_vec(),
            Val::Bucket(leaf(vec![(7u64.to_be_bytes().to_vec(), lease_value(7, 60))])),
        ),
        (b"members".to_vec(), Val::Inline(vec![(b"8e9e05c52164694d".to_vec(), b"{}".to_vec())])),
        (b"members_removed".to_vec(), Val::Inline(vec![])),
        (
            b"meta".to_vec(),
            Val::Inline(vec![
                (b"consistent_index".to_vec(), 42u64.to_be_bytes().to_vec()),
                (b"finishedCompactRev".to_vec(), rev(3, 0)),
                (b"scheduledCompactRev".to_vec(), rev(3, 0)),
                (b"term".to_vec(), 2u64.to_be_bytes().to_vec()),
            ]),
        ),
    ])
}

/// Only the two buckets etcd always has, `key` paged and `meta` inline.
fn minimal(key: Node) -> Node {
    Node::Leaf(vec![(b"key".to_vec(), Val::Bucket(key)), (b"meta".to_vec(), Val::Inline(vec![]))])
}

fn good() -> Vec<u8> {
    file(&etcd_like(key_bucket()))
}

#[test]
fn reads_an_etcd_shaped_file() {
    let s = read(&good()).unwrap();
    assert_eq!(
        (s.revision, s.compact_revision, s.scheduled_compact_revision),
        (6, Some(3), Some(3))
    );
    assert_eq!(s.consistent_index, 42);
    assert!(!s.has_sha256_trailer);
    let revs: Vec<_> = s.records.iter().map(|r| (r.main, r.sub, r.tombstone)).collect();
    assert_eq!(revs, [(2, 0, false), (3, 0, false), (4, 0, false), (5, 0, false), (6, 0, true)]);
    assert_eq!(s.records[2].kv.value.len(), 3 * PAGE, "a value on overflow pages");
    assert_eq!(s.leases, [Lease { id: 7, ttl: 60, remaining_ttl: 0 }]);
    assert!(s.auth.enabled);
    assert_eq!(s.auth.revision, 9);
    assert_eq!(s.auth.users[0].roles, ["root"]);
    assert_eq!(s.auth.roles[0].key_permission[0].range_end, b"b");
    let live: Vec<_> = s.kvs_at(s.revision).iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(live, [b"b\x00\xff".to_vec(), b"c".to_vec()]);
    let at3: Vec<_> = s.kvs_at(3).iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
    assert_eq!(at3, [(b"a".to_vec(), b"2".to_vec())]);

    let trailed = with_trailer(good());
    assert!(read(&trailed).unwrap().has_sha256_trailer);
    assert!(crate::is_etcd_snapshot(&trailed));
    assert!(!crate::is_etcd_snapshot(b"\x1f\x8b not bbolt at all, a gzip maybe"));
}

#[test]
fn status_hashes_bucket_names_keys_and_values_in_order() {
    let db = good();
    let st = status(&with_trailer(db.clone())).unwrap();
    // The same walk by hand over what the builder wrote, through the reader's own bbolt layer.
    let bolt = crate::bolt::Db::open(&db).unwrap();
    let mut walk = bolt.walk();
    let (mut h, mut n) = (Crc32c::default(), 0);
    for (name, b) in walk.entries(bolt.root()).unwrap() {
        let crate::bolt::Value::Bucket(b) = b else { panic!("top-level value") };
        h.update(name);
        for (k, v) in walk.entries(b).unwrap() {
            h.update(k);
            if let crate::bolt::Value::Data(v) = v {
                h.update(v);
            }
            n += 1;
        }
    }
    assert_eq!((st.hash, st.total_keys, st.revision), (h.sum(), n, 6));
    assert_eq!(n, 2 + 1 + 1 + 1 + 5 + 1 + 1 + 4);
    assert_eq!(st.total_size, db.len() as u64);
}

#[test]
fn a_flipped_byte_fails_the_trailer() {
    let mut f = with_trailer(good());
    f[3 * PAGE + 100] ^= 0x01;
    assert!(matches!(read(&f), Err(Error::TrailerMismatch { .. })), "{:?}", read(&f));
    assert!(matches!(status(&f), Err(Error::TrailerMismatch { .. })));
}

#[test]
fn truncated_files_fail_without_panicking() {
    let f = with_trailer(good());
    // Cuts into the database. A cut inside the trailer leaves the whole database and a few
    // bytes that by etcd's rule are no trailer, which is read unverified, as etcd would.
    let db_len = f.len() - 32;
    let lens = (0..db_len).step_by(97).chain([16, 20, PAGE, 2 * PAGE, db_len - 1]);
    for len in lens {
        let cut = &f[..len];
        assert!(read(cut).is_err() && status(cut).is_err(), "{len}");
    }
    let short = &f[..f.len() - 32 - PAGE];
    assert!(matches!(read(short), Err(Error::Truncated { .. })), "{:?}", read(short));
    assert!(matches!(
        read(&f[..PAGE + 7]),
        Err(Error::Truncated { .. } | Error::NoValidMeta { .. })
    ));
    assert!(matches!(read(&[0u8; 4]), Err(Error::NotBbolt)));
}

#[test]
fn a_page_pointer_beyond_the_file_fails() {
    let f = file(&etcd_like(Node::Branch(vec![
        leaf(vec![(rev(2, 0), kv(b"a", b"1", 2, 2, 1, 0))]),
        Node::Ref(999),
    ])));
    assert!(matches!(read(&f), Err(Error::PageOutOfBounds { pgid: 999, .. })), "{:?}", read(&f));
    let mut g = good();
    set_root(&mut g, 1 << 40);
    assert!(matches!(read(&g), Err(Error::NoValidMeta { .. })), "{:?}", read(&g));
}

#[test]
fn cycles_and_shared_pages_fail() {
    // The key bucket's leaf is page 2 and its branch page 3 (children are written first, and
    // `minimal` has no other paged bucket), so Ref(3) points the branch at itself.
    let cyc = Node::Branch(vec![leaf(vec![(rev(2, 0), kv(b"a", b"1", 2, 2, 1, 0))]), Node::Ref(3)]);
    let f = file(&minimal(cyc));
    assert!(matches!(read(&f), Err(Error::PageReachedTwice { pgid: 3 })), "{:?}", read(&f));
    assert!(matches!(status(&f), Err(Error::PageReachedTwice { pgid: 3 })));
    // A pointer to a meta page: wrong page type.
    let meta = Node::Branch(vec![Node::Ref(0)]);
    let f = file(&etcd_like(meta));
    assert!(matches!(read(&f), Err(Error::PageType { flags: 4, .. })), "{:?}", read(&f));
}

#[test]
fn a_deep_chain_of_branch_pages_fails() {
    let mut node = leaf(vec![(rev(2, 0), kv(b"a", b"1", 2, 2, 1, 0))]);
    for _ in 0..crate::bolt::MAX_DEPTH + 1 {
        node = Node::Branch(vec![node]);
    }
    let f = file(&etcd_like(node));
    assert!(matches!(read(&f), Err(Error::TooDeep { .. })), "{:?}", read(&f));
}

#[test]
fn out_of_order_keys_and_bad_elements_fail() {
    let unsorted = Node::Leaf(vec![
        (rev(3, 0), Val::Data(kv(b"a", b"1", 3, 3, 1, 0))),
        (rev(2, 0), Val::Data(kv(b"a", b"1", 2, 2, 1, 0))),
    ]);
    assert!(matches!(read(&file(&etcd_like(unsorted))), Err(Error::KeyOrder { .. })));

    // The root page's first element with a huge key size.
    let mut f = good();
    let root = u64::from_le_bytes(f[32..40].try_into().unwrap()) as usize;
    f[root * PAGE + 16 + 8..root * PAGE + 16 + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(read(&f), Err(Error::ElementOutOfBounds { .. })), "{:?}", read(&f));
}

#[test]
fn the_second_meta_page_is_used_when_the_first_is_damaged() {
    let mut f = good();
    f[64] ^= 0xff; // meta 0's txid, covered by its checksum, which no longer matches
    assert_eq!(read(&f).unwrap().revision, 6);
    f[PAGE + 64] ^= 0xff;
    assert!(matches!(
        read(&f),
        Err(Error::NoValidMeta {
            meta0: crate::InvalidMeta::Checksum,
            meta1: crate::InvalidMeta::Checksum
        })
    ));
}

#[test]
fn wrong_etcd_values_are_typed_errors() {
    let short_key = leaf(vec![(b"short".to_vec(), kv(b"a", b"1", 2, 2, 1, 0))]);
    assert!(matches!(
        read(&file(&etcd_like(short_key))),
        Err(Error::BadEntry { bucket: "key", .. })
    ));
    let garbage = leaf(vec![(rev(2, 0), vec![0xff; 5])]);
    assert!(matches!(read(&file(&etcd_like(garbage))), Err(Error::Decode { bucket: "key", .. })));
    let no_meta = Node::Leaf(vec![(b"key".to_vec(), Val::Inline(vec![]))]);
    assert!(matches!(read(&file(&no_meta)), Err(Error::MissingBucket { name: "meta" })));
}

/// A single-byte change gives a result or an error, never a panic: at every byte of each page's
/// first 512 (headers, element headers, small keys and values) and at every 61st byte elsewhere
/// (all bytes everywhere takes tens of seconds in a debug build).
#[test]
fn no_single_byte_corruption_panics() {
    let f = good();
    for at in (0..f.len()).filter(|at| at % PAGE < 512 || at % 61 == 0) {
        for x in [0x01, 0xff] {
            let mut g = f.clone();
            g[at] ^= x;
            let _ = read(&g);
            let _ = status(&g);
        }
    }
}
