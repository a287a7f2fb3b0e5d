//! A real S3-compatible server for tests: versitygw (Apache-2.0) with its
//! posix backend, on 127.0.0.1 with a free port.
//!
//! versitygw honours `If-Match` and `If-None-Match` on `PutObject`, checked
//! again under a per-key publish lock, so a conditional put is atomic —
//! what the S3 reference fence needs. `scripts/install-deps` builds it from
//! the Go module proxy into `/opt/holdfast/versitygw-<version>`.
//!
//! The posix backend treats every directory under its root as a bucket, so
//! buckets are made by creating directories before the server starts.
//!
//! Object lock: versitygw's posix backend keeps a bucket's lock
//! configuration and each object's retention in extended attributes, and
//! enforces them (a locked object cannot be overwritten or deleted). A bucket
//! has object lock only when it is created through the API with
//! `x-amz-bucket-object-lock-enabled: true` (a directory made beforehand has
//! none, and `PutObjectLockConfiguration` on it needs versioning first). For
//! S3's model of a locked bucket — versioned, a second put is a new version —
//! start the server with [`S3Server::start_versioned`]; without versioning a
//! locked object is simply never replaced.

use anyhow::{Context, bail};
use holdfast_devkit::ports::{free_port, listener_pid, listens};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `HOLDFAST_VERSITYGW_BIN`, else `versitygw` on PATH.
pub fn locate() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_VERSITYGW_BIN") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|d| d.join("versitygw")).find(|p| p.is_file()))
        .context("versitygw (the S3-compatible test server) not found: run scripts/install-deps, or set HOLDFAST_VERSITYGW_BIN")
}

/// Why a start did not come up.
enum Startup {
    /// The port was taken between the check and versitygw's bind.
    PortTaken(u16),
    Failed(anyhow::Error),
}

/// A running versitygw. Dropping it stops the server.
pub struct S3Server {
    child: Option<Child>,
    pub port: u16,
    pub root: PathBuf,
    pub log: PathBuf,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl S3Server {
    /// Starts a server whose data lives in `root` (created) with the given
    /// buckets, and waits until it accepts connections.
    pub fn start(root: &Path, log: &Path, buckets: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(root, None, log, buckets)
    }

    /// Like [`S3Server::start`], with bucket versioning available: versitygw
    /// keeps old versions under `versions` (created; outside `root`, or it
    /// would be a bucket). A bucket is versioned once versioning is enabled
    /// on it, or when it is created with object lock.
    pub fn start_versioned(root: &Path, versions: &Path, log: &Path, buckets: &[&str]) -> anyhow::Result<Self> {
        if versions.starts_with(root) {
            bail!("the versioning directory {} must be outside the root {}", versions.display(), root.display());
        }
        std::fs::create_dir_all(versions).with_context(|| format!("creating {}", versions.display()))?;
        Self::start_with(root, Some(versions), log, buckets)
    }

    fn start_with(root: &Path, versions: Option<&Path>, log: &Path, buckets: &[&str]) -> anyhow::Result<Self> {
        let bin = locate()?;
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        for b in buckets {
            std::fs::create_dir_all(root.join(b)).with_context(|| format!("creating bucket directory {b}"))?;
        }
        // A port free when picked can be taken before versitygw binds it (by
        // another suite on this machine): then it exits, and a new port is
        // tried.
        let mut attempt = 1;
        loop {
            let log_start = std::fs::metadata(log).map_or(0, |m| m.len());
            match Self::spawn(&bin, free_port(), root, versions, log)?.wait_ready(log_start, Duration::from_secs(30)) {
                Ok(server) => return Ok(server),
                Err(Startup::PortTaken(port)) if attempt < 3 => {
                    eprintln!("versitygw: port {port} was taken before it could bind it; trying another");
                    attempt += 1;
                }
                Err(Startup::PortTaken(port)) => {
                    bail!("versitygw could not bind 127.0.0.1:{port} (in use), the third port tried; see {}", log.display())
                }
                Err(Startup::Failed(e)) => return Err(e),
            }
        }
    }

    fn spawn(bin: &Path, port: u16, root: &Path, versions: Option<&Path>, log: &Path) -> anyhow::Result<Self> {
        // Throwaway credentials, passed in the environment rather than argv.
        let access_key_id = format!("holdfast{port}");
        let secret_access_key = format!("holdfast-test-secret-{port}-{}", std::process::id());
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
        let mut command = Command::new(bin);
        command.env("ROOT_ACCESS_KEY_ID", &access_key_id).env("ROOT_SECRET_ACCESS_KEY", &secret_access_key).args([
            "--port",
            &format!("127.0.0.1:{port}"),
            "--quiet",
            "posix",
        ]);
        if let Some(versions) = versions {
            command.arg("--versioning-dir").arg(versions);
        }
        let child = command
            .arg(root)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(S3Server { child: Some(child), port, root: root.to_path_buf(), log: log.to_path_buf(), access_key_id, secret_access_key })
    }

    /// Ready once versitygw itself holds the listening socket: a bare
    /// connect could reach some other process that took the port, whose
    /// answers (a reset, in one CI run) would then fail the test.
    /// `log_start`: the log's length before this start, so only its own
    /// lines are read.
    fn wait_ready(mut self, log_start: u64, timeout: Duration) -> Result<Self, Startup> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            let Some(child) = self.child.as_mut() else { break };
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                let text = std::fs::read(&self.log).unwrap_or_default();
                let new = String::from_utf8_lossy(text.get(usize::try_from(log_start).unwrap_or(0)..).unwrap_or_default());
                if new.contains("address already in use") {
                    return Err(Startup::PortTaken(self.port));
                }
                return Err(Startup::Failed(anyhow::anyhow!("versitygw exited during startup ({status}); see {}", self.log.display())));
            }
            if listens(child.id(), self.port) {
                return Ok(self);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let holder = listener_pid(self.port).map_or(String::new(), |pid| format!(" (process {pid} listens there)"));
        Err(Startup::Failed(anyhow::anyhow!(
            "versitygw did not listen on 127.0.0.1:{} within {timeout:?}{holder}; see {}",
            self.port,
            self.log.display()
        )))
    }

    /// `http://127.0.0.1:<port>`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            holdfast_devkit::process::terminate(&mut c, Duration::from_secs(5));
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the retry in `start_with` rests on: versitygw started on a port
    /// another process listens on is told apart from a server that is ready
    /// (a bare connect would have succeeded), and from other failures.
    #[test]
    fn a_port_another_process_holds_is_reported_as_taken() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let taken = std::net::TcpListener::bind(("127.0.0.1", free_port())).unwrap();
        let port = taken.local_addr().unwrap().port();
        let log = dir.path().join("versitygw.log");
        std::fs::write(&log, "an earlier start's line: address already in use\n").unwrap();
        let start = std::fs::metadata(&log).unwrap().len();
        let server = S3Server::spawn(&locate().unwrap(), port, &root, None, &log).unwrap();
        match server.wait_ready(start, Duration::from_secs(30)) {
            Err(Startup::PortTaken(p)) => assert_eq!(p, port),
            Err(Startup::Failed(e)) => panic!("not recognised as a taken port: {e:#}"),
            Ok(_) => panic!("a server that could not bind was called ready"),
        }

        // With the port free, the same start is ready, and the earlier
        // line in the log does not make it look taken.
        drop(taken);
        let start = std::fs::metadata(&log).unwrap().len();
        let server = S3Server::spawn(&locate().unwrap(), port, &root, None, &log).unwrap();
        let server = server.wait_ready(start, Duration::from_secs(30)).unwrap_or_else(|_| panic!("not ready on a free port"));
        assert!(listens(server.child.as_ref().unwrap().id(), port));
    }
}
