//! Authentication (etcd's `Auth` service): the token every request carries, re-authentication
//! when the server refuses it, and the user, role and auth administration calls.
//!
//! With [`ConnectOptions::with_user`](crate::ConnectOptions::with_user) the client calls
//! `Authenticate` when it connects and sends the token in the `token` metadata key (as etcd's
//! clients do) on every request and stream, through an interceptor on every pooled connection.
//! A token expires (`--auth-token-ttl` on the server); when the server answers "invalid auth
//! token", "user name is empty" or "revision of auth store is old", [`Client::call`] fetches a
//! new token and sends the request once more.

use std::sync::{Arc, RwLock};

use picket_proto::authpb::permission::Type as PermType;
use picket_proto::authpb::{Permission, UserAddOptions};
use picket_proto::etcdserverpb::auth_client::AuthClient;
use picket_proto::etcdserverpb::*;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::client::{request, Retry};
use crate::error::Error;
use crate::Client;

/// A user name and password to authenticate with. The password never appears in `Debug`.
#[derive(Clone)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).finish_non_exhaustive()
    }
}

impl Credentials {
    /// Credentials for `user` with `password`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self { user: user.into(), password: password.into() }
    }
}

const AUTH_NOT_ENABLED: &str = "authentication is not enabled";

/// The current token, shared by every connection of a client; sent as `token` metadata.
#[derive(Clone, Default)]
pub(crate) struct TokenSlot(Arc<RwLock<Option<MetadataValue<Ascii>>>>);

impl TokenSlot {
    fn set(&self, token: Option<MetadataValue<Ascii>>) {
        // The slot holds one value written in one statement; a poisoned lock is still usable.
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = token;
    }
}

impl Interceptor for TokenSlot {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let token = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(t) = token {
            req.metadata_mut().insert("token", t);
        }
        Ok(req)
    }
}

/// A pooled connection: the channel, with the token attached to every request.
pub(crate) type Chan = InterceptedService<Channel, TokenSlot>;

/// Whether the server refused a request because of its token: expired or forged ("invalid auth
/// token"), missing ("user name is empty"), or checked against an auth store that changed
/// before the request applied ("revision of auth store is old"). Each is decided before the
/// request takes effect (on the API layer, or deterministically by apply), which is what makes
/// sending it again after re-authenticating safe, writes included.
pub(crate) fn token_refused(status: &Status) -> bool {
    let msg = status.message();
    (status.code() == Code::Unauthenticated && msg.contains("invalid auth token"))
        || (status.code() == Code::InvalidArgument
            && (msg.contains("user name is empty")
                || msg.contains("revision of auth store is old")))
}

fn perm_type(read: bool, write: bool) -> i32 {
    match (read, write) {
        (true, true) => PermType::Readwrite as i32,
        (false, true) => PermType::Write as i32,
        _ => PermType::Read as i32,
    }
}

impl Client {
    /// Fetches a new token with the configured credentials (none configured: nothing to do).
    pub(crate) async fn authenticate(&self) -> Result<(), Error> {
        let Some(creds) = self.inner.opts.credentials.clone() else { return Ok(()) };
        // Authenticate has no side effect: retrying it on another endpoint is safe.
        let answer = self
            .call_unauthenticated(Retry::Idempotent, |ch| {
                let req = AuthenticateRequest {
                    name: creds.user.clone(),
                    password: creds.password.clone(),
                };
                async move { Ok(AuthClient::new(ch).authenticate(request(req)).await?.into_inner()) }
            })
            .await;
        let token = match answer {
            Ok(r) => r.token,
            // Auth is off: requests need no token. etcd's Go client does the same, so
            // `--user` works against a cluster whose auth is not (yet) enabled.
            Err(Error::Server { message, .. }) if message.contains(AUTH_NOT_ENABLED) => {
                self.inner.pool.token().set(None);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let value = MetadataValue::try_from(token.as_str()).map_err(|_| Error::Server {
            code: Code::Internal,
            message: "server sent a token that is not valid gRPC metadata".into(),
        })?;
        self.inner.pool.token().set(Some(value));
        Ok(())
    }

    /// Turns authentication on (the `root` user must exist and hold the `root` role).
    pub async fn auth_enable(&self) -> Result<(), Error> {
        self.call(Retry::Idempotent, |ch| async move {
            AuthClient::new(ch).auth_enable(request(AuthEnableRequest {})).await.map(|_| ())
        })
        .await
    }

    /// Turns authentication off (root only).
    pub async fn auth_disable(&self) -> Result<(), Error> {
        self.call(Retry::Idempotent, |ch| async move {
            AuthClient::new(ch).auth_disable(request(AuthDisableRequest {})).await.map(|_| ())
        })
        .await
    }

    /// Whether authentication is on, and the auth revision.
    pub async fn auth_status(&self) -> Result<(bool, u64), Error> {
        let r = self
            .call(Retry::Idempotent, |ch| async move {
                Ok(AuthClient::new(ch)
                    .auth_status(request(AuthStatusRequest {}))
                    .await?
                    .into_inner())
            })
            .await?;
        Ok((r.enabled, r.auth_revision))
    }

    /// Adds a user. With `password` `None` the user can never authenticate by password.
    pub async fn user_add(&self, name: &str, password: Option<&str>) -> Result<(), Error> {
        let req = AuthUserAddRequest {
            name: name.to_string(),
            password: password.unwrap_or_default().to_string(),
            options: Some(UserAddOptions { no_password: password.is_none() }),
            hashed_password: String::new(),
        };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).user_add(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// The roles of a user.
    pub async fn user_get(&self, name: &str) -> Result<Vec<String>, Error> {
        let req = AuthUserGetRequest { name: name.to_string() };
        let r = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move { Ok(AuthClient::new(ch).user_get(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(r.roles)
    }

    /// Every user name.
    pub async fn user_list(&self) -> Result<Vec<String>, Error> {
        let r = self
            .call(Retry::Idempotent, |ch| async move {
                Ok(AuthClient::new(ch)
                    .user_list(request(AuthUserListRequest {}))
                    .await?
                    .into_inner())
            })
            .await?;
        Ok(r.users)
    }

    /// Deletes a user.
    pub async fn user_delete(&self, name: &str) -> Result<(), Error> {
        let req = AuthUserDeleteRequest { name: name.to_string() };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).user_delete(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// Changes a user's password.
    pub async fn user_change_password(&self, name: &str, password: &str) -> Result<(), Error> {
        let req = AuthUserChangePasswordRequest {
            name: name.to_string(),
            password: password.to_string(),
            hashed_password: String::new(),
        };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).user_change_password(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// Grants `role` to `user` (granting it again is a no-op).
    pub async fn user_grant_role(&self, user: &str, role: &str) -> Result<(), Error> {
        let req = AuthUserGrantRoleRequest { user: user.to_string(), role: role.to_string() };
        self.call(Retry::Idempotent, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).user_grant_role(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// Revokes `role` from `user`.
    pub async fn user_revoke_role(&self, user: &str, role: &str) -> Result<(), Error> {
        let req = AuthUserRevokeRoleRequest { name: user.to_string(), role: role.to_string() };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).user_revoke_role(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// Adds a role.
    pub async fn role_add(&self, name: &str) -> Result<(), Error> {
        let req = AuthRoleAddRequest { name: name.to_string() };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).role_add(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// The permissions of a role.
    pub async fn role_get(&self, name: &str) -> Result<Vec<Permission>, Error> {
        let req = AuthRoleGetRequest { role: name.to_string() };
        let r = self
            .call(Retry::Idempotent, |ch| {
                let req = req.clone();
                async move { Ok(AuthClient::new(ch).role_get(request(req)).await?.into_inner()) }
            })
            .await?;
        Ok(r.perm)
    }

    /// Every role name.
    pub async fn role_list(&self) -> Result<Vec<String>, Error> {
        let r = self
            .call(Retry::Idempotent, |ch| async move {
                Ok(AuthClient::new(ch)
                    .role_list(request(AuthRoleListRequest {}))
                    .await?
                    .into_inner())
            })
            .await?;
        Ok(r.roles)
    }

    /// Deletes a role (and revokes it from every user).
    pub async fn role_delete(&self, name: &str) -> Result<(), Error> {
        let req = AuthRoleDeleteRequest { role: name.to_string() };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).role_delete(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// Grants `role` READ and/or WRITE on `[key, range_end)` (etcd's conventions: empty
    /// `range_end` for one key, `"\0"` for every key from `key` on).
    pub async fn role_grant_permission(
        &self,
        role: &str,
        key: &[u8],
        range_end: &[u8],
        read: bool,
        write: bool,
    ) -> Result<(), Error> {
        let req = AuthRoleGrantPermissionRequest {
            name: role.to_string(),
            perm: Some(Permission {
                perm_type: perm_type(read, write),
                key: key.to_vec(),
                range_end: range_end.to_vec(),
            }),
        };
        self.call(Retry::Idempotent, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).role_grant_permission(request(req)).await.map(|_| ()) }
        })
        .await
    }

    /// Revokes the permission on exactly `[key, range_end)` from `role`.
    pub async fn role_revoke_permission(
        &self,
        role: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), Error> {
        let req = AuthRoleRevokePermissionRequest {
            role: role.to_string(),
            key: key.to_vec(),
            range_end: range_end.to_vec(),
        };
        self.call(Retry::Write, |ch| {
            let req = req.clone();
            async move { AuthClient::new(ch).role_revoke_permission(request(req)).await.map(|_| ()) }
        })
        .await
    }
}
