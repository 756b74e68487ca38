//! One etcd 3.4 member on loopback for the end-to-end test, driven by `etcdctl`, with every
//! wait bounded and the member stopped by its own PID (through `picket_procs::child::Managed`).

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine;
use picket_procs::child::{open_log, Managed};
use picket_procs::{ports, tools};
use serde_json::Value;

/// The longest one etcdctl call may take. etcdctl bounds itself too (`--command-timeout`), so
/// this only catches a hung client.
const CTL_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a fresh single-member etcd may take to serve (about a second when idle).
const READY_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Etcd {
    member: Managed,
    endpoint: String,
    etcdctl: PathBuf,
    dir: tempfile::TempDir,
    /// `--user` for every call, once auth is on.
    pub user: Option<String>,
}

impl Etcd {
    /// Starts a fresh member and waits until it answers. A missing etcd or etcdctl is an error
    /// that names the Debian package to install.
    pub fn start() -> Result<Self> {
        let etcd = tools::etcd()?;
        let etcdctl = tools::etcdctl()?;
        let dir = tempfile::tempdir()?;
        let p = ports::reserve(2)?;
        let (client, peer) =
            (format!("http://127.0.0.1:{}", p[0]), format!("http://127.0.0.1:{}", p[1]));
        let log = open_log(&dir.path().join("etcd.log"), "=== etcd ===")?;
        let mut cmd = Managed::command(&etcd, log.try_clone()?, log)?;
        cmd.arg("--name=snap")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=snap={peer}"));
        let mut member = Managed::new("etcd");
        member.start(cmd)?;
        let mut etcd = Etcd { member, endpoint: client, etcdctl, dir, user: None };
        etcd.wait_ready().with_context(|| etcd.log_tail())?;
        Ok(etcd)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.member.try_wait()? {
                bail!("etcd exited before it served: {status}");
            }
            match self.ctl(["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    bail!("etcd not healthy after {READY_TIMEOUT:?}: {e:#}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<_> = log.lines().rev().take(20).collect();
        format!("etcd log tail:\n{}", lines.into_iter().rev().collect::<Vec<_>>().join("\n"))
    }

    /// Runs etcdctl against this member; its stdout, or an error with its stderr.
    pub fn ctl<I, S>(&self, args: I) -> Result<Vec<u8>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.ctl_stdin(args, b"")
    }

    /// Runs etcdctl with `stdin` as its input (for `txn`).
    pub fn ctl_stdin<I, S>(&self, args: I, stdin: &[u8]) -> Result<Vec<u8>>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(&self.etcdctl);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .args(["--dial-timeout=2s", "--command-timeout=10s"]);
        if let Some(user) = &self.user {
            cmd.arg(format!("--user={user}"));
        }
        cmd.args(args);
        run_bounded(cmd, stdin, CTL_TIMEOUT)
    }

    /// `etcdctl … -w json`, parsed.
    pub fn json<I, S>(&self, args: I) -> Result<Value>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self.ctl(
            args.into_iter().map(|a| a.as_ref().to_owned()).chain(["-w".into(), "json".into()]),
        )?;
        serde_json::from_slice(&out).with_context(|| String::from_utf8_lossy(&out).into_owned())
    }
}

/// Runs `cmd` to completion with at most `timeout`, killing it (by its own handle) past that.
pub fn run_bounded(mut cmd: Command, stdin: &[u8], timeout: Duration) -> Result<Vec<u8>> {
    let out = tempfile::tempfile()?;
    let err = tempfile::tempfile()?;
    cmd.stdin(Stdio::piped()).stdout(out.try_clone()?).stderr(err.try_clone()?);
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("spawning {what}"))?;
    // Dropping the pipe after writing closes it, so the child sees the end of its input.
    child.stdin.take().context("stdin")?.write_all(stdin)?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill()?;
            child.wait()?;
            bail!("{what} still running after {timeout:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |mut f: std::fs::File| -> Result<Vec<u8>> {
        use std::io::{Read, Seek};
        let mut v = Vec::new();
        f.rewind()?;
        f.read_to_end(&mut v)?;
        Ok(v)
    };
    let (stdout, stderr) = (read(out)?, read(err)?);
    if !status.success() {
        bail!("{what} failed ({status}): {}", String::from_utf8_lossy(&stderr));
    }
    Ok(stdout)
}

/// A key-value as etcdctl's JSON shows it (bytes base64, zero fields omitted).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl From<&picket_proto::mvccpb::KeyValue> for Kv {
    fn from(kv: &picket_proto::mvccpb::KeyValue) -> Self {
        Kv {
            key: kv.key.clone(),
            value: kv.value.clone(),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

pub fn b64(v: &Value) -> Result<Vec<u8>> {
    let s = v.as_str().unwrap_or("");
    Ok(base64::engine::general_purpose::STANDARD.decode(s)?)
}

pub fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// The `kvs` of a `get -w json` answer.
pub fn kvs(answer: &Value) -> Result<Vec<Kv>> {
    let none = Vec::new();
    answer["kvs"]
        .as_array()
        .unwrap_or(&none)
        .iter()
        .map(|kv| {
            Ok(Kv {
                key: b64(&kv["key"])?,
                value: b64(&kv["value"])?,
                create_revision: int(&kv["create_revision"]),
                mod_revision: int(&kv["mod_revision"]),
                version: int(&kv["version"]),
                lease: int(&kv["lease"]),
            })
        })
        .collect()
}
