//! Auth errors. Their texts are etcd's verbatim (clients match on them); [`AuthError::kind`]
//! names each on the wire, and the gRPC codes are in the API layer's table (`api::status`).

use picket_proto::picket::raft::v1::RefusalKind;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("etcdserver: user name is empty")]
    UserEmpty,
    #[error("etcdserver: user name already exists")]
    UserAlreadyExist,
    #[error("etcdserver: user name not found")]
    UserNotFound,
    #[error("etcdserver: role name is empty")]
    RoleEmpty,
    #[error("etcdserver: role name already exists")]
    RoleAlreadyExist,
    #[error("etcdserver: role name not found")]
    RoleNotFound,
    #[error("etcdserver: role is not granted to the user")]
    RoleNotGranted,
    #[error("etcdserver: permission is not granted to the role")]
    PermissionNotGranted,
    #[error("etcdserver: permission denied")]
    PermissionDenied,
    #[error("etcdserver: root user does not exist")]
    RootUserNotExist,
    #[error("etcdserver: root user does not have root role")]
    RootRoleNotExist,
    /// Deleting root, or taking the root role from root, while auth is enabled.
    #[error("etcdserver: invalid auth management")]
    InvalidAuthMgmt,
    #[error("etcdserver: authentication is not enabled")]
    AuthNotEnabled,
    #[error("etcdserver: authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("etcdserver: invalid auth token")]
    InvalidAuthToken,
    /// The request was checked against an auth store that has changed since; retry it.
    #[error("etcdserver: revision of auth store is old")]
    AuthOldRevision,
    /// A permission whose range is empty (`range_end` sorts at or before `key`).
    #[error(
        "picket: invalid permission range: range_end must sort after key (or be empty for one \
         key, or \"\\0\" for every key from key on)"
    )]
    InvalidPermRange,
    /// A `hashedPassword` that is not a bcrypt hash.
    #[error("picket: hashedPassword is not a bcrypt hash ($2a$, $2b$ or $2y$)")]
    InvalidHash,
    /// A password longer than bcrypt can hash (72 bytes).
    #[error("picket: password is longer than 72 bytes, the most bcrypt can hash")]
    PasswordTooLong,
}

impl AuthError {
    /// The name a refusal with this error travels under.
    pub fn kind(&self) -> RefusalKind {
        use RefusalKind as K;
        match self {
            AuthError::UserEmpty => K::AuthUserEmpty,
            AuthError::UserAlreadyExist => K::AuthUserAlreadyExist,
            AuthError::UserNotFound => K::AuthUserNotFound,
            AuthError::RoleEmpty => K::AuthRoleEmpty,
            AuthError::RoleAlreadyExist => K::AuthRoleAlreadyExist,
            AuthError::RoleNotFound => K::AuthRoleNotFound,
            AuthError::RoleNotGranted => K::AuthRoleNotGranted,
            AuthError::PermissionNotGranted => K::AuthPermissionNotGranted,
            AuthError::PermissionDenied => K::AuthPermissionDenied,
            AuthError::RootUserNotExist => K::AuthRootUserNotExist,
            AuthError::RootRoleNotExist => K::AuthRootRoleNotExist,
            AuthError::InvalidAuthMgmt => K::AuthInvalidAuthMgmt,
            AuthError::AuthNotEnabled => K::AuthNotEnabled,
            AuthError::AuthFailed => K::AuthFailed,
            AuthError::InvalidAuthToken => K::AuthInvalidAuthToken,
            AuthError::AuthOldRevision => K::AuthOldRevision,
            AuthError::InvalidPermRange => K::AuthInvalidPermRange,
            AuthError::InvalidHash => K::AuthInvalidHash,
            AuthError::PasswordTooLong => K::AuthPasswordTooLong,
        }
    }
}
