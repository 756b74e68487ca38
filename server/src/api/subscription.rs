//! `picket.v1.Subscriptions`: consumer groups with committed positions (see
//! [`crate::subscription`] for the model and `subscription.proto` for the contract).
//!
//! Group records are ordinary keys, so every write here is an etcd Txn through Raft: create is
//! "put if absent", commit and its monotonic check is a compare-and-swap on the record's mod
//! revision, retried a bounded number of times when another commit to the same group wins the
//! race. Reads are linearizable (read barrier, then the local store).

use std::sync::Arc;

use picket_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use picket_proto::etcdserverpb::request_op::Request as Op;
use picket_proto::etcdserverpb::response_op::Response as OpResponse;
use picket_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest,
};
use picket_proto::mvccpb::KeyValue;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::v1::subscriptions_server::Subscriptions;
use picket_proto::picket::v1::{
    CreateGroupRequest, CreateGroupResponse, DeleteGroupRequest, DeleteGroupResponse,
    GetGroupRequest, GetGroupResponse, GroupCommitRequest, GroupCommitResponse, GroupState,
    ListGroupsRequest, ListGroupsResponse, SubscriptionGroup,
};
use prost::Message;
use tonic::{Request, Response, Status};

use super::{unexpected, Ctx};
use crate::auth::replicated::Judgement;
use crate::auth::{KeyRange, Need};
use crate::subscription::{self as sub, GROUP_PREFIX, GROUP_PREFIX_END};

/// Compare-and-swap attempts for one commit before giving up with `ABORTED`. Each lost race
/// means another commit to the same group was applied, so a group with a handful of
/// concurrent committers converges well within this; the bound only keeps a pathological
/// storm from looping forever. Retrying is safe: every attempt re-reads the record.
const MAX_CAS_ATTEMPTS: usize = 32;

pub struct SubscriptionsService {
    ctx: Arc<Ctx>,
    /// `--sub-max-lag-revisions`, written into each record created without an explicit bound.
    default_max_lag: i64,
}

impl SubscriptionsService {
    pub fn new(ctx: Arc<Ctx>, default_max_lag: i64) -> Self {
        Self { ctx, default_max_lag }
    }

    fn compact_revision(&self) -> Result<i64, Status> {
        let (_, compacted) = self.ctx.sm.reader().revisions()?;
        Ok(compacted)
    }

    /// Linearizable read of one record: the kv (if any) and the header.
    async fn read(&self, name: &str) -> Result<(Option<KeyValue>, ResponseHeader), Status> {
        let req = RangeRequest { key: sub::group_key(name), ..Default::default() };
        let resp = super::kv::range(&self.ctx, req).await?;
        let header = resp.header.unwrap_or_default();
        Ok((resp.kvs.into_iter().next(), header))
    }

    fn state_of(&self, kv: &KeyValue, revision: i64) -> Result<GroupState, Status> {
        let (name, rec) = sub::decode(kv).ok_or_else(|| corrupt(&kv.key))?;
        Ok(sub::state(name, rec, revision, self.compact_revision()?))
    }
}

fn corrupt(key: &[u8]) -> Status {
    Status::data_loss(format!(
        "picket: group record {} does not decode (was it written with a plain put?)",
        String::from_utf8_lossy(key)
    ))
}

fn not_found(name: &str) -> Status {
    Status::not_found(format!("picket: subscription group {name:?} not found"))
}

fn check_name(name: &str) -> Result<(), Status> {
    sub::validate_name(name).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The command a group delete judged at auth revision `checked` is proposed as (wrapped, see
/// `Ctx::guard`).
pub(crate) fn delete_command(checked: Option<Judgement>, req: DeleteRangeRequest) -> Cmd {
    super::auth::guard_cmd(checked, Cmd::DeleteRange(req))
}

fn put_op(key: Vec<u8>, rec: &SubscriptionGroup) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key,
            value: rec.encode_to_vec(),
            ..Default::default()
        })),
    }
}

fn range_op(key: Vec<u8>) -> RequestOp {
    RequestOp { request: Some(Op::RequestRange(RangeRequest { key, ..Default::default() })) }
}

fn compare(key: Vec<u8>, target: CompareTarget, union: TargetUnion) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key,
        range_end: Vec::new(),
        target_union: Some(union),
    }
}

#[tonic::async_trait]
impl Subscriptions for SubscriptionsService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn create_group(
        &self,
        req: Request<CreateGroupRequest>,
    ) -> Result<Response<CreateGroupResponse>, Status> {
        // The group's record is written, and its range is what its consumers will read.
        let g = req.get_ref();
        let needs = [
            Need::Write(KeyRange::new(&sub::group_key(&g.name), &[])),
            Need::Read(KeyRange::new(&g.key, &g.range_end)),
        ];
        let checked = self.ctx.authorize(req.metadata(), &needs).await?;
        let req = req.into_inner();
        self.ctx.check_size(&req)?;
        check_name(&req.name)?;
        sub::validate_range(&req.key, &req.range_end)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        if req.max_lag_revisions < 0 {
            return Err(Status::invalid_argument(format!(
                "picket: max_lag_revisions {} is negative (0 = the server's --sub-max-lag-revisions)",
                req.max_lag_revisions
            )));
        }
        if req.start_revision < 0 {
            return Err(Status::invalid_argument(format!(
                "picket: start_revision {} is negative (0 = from the next revision)",
                req.start_revision
            )));
        }
        // Pin "now" and check the start against the compaction point after a read barrier, so
        // a start the caller saw as valid is judged against a state at least that new.
        self.ctx.read_barrier().await?;
        let (current, compacted) = self.ctx.sm.reader().revisions()?;
        let start = if req.start_revision == 0 { current + 1 } else { req.start_revision };
        if start < compacted {
            return Err(Status::out_of_range(format!(
                "picket: start_revision {start} has been compacted (compact revision {compacted})"
            )));
        }
        if start > current + 1 {
            return Err(Status::invalid_argument(format!(
                "picket: start_revision {start} is in the future (current revision {current})"
            )));
        }
        let max_lag =
            if req.max_lag_revisions == 0 { self.default_max_lag } else { req.max_lag_revisions };
        let rec = SubscriptionGroup {
            key: req.key,
            range_end: req.range_end,
            committed: start - 1,
            max_lag_revisions: max_lag,
        };
        let key = sub::group_key(&req.name);
        let txn = TxnRequest {
            compare: vec![compare(
                key.clone(),
                CompareTarget::Create,
                TargetUnion::CreateRevision(0),
            )],
            success: vec![put_op(key.clone(), &rec)],
            failure: vec![],
        };
        let resp = super::kv::txn(&self.ctx, checked, txn).await?;
        if !resp.succeeded {
            return Err(Status::already_exists(format!(
                "picket: subscription group {:?} already exists",
                req.name
            )));
        }
        let revision = resp.header.as_ref().map(|h| h.revision).unwrap_or(current);
        tracing::info!(group = %req.name, committed = rec.committed, revision, "subscription group created");
        let group = sub::state(req.name, rec, revision, self.compact_revision()?);
        Ok(Response::new(CreateGroupResponse { header: resp.header, group: Some(group) }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn delete_group(
        &self,
        req: Request<DeleteGroupRequest>,
    ) -> Result<Response<DeleteGroupResponse>, Status> {
        let needs = [Need::Write(KeyRange::new(&sub::group_key(&req.get_ref().name), &[]))];
        let checked = self.ctx.authorize(req.metadata(), &needs).await?;
        let req = req.into_inner();
        check_name(&req.name)?;
        let del = DeleteRangeRequest { key: sub::group_key(&req.name), ..Default::default() };
        match self.ctx.propose(delete_command(checked, del)).await? {
            CmdResult::DeleteRange(mut r) => {
                if r.deleted == 0 {
                    return Err(not_found(&req.name));
                }
                tracing::info!(group = %req.name, "subscription group deleted");
                self.ctx.stamp(&mut r.header);
                Ok(Response::new(DeleteGroupResponse { header: r.header }))
            }
            _ => Err(unexpected("delete group")),
        }
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_group(
        &self,
        req: Request<GetGroupRequest>,
    ) -> Result<Response<GetGroupResponse>, Status> {
        let needs = [Need::Read(KeyRange::new(&sub::group_key(&req.get_ref().name), &[]))];
        let (meta, _, req) = req.into_parts();
        check_name(&req.name)?;
        // Read first (its read barrier brings the auth store up to the request), then judge
        // (issue 19): one ReadIndex round, and a refused caller learns nothing.
        let read = self.read(&req.name).await;
        self.ctx.authorize(&meta, &needs).await?;
        let (kv, header) = read?;
        let kv = kv.ok_or_else(|| not_found(&req.name))?;
        let group = self.state_of(&kv, header.revision)?;
        Ok(Response::new(GetGroupResponse { header: Some(header), group: Some(group) }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_groups(
        &self,
        req: Request<ListGroupsRequest>,
    ) -> Result<Response<ListGroupsResponse>, Status> {
        let needs = [Need::Read(KeyRange::new(GROUP_PREFIX, GROUP_PREFIX_END))];
        let range = RangeRequest {
            key: GROUP_PREFIX.to_vec(),
            range_end: GROUP_PREFIX_END.to_vec(),
            ..Default::default()
        };
        // Read, then judge, as GetGroup does.
        let read = super::kv::range(&self.ctx, range).await;
        self.ctx.authorize(req.metadata(), &needs).await?;
        let resp = read?;
        let header = resp.header.unwrap_or_default();
        let compacted = self.compact_revision()?;
        // Records that do not decode are skipped here, as the compaction guard skips them.
        let groups = resp
            .kvs
            .iter()
            .filter_map(sub::decode)
            .map(|(name, rec)| sub::state(name, rec, header.revision, compacted))
            .collect();
        Ok(Response::new(ListGroupsResponse { header: Some(header), groups }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn commit(
        &self,
        req: Request<GroupCommitRequest>,
    ) -> Result<Response<GroupCommitResponse>, Status> {
        let needs = [Need::Write(KeyRange::new(&sub::group_key(&req.get_ref().name), &[]))];
        let checked = self.ctx.authorize(req.metadata(), &needs).await?;
        let req = req.into_inner();
        check_name(&req.name)?;
        if req.revision < 0 {
            return Err(Status::invalid_argument(format!(
                "picket: commit revision {} is negative",
                req.revision
            )));
        }
        let key = sub::group_key(&req.name);
        let (mut kv, mut header) = self.read(&req.name).await?;
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = kv.take().ok_or_else(|| not_found(&req.name))?;
            let (_, mut rec) = sub::decode(&current).ok_or_else(|| corrupt(&current.key))?;
            if req.revision <= rec.committed {
                // Monotonic: ignored, so a retried or late commit never moves the group back.
                return Ok(Response::new(GroupCommitResponse {
                    header: Some(header),
                    committed: rec.committed,
                    advanced: false,
                }));
            }
            if req.revision > header.revision {
                return Err(Status::invalid_argument(format!(
                    "picket: cannot commit revision {} past the current revision {}",
                    req.revision, header.revision
                )));
            }
            rec.committed = req.revision;
            let txn = TxnRequest {
                compare: vec![compare(
                    key.clone(),
                    CompareTarget::Mod,
                    TargetUnion::ModRevision(current.mod_revision),
                )],
                success: vec![put_op(key.clone(), &rec)],
                failure: vec![range_op(key.clone())],
            };
            let resp = super::kv::txn(&self.ctx, checked, txn).await?;
            header = resp.header.unwrap_or_default();
            if resp.succeeded {
                tracing::debug!(group = %req.name, committed = rec.committed, "group committed");
                return Ok(Response::new(GroupCommitResponse {
                    header: resp.header,
                    committed: rec.committed,
                    advanced: true,
                }));
            }
            // Another commit (or a delete) won: look again at what it left.
            kv = resp.responses.into_iter().find_map(|r| match r.response {
                Some(OpResponse::ResponseRange(r)) => r.kvs.into_iter().next(),
                _ => None,
            });
        }
        Err(Status::aborted(format!(
            "picket: commit to group {:?} lost {MAX_CAS_ATTEMPTS} races with other commits; retry",
            req.name
        )))
    }
}
