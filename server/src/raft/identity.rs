//! A member's identity: its member id (the openraft node id) and the cluster id, fixed at its
//! first start and kept in `<data-dir>/identity.json`, so later starts never recompute them.
//!
//! - A member of the initial cluster (`--initial-cluster-state new`) derives both from its flags
//!   ([`bootstrap::member_id`], [`bootstrap::cluster_id`]): every initial member computes the
//!   same values.
//! - A member added later (`member add`, then started with `--initial-cluster-state existing`)
//!   cannot: the leader chose its id when the member was added, and the cluster id is the
//!   original cluster's. It asks the members named in `--initial-cluster` for their membership
//!   and takes the id of the entry with its own peer URLs (etcd finds its id the same way).
//!
//! Both paths refuse to reuse the identity of a member that has already run. A member that
//! lost its data and came back under its old id would claim a shorter log than the leader had
//! already seen from it, which openraft treats as a broken invariant (the leader panics unless
//! the `loosen-follower-log-revert` feature is on, which we leave off). Such a member must be
//! removed and added again (`member remove`, `member add`), which gives it a new id, as etcd
//! requires too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use picket_proto::etcdserverpb::Member as PbMember;
use picket_proto::picket::raft::v1::cluster_service_client::ClusterServiceClient;
use picket_proto::picket::raft::v1::{MembershipQuery, MembershipView};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::time::Instant;

use super::bootstrap;
use super::network::peer_channel;
use super::types::NodeId;
use crate::config::{Config, InitialMember};
use crate::tls::PeerDialer;

const FILE: &str = "identity.json";

/// How long a joining member keeps asking the existing members for its id. Safe to retry: the
/// query only reads. A minute covers an election in the existing cluster and a slow start of
/// the member that was asked.
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between rounds of join queries.
const JOIN_RETRY: Duration = Duration::from_millis(500);

/// Per-query timeout. Peers are on the cluster network; a peer that takes longer is treated as
/// down for this round and asked again in the next one.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// The ids a member runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub member_id: NodeId,
    pub cluster_id: u64,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum IdentityError {
    #[error("cannot access {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is damaged ({reason}); restore it or start with an empty data dir")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "no member of --initial-cluster answered with a leader within {timeout:?} (last error: \
         {last}); start this member while the cluster is running and reachable"
    )]
    NoPeer { timeout: Duration, last: String },
    #[error(
        "the cluster has no member with peer URLs {0:?}; add it first (etcdctl member add \
         <name> --peer-urls=<url>), then start it with --initial-cluster-state existing"
    )]
    NotAdded(Vec<String>),
    #[error(
        "the cluster's member {id:#x} with peer URLs {peer_urls:?} has run before, but this data \
         dir is new: a member that lost its data must be removed (member remove) and added \
         again (member add) to rejoin"
    )]
    AlreadyStarted { id: NodeId, peer_urls: Vec<String> },
}

/// Returns this member's identity, creating and durably recording it on the first start.
pub async fn resolve(
    cfg: &Config,
    members: &[InitialMember],
    data_dir: &Path,
    dialer: &PeerDialer,
) -> Result<Identity, IdentityError> {
    let path = data_dir.join(FILE);
    if let Some(id) = load(&path)? {
        return Ok(id);
    }
    let fresh = !data_dir.join("db").exists();
    let peers: Vec<String> = members
        .iter()
        .filter(|m| m.name != cfg.name)
        .flat_map(|m| m.peer_urls.iter().cloned())
        .collect();
    let identity = if cfg.initial_cluster_state == "existing" && fresh {
        join(&peers, &cfg.advertise_peer_urls(), dialer).await?
    } else {
        let id = Identity {
            member_id: bootstrap::member_id(&cfg.initial_cluster_token, &cfg.name),
            cluster_id: bootstrap::cluster_id(&cfg.initial_cluster_token, members),
        };
        if fresh {
            check_not_started(&peers, id.member_id, dialer).await?;
        }
        id
    };
    save(data_dir, &path, &identity)?;
    tracing::info!(
        node_id = identity.member_id,
        cluster_id = identity.cluster_id,
        "recorded member identity"
    );
    Ok(identity)
}

/// Durably records `id` as the identity of the member whose data dir is `data_dir`, for tools
/// that build a data dir offline (`crate::restore`). A later start reads it back in
/// [`resolve`] instead of deriving or asking for an id.
pub fn record(data_dir: &Path, id: &Identity) -> Result<(), IdentityError> {
    save(data_dir, &data_dir.join(FILE), id)
}

fn load(path: &Path) -> Result<Option<Identity>, IdentityError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| IdentityError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(IdentityError::Io { path: path.to_path_buf(), source }),
    }
}

fn save(dir: &Path, path: &Path, id: &Identity) -> Result<(), IdentityError> {
    let io = |source| IdentityError::Io { path: path.to_path_buf(), source };
    let bytes = serde_json::to_vec_pretty(id).map_err(|e| io(std::io::Error::other(e)))?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    std::fs::write(&tmp, bytes).map_err(io)?;
    // Durability: the identity must be on disk before Raft state is written under it, or a
    // crash could leave Raft state that belongs to no recorded member id.
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    // Durability: fsync the directory so the rename survives a crash.
    std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(io)
}

async fn query(url: &str, dialer: &PeerDialer) -> Result<MembershipView, String> {
    let channel = peer_channel(url, dialer).map_err(|e| e.to_string())?;
    let mut client = ClusterServiceClient::new(channel);
    match tokio::time::timeout(QUERY_TIMEOUT, client.membership(MembershipQuery {})).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(s)) => Err(format!("{url}: {}", s.message())),
        Err(_) => Err(format!("{url}: no answer within {QUERY_TIMEOUT:?}")),
    }
}

fn started(m: &PbMember) -> bool {
    !m.name.is_empty() || !m.client_ur_ls.is_empty()
}

/// Finds the id the cluster gave a member with `peer_urls`.
async fn join(
    peers: &[String],
    own_urls: &[String],
    dialer: &PeerDialer,
) -> Result<Identity, IdentityError> {
    join_within(peers, own_urls, dialer, JOIN_TIMEOUT).await
}

/// [`join`], asking for at most `timeout`. Each round asks every peer and decides from the
/// newest membership among the answers (the highest `config_index`, the leader's own view
/// first on a tie): a member that is catching up (installing a snapshot, say) answers with a
/// membership from before the latest changes. Session 29's `set` long run saw a rejoining
/// member refused because the first member it asked still listed the started member it had
/// been before its removal. So "already started" is final only from the leader's own view; from
/// a follower's it is believed only if nothing newer shows up before the time is up.
async fn join_within(
    peers: &[String],
    own_urls: &[String],
    dialer: &PeerDialer,
    timeout: Duration,
) -> Result<Identity, IdentityError> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no member to ask in --initial-cluster");
    let mut answered_without_us = false;
    let mut started_per_follower: Option<IdentityError> = None;
    loop {
        let mut newest: Option<(&String, MembershipView)> = None;
        for url in peers {
            let view = match query(url, dialer).await {
                Ok(v) if v.leader_id != 0 && v.config_index > 0 => v,
                Ok(_) => {
                    last = format!("{url}: no leader yet");
                    continue;
                }
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let rank = |v: &MembershipView| (v.config_index, v.member_id == v.leader_id);
            if newest.as_ref().is_none_or(|(_, n)| rank(&view) > rank(n)) {
                newest = Some((url, view));
            }
        }
        if let Some((url, view)) = &newest {
            let ours =
                view.members.iter().find(|m| m.peer_ur_ls.iter().any(|u| own_urls.contains(u)));
            match ours {
                Some(m) if started(m) => {
                    let e =
                        IdentityError::AlreadyStarted { id: m.id, peer_urls: m.peer_ur_ls.clone() };
                    if view.member_id == view.leader_id {
                        return Err(e);
                    }
                    last = format!("{url}: a follower lists member {:#x} as started", m.id);
                    started_per_follower = Some(e);
                }
                Some(m) => {
                    tracing::info!(node_id = m.id, from = %url, "joining an existing cluster");
                    return Ok(Identity { member_id: m.id, cluster_id: view.cluster_id });
                }
                // The answering member may not have applied the addition yet: ask again.
                None => answered_without_us = true,
            }
        }
        if Instant::now() + JOIN_RETRY >= deadline {
            if let Some(e) = started_per_follower {
                return Err(e);
            }
            if answered_without_us {
                return Err(IdentityError::NotAdded(own_urls.to_vec()));
            }
            return Err(IdentityError::NoPeer { timeout, last });
        }
        // Bounded by the deadline above; the query only reads, so asking again is safe.
        tokio::time::sleep(JOIN_RETRY).await;
    }
}

/// Refuses to start an initial member with an empty data dir if the running cluster already
/// knows it as started (it lost its data). Peers that do not answer are skipped: on a first
/// bootstrap they are simply not up yet, and nothing is known about this member anyway.
async fn check_not_started(
    peers: &[String],
    id: NodeId,
    dialer: &PeerDialer,
) -> Result<(), IdentityError> {
    for url in peers {
        let Ok(view) = query(url, dialer).await else { continue };
        if let Some(m) = view.members.iter().find(|m| m.id == id) {
            if !m.client_ur_ls.is_empty() {
                return Err(IdentityError::AlreadyStarted { id, peer_urls: m.peer_ur_ls.clone() });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "identity_tests.rs"]
mod tests;
