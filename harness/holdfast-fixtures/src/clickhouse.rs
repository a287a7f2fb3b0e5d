//! A real ClickHouse server for tests: Debian 12's `clickhouse-server`
//! (18.16), on 127.0.0.1 with free ports, for the ClickHouse audit sink.
//!
//! The server gets a minimal XML config of its own in the test's directory:
//! HTTP and native ports, `listen_host` 127.0.0.1 only, data and tmp paths
//! under the directory, and a users file with one passwordless `default`
//! user that may connect only from 127.0.0.1. It runs as whoever runs the
//! test (root included) and is ready, usually in well under a second, when
//! `GET /ping` answers `Ok.`. `scripts/install-deps` installs the package.

use anyhow::{Context, bail};
use holdfast_devkit::ports::free_port;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `HOLDFAST_CLICKHOUSE_BIN`, else `/usr/sbin/clickhouse-server` (Debian's),
/// else `/usr/bin/clickhouse-server`, else `clickhouse-server` on PATH.
pub fn locate() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_CLICKHOUSE_BIN") {
        return Ok(PathBuf::from(p));
    }
    ["/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| holdfast_devkit::process::which("clickhouse-server"))
        .context("clickhouse-server not found: run scripts/install-deps (Debian package clickhouse-server), or set HOLDFAST_CLICKHOUSE_BIN")
}

/// A running ClickHouse. Dropping it stops the server.
pub struct ClickHouseServer {
    child: Option<Child>,
    /// The HTTP interface's port.
    pub http_port: u16,
    /// The native protocol's port (unused by holdfast; ClickHouse wants one).
    pub tcp_port: u16,
    /// Config, users file, data and tmp live here.
    pub dir: PathBuf,
    /// The server's own output; print it when a test fails.
    pub log: PathBuf,
    /// How long the last start took until `/ping` answered.
    pub startup: Duration,
}

impl ClickHouseServer {
    /// Writes a config into `dir` (created), starts the server and waits
    /// until `GET /ping` answers.
    pub fn start(dir: &Path, log: &Path) -> anyhow::Result<Self> {
        let bin = locate()?;
        for sub in ["data", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let http_port = free_port();
        let tcp_port = free_port();
        let users = dir.join("users.xml");
        std::fs::write(&users, USERS).with_context(|| format!("writing {}", users.display()))?;
        let config = dir.join("config.xml");
        let text = format!(
            r#"<?xml version="1.0"?>
<yandex>
    <logger>
        <level>information</level>
        <console>1</console>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{http_port}</http_port>
    <tcp_port>{tcp_port}</tcp_port>
    <path>{data}/</path>
    <tmp_path>{tmp}/</tmp_path>
    <users_config>{users}</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <mark_cache_size>67108864</mark_cache_size>
    <!-- Debian's shipped value; the built-in 10 s would hold a stop
         that long while a client keeps an idle connection open. -->
    <keep_alive_timeout>3</keep_alive_timeout>
</yandex>
"#,
            data = dir.join("data").display(),
            tmp = dir.join("tmp").display(),
            users = users.display(),
        );
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        let mut server =
            ClickHouseServer { child: None, http_port, tcp_port, dir: dir.to_path_buf(), log: log.to_path_buf(), startup: Duration::ZERO };
        server.spawn(&bin)?;
        Ok(server)
    }

    fn spawn(&mut self, bin: &Path) -> anyhow::Result<()> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let started = Instant::now();
        let child = Command::new(bin)
            .arg(format!("--config-file={}", self.dir.join("config.xml").display()))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(60))?;
        self.startup = started.elapsed();
        Ok(())
    }

    /// Starts the server again on the same ports and data after [`stop`](Self::stop).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn(&locate()?)
    }

    fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                bail!("clickhouse-server exited during startup ({status}); see {}", self.log.display());
            }
            if let Ok((200, body)) = http(self.http_port, "GET", "/ping", b"")
                && body.trim() == "Ok."
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        bail!("clickhouse-server did not answer GET /ping on 127.0.0.1:{} within {timeout:?}; see {}", self.http_port, self.log.display())
    }

    /// `http://127.0.0.1:<http_port>`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Runs one statement as `default` and returns the answer's body; an
    /// error carries ClickHouse's message.
    pub fn query(&self, sql: &str) -> anyhow::Result<String> {
        let (status, body) = http(self.http_port, "POST", "/", sql.as_bytes())?;
        if status != 200 {
            bail!("ClickHouse answered {status} to {sql:?}: {}", body.trim());
        }
        Ok(body)
    }

    /// The process ID, while the server runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            holdfast_devkit::process::terminate(&mut c, Duration::from_secs(10));
        }
    }
}

impl Drop for ClickHouseServer {
    fn drop(&mut self) {
        self.stop();
    }
}

const USERS: &str = r#"<?xml version="1.0"?>
<yandex>
    <profiles>
        <default></default>
    </profiles>
    <quotas>
        <default></default>
    </quotas>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
</yandex>
"#;

/// One HTTP/1.0 request to 127.0.0.1:`port` (so the answer is never
/// chunked); `(status, body)`.
fn http(port: u16, method: &str, path: &str, body: &[u8]) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let head = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers in ClickHouse's answer")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status in ClickHouse's answer: {head:?}"))?;
    Ok((status, body.to_string()))
}
