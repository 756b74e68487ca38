//! `user`, `role` and `auth`: etcdctl's authentication administration, same syntax.
//!
//! `--user name[:password]` (global) authenticates every command; without `:password` and
//! without `--password`, the password is read from stdin (one line).

use std::io::BufRead;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use picket_client::proto::Permission;
use serde_json::json;

use super::Ctx;
use crate::output::{self, text, Format, Table};

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    /// Add a user: `user add NAME` (password from --new-user-password or stdin), or
    /// `user add NAME:PASSWORD`.
    Add {
        /// `name` or `name:password`. (Fields are not called `user`: that id is the global
        /// `--user` flag's.)
        #[arg(value_name = "USER[:PASSWORD]")]
        name: String,
        /// The new user's password (instead of `name:password` or stdin).
        #[arg(long)]
        new_user_password: Option<String>,
        /// The user has no password and can never authenticate with one.
        #[arg(long)]
        no_password: bool,
    },
    /// Delete a user.
    Delete { name: String },
    /// List every user.
    List,
    /// Show a user's roles.
    Get { name: String },
    /// Change a user's password (from --new-user-password or stdin).
    Passwd {
        name: String,
        #[arg(long)]
        new_user_password: Option<String>,
    },
    /// Grant a role to a user.
    GrantRole {
        #[arg(value_name = "USER")]
        name: String,
        role: String,
    },
    /// Revoke a role from a user.
    RevokeRole {
        #[arg(value_name = "USER")]
        name: String,
        role: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RoleCmd {
    /// Add a role.
    Add { name: String },
    /// Delete a role (and revoke it from every user).
    Delete { name: String },
    /// List every role.
    List,
    /// Show a role's permissions.
    Get { name: String },
    /// Grant `read`, `write` or `readwrite` on a key, a range `KEY END`, a prefix (--prefix) or
    /// every key from KEY on (--from-key).
    GrantPermission {
        role: String,
        perm_type: String,
        key: String,
        end: Option<String>,
        #[arg(long, conflicts_with_all = ["end", "from_key"])]
        prefix: bool,
        #[arg(long, conflicts_with = "end")]
        from_key: bool,
    },
    /// Revoke the permission on exactly this key, range, prefix or from-key range.
    RevokePermission {
        role: String,
        key: String,
        end: Option<String>,
        #[arg(long, conflicts_with_all = ["end", "from_key"])]
        prefix: bool,
        #[arg(long, conflicts_with = "end")]
        from_key: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AuthCmd {
    /// Turn authentication on (the root user must exist and hold the root role).
    Enable,
    /// Turn authentication off.
    Disable,
    /// Whether authentication is on, and the auth revision.
    Status,
}

/// `[key, range_end)` from etcdctl's key arguments.
fn range_end(key: &str, end: Option<String>, prefix: bool, from_key: bool) -> Vec<u8> {
    if prefix {
        picket_client::prefix_end(key.as_bytes())
    } else if from_key {
        vec![0]
    } else {
        end.map(String::into_bytes).unwrap_or_default()
    }
}

/// A password from stdin (one line, without its newline).
pub fn read_password(prompt: &str) -> Result<String> {
    output::note(prompt);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the password from stdin")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn done(f: Format, msg: String) {
    match f {
        Format::Json => output::json_line(&json!({ "ok": true, "message": msg })),
        _ => output::line(msg),
    }
}

fn perm_kind(p: &Permission) -> &'static str {
    match p.perm_type {
        0 => "READ",
        1 => "WRITE",
        2 => "READWRITE",
        _ => "UNKNOWN",
    }
}

pub async fn user(ctx: &Ctx, c: UserCmd) -> Result<u8> {
    let client = ctx.client().await?;
    let f = ctx.format();
    match c {
        UserCmd::Add { name, new_user_password, no_password } => {
            let (name, inline) = match name.split_once(':') {
                Some((n, p)) => (n.to_string(), Some(p.to_string())),
                None => (name, None),
            };
            let password = if no_password {
                None
            } else {
                match inline.or(new_user_password) {
                    Some(p) => Some(p),
                    None => Some(read_password(&format!("Password of {name}:"))?),
                }
            };
            client.user_add(&name, password.as_deref()).await?;
            done(f, format!("User {name} created"));
        }
        UserCmd::Delete { name } => {
            client.user_delete(&name).await?;
            done(f, format!("User {name} deleted"));
        }
        UserCmd::List => {
            print_names(f, "users", "USER", &client.user_list().await?);
        }
        UserCmd::Get { name } => {
            let roles = client.user_get(&name).await?;
            match f {
                Format::Json => output::json_line(&json!({ "user": name, "roles": roles })),
                _ => {
                    output::line(format!("User: {name}"));
                    output::line(format!("Roles: {}", roles.join(" ")));
                }
            }
        }
        UserCmd::Passwd { name, new_user_password } => {
            let password = match new_user_password {
                Some(p) => p,
                None => read_password(&format!("Password of {name}:"))?,
            };
            client.user_change_password(&name, &password).await?;
            done(f, "Password updated".into());
        }
        UserCmd::GrantRole { name: user, role } => {
            client.user_grant_role(&user, &role).await?;
            done(f, format!("Role {role} is granted to user {user}"));
        }
        UserCmd::RevokeRole { name: user, role } => {
            client.user_revoke_role(&user, &role).await?;
            done(f, format!("Role {role} is revoked from user {user}"));
        }
    }
    Ok(0)
}

pub async fn role(ctx: &Ctx, c: RoleCmd) -> Result<u8> {
    let client = ctx.client().await?;
    let f = ctx.format();
    match c {
        RoleCmd::Add { name } => {
            client.role_add(&name).await?;
            done(f, format!("Role {name} created"));
        }
        RoleCmd::Delete { name } => {
            client.role_delete(&name).await?;
            done(f, format!("Role {name} deleted"));
        }
        RoleCmd::List => {
            print_names(f, "roles", "ROLE", &client.role_list().await?);
        }
        RoleCmd::Get { name } => {
            let perms = client.role_get(&name).await?;
            match f {
                Format::Json => {
                    let perms: Vec<_> = perms
                        .iter()
                        .map(|p| {
                            json!({
                                "permType": perm_kind(p),
                                "key": output::key_json(&p.key),
                                "range_end": output::key_json(&p.range_end),
                            })
                        })
                        .collect();
                    output::json_line(&json!({ "role": name, "perm": perms }));
                }
                _ => {
                    let mut t = Table::new(["TYPE", "KEY", "RANGE END"]);
                    for p in &perms {
                        t.row([perm_kind(p).to_string(), text(&p.key), text(&p.range_end)]);
                    }
                    output::line(format!("Role {name}"));
                    t.print();
                }
            }
        }
        RoleCmd::GrantPermission { role, perm_type, key, end, prefix, from_key } => {
            let (read, write) = match perm_type.to_ascii_lowercase().as_str() {
                "read" => (true, false),
                "write" => (false, true),
                "readwrite" => (true, true),
                other => bail!("permission type {other:?}: use read, write or readwrite"),
            };
            let end = range_end(&key, end, prefix, from_key);
            client.role_grant_permission(&role, key.as_bytes(), &end, read, write).await?;
            done(f, format!("Role {role} updated"));
        }
        RoleCmd::RevokePermission { role, key, end, prefix, from_key } => {
            let end = range_end(&key, end, prefix, from_key);
            client.role_revoke_permission(&role, key.as_bytes(), &end).await?;
            done(f, format!("Permission of key {key} is revoked from role {role}"));
        }
    }
    Ok(0)
}

pub async fn auth(ctx: &Ctx, c: AuthCmd) -> Result<u8> {
    let client = ctx.client().await?;
    let f = ctx.format();
    match c {
        AuthCmd::Enable => {
            client.auth_enable().await?;
            done(f, "Authentication Enabled".into());
        }
        AuthCmd::Disable => {
            client.auth_disable().await?;
            done(f, "Authentication Disabled".into());
        }
        AuthCmd::Status => {
            let (enabled, revision) = client.auth_status().await?;
            match f {
                Format::Json => {
                    output::json_line(&json!({ "enabled": enabled, "authRevision": revision }))
                }
                _ => {
                    output::line(format!("Authentication Status: {enabled}"));
                    output::line(format!("AuthRevision: {revision}"));
                }
            }
        }
    }
    Ok(0)
}

/// Prints a list of user or role names as etcdctl does: one JSON object, one name per line, or
/// a one-column table.
fn print_names(f: Format, json_key: &str, header: &str, names: &[String]) {
    match f {
        Format::Json => output::json_line(&json!({ json_key: names })),
        Format::Simple => names.iter().for_each(output::line),
        Format::Table => {
            let mut t = Table::new([header]);
            names.iter().for_each(|n| t.row([n.clone()]));
            t.print();
        }
    }
}
