//! `picketd --config-file <path>`: the flags, written as a YAML map with etcd's key names (the
//! flag names without `--`: `name`, `data-dir`, `listen-client-urls`, `initial-cluster`, ...).
//!
//! The loader is generic over the clap struct ([`parse_from`] takes any `Parser`): it turns each
//! key into `--key value` and hands the result to clap together with the command line, so every
//! flag, including ones added later, works from the file without changes here, with the same
//! parsing and validation as on the command line.
//!
//! Precedence: command line, then the file, then `PICKET_*` environment variables, then
//! defaults. etcd ignores every other flag when `--config-file` is given; Picket lets a flag on
//! the command line override the file instead, so one file can serve several members with the
//! name (or data dir) given per member. A key that is not a flag is an error naming the key.
//!
//! Values: a string or number is the flag's value; a list is joined with commas (etcd writes URL
//! lists as one comma-separated string, both work); `true`/`false` set or leave off a switch
//! (a flag that takes no value, e.g. a TLS `client-cert-auth`), while for a flag that takes a
//! value they are passed as the words `true`/`false`; an empty value (`key:` or `null`) means
//! "not set". etcd's nested TLS maps are accepted too: the keys under
//! `client-transport-security` are the client flags (`cert-file`, ...), the keys under
//! `peer-transport-security` the peer ones with a `peer-` prefix (`peer-cert-file`, ...).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches};
use thiserror::Error;
use yaml_rust2::{Yaml, YamlLoader};

/// The flag naming the file. The loader finds it by this long name.
pub const CONFIG_FILE_FLAG: &str = "config-file";

/// etcd's nested TLS sections and the prefix their keys get as flags.
const NESTED_SECTIONS: [(&str, &str); 2] =
    [("client-transport-security", ""), ("peer-transport-security", "peer-")];

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The command line itself (or a value from the file) is invalid, or `--help`/`--version`
    /// was asked for: clap's error, to be shown with [`clap::Error::exit`].
    #[error(transparent)]
    Args(#[from] clap::Error),
    #[error("--config-file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("--config-file {}: not valid YAML: {reason}", path.display())]
    Yaml { path: PathBuf, reason: String },
    #[error("--config-file {}: the file must be a YAML map of flag names to values", path.display())]
    NotAMap { path: PathBuf },
    #[error(
        "--config-file {}: unknown key {key:?}: it is not a picketd flag (keys are flag names \
         without `--`, e.g. `data-dir`)",
        path.display()
    )]
    UnknownKey { path: PathBuf, key: String },
    #[error("--config-file {}: key {key:?}: {reason}", path.display())]
    BadValue { path: PathBuf, key: String, reason: String },
}

/// Parses the process's command line, reading `--config-file` if given (see the module docs).
pub fn parse<P: CommandFactory + FromArgMatches>() -> Result<P, ConfigFileError> {
    parse_from(std::env::args_os())
}

/// Parses `args` (the first is the program name), reading `--config-file` if given.
pub fn parse_from<P, I, T>(args: I) -> Result<P, ConfigFileError>
where
    P: CommandFactory + FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // Later occurrences of a flag override earlier ones instead of being an error: that is how
    // the command line (appended last) overrides the file.
    let command = || P::command().args_override_self(true);
    let matches = command().try_get_matches_from(&args)?;
    let file_id = command()
        .get_arguments()
        .find(|a| a.get_long() == Some(CONFIG_FILE_FLAG))
        .map(|a| a.get_id().clone());
    let path = file_id
        .and_then(|id| matches.get_raw(id.as_str()).and_then(|mut v| v.next()).map(PathBuf::from));
    let Some(path) = path else {
        return Ok(P::from_arg_matches(&matches)?);
    };
    let file_args = file_to_args(&command(), &path)?;
    let mut merged = Vec::with_capacity(args.len() + file_args.len());
    merged.extend(args.first().cloned());
    merged.extend(file_args);
    merged.extend(args.into_iter().skip(1));
    let matches = command().try_get_matches_from(merged)?;
    Ok(P::from_arg_matches(&matches)?)
}

/// Reads the YAML file at `path` and turns it into flags of `command`.
pub fn file_to_args(
    command: &clap::Command,
    path: &Path,
) -> Result<Vec<OsString>, ConfigFileError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigFileError::Read { path: path.to_path_buf(), source })?;
    yaml_to_args(command, path, &text)
}

fn scalar(v: &Yaml) -> Option<String> {
    match v {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Turns the YAML text of a config file into flags of `command`; `path` only names the file in
/// errors.
pub fn yaml_to_args(
    command: &clap::Command,
    path: &Path,
    text: &str,
) -> Result<Vec<OsString>, ConfigFileError> {
    let path_buf = || path.to_path_buf();
    let docs = YamlLoader::load_from_str(text)
        .map_err(|e| ConfigFileError::Yaml { path: path_buf(), reason: e.to_string() })?;
    let root = match docs.into_iter().next() {
        None | Some(Yaml::Null) => return Ok(Vec::new()),
        Some(Yaml::Hash(h)) => h,
        Some(_) => return Err(ConfigFileError::NotAMap { path: path_buf() }),
    };
    // (flag name, value, key as written in the file) in file order.
    let mut entries: Vec<(String, Yaml, String)> = Vec::new();
    for (k, v) in root {
        let Some(key) = scalar(&k) else {
            return Err(ConfigFileError::BadValue {
                path: path_buf(),
                key: format!("{k:?}"),
                reason: "keys must be flag names".into(),
            });
        };
        match (NESTED_SECTIONS.iter().find(|(s, _)| *s == key), v) {
            (Some(_), Yaml::Null) => {}
            (Some((_, prefix)), Yaml::Hash(inner)) => {
                for (ik, iv) in inner {
                    let inner_key = scalar(&ik).unwrap_or_else(|| format!("{ik:?}"));
                    entries.push((
                        format!("{prefix}{inner_key}"),
                        iv,
                        format!("{key}.{inner_key}"),
                    ));
                }
            }
            (Some(_), _) => {
                return Err(ConfigFileError::BadValue {
                    path: path_buf(),
                    key,
                    reason: "expected a map of TLS settings".into(),
                })
            }
            (None, v) => entries.push((key.clone(), v, key)),
        }
    }
    let mut out = Vec::new();
    for (flag, value, written) in entries {
        let bad = |reason: &str| ConfigFileError::BadValue {
            path: path_buf(),
            key: written.clone(),
            reason: reason.to_string(),
        };
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(flag.as_str()))
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"));
        let Some(arg) = arg else {
            return Err(ConfigFileError::UnknownKey { path: path_buf(), key: written });
        };
        if flag == CONFIG_FILE_FLAG {
            return Err(bad("a config file cannot name another config file"));
        }
        let takes_value = arg.get_action().takes_values();
        let value = match value {
            Yaml::Null => continue,
            Yaml::Boolean(b) if !takes_value => {
                if b {
                    out.push(OsString::from(format!("--{flag}")));
                }
                continue;
            }
            _ if !takes_value => return Err(bad("expected true or false")),
            Yaml::Array(items) => {
                let parts: Option<Vec<String>> = items.iter().map(scalar).collect();
                parts.ok_or_else(|| bad("list items must be strings or numbers"))?.join(",")
            }
            v => scalar(&v).ok_or_else(|| bad("expected a string, a number or a list"))?,
        };
        // `--flag=value` keeps a value that starts with `-` from being read as a flag.
        out.push(OsString::from(format!("--{flag}={value}")));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "config_file_tests.rs"]
mod tests;
