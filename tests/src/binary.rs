//! Locating the `picketd` executable under test.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

/// The environment variable that overrides where `picketd` is. Pointing it at etcd (`$(command -v etcd)`)
/// runs the suite against etcd itself, which is how the expected values were validated.
pub const PICKETD_BIN_ENV: &str = "PICKETD_BIN";

/// Returns the `picketd` binary: `$PICKETD_BIN` if set, else `<target dir>/debug/picketd`.
///
/// Test executables live in `<target dir>/<profile>/deps/`, so the binary built by
/// `cargo build --bins` is two directories up from `std::env::current_exe()`. Binaries of this
/// crate (`src/bin/`) live in `<target dir>/<profile>/` itself, next to `picketd`.
pub fn picketd_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(PICKETD_BIN_ENV) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{PICKETD_BIN_ENV}={} does not name an existing file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot find the test executable's path")?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .with_context(|| format!("unexpected test executable location {}", exe.display()))?;
    let mut bin = profile_dir.join("picketd");
    if let Some(sibling) = exe.parent().map(|d| d.join("picketd")).filter(|p| p.is_file()) {
        bin = sibling;
    }
    if !bin.is_file() {
        bail!(
            "picketd binary not found at {}: run `cargo build --bins` (or `cargo build -p \
             picket-server --bin picketd`) first, or set {PICKETD_BIN_ENV}",
            bin.display()
        );
    }
    Ok(bin)
}
