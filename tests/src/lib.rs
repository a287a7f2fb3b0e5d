//! The end-to-end harness: real etcd members and real holdfast binaries on
//! 127.0.0.1, each test in its own directory with free ports and log files.
//! Processes stop when their guard drops; when a test fails, the guards
//! print the tail of every log.

use anyhow::Context;
use holdfast_arbiter::config::EtcdConfig;
use holdfast_client::{Client, ClientConfig};
use holdfast_devkit::etcd::{self as devetcd, ClusterSpec, EtcdBinary, EtcdProcess, MemberSpec};
use holdfast_devkit::notify::NotifySocket;
use holdfast_devkit::pki::{DevCa, Issued};
use holdfast_devkit::ports::free_port;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::Duration;

pub use holdfast_devkit::pki::DEV_TRUST_DOMAIN;

pub mod otlp;
pub mod recorder;

/// Where the workspace's binaries are: next to the test executable's deps dir.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(path.exists(), "{} is missing: build the binaries first (`cargo build --workspace --bins`; scripts/test does it)", path.display());
    path
}

/// The etcd under test, printed once per test binary.
pub fn etcd_binary() -> EtcdBinary {
    static PRINT: Once = Once::new();
    let bin = EtcdBinary::locate().expect("etcd binary");
    PRINT.call_once(|| eprintln!("etcd under test: {} ({})", bin.version_string(), bin.etcd.display()));
    bin
}

/// A per-test directory, kept (and printed) if the test fails.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    pub path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> Self {
        let dir = tempfile::Builder::new().prefix(&format!("holdfast-{name}-")).tempdir().expect("temp dir");
        let path = dir.path().to_path_buf();
        TestDir { dir: Some(dir), path }
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(d) = self.dir.take() {
                eprintln!("test files kept in {}", d.keep().display());
            }
        }
    }
}

fn print_tail(what: &str, path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!("----- {what}: last lines of {} -----", path.display());
    for l in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("{l}");
    }
}

/// A real etcd cluster of one or more members on loopback.
pub struct Etcd {
    pub bin: EtcdBinary,
    pub spec: ClusterSpec,
    pub members: Vec<Option<EtcdProcess>>,
    dir: PathBuf,
    generation: u32,
}

impl Etcd {
    pub async fn start(dir: &Path, members: usize) -> Self {
        let ports: Vec<u16> = (0..members).map(|_| free_port()).collect();
        Self::start_on(dir, &ports).await
    }

    /// Starts one member per given client port.
    pub async fn start_on(dir: &Path, client_ports: &[u16]) -> Self {
        let members = client_ports.len();
        let bin = etcd_binary();
        let spec = ClusterSpec {
            members: client_ports
                .iter()
                .enumerate()
                .map(|(i, port)| MemberSpec {
                    name: format!("m{i}"),
                    host: "127.0.0.1".into(),
                    data_dir: dir.join(format!("etcd-m{i}-0")),
                    client_port: *port,
                    peer_port: free_port(),
                })
                .collect(),
            token: format!("holdfast-test-{}", free_port()),
        };
        let mut etcd = Etcd { bin, spec, members: Vec::new(), dir: dir.to_path_buf(), generation: 0 };
        for i in 0..members {
            let p = EtcdProcess::start(&etcd.bin, &etcd.spec, i, &etcd.log(i)).expect("start etcd");
            etcd.members.push(Some(p));
        }
        etcd.wait_ready().await;
        etcd
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("etcd-m{i}.log"))
    }

    pub async fn wait_ready(&self) {
        if let Err(e) = devetcd::wait_ready(&self.endpoints(), Duration::from_secs(60)).await {
            for i in 0..self.spec.members.len() {
                print_tail("etcd", &self.log(i));
            }
            panic!("etcd not ready: {e:#}");
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.spec.client_urls()
    }

    pub fn config(&self) -> EtcdConfig {
        EtcdConfig { endpoints: self.endpoints(), request_timeout: Duration::from_secs(5), ca_file: None, cert_file: None, key_file: None }
    }

    /// A plain etcd client, for looking behind the arbiter's back.
    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect(self.endpoints(), None).await.expect("etcd client")
    }

    /// The arbiter's etcd handle (for epoch init and advance).
    pub async fn holdfast(&self) -> holdfast_arbiter::etcd::Etcd {
        holdfast_arbiter::etcd::Etcd::connect(&self.config()).await.expect("etcd connect")
    }

    pub async fn init_epoch(&self) -> holdfast_model::layout::EpochRecord {
        holdfast_arbiter::epoch::init(&self.holdfast().await, |_| {}).await.expect("epoch init")
    }

    pub async fn revision(&self) -> i64 {
        let resp = self.client().await.get("/", None).await.expect("get");
        resp.header().expect("header").revision()
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].as_ref().and_then(|p| p.pid())
    }

    pub fn stop_all(&mut self) {
        for m in self.members.iter_mut() {
            if let Some(mut p) = m.take() {
                p.stop(Duration::from_secs(10));
            }
        }
    }

    pub fn snapshot(&self, file: &Path) {
        devetcd::snapshot_save(&self.bin, &self.endpoints()[0], file).expect("snapshot save");
    }

    /// Stops every member, restores `snapshot` into fresh data directories
    /// (with a new cluster token, or the same token and peer URLs) and starts
    /// the restored cluster on the same client ports.
    pub async fn restore(&mut self, snapshot: &Path, new_token: bool) {
        self.stop_all();
        self.generation += 1;
        if new_token {
            self.spec.token = format!("{}-restored{}", self.spec.token, self.generation);
        }
        for (i, m) in self.spec.members.iter_mut().enumerate() {
            m.data_dir = self.dir.join(format!("etcd-m{i}-{}", self.generation));
        }
        for i in 0..self.spec.members.len() {
            devetcd::snapshot_restore(&self.bin, snapshot, &self.spec, i).expect("snapshot restore");
        }
        for i in 0..self.spec.members.len() {
            self.members[i] = Some(EtcdProcess::start(&self.bin, &self.spec, i, &self.log(i)).expect("start restored etcd"));
        }
        self.wait_ready().await;
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.spec.members.len() {
                print_tail("etcd", &self.log(i));
            }
        }
        self.stop_all();
    }
}

/// A throwaway CA and the certificates a test needs.
pub struct Pki {
    pub ca: DevCa,
    pub server: Issued,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let ca = DevCa::open_or_create(&dir.join("tls")).expect("dev CA");
        let server = ca.server("arbiter").expect("server cert");
        Pki { ca, server }
    }

    /// A workload SVID `spiffe://holdfast.dev/<path>`.
    pub fn workload(&self, name: &str, path: &str) -> Issued {
        self.ca.workload(name, path).expect("workload cert")
    }

    /// A client certificate from the right CA but with no SPIFFE ID.
    pub fn no_spiffe(&self, name: &str) -> Issued {
        self.ca.issue(name, &["client.example"], &[]).expect("cert")
    }

    pub fn client_config(&self, endpoint: &str, cert: &Issued) -> ClientConfig {
        ClientConfig { endpoint: endpoint.to_string(), ca: self.ca.ca_path(), cert: cert.cert.clone(), key: cert.key.clone() }
    }
}

/// A running holdfast-arbiter, started like systemd starts it.
pub struct Arbiter {
    pub child: Option<Child>,
    pub port: u16,
    pub metrics_port: u16,
    pub log: PathBuf,
    pub notify: NotifySocket,
    pub config: PathBuf,
}

impl Arbiter {
    /// Writes a config and starts the binary; does not wait for READY.
    pub fn spawn(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki) -> Self {
        Self::spawn_with(dir, name, etcd_endpoints, pki, "")
    }

    /// Like [`Arbiter::spawn`], with extra TOML appended to the config.
    pub fn spawn_with(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki, extra: &str) -> Self {
        Self::spawn_logged(dir, name, etcd_endpoints, pki, extra, "info,holdfast_arbiter=debug")
    }

    /// Like [`Arbiter::spawn_with`], with the HOLDFAST_LOG filter given.
    pub fn spawn_logged(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki, extra: &str, log_filter: &str) -> Self {
        let port = free_port();
        let metrics_port = free_port();
        let config = dir.join(format!("{name}.toml"));
        let endpoints = etcd_endpoints.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>().join(", ");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\ncluster_name = \"test\"\ndrain_timeout = \"3s\"\n[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n[etcd]\nendpoints = [{endpoints}]\nrequest_timeout = \"2s\"\n{seal}",
                pki.server.cert.display().to_string(),
                pki.server.key.display().to_string(),
                pki.ca.ca_path().display().to_string(),
                seal = if extra.contains("[seal]") { "" } else { "[seal]\ncheck_interval = \"200ms\"\nwatermark_interval = \"1s\"\n" },
            ),
        )
        .expect("write arbiter config");
        if !extra.is_empty() {
            let mut text = std::fs::read_to_string(&config).expect("config");
            text.push_str(extra);
            std::fs::write(&config, text).expect("write arbiter config");
        }
        let log = dir.join(format!("{name}.log"));
        let notify = NotifySocket::bind(&dir.join(format!("{name}.notify"))).expect("notify socket");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin("holdfast-arbiter"))
            .arg("--config")
            .arg(&config)
            .env("NOTIFY_SOCKET", notify.path())
            .env("HOLDFAST_LOG", log_filter)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("start holdfast-arbiter");
        Arbiter { child: Some(child), port, metrics_port, log, notify, config }
    }

    /// Starts the arbiter and waits for READY=1.
    pub fn start(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki) -> Self {
        Self::start_with(dir, name, etcd_endpoints, pki, "")
    }

    pub fn start_with(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki, extra: &str) -> Self {
        let mut a = Self::spawn_with(dir, name, etcd_endpoints, pki, extra);
        a.wait_ready(Duration::from_secs(30)).expect("arbiter READY=1");
        a
    }

    /// Grant transactions this arbiter has sent.
    pub async fn grant_attempts(&self, client: &Client) -> u64 {
        client.server_status().await.expect("status").grant_attempts
    }

    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let child = self.child.as_mut().context("not running")?;
        let r = self.notify.wait_ready(timeout, || matches!(child.try_wait(), Ok(None)));
        if r.is_err() {
            print_tail("arbiter", &self.log);
        }
        r
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub async fn client(&self, pki: &Pki, cert: &Issued) -> Client {
        Client::connect(&pki.client_config(&self.endpoint(), cert)).await.expect("connect to arbiter")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            devetcd::terminate(&mut c, Duration::from_secs(10));
        }
    }

    /// Waits until ServerStatus reports the wanted sealed state.
    pub async fn wait_sealed(&self, client: &Client, sealed: bool, timeout: Duration) -> holdfast_proto::v1::ServerStatusResponse {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(s) = client.server_status().await {
                if s.sealed == sealed && (sealed || s.serving) {
                    return s;
                }
                if tokio::time::Instant::now() > end {
                    panic!("arbiter sealed={} after {timeout:?}, wanted {sealed}: {}", s.sealed, s.sealed_reason);
                }
            } else if tokio::time::Instant::now() > end {
                panic!("arbiter did not answer ServerStatus within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Arbiter {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_tail("arbiter", &self.log);
        }
        self.stop();
    }
}

/// The usual fixture: one etcd (n members), the epoch initialised, a PKI
/// and one arbiter.
pub struct Appliance {
    pub arbiter: Arbiter,
    pub pki: Pki,
    pub etcd: Etcd,
    pub dir: TestDir,
}

impl Appliance {
    pub async fn start(name: &str, members: usize) -> Self {
        Self::start_with(name, members, "").await
    }

    /// Like [`Appliance::start`], with extra TOML appended to the arbiter's config.
    pub async fn start_with(name: &str, members: usize, extra: &str) -> Self {
        let dir = TestDir::new(name);
        let etcd = Etcd::start(&dir.path, members).await;
        etcd.init_epoch().await;
        let pki = Pki::new(&dir.path);
        let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, extra);
        Appliance { arbiter, pki, etcd, dir }
    }

    /// A client with the identity `spiffe://holdfast.dev/<path>`.
    pub async fn client(&self, path: &str) -> Client {
        let name = path.replace('/', "-");
        let cert = self.pki.workload(&name, path);
        self.arbiter.client(&self.pki, &cert).await
    }

    /// A Locker for identity `path` over the given arbiters.
    pub fn locker(&self, path: &str, arbiters: &[&Arbiter], on_fence: impl Fn(holdfast_client::Fenced) + Send + Sync + 'static) -> holdfast_client::Locker {
        let cert = self.pki.workload(&path.replace('/', "-"), path);
        holdfast_client::Locker::new(
            holdfast_client::LockerConfig {
                endpoints: arbiters.iter().map(|a| a.endpoint()).collect(),
                ca: self.pki.ca.ca_path(),
                cert: cert.cert,
                key: cert.key,
            },
            on_fence,
        )
        .expect("locker")
    }

    /// Environment for running holdfastctl against this appliance as `path`.
    pub fn ctl_env(&self, path: &str) -> Vec<(String, String)> {
        let cert = self.pki.workload(&path.replace('/', "-"), path);
        vec![
            ("HOLDFAST_ENDPOINT".into(), self.arbiter.endpoint()),
            ("HOLDFAST_CA".into(), self.pki.ca.ca_path().display().to_string()),
            ("HOLDFAST_CERT".into(), cert.cert.display().to_string()),
            ("HOLDFAST_KEY".into(), cert.key.display().to_string()),
        ]
    }
}

/// A throwaway PostgreSQL cluster (Debian's packages) on loopback for this
/// test; prints its log if the test fails.
pub struct Postgres(pub holdfast_devkit::postgres::PgCluster);

impl Postgres {
    pub fn start(dir: &Path) -> Self {
        let log = dir.join("postgres.log");
        match holdfast_devkit::postgres::PgCluster::start(&log) {
            Ok(pg) => Postgres(pg),
            Err(e) => {
                print_tail("postgres", &log);
                panic!("{e:#}");
            }
        }
    }

    pub fn url(&self) -> String {
        self.0.url()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_tail("postgres", &self.0.log);
        }
    }
}

/// A real S3-compatible server (versitygw) on loopback with the given
/// buckets; prints its log if the test fails.
pub struct S3(pub holdfast_devkit::s3::S3Server);

impl S3 {
    pub fn start(dir: &Path, buckets: &[&str]) -> Self {
        let log = dir.join("versitygw.log");
        match holdfast_devkit::s3::S3Server::start(&dir.join("s3"), &log, buckets) {
            Ok(s) => S3(s),
            Err(e) => {
                print_tail("versitygw", &log);
                panic!("{e:#}");
            }
        }
    }

    pub fn endpoint(&self) -> String {
        self.0.endpoint()
    }

    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` for a client process.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), self.0.access_key_id.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), self.0.secret_access_key.clone()),
        ]
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_tail("versitygw", &self.0.log);
        }
    }
}

pub fn sigstop(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGSTOP);
}
pub fn sigcont(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGCONT);
}
pub fn sigkill_group(pid: u32) {
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
}
pub fn sigkill(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
}
