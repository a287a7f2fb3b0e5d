//! A throwaway PostgreSQL cluster from Debian's packages, on 127.0.0.1 with a
//! free port, for tests of the PostgreSQL reference fence.
//!
//! PostgreSQL refuses to run as root, so when this process is root the data
//! directory belongs to the `postgres` user (created by Debian's package) and
//! `initdb` and `postgres` run under `setpriv` as that user. `setpriv` execs
//! in place, so the child we hold *is* the postmaster and signals reach it.
//! The cluster trusts local TCP connections: user `holdfast`, database
//! `holdfast`, no password. Durability is off (`fsync=off`): it is a test
//! fixture.

use anyhow::{Context, bail};
use holdfast_devkit::ports::free_port;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binaries: `HOLDFAST_PG_BIN_DIR`, else the newest
/// `/usr/lib/postgresql/<major>/bin` that has `initdb` and `postgres`.
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HOLDFAST_PG_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file()).then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b).context(
        "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin: run scripts/install-deps (Debian package postgresql), or set HOLDFAST_PG_BIN_DIR",
    )
}

/// A running throwaway cluster. Dropping it stops the server (fast
/// shutdown) and deletes the data directory.
pub struct PgCluster {
    child: Option<Child>,
    pub port: u16,
    pub log: PathBuf,
    /// Owns the data directory; removed on drop.
    _data: tempfile::TempDir,
}

/// `Some(name)` when this process is root and must drop to `name`.
fn run_as() -> Option<&'static str> {
    nix::unistd::geteuid().is_root().then_some("postgres")
}

fn command(bin: &Path, user: Option<&str>) -> Command {
    match user {
        Some(user) => {
            let mut c = Command::new("setpriv");
            c.args([&format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups", "--"]).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

impl PgCluster {
    /// Initialises a cluster, starts it and waits until it accepts
    /// connections. `log` receives initdb's and the server's output.
    pub fn start(log: &Path) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let user = run_as();
        // A directory of its own under the system temp dir: a test's own
        // directory is usually 0700 root, which `postgres` cannot traverse.
        let data = tempfile::Builder::new().prefix("holdfast-pg-").tempdir().context("creating the PostgreSQL temp dir")?;
        if let Some(name) = user {
            let pg = nix::unistd::User::from_name(name)
                .ok()
                .flatten()
                .context("user `postgres` does not exist: install Debian's postgresql package (scripts/install-deps)")?;
            nix::unistd::chown(data.path(), Some(pg.uid), Some(pg.gid)).context("chown of the PostgreSQL temp dir")?;
        }
        let pgdata = data.path().join("data");
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
        let status = command(&bin.join("initdb"), user)
            .arg("-D")
            .arg(&pgdata)
            .args(["-U", "holdfast", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"])
            .current_dir(data.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out.try_clone()?)
            .status()
            .context("running initdb")?;
        if !status.success() {
            bail!("initdb failed ({status}); see {}", log.display());
        }
        let port = free_port();
        let child = command(&bin.join("postgres"), user)
            .arg("-D")
            .arg(&pgdata)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", data.path().display()))
            .args(["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .current_dir(data.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .context("starting postgres")?;
        let mut cluster = PgCluster { child: Some(child), port, log: log.to_path_buf(), _data: data };
        cluster.wait_ready(&bin, Duration::from_secs(60))?;
        let status = Command::new(bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "holdfast", "holdfast"])
            .stdin(Stdio::null())
            .output()
            .context("running createdb")?;
        if !status.status.success() {
            bail!("createdb failed: {}", String::from_utf8_lossy(&status.stderr));
        }
        Ok(cluster)
    }

    fn wait_ready(&mut self, bin: &Path, timeout: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("postgres exited during startup ({status}); see {}", self.log.display());
            }
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "holdfast", "-d", "postgres"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("postgres did not accept connections within {timeout:?}; see {}", self.log.display())
    }

    /// `postgres://holdfast@127.0.0.1:<port>/holdfast`
    pub fn url(&self) -> String {
        format!("postgres://holdfast@127.0.0.1:{}/holdfast", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fast shutdown (SIGINT: roll back open transactions, disconnect
    /// clients), SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            // The postmaster's children are in its process group.
            holdfast_devkit::process::signal_then_kill(&mut child, nix::sys::signal::Signal::SIGINT, grace, true);
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}
