//! One-member KV semantics through the `etcd-client` crate: revisions, versions, every Range,
//! Put, DeleteRange, Txn and Compact option, and etcd's exact error codes and texts.
//!
//! Each test starts its own fresh member, so absolute revisions are known (a fresh store is at
//! revision 1, the first write takes revision 2), and ends by checking that the member still
//! serves, so no request crashed or wedged it.

use anyhow::{Context, Result};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use picket_proto::etcdserverpb::kv_client::KvClient;
use picket_proto::etcdserverpb::PutRequest;
use picket_tests::util::{keys, rev};
use picket_tests::{assert_status, kvs, Cluster, ClusterOptions, Kv};
use tonic::Code;
use tracing::info;

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
const FUTURE_REV: &str = "etcdserver: mvcc: required revision is a future revision";

async fn single(opts: ClusterOptions) -> Result<(Cluster, Client)> {
    let cluster = Cluster::start(1, opts).await?;
    let client = cluster.client(0).await?;
    Ok((cluster, client))
}

/// The member still accepts a write and serves it back with a linearizable read.
async fn assert_still_serving(client: &mut Client) -> Result<()> {
    let put = client.put("still-serving", "yes", None).await.context("put after the test")?;
    let got = client.get("still-serving", None).await.context("get after the test")?;
    assert_eq!(got.kvs().len(), 1);
    assert_eq!(got.kvs()[0].value(), b"yes");
    assert_eq!(got.kvs()[0].mod_revision(), rev(put.header()));
    Ok(())
}

/// The only key-value of a single-key `get`.
async fn get_one(client: &mut Client, key: &str, opts: Option<GetOptions>) -> Result<Option<Kv>> {
    let resp = client.get(key, opts).await?;
    assert!(resp.kvs().len() <= 1, "single-key get returned {:?}", kvs(&resp));
    Ok(kvs(&resp).into_iter().next())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_versions_and_headers() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;

    info!("a fresh store is at revision 1 and every header identifies the cluster and member");
    let empty = c.get("a", None).await?;
    let h = empty.header().context("header")?;
    assert_eq!(h.revision(), 1, "fresh store revision");
    assert_ne!(h.cluster_id(), 0, "cluster_id");
    assert_ne!(h.member_id(), 0, "member_id");
    assert!(h.raft_term() > 0, "raft_term {}", h.raft_term());
    assert!(empty.kvs().is_empty());
    assert_eq!(empty.count(), 0);
    assert!(!empty.more());

    info!("each put takes exactly one new revision; version counts puts since creation");
    assert_eq!(rev(c.put("a", "1", None).await?.header()), 2);
    assert_eq!(get_one(&mut c, "a", None).await?, Some(Kv::new("a", "1", 2, 2, 1)));
    assert_eq!(rev(c.put("a", "2", None).await?.header()), 3);
    assert_eq!(get_one(&mut c, "a", None).await?, Some(Kv::new("a", "2", 2, 3, 2)));
    assert_eq!(rev(c.put("b", "x", None).await?.header()), 4);
    assert_eq!(rev(c.get("a", None).await?.header()), 4, "range header carries the store revision");

    info!("delete takes a revision and resets version; re-creating starts over at version 1");
    let del = c.delete("a", None).await?;
    assert_eq!((del.deleted(), rev(del.header())), (1, 5));
    let gone = c.get("a", None).await?;
    assert!(gone.kvs().is_empty());
    assert_eq!(rev(gone.header()), 5);
    assert_eq!(rev(c.put("a", "3", None).await?.header()), 6);
    assert_eq!(get_one(&mut c, "a", None).await?, Some(Kv::new("a", "3", 6, 6, 1)));

    info!("deleting nothing changes nothing, so it takes no revision");
    let del = c.delete("zzz", None).await?;
    assert_eq!((del.deleted(), rev(del.header())), (0, 6));
    assert_eq!(rev(c.get("zzz", None).await?.header()), 6);

    info!("reads at old revisions see the old values; header still carries the current revision");
    let at = |r| Some(GetOptions::new().with_revision(r));
    assert_eq!(get_one(&mut c, "a", at(2)).await?, Some(Kv::new("a", "1", 2, 2, 1)));
    assert_eq!(get_one(&mut c, "a", at(3)).await?, Some(Kv::new("a", "2", 2, 3, 2)));
    assert_eq!(get_one(&mut c, "a", at(4)).await?, Some(Kv::new("a", "2", 2, 3, 2)));
    assert_eq!(get_one(&mut c, "a", at(5)).await?, None);
    assert_eq!(get_one(&mut c, "a", at(1)).await?, None);
    assert_eq!(get_one(&mut c, "a", at(6)).await?, Some(Kv::new("a", "3", 6, 6, 1)));
    assert_eq!(rev(c.get("a", at(2)).await?.header()), 6);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prev_kv_ignore_value_and_ignore_lease() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;

    info!("prev_kv on put: absent for a new key, the old pair for an existing one");
    let p = c.put("k", "v1", Some(PutOptions::new().with_prev_key())).await?;
    assert_eq!(rev(p.header()), 2);
    assert!(p.prev_key().is_none(), "prev_kv of a new key: {:?}", p.prev_key());
    let p = c.put("k", "v2", Some(PutOptions::new().with_prev_key())).await?;
    assert_eq!(rev(p.header()), 3);
    assert_eq!(p.prev_key().map(Kv::from), Some(Kv::new("k", "v1", 2, 2, 1)));
    let p = c.put("k", "v3", None).await?;
    assert!(p.prev_key().is_none(), "prev_kv returned without being asked for");

    info!("ignore_value keeps the value but still takes a revision and bumps the version");
    let p = c.put("k", "", Some(PutOptions::new().with_ignore_value().with_prev_key())).await?;
    assert_eq!(rev(p.header()), 5);
    assert_eq!(p.prev_key().map(Kv::from), Some(Kv::new("k", "v3", 2, 4, 3)));
    assert_eq!(get_one(&mut c, "k", None).await?, Some(Kv::new("k", "v3", 2, 5, 4)));

    info!("ignore_lease keeps the (absent) lease and writes the new value");
    let p = c.put("k", "v4", Some(PutOptions::new().with_ignore_lease())).await?;
    assert_eq!(rev(p.header()), 6);
    assert_eq!(get_one(&mut c, "k", None).await?, Some(Kv::new("k", "v4", 2, 6, 5)));

    info!("errors of ignore_value / ignore_lease, none of which takes a revision");
    assert_status(
        c.put("missing", "", Some(PutOptions::new().with_ignore_value())).await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_status(
        c.put("missing", "v", Some(PutOptions::new().with_ignore_lease())).await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_status(
        c.put("k", "not-empty", Some(PutOptions::new().with_ignore_value())).await,
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    assert_status(
        c.put("k", "v", Some(PutOptions::new().with_ignore_lease().with_lease(0x1234))).await,
        Code::InvalidArgument,
        "etcdserver: lease is provided",
    );
    assert_eq!(rev(c.get("k", None).await?.header()), 6, "failed puts took a revision");
    assert!(c.get("missing", None).await?.kvs().is_empty(), "a failed put created the key");

    info!("prev_kv on delete returns the deleted pairs");
    let d = c.delete("k", Some(DeleteOptions::new().with_prev_key())).await?;
    assert_eq!((d.deleted(), rev(d.header())), (1, 7));
    assert_eq!(
        d.prev_kvs().iter().map(Kv::from).collect::<Vec<_>>(),
        vec![Kv::new("k", "v4", 2, 6, 5)]
    );
    let d = c.delete("k", None).await?;
    assert!(d.prev_kvs().is_empty(), "prev_kvs returned without being asked for");

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

/// Writes the data set used by the range tests. Final state (key: value, create, mod, version):
/// `bar`: y,7,7,1; `foo/a`: 33,2,5,2; `foo/b`: 111,3,9,3; `foo/c`: 2,4,4,1; `fop`: x,6,6,1.
async fn range_fixture(c: &mut Client) -> Result<()> {
    let writes = [
        ("foo/a", "3"),
        ("foo/b", "1"),
        ("foo/c", "2"),
        ("foo/a", "33"),
        ("fop", "x"),
        ("bar", "y"),
        ("foo/b", "11"),
        ("foo/b", "111"),
    ];
    for (i, (k, v)) in writes.into_iter().enumerate() {
        let r = rev(c.put(k, v, None).await?.header());
        assert_eq!(r, i as i64 + 2, "revision of write #{i} ({k}={v})");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_options() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    range_fixture(&mut c).await?;
    let a = Kv::new("foo/a", "33", 2, 5, 2);
    let b = Kv::new("foo/b", "111", 3, 9, 3);
    let cc = Kv::new("foo/c", "2", 4, 4, 1);
    let fop = Kv::new("fop", "x", 6, 6, 1);
    let bar = Kv::new("bar", "y", 7, 7, 1);

    info!("prefix, explicit range, from-key and all-keys ranges, in key order");
    let r = c.get("foo/", Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(kvs(&r), vec![a.clone(), b.clone(), cc.clone()]);
    assert_eq!((r.count(), r.more(), rev(r.header())), (3, false, 9));
    let r = c.get("foo/a", Some(GetOptions::new().with_range("foo/c"))).await?;
    assert_eq!(kvs(&r), vec![a.clone(), b.clone()]);
    let r = c.get("foo/b", Some(GetOptions::new().with_from_key())).await?;
    assert_eq!(kvs(&r), vec![b.clone(), cc.clone(), fop.clone()]);
    assert_eq!(r.count(), 3);
    let r = c.get("", Some(GetOptions::new().with_all_keys())).await?;
    assert_eq!(kvs(&r), vec![bar.clone(), a.clone(), b.clone(), cc.clone(), fop.clone()]);
    assert_eq!(r.count(), 5);
    let r = c.get("foo", None).await?;
    assert!(r.kvs().is_empty(), "a single-key get of a non-existent key matched {:?}", kvs(&r));

    info!("limit truncates and sets `more`; count is the size of the whole range");
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_limit(2))).await?;
    assert_eq!(kvs(&r), vec![a.clone(), b.clone()]);
    assert_eq!((r.count(), r.more()), (3, true));
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_limit(3))).await?;
    assert_eq!(kvs(&r).len(), 3);
    assert_eq!((r.count(), r.more()), (3, false));
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_limit(10))).await?;
    assert_eq!((r.kvs().len(), r.count(), r.more()), (3, 3, false));

    info!("count_only returns no pairs; keys_only returns pairs without values");
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_count_only())).await?;
    assert!(r.kvs().is_empty(), "count_only returned {:?}", kvs(&r));
    assert_eq!((r.count(), r.more()), (3, false));
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_keys_only())).await?;
    let no_values: Vec<Kv> =
        [&a, &b, &cc].iter().map(|kv| Kv { value: Vec::new(), ..(*kv).clone() }).collect();
    assert_eq!(kvs(&r), no_values);

    info!("sorting by every target in both orders (ties are impossible in this data set)");
    let sorted = |target, order| Some(GetOptions::new().with_prefix().with_sort(target, order));
    let cases = [
        (SortTarget::Key, SortOrder::Ascend, ["foo/a", "foo/b", "foo/c"]),
        (SortTarget::Key, SortOrder::Descend, ["foo/c", "foo/b", "foo/a"]),
        // versions: a=2, b=3, c=1
        (SortTarget::Version, SortOrder::Ascend, ["foo/c", "foo/a", "foo/b"]),
        (SortTarget::Version, SortOrder::Descend, ["foo/b", "foo/a", "foo/c"]),
        // A non-key target with order NONE sorts ascending (etcd's default).
        (SortTarget::Version, SortOrder::None, ["foo/c", "foo/a", "foo/b"]),
        // create revisions: a=2, b=3, c=4
        (SortTarget::Create, SortOrder::Ascend, ["foo/a", "foo/b", "foo/c"]),
        (SortTarget::Create, SortOrder::Descend, ["foo/c", "foo/b", "foo/a"]),
        // mod revisions: a=5, b=9, c=4
        (SortTarget::Mod, SortOrder::Ascend, ["foo/c", "foo/a", "foo/b"]),
        (SortTarget::Mod, SortOrder::Descend, ["foo/b", "foo/a", "foo/c"]),
        // values (bytewise): "111" < "2" < "33"
        (SortTarget::Value, SortOrder::Ascend, ["foo/b", "foo/c", "foo/a"]),
        (SortTarget::Value, SortOrder::Descend, ["foo/a", "foo/c", "foo/b"]),
    ];
    for (target, order, expected) in cases {
        let r = c.get("foo/", sorted(target, order)).await?;
        assert_eq!(keys(&r), expected, "sort by {target:?} {order:?}");
    }
    info!("sort applies before limit");
    let r = c
        .get(
            "foo/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Mod, SortOrder::Descend)
                    .with_limit(1),
            ),
        )
        .await?;
    assert_eq!(kvs(&r), vec![b.clone()]);
    assert_eq!((r.count(), r.more()), (3, true));

    info!("reads at a revision see the range as it was then");
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_revision(4))).await?;
    assert_eq!(
        kvs(&r),
        vec![
            Kv::new("foo/a", "3", 2, 2, 1),
            Kv::new("foo/b", "1", 3, 3, 1),
            Kv::new("foo/c", "2", 4, 4, 1)
        ]
    );
    assert_eq!(rev(r.header()), 9);
    let r = c
        .get("foo/", Some(GetOptions::new().with_prefix().with_revision(3).with_count_only()))
        .await?;
    assert_eq!(r.count(), 2);
    let r = c.get("", Some(GetOptions::new().with_all_keys().with_revision(1))).await?;
    assert!(r.kvs().is_empty());
    let r = c.get("foo/b", Some(GetOptions::new().with_revision(8))).await?;
    assert_eq!(kvs(&r), vec![Kv::new("foo/b", "11", 3, 8, 2)]);

    info!("mod and create revision filters");
    let filtered = |o: GetOptions| Some(o.with_prefix());
    let r = c.get("foo/", filtered(GetOptions::new().with_min_mod_revision(5))).await?;
    assert_eq!(kvs(&r), vec![a.clone(), b.clone()]);
    let r = c.get("foo/", filtered(GetOptions::new().with_max_mod_revision(5))).await?;
    assert_eq!(kvs(&r), vec![a.clone(), cc.clone()]);
    let r = c
        .get("foo/", filtered(GetOptions::new().with_min_mod_revision(5).with_max_mod_revision(5)))
        .await?;
    assert_eq!(kvs(&r), vec![a.clone()]);
    let r = c.get("foo/", filtered(GetOptions::new().with_min_create_revision(3))).await?;
    assert_eq!(kvs(&r), vec![b.clone(), cc.clone()]);
    let r = c.get("foo/", filtered(GetOptions::new().with_max_create_revision(3))).await?;
    assert_eq!(kvs(&r), vec![a.clone(), b.clone()]);
    // The lock and election recipes combine the filter with a sort and a limit.
    let r = c
        .get(
            "foo/",
            filtered(
                GetOptions::new()
                    .with_max_create_revision(3)
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_limit(1),
            ),
        )
        .await?;
    assert_eq!(kvs(&r), vec![b.clone()]);

    info!("serializable reads serve the same data");
    let r = c.get("foo/", Some(GetOptions::new().with_prefix().with_serializable())).await?;
    assert_eq!(kvs(&r), vec![a.clone(), b.clone(), cc.clone()]);
    assert_eq!(rev(r.header()), 9);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_single_range_and_prefix() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    for (i, k) in ["a", "b", "c", "d", "p/1", "p/2", "p/3", "q"].into_iter().enumerate() {
        assert_eq!(rev(c.put(k, format!("v-{k}"), None).await?.header()), i as i64 + 2);
    }
    // Revisions: a=2 b=3 c=4 d=5 p/1=6 p/2=7 p/3=8 q=9.

    info!("single-key delete");
    let d = c.delete("a", None).await?;
    assert_eq!((d.deleted(), rev(d.header())), (1, 10));

    info!("a range delete takes one revision for all its keys and returns them in key order");
    let d = c.delete("b", Some(DeleteOptions::new().with_range("d").with_prev_key())).await?;
    assert_eq!((d.deleted(), rev(d.header())), (2, 11));
    assert_eq!(
        d.prev_kvs().iter().map(Kv::from).collect::<Vec<_>>(),
        vec![Kv::new("b", "v-b", 3, 3, 1), Kv::new("c", "v-c", 4, 4, 1)]
    );

    info!("prefix delete");
    let d = c.delete("p/", Some(DeleteOptions::new().with_prefix().with_prev_key())).await?;
    assert_eq!((d.deleted(), rev(d.header())), (3, 12));
    assert_eq!(
        d.prev_kvs().iter().map(Kv::from).collect::<Vec<_>>(),
        vec![
            Kv::new("p/1", "v-p/1", 6, 6, 1),
            Kv::new("p/2", "v-p/2", 7, 7, 1),
            Kv::new("p/3", "v-p/3", 8, 8, 1)
        ]
    );

    info!("a delete that matches nothing takes no revision");
    let d = c.delete("zz", Some(DeleteOptions::new().with_prefix().with_prev_key())).await?;
    assert_eq!((d.deleted(), rev(d.header())), (0, 12));
    assert!(d.prev_kvs().is_empty());

    let all = c.get("", Some(GetOptions::new().with_all_keys())).await?;
    assert_eq!(keys(&all), ["d", "q"]);

    info!("deleted keys remain readable at older revisions");
    let old = c.get("p/", Some(GetOptions::new().with_prefix().with_revision(11))).await?;
    assert_eq!(keys(&old), ["p/1", "p/2", "p/3"]);

    info!("from-key delete removes everything at and after the key");
    let d = c.delete("d", Some(DeleteOptions::new().with_from_key())).await?;
    assert_eq!((d.deleted(), rev(d.header())), (2, 13));
    let all = c.get("", Some(GetOptions::new().with_all_keys())).await?;
    assert!(all.kvs().is_empty(), "left: {:?}", kvs(&all));
    assert_eq!(all.count(), 0);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

/// Runs a write-free txn with one compare and returns whether it succeeded.
async fn compare_holds(c: &mut Client, cmp: Compare) -> Result<bool> {
    let label = format!("{cmp:?}");
    let r = c.txn(Txn::new().when([cmp])).await.with_context(|| label.clone())?;
    assert!(r.op_responses().is_empty(), "{label}: empty branches returned responses");
    Ok(r.succeeded())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_compare_targets_and_results() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    c.put("k", "v", None).await?; // rev 2
    c.put("k", "v2", None).await?; // rev 3: k has create 2, mod 3, version 2, lease 0
    use CompareOp::{Equal, Greater, Less, NotEqual};

    info!("every target with every result on an existing key");
    let cases: Vec<(Compare, bool)> = vec![
        (Compare::version("k", Equal, 2), true),
        (Compare::version("k", Equal, 1), false),
        (Compare::version("k", NotEqual, 1), true),
        (Compare::version("k", NotEqual, 2), false),
        (Compare::version("k", Greater, 1), true),
        (Compare::version("k", Greater, 2), false),
        (Compare::version("k", Less, 3), true),
        (Compare::version("k", Less, 2), false),
        (Compare::create_revision("k", Equal, 2), true),
        (Compare::create_revision("k", Equal, 3), false),
        (Compare::create_revision("k", NotEqual, 3), true),
        (Compare::create_revision("k", Greater, 1), true),
        (Compare::create_revision("k", Greater, 2), false),
        (Compare::create_revision("k", Less, 3), true),
        (Compare::create_revision("k", Less, 2), false),
        (Compare::mod_revision("k", Equal, 3), true),
        (Compare::mod_revision("k", Equal, 2), false),
        (Compare::mod_revision("k", NotEqual, 3), false),
        (Compare::mod_revision("k", NotEqual, 2), true),
        (Compare::mod_revision("k", Greater, 2), true),
        (Compare::mod_revision("k", Greater, 3), false),
        (Compare::mod_revision("k", Less, 4), true),
        (Compare::mod_revision("k", Less, 3), false),
        (Compare::value("k", Equal, "v2"), true),
        (Compare::value("k", Equal, "v"), false),
        (Compare::value("k", NotEqual, "v"), true),
        (Compare::value("k", NotEqual, "v2"), false),
        (Compare::value("k", Greater, "v1"), true),
        (Compare::value("k", Greater, "v2"), false),
        (Compare::value("k", Less, "v3"), true),
        (Compare::value("k", Less, "v2"), false),
        (Compare::lease("k", Equal, 0), true),
        (Compare::lease("k", Equal, 7), false),
        (Compare::lease("k", NotEqual, 7), true),
        (Compare::lease("k", NotEqual, 0), false),
        (Compare::lease("k", Greater, 0), false),
        (Compare::lease("k", Less, 7), true),
        (Compare::lease("k", Less, 0), false),
    ];
    for (cmp, expected) in cases {
        let label = format!("{cmp:?}");
        assert_eq!(compare_holds(&mut c, cmp).await?, expected, "{label}");
    }

    info!("a missing key has version/create/mod/lease 0, and a value compare on it always fails");
    let missing: Vec<(Compare, bool)> = vec![
        (Compare::version("nokey", Equal, 0), true),
        (Compare::create_revision("nokey", Equal, 0), true),
        (Compare::mod_revision("nokey", Equal, 0), true),
        (Compare::lease("nokey", Equal, 0), true),
        (Compare::version("nokey", Greater, 0), false),
        (Compare::value("nokey", Equal, ""), false),
        (Compare::value("nokey", NotEqual, "x"), false),
        (Compare::value("nokey", Less, "x"), false),
    ];
    for (cmp, expected) in missing {
        let label = format!("{cmp:?}");
        assert_eq!(compare_holds(&mut c, cmp).await?, expected, "{label}");
    }

    info!("all compares must hold; a compare over a range must hold for every key in it");
    let both =
        Txn::new().when([Compare::version("k", Equal, 2), Compare::value("k", Equal, "nope")]);
    assert!(!c.txn(both).await?.succeeded());
    c.put("r/1", "x", None).await?;
    c.put("r/2", "x", None).await?;
    assert!(compare_holds(&mut c, Compare::version("r/", Equal, 1).with_prefix()).await?);
    assert!(compare_holds(&mut c, Compare::value("r/", Equal, "x").with_prefix()).await?);
    c.put("r/2", "y", None).await?;
    assert!(!compare_holds(&mut c, Compare::version("r/", Equal, 1).with_prefix()).await?);
    assert!(!compare_holds(&mut c, Compare::value("r/", Equal, "x").with_prefix()).await?);
    assert!(compare_holds(&mut c, Compare::version("r/1", Equal, 1).with_range("r/2")).await?);

    info!("compares alone never change the store");
    assert_eq!(rev(c.get("k", None).await?.header()), 6);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_branches_nesting_and_revisions() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    c.put("k", "v", None).await?; // rev 2

    info!("success branch: a range inside the txn sees the txn's own put");
    let t = Txn::new()
        .when([Compare::value("k", CompareOp::Equal, "v")])
        .and_then([
            TxnOp::put("k", "s", Some(PutOptions::new().with_prev_key())),
            TxnOp::get("k", None),
        ])
        .or_else([TxnOp::put("k", "f", None)]);
    let r = c.txn(t).await?;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 3);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 2, "{ops:?}");
    match &ops[0] {
        TxnOpResponse::Put(p) => {
            assert_eq!(p.prev_key().map(Kv::from), Some(Kv::new("k", "v", 2, 2, 1)))
        }
        other => panic!("expected a put response, got {other:?}"),
    }
    match &ops[1] {
        TxnOpResponse::Get(g) => assert_eq!(kvs(g), vec![Kv::new("k", "s", 2, 3, 2)]),
        other => panic!("expected a range response, got {other:?}"),
    }

    info!("failure branch runs when a compare fails");
    let t = Txn::new()
        .when([Compare::value("k", CompareOp::Equal, "nope")])
        .and_then([TxnOp::put("x", "never", None)])
        .or_else([TxnOp::put("k", "f", None), TxnOp::get("k", None), TxnOp::delete("zzz", None)]);
    let r = c.txn(t).await?;
    assert!(!r.succeeded());
    assert_eq!(rev(r.header()), 4);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 3, "{ops:?}");
    match &ops[1] {
        TxnOpResponse::Get(g) => assert_eq!(kvs(g), vec![Kv::new("k", "f", 2, 4, 3)]),
        other => panic!("expected a range response, got {other:?}"),
    }
    match &ops[2] {
        TxnOpResponse::Delete(d) => assert_eq!(d.deleted(), 0),
        other => panic!("expected a delete response, got {other:?}"),
    }
    assert!(c.get("x", None).await?.kvs().is_empty(), "the success branch ran as well");

    info!("every key written by one txn, nested txns included, shares one revision");
    let inner = Txn::new()
        .when([Compare::version("k", CompareOp::Equal, 3)])
        .and_then([TxnOp::put("t3", "c", None), TxnOp::get("t1", None)])
        .or_else([TxnOp::put("t4", "d", None)]);
    let t = Txn::new().when([Compare::create_revision("t1", CompareOp::Equal, 0)]).and_then([
        TxnOp::put("t1", "a", None),
        TxnOp::put("t2", "b", None),
        TxnOp::txn(inner),
        TxnOp::delete("k", None),
    ]);
    let r = c.txn(t).await?;
    assert!(r.succeeded());
    let txn_rev = rev(r.header());
    assert_eq!(txn_rev, 5);
    let ops = r.op_responses();
    assert_eq!(ops.len(), 4, "{ops:?}");
    match &ops[2] {
        TxnOpResponse::Txn(nested) => {
            assert!(nested.succeeded(), "nested compare on k (version 3, untouched so far) failed");
            let nops = nested.op_responses();
            assert_eq!(nops.len(), 2, "{nops:?}");
            match &nops[1] {
                TxnOpResponse::Get(g) => assert_eq!(kvs(g), vec![Kv::new("t1", "a", 5, 5, 1)]),
                other => panic!("expected a range response in the nested txn, got {other:?}"),
            }
        }
        other => panic!("expected a nested txn response, got {other:?}"),
    }
    let all = c.get("t", Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(
        kvs(&all),
        vec![Kv::new("t1", "a", 5, 5, 1), Kv::new("t2", "b", 5, 5, 1), Kv::new("t3", "c", 5, 5, 1)]
    );
    assert!(c.get("k", None).await?.kvs().is_empty());

    info!("etcd evaluates nested compares against the store as it was before the txn");
    // t5 does not exist before the txn; the outer txn creates it, but the nested compare still
    // sees version 0, so the nested success branch runs.
    let inner = Txn::new()
        .when([Compare::version("t5", CompareOp::Equal, 0)])
        .and_then([TxnOp::put("t6", "before", None)])
        .or_else([TxnOp::put("t6", "after", None)]);
    let t = Txn::new().and_then([TxnOp::put("t5", "x", None), TxnOp::txn(inner)]);
    let r = c.txn(t).await?;
    assert_eq!(rev(r.header()), 6);
    assert_eq!(get_one(&mut c, "t6", None).await?, Some(Kv::new("t6", "before", 6, 6, 1)));

    info!("txns without writes take no revision");
    let r = c.txn(Txn::new().and_then([TxnOp::get("t1", None)])).await?;
    assert_eq!(rev(r.header()), 6);
    let r = c
        .txn(
            Txn::new()
                .when([Compare::version("t1", CompareOp::Equal, 1)])
                .or_else([TxnOp::put("t1", "no", None)]),
        )
        .await?;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 6);
    let r = c.txn(Txn::new().and_then([TxnOp::delete("missing", None)])).await?;
    assert_eq!(rev(r.header()), 6);
    let r = c.txn(Txn::new()).await?;
    assert!(r.succeeded(), "an empty txn succeeds");
    assert_eq!(rev(r.header()), 6);
    assert_eq!(rev(c.put("after", "1", None).await?.header()), 7);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    for (i, v) in ["1", "2", "3"].into_iter().enumerate() {
        assert_eq!(rev(c.put("c", v, None).await?.header()), i as i64 + 2);
    }
    assert_eq!(rev(c.put("d", "x", None).await?.header()), 5);
    let at = |r| Some(GetOptions::new().with_revision(r));

    info!("future revisions are rejected by reads and by compaction");
    assert_status(c.get("c", at(6)).await, Code::OutOfRange, FUTURE_REV);
    assert_status(c.compact(100, None).await, Code::OutOfRange, FUTURE_REV);

    info!("compact at 3: below it is gone, at and above it is readable");
    let r = c.compact(3, None).await?;
    assert_eq!(rev(r.header()), 5, "compaction takes no revision");
    assert_status(c.get("c", at(2)).await, Code::OutOfRange, COMPACTED);
    assert_status(
        c.get("c", Some(GetOptions::new().with_prefix().with_revision(1))).await,
        Code::OutOfRange,
        COMPACTED,
    );
    assert_eq!(get_one(&mut c, "c", at(3)).await?, Some(Kv::new("c", "2", 2, 3, 2)));
    assert_eq!(get_one(&mut c, "c", at(4)).await?, Some(Kv::new("c", "3", 2, 4, 3)));
    assert_eq!(get_one(&mut c, "c", at(5)).await?, Some(Kv::new("c", "3", 2, 4, 3)));
    assert_eq!(get_one(&mut c, "c", None).await?, Some(Kv::new("c", "3", 2, 4, 3)));
    assert_eq!(get_one(&mut c, "d", None).await?, Some(Kv::new("d", "x", 5, 5, 1)));
    assert_status(c.get("c", at(6)).await, Code::OutOfRange, FUTURE_REV);

    info!("a range inside a txn at a compacted revision fails the same way");
    let t = Txn::new().and_then([TxnOp::get("c", at(2))]);
    assert_status(c.txn(t).await, Code::OutOfRange, COMPACTED);

    info!("compacting at or below the compacted revision fails");
    assert_status(c.compact(3, None).await, Code::OutOfRange, COMPACTED);
    assert_status(c.compact(2, None).await, Code::OutOfRange, COMPACTED);

    info!("physical compaction at the current revision");
    c.compact(5, Some(CompactionOptions::new().with_physical())).await?;
    assert_status(c.get("c", at(4)).await, Code::OutOfRange, COMPACTED);
    assert_eq!(get_one(&mut c, "c", at(5)).await?, Some(Kv::new("c", "3", 2, 4, 3)));
    assert_eq!(rev(c.put("e", "1", None).await?.header()), 6, "the next write after compaction");

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;
    c.put("a", "1", None).await?; // rev 2

    info!("empty keys");
    const NO_KEY: &str = "etcdserver: key is not provided";
    assert_status(c.put("", "v", None).await, Code::InvalidArgument, NO_KEY);
    assert_status(c.get("", None).await, Code::InvalidArgument, NO_KEY);
    assert_status(c.delete("", None).await, Code::InvalidArgument, NO_KEY);
    assert_status(
        c.txn(Txn::new().and_then([TxnOp::put("", "v", None)])).await,
        Code::InvalidArgument,
        NO_KEY,
    );

    info!("duplicate keys among the writes of one branch (nested txns included)");
    const DUP: &str = "etcdserver: duplicate key given in txn request";
    let dups = [
        Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]),
        Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::delete("d", None)]),
        Txn::new().and_then([
            TxnOp::delete("c", Some(DeleteOptions::new().with_range("e"))),
            TxnOp::put("d", "1", None),
        ]),
        Txn::new().or_else([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]),
        Txn::new().and_then([
            TxnOp::put("d", "1", None),
            TxnOp::txn(Txn::new().and_then([TxnOp::put("d", "2", None)])),
        ]),
    ];
    for t in dups {
        let label = format!("{t:?}");
        let res = c.txn(t).await;
        assert!(res.is_err(), "duplicate-key txn was accepted: {label}");
        assert_status(res, Code::InvalidArgument, DUP);
    }
    info!("the same key in the two branches, or read twice, is not a duplicate");
    let ok = Txn::new()
        .when([Compare::version("a", CompareOp::Equal, 1)])
        .and_then([TxnOp::put("d", "s", None), TxnOp::get("d", None), TxnOp::get("d", None)])
        .or_else([TxnOp::put("d", "f", None)]);
    let r = c.txn(ok).await?;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 3);

    info!("unknown leases");
    const NO_LEASE: &str = "etcdserver: requested lease not found";
    assert_status(
        c.put("l", "v", Some(PutOptions::new().with_lease(0x1234))).await,
        Code::NotFound,
        NO_LEASE,
    );
    let t = Txn::new().and_then([TxnOp::put("l", "v", Some(PutOptions::new().with_lease(0x1234)))]);
    assert_status(c.txn(t).await, Code::NotFound, NO_LEASE);

    info!("no failed request took a revision or wrote anything");
    let all = c.get("", Some(GetOptions::new().with_all_keys())).await?;
    assert_eq!(rev(all.header()), 3);
    assert_eq!(keys(&all), ["a", "d"]);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_ops_limit() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default().max_txn_ops(4)).await?;
    const TOO_MANY: &str = "etcdserver: too many operations in txn request";
    let puts = |n: usize, prefix: &str| {
        (0..n).map(|i| TxnOp::put(format!("{prefix}{i}"), "v", None)).collect::<Vec<_>>()
    };
    let compares = |n: usize| {
        (0..n).map(|i| Compare::version(format!("c{i}"), CompareOp::Equal, 0)).collect::<Vec<_>>()
    };

    info!("exactly --max-txn-ops operations per branch are allowed");
    let r =
        c.txn(Txn::new().when(compares(4)).and_then(puts(4, "s")).or_else(puts(4, "f"))).await?;
    assert!(r.succeeded());
    assert_eq!(rev(r.header()), 2);

    info!("one more in any branch, or one more compare, is rejected");
    assert_status(c.txn(Txn::new().and_then(puts(5, "s"))).await, Code::InvalidArgument, TOO_MANY);
    assert_status(c.txn(Txn::new().or_else(puts(5, "f"))).await, Code::InvalidArgument, TOO_MANY);
    assert_status(c.txn(Txn::new().when(compares(5))).await, Code::InvalidArgument, TOO_MANY);
    let all = c.get("", Some(GetOptions::new().with_all_keys())).await?;
    assert_eq!(rev(all.header()), 2);
    assert_eq!(all.count(), 4);

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_too_large() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default().max_request_bytes(1024)).await?;
    const TOO_LARGE: &str = "etcdserver: request is too large";

    info!("a request under --max-request-bytes is served");
    c.put("small", vec![b's'; 512], None).await?;

    info!("a 4 KiB value is rejected, alone or inside a txn");
    assert_status(c.put("big", vec![b'b'; 4096], None).await, Code::InvalidArgument, TOO_LARGE);
    let t = Txn::new().and_then([TxnOp::put("big", vec![b'b'; 4096], None)]);
    assert_status(c.txn(t).await, Code::InvalidArgument, TOO_LARGE);
    assert!(c.get("big", None).await?.kvs().is_empty());
    assert_eq!(rev(c.get("small", None).await?.header()), 2);

    info!("the refusal keeps etcd's message and names the flag in its picket-hint metadata");
    let mut kv = KvClient::connect(cluster.endpoint(0)).await?;
    let req = PutRequest { key: b"big".to_vec(), value: vec![b'b'; 4096], ..Default::default() };
    let err = kv.put(req).await.expect_err("a 4 KiB put over a 1 KiB limit");
    assert_eq!(err.message(), TOO_LARGE);
    let hint = err.metadata().get("picket-hint").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert!(hint.contains("--max-request-bytes (1024)"), "hint: {hint:?}");

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_keys_empty_and_large_values() -> Result<()> {
    let (cluster, mut c) = single(ClusterOptions::default()).await?;

    info!("keys and values are arbitrary bytes, 0x00 and 0xFF included");
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"\x00".to_vec(), b"zero".to_vec()),
        (b"\x00\x00".to_vec(), b"\x00\x01\x02".to_vec()),
        (b"a\x00b".to_vec(), b"\xff\xfe".to_vec()),
        (b"\xfe\xff".to_vec(), b"x".to_vec()),
        (b"\xff".to_vec(), b"ff".to_vec()),
        (b"\xff\xff".to_vec(), b"ffff".to_vec()),
        (b"empty".to_vec(), Vec::new()),
    ];
    for (i, (k, v)) in pairs.iter().enumerate() {
        assert_eq!(rev(c.put(k.clone(), v.clone(), None).await?.header()), i as i64 + 2);
    }
    for (i, (k, v)) in pairs.iter().enumerate() {
        let r = c.get(k.clone(), None).await?;
        let r_i = i as i64 + 2;
        assert_eq!(kvs(&r), vec![Kv::new(k, v, r_i, r_i, 1)], "key #{i}");
    }
    info!("an empty value is a real value: the key exists with version 1");
    let r = c.get("empty", Some(GetOptions::new().with_count_only())).await?;
    assert_eq!(r.count(), 1);

    info!("ordering is bytewise");
    let all = c.get("", Some(GetOptions::new().with_all_keys().with_keys_only())).await?;
    let got: Vec<Vec<u8>> = all.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    let expected: Vec<Vec<u8>> = vec![
        b"\x00".to_vec(),
        b"\x00\x00".to_vec(),
        b"a\x00b".to_vec(),
        b"empty".to_vec(),
        b"\xfe\xff".to_vec(),
        b"\xff".to_vec(),
        b"\xff\xff".to_vec(),
    ];
    assert_eq!(got, expected);
    let r = c.get(b"\xff".to_vec(), Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(
        r.kvs().iter().map(|kv| kv.key().to_vec()).collect::<Vec<_>>(),
        vec![b"\xff".to_vec(), b"\xff\xff".to_vec()]
    );
    let r = c.get(b"a\x00".to_vec(), Some(GetOptions::new().with_prefix())).await?;
    assert_eq!(
        r.kvs().iter().map(|kv| kv.key().to_vec()).collect::<Vec<_>>(),
        vec![b"a\x00b".to_vec()]
    );
    let r =
        c.get(b"\x00".to_vec(), Some(GetOptions::new().with_range(b"\x00\x01".to_vec()))).await?;
    assert_eq!(r.count(), 2);

    info!("a ~1 MiB value round-trips through put, get and prev_kv");
    let big: Vec<u8> =
        (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let p = c.put("big", big.clone(), None).await?;
    let big_rev = rev(p.header());
    let r = c.get("big", None).await?;
    assert_eq!(kvs(&r), vec![Kv::new("big", &big, big_rev, big_rev, 1)]);
    let p = c.put("big", "small now", Some(PutOptions::new().with_prev_key())).await?;
    assert_eq!(p.prev_key().map(Kv::from), Some(Kv::new("big", &big, big_rev, big_rev, 1)));
    let r = c.get("big", Some(GetOptions::new().with_revision(big_rev))).await?;
    assert_eq!(r.kvs().first().map(|kv| kv.value().len()), Some(big.len()));

    assert_still_serving(&mut c).await?;
    cluster.finish();
    Ok(())
}
