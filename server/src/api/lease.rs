//! `etcdserverpb.Lease`: Grant, Revoke, KeepAlive, TimeToLive, Leases, and the leader-only
//! expiry task.
//!
//! Grants and revokes are Raft commands. Keep-alives and time-to-live questions are answered by
//! the leader's [`LeaseClock`]; a follower relays them to the leader over the peer service, so a
//! client may keep a lease alive through any member.

use openraft::async_runtime::WatchReceiver;
use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesOrdered;
use futures::Stream;
use parking_lot::Mutex;
use picket_proto::etcdserverpb::lease_server::Lease;
use picket_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::LeaseExpire;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::{Code, Request, Response, Status, Streaming};

use super::lease_id::{new_lease_id, GRANT_ID_ATTEMPTS};
use super::status::lease_status;
use super::{unexpected, Ctx};
use crate::auth::replicated::Judgement;
use crate::lease::{LeaseClock, LeaseError, MAX_TTL_SECONDS};
use crate::raft::proposer::ProposeError;
use crate::raft::relay::LeaderRelay;

/// How often the leader looks for expired leases. A lease can outlive its deadline by up to one
/// tick plus one Raft commit; a shorter tick costs a scan of the lease table each time.
const EXPIRY_TICK: Duration = Duration::from_millis(100);

/// At most this many revokes in flight at once (etcd limits revocations to 1000/s), so a mass
/// expiry cannot flood the Raft log ahead of client writes.
const MAX_REVOKES_IN_FLIGHT: usize = 64;

/// Keep-alives of one stream answered concurrently. Clients multiplex many leases on one stream
/// (etcd-client, and etcd's own clientv3, send one request per lease per period); answering them
/// one at a time would make each wait for the previous one's leadership confirmation, so a
/// stream of N leases would need N confirmation rounds per period. In flight together they join
/// the same round. Answers still go out in request order. The bound keeps one stream from
/// holding unbounded work.
const KEEPALIVES_IN_FLIGHT: usize = 256;

pub struct LeaseService {
    ctx: Arc<Ctx>,
}

impl LeaseService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }
}

/// Leader-side lease state shared by the service and the expiry task.
#[derive(Default)]
pub struct LeaseLeader {
    clock: Mutex<LeaseClock>,
}

impl LeaseLeader {
    /// Brings the clock in line with the current Raft role. Returns the term if leader.
    fn sync_role(&self, ctx: &Ctx) -> Option<u64> {
        let term = {
            let metrics = ctx.proposer.raft().metrics();
            let m = metrics.borrow_watched();
            (m.current_leader == Some(ctx.member_id)).then_some(m.current_term)
        };
        self.clock.lock().set_leader_term(term);
        term
    }
}

/// The command a lease grant judged at auth revision `checked` is proposed as: wrapped, like
/// every write (`Ctx::guard`), so a grant judged with auth off on a member that had not applied
/// AuthEnable is refused after it.
pub(crate) fn grant_command(checked: Option<Judgement>, req: LeaseGrantRequest) -> Cmd {
    super::auth::guard_cmd(checked, Cmd::LeaseGrant(req))
}

/// Proposes a grant of `ttl` seconds under `id`, or, with `id` 0, under an id the server chooses
/// (`lease_id`), retrying with a fresh id when another member's grant took the same one.
pub(crate) async fn propose_grant(
    ctx: &Ctx,
    checked: Option<Judgement>,
    ttl: i64,
    id: i64,
) -> Result<LeaseGrantResponse, Status> {
    let attempts = if id == 0 { GRANT_ID_ATTEMPTS } else { 1 };
    for attempt in 1..=attempts {
        let chosen = if id == 0 { new_lease_id() } else { id };
        let grant = LeaseGrantRequest { ttl, id: chosen };
        match ctx.propose(grant_command(checked, grant)).await {
            Ok(CmdResult::LeaseGrant(r)) => return Ok(r),
            Ok(_) => return Err(unexpected("lease_grant")),
            Err(s) if s.code() == Code::FailedPrecondition && id == 0 && attempt < attempts => {
                tracing::warn!(lease_id = chosen, "server-chosen lease id collided; retrying");
            }
            Err(s) => return Err(s),
        }
    }
    Err(Status::internal("picket: could not choose a free lease id"))
}

/// Answers a keep-alive on the leader: confirms leadership with a quorum first (by a recent
/// acknowledgement, `Proposer::lease_read_index`), so a deposed leader cannot extend a lease
/// the real leader is about to expire.
pub async fn keep_alive_local(ctx: &Ctx, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    ctx.proposer.lease_read_index().await.map_err(ProposeError::into_status)?;
    if ctx.lease_leader.sync_role(ctx).is_none() {
        return Err(ProposeError::NotLeader(None).into_status());
    }
    let ttl = ctx.sm.with_leases(|t| t.get(id).map(|r| r.ttl));
    // The clock's lock is taken and released here, never held across the wait below.
    let renewed =
        ttl.map(|ttl| (ttl, ctx.lease_leader.clock.lock().renew(id, ttl, Instant::now())));
    let ttl = match renewed {
        Some((ttl, true)) => ttl,
        Some((_, false)) => return expired_keep_alive(ctx, id).await,
        None => 0,
    };
    Ok(LeaseKeepAliveResponse { header: Some(ctx.header(ctx.sm.revision())), id, ttl })
}

/// A keep-alive that arrived after the lease's deadline on this leader: its revoke is proposed
/// (or about to be) and will apply, so answer "not found" once it has, as etcd does. Bounded by
/// the request timeout; if leadership moves first the answer is "not leader" and the client
/// retries on the new leader, which is safe: a keep-alive changes nothing but a deadline, and
/// the new leader only renews leases that still exist once it has applied the old term's
/// entries (its read index covers them).
async fn expired_keep_alive(ctx: &Ctx, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    let deadline = Instant::now() + ctx.proposer.request_timeout();
    // Raft's metrics change whenever this member applies an entry or its role changes, so
    // waiting on them wakes this call for exactly the events that can end it (the revoke
    // applied, leadership lost), with no polling interval.
    let mut metrics = ctx.proposer.raft().metrics();
    loop {
        if ctx.sm.with_leases(|t| t.get(id).is_none()) {
            let header = Some(ctx.header(ctx.sm.revision()));
            return Ok(LeaseKeepAliveResponse { header, id, ttl: 0 });
        }
        if ctx.lease_leader.sync_role(ctx).is_none() {
            return Err(ProposeError::NotLeader(None).into_status());
        }
        if Instant::now() >= deadline {
            return Err(ProposeError::Timeout.into_status());
        }
        // Bounded by the request deadline: the next pass then answers Timeout.
        match tokio::time::timeout_at(deadline, metrics.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_)) => return Err(ProposeError::Stopped.into_status()),
        }
    }
}

/// Answers TimeToLive on the leader.
pub async fn time_to_live_local(
    ctx: &Ctx,
    req: &LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, Status> {
    ctx.proposer.local_read_index().await.map_err(ProposeError::into_status)?;
    if ctx.lease_leader.sync_role(ctx).is_none() {
        return Err(ProposeError::NotLeader(None).into_status());
    }
    let granted = ctx.sm.with_leases(|t| t.get(req.id).map(|r| r.ttl));
    let Some(granted) = granted else {
        return Ok(LeaseTimeToLiveResponse {
            header: Some(ctx.header(ctx.sm.revision())),
            id: req.id,
            ttl: -1,
            granted_ttl: 0,
            keys: Vec::new(),
        });
    };
    let ttl = ctx.lease_leader.clock.lock().remaining_seconds(req.id, granted, Instant::now());
    let keys = if req.keys { ctx.sm.reader().keys_of_lease(req.id)? } else { Vec::new() };
    Ok(LeaseTimeToLiveResponse {
        header: Some(ctx.header(ctx.sm.revision())),
        id: req.id,
        ttl,
        granted_ttl: granted,
        keys,
    })
}

/// How long [`at_leader`] pauses between passes: long enough for a leader change to show in
/// this member's view, short next to the request timeout that bounds the whole call.
const RELAY_RETRY: Duration = Duration::from_millis(50);

/// Answers a lease call that only the leader can answer (a keep-alive, a TimeToLive): relayed
/// (`relay`, given a client for the leader) when another member is known to lead, answered here
/// (`local`) otherwise. Both are reads or idempotent, so a failed pass is retried until the
/// request deadline.
///
/// A member that knows another leader relays at once rather than first trying locally: the
/// local attempt starts a read-index round only for openraft to refuse it (not the leader),
/// which cost a follower a spawned task and a message to its core on every keep-alive. A
/// member whose view is stale either way still gets there: a relay the old leader refuses falls
/// through to the local attempt, and a local attempt on a member that lost leadership falls
/// through to the next pass's relay.
async fn at_leader<T, R, FR, L, FL>(
    ctx: &Ctx,
    what: &str,
    id: i64,
    mut relay: R,
    mut local: L,
) -> Result<T, Status>
where
    R: FnMut(LeaderRelay) -> FR,
    FR: Future<Output = Result<T, Status>>,
    L: FnMut() -> FL,
    FL: Future<Output = Result<T, Status>>,
{
    let deadline = Instant::now() + ctx.proposer.request_timeout();
    loop {
        if let Some(peer) = ctx.proposer.leader_relay() {
            match relay(peer).await {
                Ok(r) => return Ok(r),
                Err(s) => tracing::debug!(lease_id = id, error = %s, "{what} relay failed"),
            }
        }
        match local().await {
            Err(s) if s.code() == Code::Unavailable => {}
            other => return other,
        }
        if Instant::now() >= deadline {
            return Err(ProposeError::NoLeader.into_status());
        }
        tokio::time::sleep(RELAY_RETRY).await;
    }
}

/// Keep-alive from any member ([`at_leader`]); a relayed answer gets this member's header.
async fn keep_alive(ctx: &Ctx, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
    let relay = |leader: LeaderRelay| async move {
        let mut r = leader.lease_keep_alive(id).await?;
        r.header = Some(ctx.header(ctx.sm.revision()));
        Ok(r)
    };
    at_leader(ctx, "keep-alive", id, relay, || keep_alive_local(ctx, id)).await
}

/// The leader's answers to relayed lease requests.
pub struct LeaseRelayTarget(pub Arc<Ctx>);

#[tonic::async_trait]
impl crate::raft::service::LeaderLeases for LeaseRelayTarget {
    async fn keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse, Status> {
        keep_alive_local(&self.0, id).await
    }

    async fn time_to_live(
        &self,
        req: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, Status> {
        time_to_live_local(&self.0, &req).await
    }
}

/// TimeToLive from any member ([`at_leader`]); a relayed answer gets this member's header.
pub async fn time_to_live_any(
    ctx: &Ctx,
    req: LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, Status> {
    let relay = |leader: LeaderRelay| async move {
        let mut client = leader.client;
        let mut r = client.lease_time_to_live(req).await?.into_inner();
        r.header = Some(ctx.header(ctx.sm.revision()));
        Ok(r)
    };
    at_leader(ctx, "time-to-live", req.id, relay, || time_to_live_local(ctx, &req)).await
}

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn lease_grant(
        &self,
        req: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Any authenticated user may grant a lease (etcd); what it is attached to is checked
        // by the puts that attach keys.
        let checked = self.ctx.authorize(&meta, &[]).await?;
        if req.ttl > MAX_TTL_SECONDS {
            return Err(lease_status(&LeaseError::TtlTooLarge));
        }
        if req.id < 0 {
            return Err(Status::invalid_argument("picket: lease id must not be negative"));
        }
        let mut r = propose_grant(&self.ctx, checked, req.ttl, req.id).await?;
        r.header = Some(self.ctx.header(self.ctx.sm.revision()));
        Ok(Response::new(r))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(lease_id = req.get_ref().id))]
    async fn lease_revoke(
        &self,
        req: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let (meta, _, req) = req.into_parts();
        // Revoking deletes every attached key: WRITE on each of them (etcd), checked after a
        // read barrier so the attachment list is current. A key attached after the check is
        // deleted with the lease, as in etcd: attaching it took WRITE on it from its writer.
        // With auth off nothing is checked, but the revoke still names the (disabled) auth store
        // it was admitted under, so it is refused if auth was enabled before it applies.
        let write = crate::auth::Need::Write;
        let checked = self.ctx.authorize_lease(&meta, &[], req.id, write).await?;
        match self.ctx.propose(self.ctx.guard(checked, Cmd::LeaseRevoke(req))).await? {
            CmdResult::LeaseRevoke(mut r) => {
                self.ctx.stamp(&mut r.header);
                Ok(Response::new(r))
            }
            _ => Err(unexpected("lease_revoke")),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        req: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        // Any authenticated user may keep a lease alive (etcd); the token is checked once, when
        // the stream opens.
        self.ctx.authorize(req.metadata(), &[]).await?;
        let mut incoming = req.into_inner();
        // Bounded: a client that stops reading responses stops having its requests read.
        let (tx, rx) = mpsc::channel(64);
        let ctx = self.ctx.clone();
        tokio::spawn(async move {
            let mut in_flight = FuturesOrdered::new();
            let mut incoming_open = true;
            loop {
                tokio::select! {
                    msg = incoming.next(),
                        if incoming_open && in_flight.len() < KEEPALIVES_IN_FLIGHT => match msg {
                        Some(Ok(msg)) => {
                            let ctx = ctx.clone();
                            in_flight.push_back(async move { keep_alive(&ctx, msg.id).await });
                        }
                        _ => incoming_open = false,
                    },
                    Some(resp) = in_flight.next(), if !in_flight.is_empty() => {
                        let failed = resp.is_err();
                        if tx.send(resp).await.is_err() || failed {
                            break;
                        }
                    }
                    // The client closed its side and every answer went out.
                    else => break,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn lease_time_to_live(
        &self,
        req: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        // Judged after a read barrier (issue 19: a member that has not applied an AuthEnable
        // acknowledged before the request must not judge it as "auth off"). The TTL itself is the
        // leader's, asked for after: one extra round, on a call that is not on a hot path.
        let (meta, _, req) = req.into_parts();
        self.ctx.authorize_read(&meta, true, &[]).await?;
        let resp = time_to_live_any(&self.ctx, req).await?;
        // The keys are listed only to a caller who may read every one of them, else the call is
        // refused (etcd 3.4.26/3.5.8 `checkLeaseTimeToLive`): key names are data too. Judged
        // against this member's auth store, which the barrier above brought up to date.
        if req.keys && self.ctx.auth_enabled() {
            let needs: Vec<_> = resp
                .keys
                .iter()
                .map(|k| crate::auth::Need::Read(crate::auth::KeyRange::new(k, &[])))
                .collect();
            self.ctx.authorize_read(&meta, false, &needs).await?;
        }
        Ok(Response::new(resp))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn lease_leases(
        &self,
        req: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        // The read barrier first, then the judgment (`Ctx::authorize_read`), then the local read
        // the barrier made linearizable: one round.
        self.ctx.authorize_read(req.metadata(), true, &[]).await?;
        let leases =
            self.ctx.sm.with_leases(|t| t.iter().map(|r| LeaseStatus { id: r.id }).collect());
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.ctx.header(self.ctx.sm.revision())),
            leases,
        }))
    }
}

/// Runs for the life of the node: while this member leads, proposes a revoke for every lease
/// whose deadline has passed.
pub async fn run_expiry(ctx: Arc<Ctx>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let in_flight: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let mut tick = tokio::time::interval(EXPIRY_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let Some(term) = ctx.lease_leader.sync_role(&ctx) else {
            continue;
        };
        let live: Vec<(i64, i64)> =
            ctx.sm.with_leases(|t| t.iter().map(|r| (r.id, r.ttl)).collect());
        let expired = ctx.lease_leader.clock.lock().expired(live, Instant::now());
        for id in expired {
            {
                let mut busy = in_flight.lock();
                if busy.len() >= MAX_REVOKES_IN_FLIGHT || !busy.insert(id) {
                    continue;
                }
            }
            let ctx = ctx.clone();
            let in_flight = in_flight.clone();
            tokio::spawn(async move {
                tracing::info!(lease_id = id, "lease expired; revoking");
                // Carries this leader's term: if leadership moved while this member was paused
                // or partitioned, the entry lands in a later term (forwarded to the new leader,
                // or appended after a re-election) and apply ignores it.
                match ctx.propose(Cmd::LeaseExpire(LeaseExpire { id, term })).await {
                    Ok(_) => {}
                    // Already revoked by a client or an earlier attempt.
                    Err(s) if s.code() == Code::NotFound => {}
                    // Stale: a newer leader's clock owns this lease now.
                    Err(s) if s.code() == Code::FailedPrecondition => {
                        tracing::info!(lease_id = id, term, "stale lease expiry ignored")
                    }
                    // Leadership moved or the commit timed out: the next leader's clock takes
                    // over, or the next tick retries; a revoke is idempotent in effect.
                    Err(s) => tracing::warn!(lease_id = id, error = %s, "lease revoke failed"),
                }
                in_flight.lock().remove(&id);
            });
        }
    }
}
