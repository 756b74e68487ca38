//! `etcdserverpb.Auth`, and the checks every other service runs when auth is enabled.
//!
//! Every request carries the token from `Authenticate` in the gRPC metadata key `token` (what
//! etcd's clients send). [`Ctx::auth_info`] verifies it against the member's applied auth store
//! (see `crate::auth::token`), and [`Ctx::authorize`] checks what the request needs against the
//! user's roles *before* anything is proposed. A write then travels as an `AuthChecked` command
//! that names the auth revision it was checked at, and apply refuses it if the auth store has
//! changed since ("revision of auth store is old"; clients retry), so a request racing a
//! permission revoke cannot slip through. Reads are checked after their read barrier, against a
//! store at least as new as the request.
//!
//! With auth disabled nothing is checked and no token is needed, but a write still travels as
//! `AuthChecked`, naming the revision of the (disabled) auth store it was judged against: a
//! member that has not applied AuthEnable yet admits an anonymous write, and apply, which runs it
//! after the AuthEnable entry, must refuse it (etcd refuses such a request too: its header names
//! the auth revision it was checked under). Linearizable reads take their read barrier before
//! auth is even looked at, so "auth is off" is never decided from a store older than the request.
//! Serializable reads are judged against local state, as they read it.

use std::time::Duration;

use picket_proto::authpb::permission::Type as PermType;
use picket_proto::etcdserverpb::auth_server::Auth;
use picket_proto::etcdserverpb::*;
use picket_proto::picket::raft::v1::auth_command::Op;
use picket_proto::picket::raft::v1::command_result::Result as CmdResult;
use picket_proto::picket::raft::v1::raft_command::Cmd;
use picket_proto::picket::raft::v1::{AuthCommand, AuthEnable};
use picket_proto::picket::storage::v1::AuthState;
use std::sync::Arc;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::status::auth_status;
use super::{unexpected, Ctx};
use crate::auth::perm::{self, Need};
use crate::auth::replicated::Judgement;
use crate::auth::{password, store, token, AuthError};

/// Token lifetime and hashing cost (`--auth-token-ttl`, `--bcrypt-cost`).
#[derive(Debug, Clone)]
pub struct AuthGate {
    pub token_ttl: Duration,
    pub bcrypt_cost: u32,
}

impl Default for AuthGate {
    fn default() -> Self {
        Self { token_ttl: Duration::from_secs(300), bcrypt_cost: password::DEFAULT_COST }
    }
}

/// Who sent a request, and the auth store it is judged against.
pub struct AuthInfo {
    pub user: String,
    pub state: Arc<AuthState>,
}

impl AuthInfo {
    fn is_root(&self) -> bool {
        store::find_user(&self.state, &self.user).is_some_and(perm::is_root)
    }

    fn check(&self, needs: &[Need]) -> Result<(), Status> {
        let user = store::find_user(&self.state, &self.user)
            .ok_or_else(|| auth_status(&AuthError::InvalidAuthToken))?;
        perm::check(user, &self.state.roles, needs).map_err(|e| auth_status(&e))
    }
}

/// Unix seconds now, for token expiry: the member's wall clock (`time_ids::now_ms`). API layer
/// only (never apply).
fn now_unix() -> u64 {
    super::time_ids::now_ms() / 1000
}

impl Ctx {
    /// Whether this member has applied an AuthEnable (and no later AuthDisable).
    pub fn auth_enabled(&self) -> bool {
        self.sm.auth().enabled
    }

    /// The caller, from the `token` metadata; `None` when auth is disabled.
    pub async fn auth_info(&self, meta: &MetadataMap) -> Result<Option<AuthInfo>, Status> {
        match self.judge(meta).await? {
            Judged::Off(_) => Ok(None),
            Judged::User(info) => Ok(Some(info)),
        }
    }

    /// Who the caller is, or the store that said auth is off.
    async fn judge(&self, meta: &MetadataMap) -> Result<Judged, Status> {
        let mut state = self.sm.auth();
        if !state.enabled {
            return Ok(Judged::Off(state));
        }
        let invalid = || auth_status(&AuthError::InvalidAuthToken);
        let Some(raw) = meta.get("token") else {
            return Err(auth_status(&AuthError::UserEmpty));
        };
        let claims = token::parse(raw.to_str().map_err(|_| invalid())?)?;
        if state.revision < claims.auth_revision {
            // Issued by a member that is ahead of us: catch up before judging it.
            self.read_barrier().await?;
            state = self.sm.auth();
            if !state.enabled {
                return Ok(Judged::Off(state));
            }
        }
        let user = store::find_user(&state, &claims.user).ok_or_else(invalid)?;
        let now = now_unix();
        if let Some(ahead) = claims.issued_ahead(now) {
            // Refused by verify below. Said here because the fix is an operator's: some member's
            // clock (the one that issued it) runs this far ahead of this one's.
            tracing::warn!(
                user = %claims.user,
                ahead_secs = ahead,
                "refused an auth token issued {ahead} s ahead of this member's clock; \
                 check the members' clocks (NTP)"
            );
        }
        token::verify(&state.signing_key, &claims, &user.password, now)?;
        Ok(Judged::User(AuthInfo { user: claims.user, state }))
    }

    /// Checks `needs` for the caller. Returns the auth revision the check used (to carry in the
    /// proposed command, see [`Ctx::guard`]), also when auth is disabled (nothing is checked
    /// then, but apply must know the write was admitted with auth off).
    ///
    /// With auth on, the judgment waits for a read barrier first, so the auth store it reads is
    /// at least as new as every auth change acknowledged before this request arrived (on any
    /// member). Without it, a member that had not yet applied such a change judged the write
    /// against the older store, and apply refused it with "revision of auth store is old": a
    /// client that revoked a permission through one member and then wrote through another got
    /// that error for a request it had made in order (seen in `tests/tests/gateway.rs`, 1 run in
    /// 5). The barrier is one ReadIndex round, only while auth is on.
    pub async fn authorize(
        &self,
        meta: &MetadataMap,
        needs: &[Need],
    ) -> Result<Option<Judgement>, Status> {
        if self.auth_enabled() {
            self.read_barrier().await?;
        }
        self.authorize_local(meta, needs).await
    }

    /// [`Self::authorize`] against this member's applied auth store as it is.
    async fn authorize_local(
        &self,
        meta: &MetadataMap,
        needs: &[Need],
    ) -> Result<Option<Judgement>, Status> {
        match self.judge(meta).await? {
            Judged::Off(state) => Ok(checked_revision(&state)),
            Judged::User(info) => {
                info.check(needs)?;
                Ok(checked_revision(&info.state))
            }
        }
    }

    /// Checks that the caller holds the root role (admin operations).
    /// Like [`Self::authorize`], the judgment follows a read barrier while auth is on.
    pub async fn authorize_admin(&self, meta: &MetadataMap) -> Result<Option<Judgement>, Status> {
        if self.auth_enabled() {
            self.read_barrier().await?;
        }
        match self.judge(meta).await? {
            Judged::Off(state) => Ok(checked_revision(&state)),
            Judged::User(info) if info.is_root() => Ok(checked_revision(&info.state)),
            Judged::User(_) => Err(auth_status(&AuthError::PermissionDenied)),
        }
    }

    /// Checks a read after the read barrier it needs (so the auth store is at least as new as
    /// the request), for linearizable reads; serializable ones are checked against local state.
    /// The barrier comes first, also when auth looks off here: this member may not have applied
    /// an AuthEnable acknowledged before the request (issue 19). The caller serves a linearizable
    /// read without a second barrier.
    pub async fn authorize_read(
        &self,
        meta: &MetadataMap,
        linearizable: bool,
        needs: &[Need],
    ) -> Result<(), Status> {
        if linearizable {
            self.read_barrier().await?;
        }
        if !self.auth_enabled() {
            return Ok(());
        }
        self.authorize_local(meta, needs).await.map(|_| ())
    }

    /// [`Self::authorize`] for a request that touches lease `lease`: besides `needs`, `what`
    /// (WRITE for a put that attaches the lease or a revoke) on every key attached to it now
    /// (etcd `checkLeasePuts`). A put may not attach a lease holding a key its writer cannot
    /// write: the writer could not revoke that lease, and its key would live and die with
    /// someone else's. The attachments are read after the same read barrier `authorize` takes,
    /// so a key attached before this request arrived counts; one attached after is attached by
    /// a writer that had WRITE on it, as in etcd's revoke. Nothing extra while auth is off.
    pub async fn authorize_lease(
        &self,
        meta: &MetadataMap,
        needs: &[Need],
        lease: i64,
        what: fn(crate::auth::KeyRange) -> Need,
    ) -> Result<Option<Judgement>, Status> {
        if lease == 0 || !self.auth_enabled() {
            return self.authorize(meta, needs).await;
        }
        self.read_barrier().await?;
        let keys = self.sm.reader().keys_of_lease(lease)?;
        let mut all = needs.to_vec();
        all.extend(keys.iter().map(|k| what(crate::auth::KeyRange::new(k, &[]))));
        self.authorize_local(meta, &all).await
    }

    /// Wraps `cmd` as checked at `checked`, the revision [`Ctx::authorize`] returned, with auth
    /// on or off (see the module docs). `None` (nothing was checked) leaves it unwrapped.
    pub fn guard(&self, checked: Option<Judgement>, cmd: Cmd) -> Cmd {
        guard_cmd(checked, cmd)
    }
}

/// Who sent a request, or the applied store that said auth is off when it was judged.
enum Judged {
    Off(Arc<AuthState>),
    User(AuthInfo),
}

/// The auth revision a request judged against `state` carries in its command: the store's
/// revision also when auth is off there. Every auth change bumps the revision (AuthEnable too), so
/// apply refuses the command if auth is on and the store has changed since it was judged,
/// including "it was off then".
fn checked_revision(state: &AuthState) -> Option<Judgement> {
    Some(Judgement { revision: state.revision, auth_on: state.enabled })
}

/// [`Ctx::guard`], without the context.
pub(crate) fn guard_cmd(checked: Option<Judgement>, cmd: Cmd) -> Cmd {
    match checked {
        Some(judged) => crate::auth::replicated::checked(judged, cmd),
        None => cmd,
    }
}

/// What a lock or election on `name` needs: its contenders' keys live under `name/`, so READ
/// (and WRITE, to contend) on that prefix, as the KV requests etcd's lock service makes need.
pub fn contender_needs(name: &[u8], write: bool) -> Vec<Need> {
    let range = crate::auth::KeyRange::prefix(&crate::concurrency::contender_prefix(name));
    let mut out = vec![Need::Read(range.clone())];
    if write {
        out.push(Need::Write(range));
    }
    out
}

/// The command an auth mutation judged at auth revision `checked` is proposed as: wrapped like
/// every write (issue 19), so a user add judged with auth off on a member that had not applied
/// AuthEnable is refused after it. Concurrent mutations by root judged at the same revision
/// get etcd's "revision of auth store is old" for all but the first, which clients retry.
pub(crate) fn mutation_command(checked: Option<Judgement>, op: Op) -> Cmd {
    guard_cmd(checked, Cmd::Auth(AuthCommand { op: Some(op) }))
}

/// WRITE on one key (unlock, resign and proclaim change or delete the holder's key).
pub fn write_key(key: &[u8]) -> Need {
    Need::Write(crate::auth::KeyRange::new(key, &[]))
}

pub struct AuthService {
    ctx: Arc<Ctx>,
}

impl AuthService {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self { ctx }
    }

    fn header(&self) -> Option<ResponseHeader> {
        Some(self.ctx.header(self.ctx.sm.revision()))
    }

    /// Proposes an auth mutation after checking the caller is root (when auth is on).
    async fn mutate(&self, meta: &MetadataMap, op: Op) -> Result<Option<ResponseHeader>, Status> {
        let checked = self.ctx.authorize_admin(meta).await?;
        match self.ctx.propose(mutation_command(checked, op)).await? {
            CmdResult::Auth(_) => Ok(self.header()),
            _ => Err(unexpected("auth")),
        }
    }

    /// A store restored from an etcd snapshot is on without a token signing key (etcd keeps
    /// none in its backend, and a key derived from the file would let anyone holding a backup
    /// forge tokens). The first Authenticate with a good password proposes a random one; apply
    /// keeps only the first of concurrent proposals (`auth::store::mutate`), and the store
    /// returned is read after this member applied it.
    async fn install_key(&self, judged: &AuthState) -> Result<Arc<AuthState>, Status> {
        #[allow(clippy::disallowed_methods)] // Randomness before proposing, not in apply.
        let signing_key: [u8; 32] = rand::random();
        let op = Op::Enable(AuthEnable { signing_key: signing_key.to_vec() });
        // A concurrent install (or any auth change) makes this one stale; either way the store
        // read next says whether a key is in place.
        if let Err(e) = self.ctx.propose(mutation_command(checked_revision(judged), op)).await {
            tracing::debug!(error = %e, "installing the token signing key");
        }
        let state = self.fresh_state().await?;
        if state.signing_key.is_empty() {
            return Err(Status::unavailable(
                "picket: the token signing key of this restored store is being installed; retry",
            ));
        }
        tracing::info!(member_id = self.ctx.member_id, "token signing key installed");
        Ok(state)
    }

    /// The auth store as of a read barrier (at least as new as the request).
    async fn fresh_state(&self) -> Result<Arc<AuthState>, Status> {
        self.ctx.read_barrier().await?;
        Ok(self.ctx.sm.auth())
    }

    /// Hashes a password off the async runtime (bcrypt is slow on purpose).
    async fn hash(&self, password: String) -> Result<String, Status> {
        let cost = self.ctx.auth.bcrypt_cost;
        tokio::task::spawn_blocking(move || password::hash(&password, cost))
            .await
            .map_err(|e| Status::internal(format!("picket: password hashing failed: {e}")))?
            .map_err(|e| auth_status(&e))
    }

    /// The hash to replicate: the client's bcrypt `hashedPassword`, or the password hashed here.
    async fn hash_for(&self, password: String, hashed: String) -> Result<String, Status> {
        if !hashed.is_empty() {
            if !password::is_bcrypt_hash(&hashed) {
                return Err(auth_status(&AuthError::InvalidHash));
            }
            return Ok(hashed);
        }
        self.hash(password).await
    }
}

fn name_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tonic::async_trait]
impl Auth for AuthService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn auth_enable(
        &self,
        req: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        // The signing key is chosen here, on the proposing member, never in apply.
        #[allow(clippy::disallowed_methods)] // Randomness before proposing, not in apply.
        let signing_key: [u8; 32] = rand::random();
        let op = Op::Enable(AuthEnable { signing_key: signing_key.to_vec() });
        let header = self.mutate(req.metadata(), op).await?;
        tracing::info!(member_id = self.ctx.member_id, "auth enabled");
        Ok(Response::new(AuthEnableResponse { header }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn auth_disable(
        &self,
        req: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::Disable(r)).await?;
        tracing::info!(member_id = self.ctx.member_id, "auth disabled");
        Ok(Response::new(AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        _req: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let state = self.fresh_state().await?;
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: state.enabled,
            auth_revision: state.revision,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn authenticate(
        &self,
        req: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let r = req.into_inner();
        // Checked against a store at least as new as the request: a password changed just
        // before is the one that counts.
        let state = self.fresh_state().await?;
        if !state.enabled {
            return Err(auth_status(&AuthError::AuthNotEnabled));
        }
        let failed = || auth_status(&AuthError::AuthFailed);
        let user = store::find_user(&state, &r.name).ok_or_else(failed)?;
        if user.options.as_ref().is_some_and(|o| o.no_password) {
            return Err(failed());
        }
        let checked_hash = user.password.clone();
        let hash = checked_hash.clone();
        let password = r.password;
        let ok = tokio::task::spawn_blocking(move || password::verify(&password, &hash))
            .await
            .map_err(|e| Status::internal(format!("picket: password check failed: {e}")))?;
        if !ok {
            tracing::debug!(user = %r.name, "authentication failed");
            return Err(failed());
        }
        let state =
            if state.signing_key.is_empty() { self.install_key(&state).await? } else { state };
        // The token binds the hash the password was checked against; a store read again (to
        // install the key) must still hold it.
        if store::find_user(&state, &r.name).is_none_or(|u| u.password != checked_hash) {
            return Err(failed());
        }
        let (issued, expires) = token::lifetime(super::time_ids::now_ms(), self.ctx.auth.token_ttl);
        let token = token::sign(
            &state.signing_key,
            &r.name,
            &checked_hash,
            state.revision,
            issued,
            expires,
        );
        Ok(Response::new(AuthenticateResponse { header: self.header(), token }))
    }

    async fn user_add(
        &self,
        req: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let (meta, _, mut r) = req.into_parts();
        self.ctx.authorize_admin(&meta).await?;
        if r.name.is_empty() {
            return Err(auth_status(&AuthError::UserEmpty));
        }
        let no_password = r.options.as_ref().is_some_and(|o| o.no_password);
        let password = std::mem::take(&mut r.password);
        r.hashed_password = if no_password {
            String::new()
        } else {
            self.hash_for(password, std::mem::take(&mut r.hashed_password)).await?
        };
        let header = self.mutate(&meta, Op::UserAdd(r)).await?;
        Ok(Response::new(AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        req: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let state = self.fresh_state().await?;
        if let Some(info) = self.ctx.auth_info(&meta).await? {
            // Anyone may look at themselves (etcd).
            if !info.is_root() && info.user != r.name {
                return Err(auth_status(&AuthError::PermissionDenied));
            }
        }
        let user = store::find_user(&state, &r.name)
            .ok_or_else(|| auth_status(&AuthError::UserNotFound))?;
        Ok(Response::new(AuthUserGetResponse { header: self.header(), roles: user.roles.clone() }))
    }

    async fn user_list(
        &self,
        req: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let state = self.fresh_state().await?;
        let users = state.users.iter().map(|u| name_of(&u.name)).collect();
        Ok(Response::new(AuthUserListResponse { header: self.header(), users }))
    }

    async fn user_delete(
        &self,
        req: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::UserDelete(r)).await?;
        Ok(Response::new(AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        req: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let (meta, _, mut r) = req.into_parts();
        self.ctx.authorize_admin(&meta).await?;
        let password = std::mem::take(&mut r.password);
        r.hashed_password = self.hash_for(password, std::mem::take(&mut r.hashed_password)).await?;
        let header = self.mutate(&meta, Op::UserChangePassword(r)).await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        req: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::UserGrantRole(r)).await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::UserRevokeRole(r)).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        req: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::RoleAdd(r)).await?;
        Ok(Response::new(AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        req: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let state = self.fresh_state().await?;
        if let Some(info) = self.ctx.auth_info(&meta).await? {
            // Anyone may look at a role they hold (etcd).
            let holds =
                store::find_user(&state, &info.user).is_some_and(|u| u.roles.contains(&r.role));
            if !info.is_root() && !holds {
                return Err(auth_status(&AuthError::PermissionDenied));
            }
        }
        // Only roles that were added, as in etcd: `root` too is "role name not found" until a
        // RoleAdd creates it, although granting it to a user and judging by it need no RoleAdd.
        let perm = match store::find_role(&state, &r.role) {
            Some(role) => role.key_permission.clone(),
            None => return Err(auth_status(&AuthError::RoleNotFound)),
        };
        Ok(Response::new(AuthRoleGetResponse { header: self.header(), perm }))
    }

    async fn role_list(
        &self,
        req: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        self.ctx.authorize_admin(req.metadata()).await?;
        let state = self.fresh_state().await?;
        let roles = state.roles.iter().map(|r| name_of(&r.name)).collect();
        Ok(Response::new(AuthRoleListResponse { header: self.header(), roles }))
    }

    async fn role_delete(
        &self,
        req: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::RoleDelete(r)).await?;
        Ok(Response::new(AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let Some(p) = r.perm.as_ref() else {
            return Err(Status::invalid_argument(
                "picket: role grant-permission needs a permission",
            ));
        };
        if PermType::try_from(p.perm_type).is_err() {
            return Err(Status::invalid_argument(
                "picket: permission type must be READ (0), WRITE (1) or READWRITE (2)",
            ));
        }
        if !perm::valid_perm_range(&p.key, &p.range_end) {
            return Err(auth_status(&AuthError::InvalidPermRange));
        }
        let header = self.mutate(&meta, Op::RoleGrantPermission(r)).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let (meta, _, r) = req.into_parts();
        let header = self.mutate(&meta, Op::RoleRevokePermission(r)).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header }))
    }
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
