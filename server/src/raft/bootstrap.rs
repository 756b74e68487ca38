//! Static bootstrap: member and cluster ids derived from `--initial-cluster`, the openraft
//! configuration derived from our flags, and first-start initialization.
//!
//! Every member of a new cluster computes the same ids from the same flags and calls
//! `initialize` with the same membership, which openraft documents as safe; the first election
//! then picks a leader. A member whose data dir already holds Raft state skips initialization and
//! recovers from disk.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::error::{InitializeError, RaftError};
use openraft::SnapshotPolicy;
use sha2::{Digest, Sha256};

use super::types::{Member, NodeId, Raft, TypeConfig};
use crate::config::{Config, InitialMember};

fn hash_u64(parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    // Zero means "no node" to openraft and etcd clients alike.
    u64::from_be_bytes(b).max(1)
}

/// The member id of a statically configured member: a hash of the cluster token and its name,
/// so it is stable across restarts and identical on every member.
pub fn member_id(token: &str, name: &str) -> NodeId {
    hash_u64(&[b"member", token.as_bytes(), name.as_bytes()])
}

/// The cluster id: a hash of the token and the initial member ids.
pub fn cluster_id(token: &str, members: &[InitialMember]) -> u64 {
    let mut ids: Vec<u64> = members.iter().map(|m| member_id(token, &m.name)).collect();
    ids.sort_unstable();
    let joined: Vec<u8> = ids.iter().flat_map(|i| i.to_be_bytes()).collect();
    hash_u64(&[b"cluster", token.as_bytes(), &joined])
}

/// Log entries kept behind a snapshot so a briefly lagging follower catches up from the log
/// rather than a full snapshot (etcd keeps 5000).
const MAX_CATCH_UP_ENTRIES: u64 = 5000;

pub fn raft_config(cfg: &Config) -> Result<Arc<openraft::Config>, openraft::ConfigError> {
    let raft = openraft::Config {
        cluster_name: cfg.initial_cluster_token.clone(),
        heartbeat_interval: cfg.heartbeat_interval_ms,
        // etcd's `--election-timeout` T means "a follower campaigns after T to 2T without a
        // heartbeat". openraft 0.9 makes a follower wait `leader_lease + election_timeout`,
        // with leader_lease = election_timeout_max and election_timeout drawn from
        // [min, max): mapping T to [T, 2T) made failover take 3-4 s (docs/failover.md). With
        // [T/2, 3T/4) a follower campaigns 1.25T to 1.5T after the last heartbeat, inside
        // etcd's window, and the lease that guards against deposed leaders still exceeds
        // every heartbeat gap `Config::validate` allows (T >= 5 heartbeats).
        election_timeout_min: cfg.election_timeout_ms / 2,
        election_timeout_max: cfg.election_timeout_ms * 3 / 4,
        // Per snapshot chunk: generous, because a chunk is written and fsynced on a possibly
        // busy follower. A timed-out chunk is simply resent.
        install_snapshot_timeout: 10_000,
        // Builds are asked for by `snapshot_pace` every `--snapshot-count` entries, which holds
        // them back while a snapshot is being sent (openraft's own policy would purge the log
        // the receiving follower continues from).
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: MAX_CATCH_UP_ENTRIES.min(cfg.snapshot_count),
        // `--pre-vote`: a member whose election timer ran out while it was paused or cut off
        // first asks whether it would win; without it, its raised term deposes a healthy
        // leader as soon as it can talk again (tests/pre_vote.rs).
        enable_pre_vote: Some(cfg.pre_vote),
        ..Default::default()
    };
    Ok(Arc::new(raft.validate()?))
}

/// The initial membership as openraft nodes. It must be identical on every initial member:
/// each member writes it as its own log entry at index 0, and entries with the same log id are
/// never compared, so a difference would persist forever. So it holds only what every member
/// knows from the flags; client URLs are published by each member once it runs
/// (`raft::member_tasks::publish`).
pub fn initial_nodes(cfg: &Config, members: &[InitialMember]) -> BTreeMap<NodeId, Member> {
    members
        .iter()
        .map(|m| {
            (
                member_id(&cfg.initial_cluster_token, &m.name),
                Member {
                    name: m.name.clone(),
                    peer_urls: m.peer_urls.clone(),
                    client_urls: Vec::new(),
                },
            )
        })
        .collect()
}

/// Initializes a brand-new member with the configured cluster. Does nothing on a member that
/// already has Raft state.
pub async fn initialize_if_new(
    raft: &Raft,
    nodes: BTreeMap<NodeId, Member>,
) -> Result<(), RaftError<TypeConfig, InitializeError<TypeConfig>>> {
    match raft.initialize(nodes).await {
        Ok(()) => {
            tracing::info!("initialized new cluster membership");
            Ok(())
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
            tracing::info!("raft state found on disk; recovering");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(member_id("t", "a"), member_id("t", "a"));
        assert_ne!(member_id("t", "a"), member_id("t", "b"));
        assert_ne!(member_id("t", "a"), member_id("u", "a"));
        let m = |n: &str| InitialMember { name: n.into(), peer_urls: vec![] };
        assert_eq!(cluster_id("t", &[m("a"), m("b")]), cluster_id("t", &[m("b"), m("a")]));
    }
}
