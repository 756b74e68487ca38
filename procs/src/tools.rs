//! The system tools the tests and the harness run, found the way `scripts/setup-deps.sh`
//! installs them: commands on `PATH`, libfaketime through its Debian package's file list (its
//! directory carries the architecture triplet, so no fixed path is right on every machine).
//!
//! A missing tool is a [`Missing`] error naming the tool, what was looked at and the Debian
//! package that provides it. Callers fail with it: a test that cannot run is a failure, never a
//! pass (`scripts/test.sh` and CI install every tool first, so there it means a broken setup).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tool the tests need but this machine lacks.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} is missing: {looked} (install Debian's `{package}`; scripts/setup-deps.sh does)")]
#[non_exhaustive]
pub struct Missing {
    /// The tool, as a person would name it.
    pub what: String,
    /// Where it was looked for.
    pub looked: String,
    /// The Debian package that provides it.
    pub package: &'static str,
}

/// The first executable file called `name` on `PATH`.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Finds command `name` on `PATH`, or says which `package` provides it.
pub fn command(name: &str, package: &'static str) -> Result<PathBuf, Missing> {
    on_path(name).ok_or_else(|| Missing {
        what: format!("`{name}`"),
        looked: "not on PATH".into(),
        package,
    })
}

/// etcd 3.4, run beside Picket by the compatibility tests and the harness's comparison runs.
pub fn etcd() -> Result<PathBuf, Missing> {
    command("etcd", "etcd-server")
}

/// etcdctl 3.4, the compatibility tests' client.
pub fn etcdctl() -> Result<PathBuf, Missing> {
    command("etcdctl", "etcd-client")
}

/// `ip` (network namespaces and veth pairs for the harness).
pub fn ip() -> Result<PathBuf, Missing> {
    command("ip", "iproute2")
}

/// `iptables` (the harness's partitions).
pub fn iptables() -> Result<PathBuf, Missing> {
    command("iptables", "iptables")
}

/// The file name of libfaketime's multi-threaded build (picketd is multi-threaded).
pub const LIBFAKETIME_MT: &str = "libfaketimeMT.so.1";

/// libfaketime's multi-threaded library, from the file list of Debian's `libfaketime` package
/// (which `faketime` depends on), so it is found on every architecture.
pub fn libfaketime() -> Result<PathBuf, Missing> {
    let listed = Command::new("dpkg-query").args(["-L", "libfaketime"]).output();
    let found = listed.ok().filter(|o| o.status.success()).and_then(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .find(|p| p.file_name().is_some_and(|n| n == LIBFAKETIME_MT) && p.is_file())
    });
    found.ok_or_else(|| Missing {
        what: format!("libfaketime ({LIBFAKETIME_MT})"),
        looked: "not in the file list of the `libfaketime` package (dpkg-query -L libfaketime)"
            .into(),
        package: "faketime",
    })
}

/// Whether this process runs as root (the harness's namespaces and iptables need it).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_command_names_itself_and_its_package() {
        let e = command("picket-no-such-tool", "some-package").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("`picket-no-such-tool`") && text.contains("some-package"), "{text}");
    }

    #[test]
    fn finds_a_command_every_machine_has() {
        let sh = command("sh", "dash").expect("sh is on PATH");
        assert!(sh.is_absolute(), "{}", sh.display());
    }
}
