//! The cluster checks of a run (`judge_agreement`, `scan_logs`) on broken inputs: each must
//! report what it exists to catch.

use super::*;

fn view(revision: i64, hash: &str) -> Result<NodeView, String> {
    Ok(NodeView { revision, hash: hash.into(), keys: 3 })
}

fn kinds(a: &[Anomaly]) -> Vec<String> {
    a.iter().map(|a| a.kind.clone()).collect()
}

#[test]
fn agreeing_nodes_are_fine() {
    let last = vec![("n1".into(), view(9, "ab")), ("n2".into(), view(9, "ab"))];
    let a = judge_agreement(&last);
    assert!(a.anomalies.is_empty() && a.notes.is_empty(), "{:?}", kinds(&a.anomalies));
}

#[test]
fn nodes_with_different_hashes_at_one_revision_disagree() {
    let last = vec![
        ("n1".into(), view(9, "ab")),
        ("n2".into(), view(9, "ab")),
        ("n3".into(), view(9, "cd")),
    ];
    assert_eq!(kinds(&judge_agreement(&last).anomalies), ["nodes-disagree"]);
}

#[test]
fn nodes_at_different_revisions_disagree() {
    let last = vec![("n1".into(), view(9, "ab")), ("n2".into(), view(8, "ab"))];
    assert_eq!(kinds(&judge_agreement(&last).anomalies), ["nodes-disagree"]);
}

#[test]
fn a_silent_node_is_noted_and_the_rest_still_compared() {
    let last = vec![
        ("n1".into(), view(9, "ab")),
        ("n2".into(), Err("connection refused".to_string())),
        ("n3".into(), view(9, "ff")),
    ];
    let a = judge_agreement(&last);
    assert_eq!(kinds(&a.anomalies), ["nodes-disagree"]);
    assert_eq!(a.notes.len(), 1, "{:?}", a.notes);
    assert!(a.notes[0].contains("n2"), "{:?}", a.notes);
}

fn node(dir: &std::path::Path, name: &str, log: &str) -> NodeInfo {
    let path = dir.join(format!("{name}.log"));
    std::fs::write(&path, log).unwrap();
    NodeInfo {
        name: name.into(),
        client_url: String::new(),
        peer_url: String::new(),
        data_dir: dir.join(name),
        log: path,
    }
}

#[test]
fn panics_and_fatal_errors_in_node_logs_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        node(dir.path(), "n1", "INFO started\nINFO became leader\n"),
        node(
            dir.path(),
            "n2",
            "INFO started\nthread 'tokio-runtime-worker' panicked at server/src/x.rs:1:2:\nboom\n",
        ),
        node(dir.path(), "n3", "panic: runtime error: index out of range\n"),
        node(dir.path(), "n4", "  fatal error: concurrent map writes\n"),
    ];
    let found = scan_logs(&nodes);
    assert_eq!(kinds(&found), ["node-panic", "node-panic", "node-panic"]);
    let text = serde_json::to_string(&found).unwrap();
    for n in ["n2", "n3", "n4"] {
        assert!(text.contains(&format!("node {n} logged a crash")), "{text}");
    }
    assert!(!text.contains("node n1"), "{text}");
}

#[test]
fn a_clean_log_that_mentions_panics_in_passing_is_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![node(dir.path(), "n1", "INFO config: panic_on_fatal=false\n")];
    assert!(scan_logs(&nodes).is_empty());
}

#[test]
fn snapshot_installs_are_counted_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let line = "2026-12-01T10:00:00Z  INFO picketd::storage::state_machine: installing snapshot \
                log_index=Some(812) bytes=20311";
    let nodes = vec![
        node(dir.path(), "n1", "INFO started\nINFO built snapshot log_index=Some(800)\n"),
        node(dir.path(), "n2", &format!("INFO started\n{line}\nINFO x\n{line}\n")),
    ];
    let counts = count_snapshot_installs(&nodes);
    assert_eq!(counts["n1"], 0, "building one is not installing one");
    assert_eq!(counts["n2"], 2);
}
