//! The auth store (`picket.storage.v1.AuthState`) and its deterministic mutations, etcd's
//! `auth/store.go` semantics: users and roles sorted by name, the auth revision bumped by every
//! successful mutation, the `root` user and role protected while auth is enabled.

use picket_proto::authpb::{Permission, Role, User, UserAddOptions};
use picket_proto::picket::raft::v1::auth_command::Op;
use picket_proto::picket::storage::v1::AuthState;

use super::perm::valid_perm_range;
use super::{AuthError, ROOT};

pub fn find_user<'a>(state: &'a AuthState, name: &str) -> Option<&'a User> {
    state.users.iter().find(|u| u.name == name.as_bytes())
}

pub fn find_role<'a>(state: &'a AuthState, name: &str) -> Option<&'a Role> {
    state.roles.iter().find(|r| r.name == name.as_bytes())
}

fn user_mut<'a>(state: &'a mut AuthState, name: &str) -> Result<&'a mut User, AuthError> {
    state.users.iter_mut().find(|u| u.name == name.as_bytes()).ok_or(AuthError::UserNotFound)
}

fn role_mut<'a>(state: &'a mut AuthState, name: &str) -> Result<&'a mut Role, AuthError> {
    state.roles.iter_mut().find(|r| r.name == name.as_bytes()).ok_or(AuthError::RoleNotFound)
}

/// The role names a user may be granted: every stored role, plus `root`, which exists
/// implicitly (etcd creates it on first grant; here it needs no record: it has every permission).
fn role_exists(state: &AuthState, name: &str) -> bool {
    name == ROOT || find_role(state, name).is_some()
}

/// Applies one auth mutation. On success the auth revision is bumped; on error nothing changes.
/// Deterministic: it only reads `state` and `op` (passwords arrive already hashed).
pub fn mutate(state: &mut AuthState, op: Op) -> Result<(), AuthError> {
    match op {
        Op::Enable(e) => {
            let needs_key = state.signing_key.is_empty() && !e.signing_key.is_empty();
            if state.enabled && !needs_key {
                // Already on: keep the signing key, so tokens already issued stay valid.
                return Ok(());
            }
            if state.enabled {
                // On without a key: a store restored from an etcd snapshot (etcd keeps its
                // token keys out of the backend). The first Authenticate proposes one; it
                // takes, and the revision bump makes every member reload the store.
                state.signing_key = e.signing_key;
                state.revision += 1;
                return Ok(());
            }
            let root = find_user(state, ROOT).ok_or(AuthError::RootUserNotExist)?;
            if !root.roles.iter().any(|r| r == ROOT) {
                return Err(AuthError::RootRoleNotExist);
            }
            state.enabled = true;
            state.signing_key = e.signing_key;
        }
        Op::Disable(_) => {
            state.enabled = false;
        }
        Op::UserAdd(r) => {
            if r.name.is_empty() {
                return Err(AuthError::UserEmpty);
            }
            if find_user(state, &r.name).is_some() {
                return Err(AuthError::UserAlreadyExist);
            }
            let no_password = r.options.as_ref().is_some_and(|o| o.no_password);
            let user = User {
                name: r.name.into_bytes(),
                // Only the hash is ever stored; a raw `password` in the log is ignored.
                password: if no_password { Vec::new() } else { r.hashed_password.into_bytes() },
                roles: Vec::new(),
                options: Some(UserAddOptions { no_password }),
            };
            let at = state.users.partition_point(|u| u.name < user.name);
            state.users.insert(at, user);
        }
        Op::UserDelete(r) => {
            if r.name.is_empty() {
                return Err(AuthError::UserEmpty);
            }
            if state.enabled && r.name == ROOT {
                return Err(AuthError::InvalidAuthMgmt);
            }
            let at = state
                .users
                .iter()
                .position(|u| u.name == r.name.as_bytes())
                .ok_or(AuthError::UserNotFound)?;
            state.users.remove(at);
        }
        Op::UserChangePassword(r) => {
            let user = user_mut(state, &r.name)?;
            if user.options.as_ref().is_some_and(|o| o.no_password) {
                // etcd refuses to give a password to a user created without one.
                return Err(AuthError::InvalidAuthMgmt);
            }
            user.password = r.hashed_password.into_bytes();
        }
        Op::UserGrantRole(r) => {
            if find_user(state, &r.user).is_none() {
                return Err(AuthError::UserNotFound);
            }
            if !role_exists(state, &r.role) {
                return Err(AuthError::RoleNotFound);
            }
            let user = user_mut(state, &r.user)?;
            match user.roles.binary_search(&r.role) {
                // Granting a role twice is a no-op that still succeeds, as in etcd.
                Ok(_) => return Ok(()),
                Err(at) => user.roles.insert(at, r.role),
            }
        }
        Op::UserRevokeRole(r) => {
            if state.enabled && r.name == ROOT && r.role == ROOT {
                return Err(AuthError::InvalidAuthMgmt);
            }
            let user = user_mut(state, &r.name)?;
            let at = user.roles.binary_search(&r.role).map_err(|_| AuthError::RoleNotGranted)?;
            user.roles.remove(at);
        }
        Op::RoleAdd(r) => {
            if r.name.is_empty() {
                return Err(AuthError::RoleEmpty);
            }
            // `root` may be added explicitly (etcdctl users often do); until then it exists
            // implicitly for grants.
            if find_role(state, &r.name).is_some() {
                return Err(AuthError::RoleAlreadyExist);
            }
            let role = Role { name: r.name.into_bytes(), key_permission: Vec::new() };
            let at = state.roles.partition_point(|x| x.name < role.name);
            state.roles.insert(at, role);
        }
        Op::RoleDelete(r) => {
            if state.enabled && r.role == ROOT {
                return Err(AuthError::InvalidAuthMgmt);
            }
            let at = state
                .roles
                .iter()
                .position(|x| x.name == r.role.as_bytes())
                .ok_or(AuthError::RoleNotFound)?;
            state.roles.remove(at);
            // Nobody keeps a role that no longer exists (etcd revokes it from every user).
            for u in &mut state.users {
                u.roles.retain(|x| *x != r.role);
            }
        }
        Op::RoleGrantPermission(r) => {
            let perm = r.perm.unwrap_or_default();
            if !valid_perm_range(&perm.key, &perm.range_end) {
                return Err(AuthError::InvalidPermRange);
            }
            let role = role_mut(state, &r.name)?;
            // The same range granted again replaces its type (etcd).
            match role
                .key_permission
                .binary_search_by(|p| (&p.key, &p.range_end).cmp(&(&perm.key, &perm.range_end)))
            {
                Ok(at) => role.key_permission[at].perm_type = perm.perm_type,
                Err(at) => role.key_permission.insert(
                    at,
                    Permission {
                        perm_type: perm.perm_type,
                        key: perm.key,
                        range_end: perm.range_end,
                    },
                ),
            }
        }
        Op::RoleRevokePermission(r) => {
            let role = role_mut(state, &r.role)?;
            let at = role
                .key_permission
                .iter()
                .position(|p| p.key == r.key && p.range_end == r.range_end)
                .ok_or(AuthError::PermissionNotGranted)?;
            role.key_permission.remove(at);
        }
    }
    state.revision += 1;
    Ok(())
}
