//! Unit tests of the auth store, permission coverage and tokens.

use picket_proto::authpb::permission::Type as PermType;
use picket_proto::authpb::{Permission, User};
use picket_proto::etcdserverpb::*;
use picket_proto::picket::raft::v1::auth_command::Op;
use picket_proto::picket::raft::v1::AuthEnable;
use picket_proto::picket::storage::v1::AuthState;

use super::perm::{check, txn_needs};
use super::store::{find_user, mutate};
use super::*;

fn user_add(name: &str) -> Op {
    Op::UserAdd(AuthUserAddRequest {
        name: name.into(),
        hashed_password: format!("hash-of-{name}"),
        ..Default::default()
    })
}

fn grant(role: &str, key: &[u8], end: &[u8], t: PermType) -> Op {
    Op::RoleGrantPermission(AuthRoleGrantPermissionRequest {
        name: role.into(),
        perm: Some(Permission { perm_type: t as i32, key: key.to_vec(), range_end: end.to_vec() }),
    })
}

/// root with the root role, and alice with READWRITE on `/app/`.
fn sample() -> AuthState {
    let mut s = AuthState::default();
    for op in [
        user_add("root"),
        Op::UserGrantRole(AuthUserGrantRoleRequest { user: "root".into(), role: ROOT.into() }),
        user_add("alice"),
        Op::RoleAdd(AuthRoleAddRequest { name: "app".into() }),
        grant("app", b"/app/", b"/app0", PermType::Readwrite),
        Op::UserGrantRole(AuthUserGrantRoleRequest { user: "alice".into(), role: "app".into() }),
    ] {
        mutate(&mut s, op).unwrap();
    }
    s
}

fn can(s: &AuthState, user: &str, needs: &[Need]) -> bool {
    check(find_user(s, user).unwrap(), &s.roles, needs).is_ok()
}

fn read(k: &[u8], e: &[u8]) -> Need {
    Need::Read(KeyRange::new(k, e))
}

fn write(k: &[u8], e: &[u8]) -> Need {
    Need::Write(KeyRange::new(k, e))
}

/// A store restored from an etcd snapshot is on but has no token key (etcd keeps none in its
/// backend): the first key proposed takes, bumps the revision (so every member reloads the
/// store), and later ones are ignored like any enable of an enabled store.
#[test]
fn an_enabled_store_without_a_signing_key_takes_the_first_one_proposed() {
    let mut s = AuthState { enabled: true, revision: 7, ..Default::default() };
    mutate(&mut s, Op::Enable(AuthEnable { signing_key: vec![3; 32] })).unwrap();
    assert_eq!((s.signing_key.clone(), s.revision), (vec![3; 32], 8));
    mutate(&mut s, Op::Enable(AuthEnable { signing_key: vec![4; 32] })).unwrap();
    assert_eq!((s.signing_key.clone(), s.revision), (vec![3; 32], 8));
    // No token verifies under the empty key of a store that has not got one yet.
    let token = crate::auth::token::sign(&[], "alice", b"hash", 7, 0, u64::MAX);
    let claims = crate::auth::token::parse(&token).unwrap();
    assert_eq!(
        crate::auth::token::verify(&[], &claims, b"hash", 0),
        Err(AuthError::InvalidAuthToken)
    );
}

#[test]
fn enable_needs_root_user_with_root_role() {
    let enable = || Op::Enable(AuthEnable { signing_key: vec![7; 32] });
    let mut s = AuthState::default();
    assert_eq!(mutate(&mut s, enable()), Err(AuthError::RootUserNotExist));
    mutate(&mut s, user_add("root")).unwrap();
    assert_eq!(mutate(&mut s, enable()), Err(AuthError::RootRoleNotExist));
    let rev = s.revision;
    assert!(!s.enabled, "a refused enable changes nothing");
    mutate(
        &mut s,
        Op::UserGrantRole(AuthUserGrantRoleRequest { user: "root".into(), role: ROOT.into() }),
    )
    .unwrap();
    mutate(&mut s, enable()).unwrap();
    assert!(s.enabled);
    assert_eq!(s.revision, rev + 2);
    // Enabling again keeps the signing key (tokens stay valid).
    mutate(&mut s, Op::Enable(AuthEnable { signing_key: vec![9; 32] })).unwrap();
    assert_eq!(s.signing_key, vec![7; 32]);
    // root is protected while auth is on.
    let del = Op::UserDelete(AuthUserDeleteRequest { name: "root".into() });
    assert_eq!(mutate(&mut s, del), Err(AuthError::InvalidAuthMgmt));
    let revoke =
        Op::UserRevokeRole(AuthUserRevokeRoleRequest { name: "root".into(), role: ROOT.into() });
    assert_eq!(mutate(&mut s, revoke), Err(AuthError::InvalidAuthMgmt));
}

#[test]
fn user_and_role_errors_are_etcds() {
    let mut s = sample();
    assert_eq!(mutate(&mut s, user_add("alice")), Err(AuthError::UserAlreadyExist));
    assert_eq!(mutate(&mut s, user_add("")), Err(AuthError::UserEmpty));
    let g = Op::UserGrantRole(AuthUserGrantRoleRequest { user: "bob".into(), role: "app".into() });
    assert_eq!(mutate(&mut s, g), Err(AuthError::UserNotFound));
    let g = Op::UserGrantRole(AuthUserGrantRoleRequest { user: "alice".into(), role: "x".into() });
    assert_eq!(mutate(&mut s, g), Err(AuthError::RoleNotFound));
    let r =
        Op::UserRevokeRole(AuthUserRevokeRoleRequest { name: "alice".into(), role: "x".into() });
    assert_eq!(mutate(&mut s, r), Err(AuthError::RoleNotGranted));
    let r = Op::RoleAdd(AuthRoleAddRequest { name: "app".into() });
    assert_eq!(mutate(&mut s, r), Err(AuthError::RoleAlreadyExist));
    let r = Op::RoleRevokePermission(AuthRoleRevokePermissionRequest {
        role: "app".into(),
        key: b"/other/".to_vec(),
        range_end: Vec::new(),
    });
    assert_eq!(mutate(&mut s, r), Err(AuthError::PermissionNotGranted));
    assert_eq!(
        mutate(&mut s, grant("app", b"b", b"a", PermType::Read)),
        Err(AuthError::InvalidPermRange)
    );
    assert_eq!(AuthError::UserNotFound.to_string(), "etcdserver: user name not found");
    assert_eq!(AuthError::PermissionDenied.to_string(), "etcdserver: permission denied");
}

#[test]
fn prefix_permission_covers_inside_only() {
    let s = sample();
    assert!(can(&s, "alice", &[read(b"/app/x", b""), write(b"/app/x", b"")]));
    assert!(can(&s, "alice", &[read(b"/app/", b"/app0")]));
    assert!(!can(&s, "alice", &[read(b"/other", b"")]));
    assert!(!can(&s, "alice", &[write(b"/other", b"")]));
    // A range that sticks out of the prefix is refused.
    assert!(!can(&s, "alice", &[read(b"/app/", b"/b")]));
    assert!(!can(&s, "alice", &[read(b"/app/", b"\0")]));
    // root may do everything.
    assert!(can(&s, "root", &[read(b"", b"\0"), write(b"", b"\0")]));
}

#[test]
fn adjacent_permissions_cover_together() {
    let mut s = sample();
    mutate(&mut s, grant("app", b"a", b"c", PermType::Read)).unwrap();
    mutate(&mut s, grant("app", b"c", b"e", PermType::Readwrite)).unwrap();
    assert!(can(&s, "alice", &[read(b"a", b"e")]));
    assert!(!can(&s, "alice", &[read(b"a", b"f")]));
    assert!(!can(&s, "alice", &[write(b"a", b"e")]), "READ does not grant WRITE");
    assert!(can(&s, "alice", &[write(b"c", b"e")]));
    mutate(&mut s, grant("app", b"z", b"\0", PermType::Write)).unwrap();
    assert!(can(&s, "alice", &[write(b"zz", b"\0")]));
    assert!(!can(&s, "alice", &[read(b"zz", b"")]));
}

#[test]
fn txn_needs_cover_compares_and_both_branches() {
    let s = sample();
    let put = |k: &[u8]| RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: k.to_vec(),
            ..Default::default()
        })),
    };
    let inside = TxnRequest {
        compare: vec![Compare { key: b"/app/a".to_vec(), ..Default::default() }],
        success: vec![put(b"/app/b")],
        failure: vec![put(b"/app/c")],
    };
    assert!(can(&s, "alice", &txn_needs(&inside)));
    let mut out = inside.clone();
    out.failure = vec![put(b"/etc/passwd")];
    assert!(!can(&s, "alice", &txn_needs(&out)), "an op outside in the other branch");
    let mut cmp = inside;
    cmp.compare.push(Compare { key: b"/secret".to_vec(), ..Default::default() });
    assert!(!can(&s, "alice", &txn_needs(&cmp)), "a compare outside");
}

#[test]
fn revoking_takes_effect_and_role_delete_revokes_from_users() {
    let mut s = sample();
    mutate(
        &mut s,
        Op::RoleRevokePermission(AuthRoleRevokePermissionRequest {
            role: "app".into(),
            key: b"/app/".to_vec(),
            range_end: b"/app0".to_vec(),
        }),
    )
    .unwrap();
    assert!(!can(&s, "alice", &[read(b"/app/x", b"")]));
    mutate(&mut s, Op::RoleDelete(AuthRoleDeleteRequest { role: "app".into() })).unwrap();
    assert!(find_user(&s, "alice").unwrap().roles.is_empty());
}

#[test]
fn tokens_verify_and_refuse_forgery_expiry_and_password_change() {
    let key = [1u8; 32];
    let t = token::sign(&key, "alice", b"h1", 5, 700, 1000);
    let c = token::parse(&t).unwrap();
    assert_eq!(
        (c.user.as_str(), c.auth_revision, c.issued, c.expires),
        ("alice", 5, Some(700), 1000)
    );
    assert!(token::verify(&key, &c, b"h1", 999).is_ok());
    assert_eq!(token::verify(&key, &c, b"h1", 1000), Err(AuthError::InvalidAuthToken));
    assert_eq!(token::verify(&key, &c, b"h2", 999), Err(AuthError::InvalidAuthToken));
    assert_eq!(token::verify(&[2u8; 32], &c, b"h1", 999), Err(AuthError::InvalidAuthToken));
    // Claiming to be someone else, a later expiry or a later issue time breaks the signature.
    for (from, to) in [(".1000.", ".99999."), (".700.", ".900.")] {
        let forged = t.replacen(from, to, 1);
        let fc = token::parse(&forged).unwrap();
        assert_eq!(token::verify(&key, &fc, b"h1", 999), Err(AuthError::InvalidAuthToken), "{to}");
    }
    for junk in [
        "",
        "v1",
        "v3.YQ.1.2.3.AA",
        "v1.@@.1.2.AA",
        "v1.YQ.x.2.AA",
        "v1.YQ.1.2.AA.extra",
        "v2.YQ.1.2.AA",
        "v2.YQ.1.x.3.AA",
        "v2.YQ.1.2.3.AA.extra",
    ] {
        assert_eq!(token::parse(junk), Err(AuthError::InvalidAuthToken), "{junk}");
    }
}

/// A member whose wall clock ran an hour ahead signed tokens that every other member accepted
/// for an hour past `--auth-token-ttl` (the expiry came from the issuer's clock alone). Seen
/// failing with the issue-time check taken out of `verify`: the token issued 3,600 s ahead
/// verified at the correct clock.
#[test]
fn a_token_issued_by_a_clock_far_ahead_is_refused_and_small_skew_is_tolerated() {
    let key = [1u8; 32];
    let now = 1_000_000;
    let ttl = 300;
    let from_ahead = |ahead: u64| {
        let t = token::sign(&key, "alice", b"h1", 5, now + ahead, now + ahead + ttl);
        token::verify(&key, &token::parse(&t).unwrap(), b"h1", now)
    };
    assert_eq!(from_ahead(3600), Err(AuthError::InvalidAuthToken));
    assert_eq!(from_ahead(token::CLOCK_TOLERANCE_SECS + 1), Err(AuthError::InvalidAuthToken));
    // Within the tolerance (and a token from a clock behind, which only lives shorter) is fine.
    assert!(from_ahead(token::CLOCK_TOLERANCE_SECS).is_ok());
    assert!(from_ahead(0).is_ok());
    let behind = token::sign(&key, "alice", b"h1", 5, now - 200, now - 200 + ttl);
    assert!(token::verify(&key, &token::parse(&behind).unwrap(), b"h1", now).is_ok());
    let c = token::parse(&token::sign(&key, "alice", b"h1", 5, now + 3600, now + 3900)).unwrap();
    assert_eq!(c.issued_ahead(now), Some(3600));
    assert_eq!(c.issued_ahead(u64::MAX), None, "no overflow");
}

/// A token lives at least `--auth-token-ttl`, wherever in a second it is issued. Expiry was
/// counted from the issue second rounded down, so a 1 s token signed at x.999 s expired 1 ms
/// later: CI saw `tests/auth.rs`'s first request with a fresh 1 s token refused.
#[test]
fn a_token_lives_at_least_its_ttl_wherever_in_a_second_it_is_issued() {
    let key = [1u8; 32];
    for ttl_secs in [1u64, 2, 300] {
        let ttl = std::time::Duration::from_secs(ttl_secs);
        for now_ms in [1_000_000_000, 1_000_000_001, 1_000_000_500, 1_000_000_999] {
            let (issued, expires) = token::lifetime(now_ms, ttl);
            let c = token::parse(&token::sign(&key, "alice", b"h1", 5, issued, expires)).unwrap();
            // The last whole second a verifier can read before `now_ms + ttl` has passed.
            let last_valid_sec = (now_ms + ttl_secs * 1000 - 1) / 1000;
            for sec in now_ms / 1000..=last_valid_sec {
                assert!(
                    token::verify(&key, &c, b"h1", sec).is_ok(),
                    "ttl {ttl_secs} s, issued at {now_ms} ms, refused at second {sec}"
                );
            }
            // ...and is refused in the first second that begins after its TTL has passed.
            let gone = token::verify(&key, &c, b"h1", last_valid_sec + 1);
            assert_eq!(gone, Err(AuthError::InvalidAuthToken), "ttl {ttl_secs} s, {now_ms} ms");
        }
    }
}

/// Tokens of builds before the issue time was signed (v1) are still accepted during a rolling
/// upgrade, with the old rule (expiry only), and a v1 signature cannot be passed off as v2.
#[test]
fn tokens_of_earlier_builds_still_verify() {
    let key = [1u8; 32];
    let t = token::sign_v1(&key, "alice", b"h1", 5, 1000);
    let c = token::parse(&t).unwrap();
    assert_eq!((c.issued, c.expires), (None, 1000));
    assert!(token::verify(&key, &c, b"h1", 999).is_ok());
    assert_eq!(token::verify(&key, &c, b"h1", 1000), Err(AuthError::InvalidAuthToken));
    // The same signature under a v2 header (with any issue time) does not verify.
    let sig = t.rsplit('.').next().unwrap();
    let relabeled = format!("v2.YWxpY2U.5.0.1000.{sig}");
    let rc = token::parse(&relabeled).unwrap();
    assert_eq!(token::verify(&key, &rc, b"h1", 999), Err(AuthError::InvalidAuthToken));
}

#[test]
fn passwords_hash_with_salt_and_verify() {
    let h1 = password::hash("pw", password::MIN_COST).unwrap();
    let h2 = password::hash("pw", password::MIN_COST).unwrap();
    assert_ne!(h1, h2, "random salt");
    assert!(password::is_bcrypt_hash(&h1));
    assert!(!password::is_bcrypt_hash("plain"));
    assert!(password::verify("pw", h1.as_bytes()));
    assert!(!password::verify("wrong", h1.as_bytes()));
    assert!(!password::verify("pw", b""));
    assert_eq!(password::hash(&"x".repeat(73), 4), Err(AuthError::PasswordTooLong));
}

#[test]
fn users_stay_sorted_so_members_write_the_same_bytes() {
    let mut a = AuthState::default();
    let mut b = AuthState::default();
    for n in ["c", "a", "b"] {
        mutate(&mut a, user_add(n)).unwrap();
    }
    for n in ["b", "c", "a"] {
        mutate(&mut b, user_add(n)).unwrap();
    }
    let names = |s: &AuthState| s.users.iter().map(|u: &User| u.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    assert_eq!(names(&a), vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
}
