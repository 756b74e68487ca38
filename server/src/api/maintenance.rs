//! `etcdserverpb.Maintenance`: Status, Alarm, HashKV, Hash, Snapshot, Defragment, MoveLeader.
//!
//! Everything here describes or maintains *this* member (as in etcd): Status and the hashes are
//! local reads, Snapshot streams this member's state, Defragment compacts this member's RocksDB.
//! MoveLeader is a cluster operation and goes to the leader ([`crate::raft::transfer`]).
//!
//! Alarms are replicated ([`crate::quota`]): Activate and Deactivate are Raft commands applied
//! on every member, GET lists this member's applied copy. Members raise and clear their own
//! NOSPACE alarm (`--quota-backend-bytes`); `etcdctl alarm disarm` deactivates any alarm.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use picket_proto::etcdserverpb::alarm_request::AlarmAction;
use picket_proto::etcdserverpb::maintenance_server::Maintenance;
use picket_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse,
    DowngradeRequest, DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse,
    MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest,
    StatusResponse,
};
use picket_proto::picket::raft::v1::cluster_op::Op;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use tonic::{Request, Response, Status};

use super::status::storage_failure;
use super::Ctx;
use crate::auth::replicated::Judgement;
use crate::mvcc::hash::{hash_kv, hash_store};
use crate::raft::membership::ClusterControl;
use crate::storage::engine::{Cf, Engine};
use crate::storage::rocks::RocksEngine;
use crate::storage::{snapshot, snapshot_file};

/// The version `Status` reports. Clients gate features on an etcd version, so Picket reports the
/// etcd API level it implements (3.5.0) and names itself in the semver build metadata, which
/// does not affect version precedence (a `-picket` pre-release would sort below 3.5.0).
pub const VERSION: &str = concat!("3.5.0+picket.", env!("CARGO_PKG_VERSION"));

/// The `etcdserver` field of the HTTP gateway's `GET /version`: [`VERSION`] without its build
/// metadata, because clients parse this field as dotted integers (Patroni does).
pub const ETCD_SERVER_VERSION: &str = "3.5.0";

/// The `etcdcluster` field of `GET /version`: the cluster's API level, `major.minor.0` as etcd
/// reports it.
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";

/// Bytes of snapshot per streamed message (etcd sends 32 KiB).
const SNAPSHOT_CHUNK: usize = 64 * 1024;

/// etcd's text for a member without a leader, listed in `Status.errors`.
const NO_LEADER: &str = "etcdserver: no leader";

/// The command a client's alarm change judged at auth revision `checked` is proposed as:
/// wrapped like every client write (issue 19), so one judged with auth off on a member that had
/// not applied AuthEnable is refused after it. The quota monitor's own alarms carry no client
/// and stay unwrapped (`crate::api::quota_monitor`).
pub(crate) fn alarm_command(checked: Option<Judgement>, req: AlarmRequest) -> Cmd {
    super::auth::guard_cmd(checked, Cmd::Alarm(req))
}

pub struct MaintenanceService {
    ctx: Arc<Ctx>,
    control: ClusterControl,
    /// The quota in effect (`--quota-backend-bytes`), reported in `Status.db_size_quota`.
    quota: u64,
}

impl MaintenanceService {
    pub fn new(ctx: Arc<Ctx>, control: ClusterControl) -> Self {
        Self { ctx, control, quota: crate::quota::DEFAULT_QUOTA_BYTES }
    }

    /// Reports `quota` as the storage quota in `Status`.
    pub fn with_quota(mut self, quota: u64) -> Self {
        self.quota = quota;
        self
    }

    fn engine(&self) -> RocksEngine {
        self.ctx.sm.engine().clone()
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn alarm(&self, req: Request<AlarmRequest>) -> Result<Response<AlarmResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Listing alarms needs a valid token; raising or clearing one is root's (etcd).
        let checked = if req.action == AlarmAction::Get as i32 {
            // The list is linearizable, as etcd's (every Alarm action goes through its Raft
            // log): a read barrier first, so an alarm raised or cleared through any member
            // before this request is in the list. Nothing is proposed, so nothing is guarded.
            self.ctx.authorize_read(&meta, true, &[]).await?;
            None
        } else {
            self.ctx.authorize_admin(&meta).await?
        };
        let action = AlarmAction::try_from(req.action)
            .map_err(|_| Status::invalid_argument("picket: unknown alarm action"))?;
        let alarms = match action {
            // This member's applied copy of the replicated set, read after the barrier above.
            AlarmAction::Get => {
                let active = crate::quota::read_alarms(self.ctx.sm.engine())
                    .map_err(|e| storage_failure("alarm", e))?;
                active
                    .into_iter()
                    .filter(|&(m, a)| {
                        (req.member_id == 0 || m == req.member_id)
                            && (req.alarm == AlarmType::None as i32 || a == req.alarm)
                    })
                    .map(|(member_id, alarm)| AlarmMember { member_id, alarm })
                    .collect()
            }
            AlarmAction::Activate | AlarmAction::Deactivate => {
                if action == AlarmAction::Activate && req.alarm == AlarmType::None as i32 {
                    return Err(Status::invalid_argument("picket: cannot activate alarm NONE"));
                }
                match self.ctx.propose(alarm_command(checked, req)).await? {
                    CmdResult::Alarm(r) => r.alarms,
                    _ => return Err(super::unexpected("alarm")),
                }
            }
        };
        let header = Some(self.ctx.header(self.ctx.sm.revision()));
        Ok(Response::new(AlarmResponse { header, alarms }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn status(
        &self,
        _req: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let m = self.control.metrics();
        let id = self.ctx.member_id;
        let membership = m.membership_config.membership();
        let is_learner =
            membership.get_node(&id).is_some() && !membership.voter_ids().any(|v| v == id);
        // Not openraft's `current_leader`: with Pre-Vote a follower keeps naming a leader it no
        // longer hears from (`raft::leader_contact`).
        let leader = self.control.leader().unwrap_or(0);
        let mut errors = Vec::new();
        if leader == 0 {
            errors.push(NO_LEADER.to_string());
        }
        // etcd's format for active alarms in `Status.errors`.
        let alarms = crate::quota::read_alarms(self.ctx.sm.engine())
            .map_err(|e| storage_failure("alarm", e))?;
        for (member, alarm) in alarms {
            errors.push(format!("memberID:{member:x} alarm:{} ", crate::quota::alarm_name(alarm)));
        }
        let (db_size, db_size_in_use) = crate::quota::db_sizes(self.ctx.sm.engine());
        Ok(Response::new(StatusResponse {
            header: Some(self.ctx.header(self.ctx.sm.revision())),
            version: VERSION.to_string(),
            db_size,
            leader,
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map(|l| l.index).unwrap_or(0),
            errors,
            db_size_in_use,
            is_learner,
            db_size_quota: i64::try_from(self.quota).unwrap_or(i64::MAX),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn defragment(
        &self,
        req: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        // etcd's NOSPACE recovery is `compact` then `defrag`. Picket removes compacted history
        // in bounded steps after the compact answered, so defrag first waits (bounded by the
        // request timeout) for this member's steps to finish, or it would reclaim only part.
        // Past the bound it defragments what has been removed so far.
        let compacted = self.ctx.sm.with_store(|s| s.compact_revision());
        let bound = self.ctx.proposer.request_timeout();
        if !self.ctx.wait_physical_compaction(compacted, bound).await {
            tracing::warn!(
                compacted,
                "defragmenting while compacted history is still being removed"
            );
        }
        let engine = self.engine();
        // A full manual compaction rewrites every SST file: blocking, possibly long work.
        tokio::task::spawn_blocking(move || {
            for cf in Cf::ALL {
                engine.db().compact_range_cf(engine.cf_handle(cf), None::<&[u8]>, None::<&[u8]>);
            }
        })
        .await
        .map_err(|e| storage_failure("defragment", e))?;
        tracing::info!("defragmented (compacted every column family)");
        Ok(Response::new(DefragmentResponse {
            header: Some(self.ctx.header(self.ctx.sm.revision())),
        }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn hash(&self, req: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let engine = self.engine();
        let (hash, revision) = tokio::task::spawn_blocking(move || {
            let view = engine.view();
            let revision = crate::mvcc::read::read_revisions(&view)?.current;
            hash_store(&view).map(|h| (h, revision))
        })
        .await
        .map_err(|e| storage_failure("hash", e))??;
        Ok(Response::new(HashResponse { header: Some(self.ctx.header(revision)), hash }))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(revision = req.get_ref().revision))]
    async fn hash_kv(
        &self,
        req: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let rev = req.get_ref().revision;
        let engine = self.engine();
        // Reads the whole kv column family: keep it off the async workers.
        let h = tokio::task::spawn_blocking(move || hash_kv(&engine.view(), rev))
            .await
            .map_err(|e| storage_failure("hash", e))??;
        Ok(Response::new(HashKvResponse {
            header: Some(self.ctx.header(h.current_revision)),
            hash: h.hash,
            compact_revision: h.compact_revision,
        }))
    }

    type SnapshotStream = SnapshotStream;

    #[tracing::instrument(skip_all)]
    async fn snapshot(
        &self,
        req: Request<SnapshotRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        // A snapshot holds every key and the auth store: root only (etcd).
        self.ctx.authorize_admin(req.metadata()).await?;
        let engine = self.engine();
        let revision = self.ctx.sm.revision();
        // Building reads the whole store from one RocksDB snapshot (a consistent cut).
        let blob = tokio::task::spawn_blocking(move || snapshot::build(&engine))
            .await
            .map_err(|e| storage_failure("snapshot", e))?
            .map_err(|e| storage_failure("snapshot", e))?;
        let file = snapshot_file::encode(&blob);
        tracing::info!(bytes = file.len(), revision, "streaming snapshot");
        let total = file.len();
        let mut header = Some(self.ctx.header(revision));
        // Chunks are cut lazily from the one buffer the stream owns.
        let chunks = (0..total.div_ceil(SNAPSHOT_CHUNK)).map(move |i| {
            let start = i * SNAPSHOT_CHUNK;
            let end = (start + SNAPSHOT_CHUNK).min(total);
            Ok(SnapshotResponse {
                header: header.take(),
                remaining_bytes: (total - end) as u64,
                blob: file[start..end].to_vec(),
            })
        });
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    #[tracing::instrument(skip_all, fields(target = req.get_ref().target_id))]
    async fn move_leader(
        &self,
        req: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        self.control.execute(Op::MoveLeader(req.into_inner())).await?;
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.ctx.header(self.ctx.sm.revision())),
        }))
    }

    async fn downgrade(
        &self,
        _req: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(Status::unimplemented("picket: cluster version downgrade is not supported"))
    }
}
