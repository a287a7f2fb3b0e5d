//! The end-to-end harness: real etcd members and real holdfast binaries on
//! 127.0.0.1, each test in its own directory with free ports and log files.
//! Processes stop when their guard drops; when a test fails, the guards
//! print the tail of every log.

use holdfast_client::{Client, ClientConfig};
use holdfast_config::EtcdConfig;
use holdfast_devkit::arbiter::{ArbiterProcess, Launch};
use holdfast_devkit::controller::ControllerProcess;
use holdfast_devkit::etcd::{self as devetcd, ClusterSpec, EtcdBinary, EtcdProcess, MemberSpec};
use holdfast_devkit::pki::{DevCa, EtcdPki, Issued};
use holdfast_devkit::ports::free_port;
use holdfast_fixtures::policy::FixtureClass;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

pub use holdfast_config::arbiter::{ArbiterConfig, OtlpProtocol};
pub use holdfast_devkit::pki::DEV_TRUST_DOMAIN;

pub mod debs;
pub mod golang;
pub mod java;
pub mod otlp;
pub mod peernet;
pub mod python;
pub mod recorder;

/// cargo's `target/` of this test build: the clients' tool caches live under
/// it (Go's module and build caches, the Python venv, Maven's repository),
/// so a fresh clone needs only the toolchains and their registries.
pub fn cargo_target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors().nth(3).expect("target dir").to_path_buf()
}

/// Where the workspace's binaries are: next to the test executable's deps dir.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build --workspace --bins`; scripts/test does it)",
        path.display()
    );
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
        if std::thread::panicking()
            && let Some(d) = self.dir.take()
        {
            eprintln!("test files kept in {}", d.keep().display());
        }
    }
}

fn print_tail(what: &str, path: &Path) {
    eprintln!("----- {what}: last lines of {} -----", path.display());
    eprintln!("{}", holdfast_devkit::arbiter::tail(path, 40));
}

/// A real etcd cluster of one or more members on loopback.
pub struct Etcd {
    pub bin: EtcdBinary,
    pub spec: ClusterSpec,
    pub members: Vec<Option<EtcdProcess>>,
    dir: PathBuf,
    generation: u32,
    /// The etcd CA's directory when the members run client and peer TLS
    /// with certificate authentication ([`Etcd::start_secure`]).
    tls_dir: Option<PathBuf>,
    /// The proxies on the peer links ([`Etcd::start_partitionable`]).
    peer_net: Option<peernet::PeerNet>,
}

impl Etcd {
    pub async fn start(dir: &Path, members: usize) -> Self {
        let ports: Vec<u16> = (0..members).map(|_| free_port()).collect();
        Self::start_on(dir, &ports).await
    }

    /// Members with client and peer TLS and `--client-cert-auth`, their own
    /// CA (not the workloads'); [`Etcd::config`] then carries etcd root's
    /// client certificate. Authentication is off until
    /// `holdfastctl etcd roles` (or [`Etcd::enable_auth`]) turns it on.
    pub async fn start_secure(dir: &Path, members: usize) -> Self {
        let tls_dir = dir.join("etcd-tls");
        let tls = EtcdPki::open_or_create(&tls_dir).expect("etcd CA").member_tls(&[]).expect("etcd member certificate");
        let ports: Vec<u16> = (0..members).map(|_| free_port()).collect();
        Self::start_with_tls(dir, &ports, Some(tls), Some(tls_dir), false).await
    }

    /// Starts one member per given client port.
    pub async fn start_on(dir: &Path, client_ports: &[u16]) -> Self {
        Self::start_with_tls(dir, client_ports, None, None, false).await
    }

    /// Plain members whose peer links pass through proxies
    /// ([`peernet::PeerNet`]), so that [`Etcd::isolate`] can cut one member
    /// off from the others while its client port keeps answering.
    pub async fn start_partitionable(dir: &Path, members: usize) -> Self {
        let ports: Vec<u16> = (0..members).map(|_| free_port()).collect();
        Self::start_with_tls(dir, &ports, None, None, true).await
    }

    /// Cuts member `i` off from its peers (see [`Etcd::start_partitionable`]).
    pub async fn isolate(&self, i: usize) {
        let net = self.peer_net.as_ref().expect("a cluster from Etcd::start_partitionable");
        let members = self.client().await.member_list().await.expect("member list");
        let name = &self.spec.members[i].name;
        let id = members.members().iter().find(|m| m.name() == name).map(|m| format!("{:x}", m.id())).expect("the member's ID");
        net.isolate(i, &id);
    }

    /// Restores every peer link cut by [`Etcd::isolate`].
    pub fn heal(&self) {
        self.peer_net.as_ref().expect("a cluster from Etcd::start_partitionable").heal();
    }

    async fn start_with_tls(
        dir: &Path,
        client_ports: &[u16],
        tls: Option<devetcd::MemberTls>,
        tls_dir: Option<PathBuf>,
        partitionable: bool,
    ) -> Self {
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
                    advertised_peer_port: None,
                    tls: tls.clone(),
                    metrics_port: None,
                })
                .collect(),
            token: format!("holdfast-test-{}", free_port()),
        };
        let mut spec = spec;
        let peer_net = if partitionable {
            let listen: Vec<u16> = spec.members.iter().map(|m| m.peer_port).collect();
            let (net, proxies) = peernet::PeerNet::start(&listen).await;
            for (m, port) in spec.members.iter_mut().zip(proxies) {
                m.advertised_peer_port = Some(port);
            }
            Some(net)
        } else {
            None
        };
        let mut etcd = Etcd { bin, spec, members: Vec::new(), dir: dir.to_path_buf(), generation: 0, tls_dir, peer_net };
        for i in 0..members {
            let p = EtcdProcess::start(&etcd.bin, &etcd.spec, i, &etcd.log(i)).expect("start etcd");
            etcd.members.push(Some(p));
        }
        etcd.wait_ready().await;
        etcd
    }

    /// Stops member `i` and starts it again on the same data (every
    /// client's connection to it drops).
    pub async fn restart_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.stop(Duration::from_secs(10));
        }
        self.members[i] = Some(EtcdProcess::start(&self.bin, &self.spec, i, &self.log(i)).expect("restart etcd"));
        self.wait_ready().await;
    }

    /// The etcd CA of a cluster from [`Etcd::start_secure`].
    pub fn pki(&self) -> EtcdPki {
        EtcdPki::open_or_create(self.tls_dir.as_ref().expect("a secure cluster")).expect("etcd CA")
    }

    fn log(&self, i: usize) -> PathBuf {
        self.dir.join(format!("etcd-m{i}.log"))
    }

    pub async fn wait_ready(&self) {
        if let Err(e) = devetcd::wait_ready_with(&self.config(), Duration::from_secs(60)).await {
            for i in 0..self.spec.members.len() {
                print_tail("etcd", &self.log(i));
            }
            panic!("etcd not ready: {e:#}");
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.spec.client_urls()
    }

    /// Where and how to reach etcd: plain, or as etcd's root user.
    pub fn config(&self) -> EtcdConfig {
        self.config_as(holdfast_store::roles::ROOT)
    }

    /// [`Etcd::config`] as the etcd user `user` (a client certificate with
    /// that CN from the etcd CA) on a cluster from [`Etcd::start_secure`];
    /// the plain config on any other.
    pub fn config_as(&self, user: &str) -> EtcdConfig {
        let Some(dir) = &self.tls_dir else { return EtcdConfig::plain(self.endpoints()) };
        EtcdPki::open_or_create(dir).and_then(|p| p.config_as(user, self.endpoints())).expect("etcd user certificate")
    }

    /// Creates every holdfast role and user and enables authentication
    /// (what `holdfastctl etcd roles` does).
    pub async fn enable_auth(&self) {
        holdfast_store::roles::ensure(&mut self.client().await, true).await.expect("etcd roles");
    }

    /// An etcd client (root's, on a secure cluster), for looking behind the
    /// arbiter's back.
    pub async fn client(&self) -> etcd_client::Client {
        Self::client_for(&self.config()).await
    }

    /// An etcd client with the credentials of `config`.
    pub async fn client_for(config: &EtcdConfig) -> etcd_client::Client {
        holdfast_store::etcd::connect_client(config).await.expect("etcd client")
    }

    /// The arbiter's etcd handle (for epoch init and advance).
    pub async fn holdfast(&self) -> holdfast_store::Etcd {
        holdfast_store::Etcd::connect(&self.config()).await.expect("etcd connect")
    }

    /// Publishes a class set through a real controller (see
    /// [`holdfast_fixtures::policy`]): `classes` as (namespace, TTL in
    /// seconds; a namespace starting with [`DURABLE_CLASSES`] gets
    /// `fairness = "durable"`, every other one best-effort; one starting
    /// with [`OPEN_CLASSES`] gets `on_quorum_loss = "open"`, one starting
    /// with [`HOMED_CLASSES`] `home_region` [`HOME_REGION`]), one grant giving every `spiffe://holdfast.dev/` identity
    /// lock, inspect and force-release on them, plus `extra_grants`.
    /// Returns once the set is published; keep the controller running.
    pub async fn publish_policy(&self, dir: &Path, classes: &[(&str, u64)], extra_grants: &str) -> ControllerProcess {
        let classes: Vec<FixtureClass> = classes
            .iter()
            .map(|(ns, ttl)| {
                let class = FixtureClass::new(ns, Duration::from_secs(*ttl));
                let class = if ns.starts_with(OPEN_CLASSES) { class.open() } else { class };
                let class = if ns.starts_with(HOMED_CLASSES) { class.homed(HOME_REGION) } else { class };
                if ns.starts_with(DURABLE_CLASSES) { class.durable() } else { class }
            })
            .collect();
        let config = EtcdConfig { request_timeout: Duration::from_secs(2), ..self.config_as(holdfast_store::roles::CONTROLLER.name) };
        let pausetest = self.config_as(holdfast_store::roles::PAUSETEST.name);
        let (controller, _) =
            holdfast_fixtures::policy::publish(bin("holdfast-controller"), dir, config, &pausetest, LAB_IDENTITIES, &classes, extra_grants)
                .await
                .expect("publish the lab class set");
        controller
    }

    /// [`Etcd::publish_policy`] with [`LAB_CLASSES`].
    pub async fn publish_lab_policy(&self, dir: &Path) -> ControllerProcess {
        self.publish_policy(dir, LAB_CLASSES, "").await
    }

    pub async fn init_epoch(&self) -> holdfast_model::layout::EpochRecord {
        holdfast_store::epoch::init(&self.holdfast().await, |_| {}).await.expect("epoch init")
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
        devetcd::snapshot_save(&self.bin, &self.config(), file).expect("snapshot save");
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

/// Changes to the arbiter config a test makes (see [`Arbiter::spawn_with`]).
pub type Configure<'a> = &'a dyn Fn(&mut ArbiterConfig);

/// No change to the test's arbiter config.
pub fn defaults(_: &mut ArbiterConfig) {}

/// The arbiter's HOLDFAST_LOG in the tests unless one asks for another.
pub const DEFAULT_LOG_FILTER: &str = "info,holdfast_arbiter=debug";

/// A running holdfast-arbiter, started like systemd starts it (through the
/// devkit's one launcher).
pub struct Arbiter {
    pub process: ArbiterProcess,
    pub port: u16,
    pub metrics_port: u16,
    pub log: PathBuf,
    pub config: PathBuf,
}

impl std::ops::Deref for Arbiter {
    type Target = ArbiterProcess;
    fn deref(&self) -> &ArbiterProcess {
        &self.process
    }
}

impl std::ops::DerefMut for Arbiter {
    fn deref_mut(&mut self) -> &mut ArbiterProcess {
        &mut self.process
    }
}

impl Arbiter {
    /// The config a test arbiter named `name` starts from: loopback on free
    /// ports, the test PKI, fast seal checks, and its own state directory
    /// `DIR/NAME.state` (its record of the epochs it served, kept across
    /// restarts of the same name, as a host's is; never the shared default,
    /// which arbiters of other tests' clusters would find).
    pub fn config(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki) -> ArbiterConfig {
        let mut c = ArbiterConfig::new(
            pki.ca.arbiter_tls(&pki.server),
            EtcdConfig { request_timeout: Duration::from_secs(2), ..EtcdConfig::plain(etcd_endpoints.to_vec()) },
        );
        c.listen = ([127, 0, 0, 1], free_port()).into();
        c.metrics_listen = ([127, 0, 0, 1], free_port()).into();
        c.cluster_name = "test".into();
        c.state_dir = dir.join(format!("{name}.state"));
        c.drain_timeout = Duration::from_secs(3);
        c.seal.check_interval = Duration::from_millis(200);
        c.seal.watermark_interval = Duration::from_secs(1);
        c
    }

    /// Writes a config and starts the binary; does not wait for READY.
    pub fn spawn(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki) -> Self {
        Self::spawn_with(dir, name, etcd_endpoints, pki, &defaults)
    }

    /// Like [`Arbiter::spawn`], with the test's changes to the config.
    pub fn spawn_with(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki, configure: Configure) -> Self {
        Self::spawn_logged(dir, name, etcd_endpoints, pki, configure, DEFAULT_LOG_FILTER)
    }

    /// Like [`Arbiter::spawn_with`], with the HOLDFAST_LOG filter given.
    pub fn spawn_logged(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki, configure: Configure, log_filter: &str) -> Self {
        Self::spawn_env(dir, name, etcd_endpoints, pki, configure, log_filter, &[])
    }

    /// Like [`Arbiter::spawn_logged`], with more environment variables
    /// (test-build faults such as `HOLDFAST_FAULT_STALL_KEEPALIVE_AFTER`).
    pub fn spawn_env(
        dir: &Path,
        name: &str,
        etcd_endpoints: &[String],
        pki: &Pki,
        configure: Configure,
        log_filter: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let mut config = Self::config(dir, name, etcd_endpoints, pki);
        configure(&mut config);
        let (port, metrics_port) = (config.listen.port(), config.metrics_listen.port());
        let mut launch = Launch::new(bin("holdfast-arbiter"), config, dir, name);
        launch.written_by = "Written by the end-to-end harness".into();
        launch.env.push(("HOLDFAST_LOG".into(), log_filter.into()));
        launch.env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let process = ArbiterProcess::spawn(&launch).expect("start holdfast-arbiter");
        Arbiter { process, port, metrics_port, log: launch.log, config: launch.config_path }
    }

    /// Starts the arbiter and waits for READY=1.
    pub fn start(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki) -> Self {
        Self::start_with(dir, name, etcd_endpoints, pki, &defaults)
    }

    pub fn start_with(dir: &Path, name: &str, etcd_endpoints: &[String], pki: &Pki, configure: Configure) -> Self {
        let mut a = Self::spawn_with(dir, name, etcd_endpoints, pki, configure);
        a.wait_ready(Duration::from_secs(30)).expect("arbiter READY=1");
        a
    }

    /// Grant transactions this arbiter has sent.
    pub async fn grant_attempts(&self, client: &Client) -> u64 {
        client.server_status().await.expect("status").grant_attempts
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub async fn client(&self, pki: &Pki, cert: &Issued) -> Client {
        Client::connect(&pki.client_config(&self.endpoint(), cert)).await.expect("connect to arbiter")
    }

    pub fn stop(&mut self) {
        self.process.stop(Duration::from_secs(10));
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

/// Every identity the test PKI issues ([`Pki::workload`]).
pub const LAB_IDENTITIES: &str = "spiffe://holdfast.dev/";

/// Lab classes whose namespace starts with this are homed to
/// [`HOME_REGION`] ([`Etcd::publish_policy`]).
pub const HOMED_CLASSES: &str = "homed";

/// The home region of [`HOMED_CLASSES`]: an arbiter with another `region`
/// refuses them (WRONG_REGION); one with none serves them.
pub const HOME_REGION: &str = "hall-a";

/// Lab classes whose namespace starts with this have durable fairness
/// ([`Etcd::publish_policy`]).
pub const DURABLE_CLASSES: &str = "durable";

/// Lab classes whose namespace starts with this fail open on quorum loss
/// (`on_quorum_loss = "open"`; give them a TTL of 30 s or more, unfenced).
pub const OPEN_CLASSES: &str = "open";

/// The lab's classes, (namespace, TTL in seconds): every namespace the
/// tests lock in. A session's TTL must be its key's class TTL, so a test
/// opens sessions with the TTL listed here (or `open_session_for`).
/// Classes under 30 s are fenced, with a fixture pause-test record.
pub const LAB_CLASSES: &[(&str, u64)] = &[
    ("a", 10),
    ("batch", 10),
    ("demo", 30),
    ("deposed", 10),
    ("durable", 10),
    ("expiry", 5),
    ("fence", 10),
    ("hot", 10),
    ("jobs", 10),
    ("metrics", 10),
    ("ns", 10),
    ("orders", 30),
    ("payments", 30),
    ("pausetest", 5),
    ("poll", 10),
    ("race", 30),
    ("re", 10),
    ("redact", 10),
    ("reports", 30),
    ("svc", 10),
    ("team", 10),
    ("teams", 5),
    ("trace", 10),
    ("vt", 30),
    ("vt-burst", 30),
    ("w", 30),
];

/// The usual fixture: one etcd (n members), the epoch initialised, the lab
/// class set ([`LAB_CLASSES`]) published by a real controller, a PKI and
/// one arbiter.
pub struct Appliance {
    pub arbiter: Arbiter,
    pub controller: ControllerProcess,
    pub pki: Pki,
    pub etcd: Etcd,
    pub dir: TestDir,
}

impl Appliance {
    pub async fn start(name: &str, members: usize) -> Self {
        Self::start_with(name, members, &defaults).await
    }

    /// Like [`Appliance::start`], with the test's changes to the arbiter's config.
    pub async fn start_with(name: &str, members: usize, configure: Configure<'_>) -> Self {
        Self::start_policy(name, members, configure, LAB_CLASSES, "").await
    }

    /// Like [`Appliance::start_with`], with the class set given (see
    /// [`Etcd::publish_policy`]).
    pub async fn start_policy(name: &str, members: usize, configure: Configure<'_>, classes: &[(&str, u64)], extra_grants: &str) -> Self {
        Self::start_full(name, members, configure, classes, extra_grants, &[]).await
    }

    /// Like [`Appliance::start`], with more environment variables for the
    /// arbiter.
    pub async fn start_env(name: &str, members: usize, env: &[(&str, &str)]) -> Self {
        Self::start_full(name, members, &defaults, LAB_CLASSES, "", env).await
    }

    async fn start_full(
        name: &str,
        members: usize,
        configure: Configure<'_>,
        classes: &[(&str, u64)],
        extra_grants: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let dir = TestDir::new(name);
        let etcd = Etcd::start(&dir.path, members).await;
        etcd.init_epoch().await;
        let controller = etcd.publish_policy(&dir.path, classes, extra_grants).await;
        let pki = Pki::new(&dir.path);
        let mut arbiter = Arbiter::spawn_env(&dir.path, "arbiter", &etcd.endpoints(), &pki, configure, DEFAULT_LOG_FILTER, env);
        arbiter.wait_ready(Duration::from_secs(30)).expect("arbiter READY=1");
        Appliance { arbiter, controller, pki, etcd, dir }
    }

    /// A client with the identity `spiffe://holdfast.dev/<path>`.
    pub async fn client(&self, path: &str) -> Client {
        let name = path.replace('/', "-");
        let cert = self.pki.workload(&name, path);
        self.arbiter.client(&self.pki, &cert).await
    }

    /// A Locker for identity `path` over the given arbiters.
    pub fn locker(
        &self,
        path: &str,
        arbiters: &[&Arbiter],
        on_fence: impl Fn(holdfast_client::Fenced) + Send + Sync + 'static,
    ) -> holdfast_client::Locker {
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
pub struct Postgres(pub holdfast_fixtures::postgres::PgCluster);

impl Postgres {
    pub fn start(dir: &Path) -> Self {
        let log = dir.join("postgres.log");
        match holdfast_fixtures::postgres::PgCluster::start(&log) {
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
pub struct S3(pub holdfast_fixtures::s3::S3Server);

impl S3 {
    pub fn start(dir: &Path, buckets: &[&str]) -> Self {
        let log = dir.join("versitygw.log");
        match holdfast_fixtures::s3::S3Server::start(&dir.join("s3"), &log, buckets) {
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
        vec![("AWS_ACCESS_KEY_ID".into(), self.0.access_key_id.clone()), ("AWS_SECRET_ACCESS_KEY".into(), self.0.secret_access_key.clone())]
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_tail("versitygw", &self.0.log);
        }
    }
}

/// Stops `pid` and returns once every one of its threads has stopped.
///
/// `kill` only queues SIGSTOP and wakes one thread to act on it; the other
/// threads run on until that one is scheduled, which on a loaded machine
/// can be long enough for a multi-threaded daemon to answer a request sent
/// after this call. So this waits (up to 10 s) until `/proc/PID/task/*/stat`
/// shows every thread stopped, or the process gone.
pub fn sigstop(pid: u32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGSTOP);
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !all_threads_stopped(pid) {
        assert!(std::time::Instant::now() < end, "process {pid}: a thread still running 10 s after SIGSTOP");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether every thread of `pid` is stopped (state T or t), or the process
/// is gone (no /proc entry, or only dead threads left).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        // "tid (comm) S ...": the state follows the last ')', as comm may hold one.
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return true;
        };
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
        matches!(state, None | Some('T' | 't' | 'Z' | 'X'))
    })
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

/// A copy of the dev class set (`config/classes.d`, `config/grants.d`) in
/// `root/policy`; returns that directory.
pub fn dev_policy(root: &Path) -> PathBuf {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let dir = root.join("policy");
    for sub in ["classes.d", "grants.d"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        for entry in std::fs::read_dir(config.join(sub)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(sub).join(entry.file_name())).unwrap();
        }
    }
    dir
}

/// A finished command: its exit status (-1 if killed by a signal) and
/// output; prints both in assertion messages.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// Runs `cmd` to completion.
    pub fn of(cmd: &mut std::process::Command) -> Self {
        let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// stdout as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("no JSON ({e}):\n{self}"))
    }
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// The body of `GET /metrics` from a daemon's metrics port on loopback.
pub async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    assert!(buf.starts_with("HTTP/1."), "{buf}");
    buf.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample whose series is exactly `series`, if the scrape
/// has it yet (for waits on a series that appears with its first event).
pub fn sample_opt(text: &str, series: &str) -> Option<f64> {
    let (_, v) = text.lines().filter_map(|l| l.rsplit_once(' ')).find(|(s, _)| *s == series)?;
    Some(v.parse().unwrap_or_else(|e| panic!("{series}: {v:?} is not a number: {e}")))
}

/// The value of the sample whose series is exactly `series`. A series that
/// is not in `text` fails the test, naming the series of the same metric
/// that are: a renamed metric or label must not read as zero.
pub fn sample(text: &str, series: &str) -> f64 {
    if let Some(v) = sample_opt(text, series) {
        return v;
    }
    let metric = series.split('{').next().unwrap_or(series);
    let same: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && l.starts_with(metric)).collect();
    panic!("no series {series} in the scrape; series of {metric}: {same:?}");
}

/// holdfastctl's arbiter flags (`--endpoint`, `--ca`, `--cert`, `--key`)
/// from a dev appliance's env file.
pub fn conn_flags(env: &std::collections::HashMap<String, String>) -> Vec<String> {
    ["endpoint", "ca", "cert", "key"].iter().map(|f| format!("--{f}={}", env[&format!("HOLDFAST_{}", f.to_uppercase())])).collect()
}

/// holdfastctl's `--etcd-*` flags for `cfg` (a secure cluster's user).
pub fn etcd_flags(cfg: &EtcdConfig) -> Vec<String> {
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    vec![
        format!("--etcd-endpoint={}", cfg.endpoints.join(",")),
        format!("--etcd-ca={}", path(&cfg.ca_file)),
        format!("--etcd-cert={}", path(&cfg.cert_file)),
        format!("--etcd-key={}", path(&cfg.key_file)),
    ]
}

/// A new ed25519 key pair from the real `ssh-keygen` in `dir`: the private
/// key's path and the public key's line.
pub fn ssh_keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    std::fs::create_dir_all(dir).expect("key dir");
    let key = dir.join(name);
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .output()
        .expect("run ssh-keygen");
    assert!(out.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
    let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key").trim().to_string();
    (key, public)
}

/// The `export K=V` lines of a `holdfastctl dev` env file.
pub fn env_file(path: &Path) -> std::collections::HashMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `holdfastctl dev --detach --dir STATE` on the etcd under test: its banner
/// (stdout) once the appliance is up, and the guard that stops it. Fails
/// the test, with both outputs, when the appliance does not come up.
pub fn dev_detach(state: &Path) -> (String, DevStop) {
    let out = std::process::Command::new(bin("holdfastctl"))
        .args(["dev", "--detach", "--dir"])
        .arg(state)
        .env("HOLDFAST_ETCD_BIN", etcd_binary().etcd)
        .output()
        .expect("run holdfastctl dev --detach");
    let stop = DevStop(state.to_path_buf());
    let banner = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "holdfastctl dev --detach failed:\n{banner}\n{}", String::from_utf8_lossy(&out.stderr));
    (banner, stop)
}

/// Stops a detached `holdfastctl dev` appliance even when an assertion fails.
pub struct DevStop(pub PathBuf);

impl Drop for DevStop {
    fn drop(&mut self) {
        let _ = std::process::Command::new(bin("holdfastctl")).args(["dev", "stop", "--dir"]).arg(&self.0).output();
    }
}

/// A holdfast-tailer for a test: its store in `store`, its metrics on
/// `metrics_port`, a 2 s election TTL and a 500 ms checkpoint interval.
/// Returns once it sent READY=1 (active or standby).
pub fn start_tailer(dir: &Path, name: &str, etcd: EtcdConfig, store: &Path, metrics_port: u16) -> holdfast_devkit::tailer::TailerProcess {
    start_tailer_with(dir, name, etcd, store, metrics_port, &|_| {})
}

/// Three approvers with real ssh-keygen keys (alice: lock-operator; bob:
/// lock- and dr-operator; carol: lock-operator), each with a SPIFFE ID under
/// [`LAB_IDENTITIES`] (`ops/NAME`, which the lab grant lets force-release
/// everything unless a test's extra grants narrow it), and holdfastctl's
/// flags for the force-release role of `etcd`: the two-person
/// force-release, as operators run it.
pub struct ForceOps {
    pub flags: Vec<String>,
    pub keys: Vec<PathBuf>,
}

impl ForceOps {
    pub fn new(dir: &Path, etcd: &Etcd) -> Self {
        let keys_dir = dir.join("keys");
        let (alice, alice_pub) = ssh_keygen(&keys_dir, "alice");
        let (bob, bob_pub) = ssh_keygen(&keys_dir, "bob");
        let (carol, carol_pub) = ssh_keygen(&keys_dir, "carol");
        let approvers = dir.join("approvers.toml");
        let id = |name: &str| format!("{LAB_IDENTITIES}ops/{name}");
        std::fs::write(
            &approvers,
            format!(
                "[approver.alice]\nroles = [\"lock-operator\"]\nkeys = [{alice_pub:?}]\nidentity = {:?}\n\
                 [approver.bob]\nroles = [\"lock-operator\", \"dr-operator\"]\nkeys = [{bob_pub:?}]\nidentity = {:?}\n\
                 [approver.carol]\nroles = [\"lock-operator\"]\nkeys = [{carol_pub:?}]\nidentity = {:?}\n",
                id("alice"),
                id("bob"),
                id("carol")
            ),
        )
        .expect("write approvers.toml");
        let mut flags = etcd_flags(&etcd.config_as(holdfast_store::roles::FORCE_RELEASE.name));
        flags.push(format!("--approvers={}", approvers.display()));
        flags.push(format!("--state-dir={}", dir.join("state").display()));
        ForceOps { flags, keys: vec![alice, bob, carol] }
    }

    pub fn ctl(&self, args: &[&str]) -> Ran {
        Ran::of(std::process::Command::new(bin("holdfastctl")).args(args).args(&self.flags))
    }

    /// `force-release request KEY` by alice; returns the request's path and the output.
    pub fn request(&self, key: &str, extra: &[&str]) -> (String, Ran) {
        let mut args = vec!["force-release", "request", key, "--requester", "alice", "--reason", "a stuck batch job"];
        args.extend_from_slice(extra);
        let out = self.ctl(&args);
        assert_eq!(out.code, 0, "{out}");
        let path = out.stdout.lines().find_map(|l| l.strip_prefix("wrote ")).expect("the request's path").to_string();
        (path, out)
    }

    /// The whole two-person force-release of `key`: alice requests,
    /// alice and bob sign, apply.
    pub fn release(&self, key: &str) {
        let (request, _) = self.request(key, &[]);
        self.sign(&request, &[0, 1]);
        let applied = self.ctl(&["force-release", "apply", &request]);
        assert_eq!(applied.code, 0, "{applied}");
    }

    /// Signs with approvers `who` (indexes into `keys`).
    pub fn sign(&self, request: &str, who: &[usize]) {
        for i in who {
            let out = Ran::of(std::process::Command::new(bin("holdfastctl")).args([
                "approve",
                request,
                "--ssh-key",
                &self.keys[*i].display().to_string(),
            ]));
            assert_eq!(out.code, 0, "{out}");
        }
    }
}

/// [`start_tailer`], with `configure` applied to the config last (sinks,
/// intervals).
pub fn start_tailer_with(
    dir: &Path,
    name: &str,
    etcd: EtcdConfig,
    store: &Path,
    metrics_port: u16,
    configure: &dyn Fn(&mut holdfast_config::TailerConfig),
) -> holdfast_devkit::tailer::TailerProcess {
    let mut config = holdfast_config::TailerConfig::new(etcd);
    config.store_dir = store.to_path_buf();
    config.metrics_listen = ([127, 0, 0, 1], metrics_port).into();
    config.cluster_name = name.into();
    config.checkpoint_interval = Duration::from_millis(500);
    config.election.ttl = Duration::from_secs(2);
    configure(&mut config);
    let launch = holdfast_devkit::tailer::TailerLaunch::new(bin("holdfast-tailer"), config, dir, name);
    let mut tailer = holdfast_devkit::tailer::TailerProcess::spawn(&launch).expect("start holdfast-tailer");
    if let Err(e) = tailer.wait_ready(Duration::from_secs(60)) {
        print_tail(name, &dir.join(format!("{name}.log")));
        panic!("{e:#}");
    }
    tailer
}

/// Waits (up to 60 s) until the audit store in `store` has checkpointed
/// etcd's revision as it is now; returns that revision.
pub async fn tailer_caught_up(etcd: &Etcd, store: &Path) -> i64 {
    let target = etcd.revision().await;
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let at = holdfast_audit::store::read_checkpoint(store).expect("read the checkpoint").map_or(0, |c| c.revision);
        if at >= target {
            return target;
        }
        assert!(std::time::Instant::now() < end, "the tailer's checkpoint is at {at}, etcd at {target}, after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The etcd version `packaging/etcd/go.mod` pins, as `packaging/etcd/build
/// --version` prints it (`v3.6.x`): the one holdfast-etcd ships and the
/// tests run.
pub fn pinned_etcd() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/etcd/build");
    let out = std::process::Command::new(&script).arg("--version").output().unwrap_or_else(|e| panic!("{}: {e}", script.display()));
    assert!(out.status.success(), "{} --version: {}", script.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Asserts that every test of a conformance suite in `expected` reported
/// `passed` in `last` (test name → its last outcome), that the suite ran no
/// test the list does not name, and says which `language` failed.
pub fn assert_conformance(
    language: &str,
    expected: &[&str],
    last: &std::collections::BTreeMap<String, String>,
    passed: &str,
    stderr: &str,
) {
    let wrong: Vec<String> = expected
        .iter()
        .filter(|t| last.get(**t).map(String::as_str) != Some(passed))
        .map(|t| format!("{t}: {}", last.get(*t).map_or("did not run", String::as_str)))
        .collect();
    assert!(wrong.is_empty(), "{language} conformance tests that did not pass: {wrong:?}\nstderr:\n{stderr}");
    let unexpected: Vec<&String> = last.keys().filter(|t| !expected.contains(&t.as_str())).collect();
    assert!(unexpected.is_empty(), "{language} tests not listed in EXPECTED (add them): {unexpected:?}");
}

/// The classes the client conformance suites lock in, added to the dev
/// appliance's class set as a drop-in (`classes.d/conformance.toml`):
/// `conformance` and `re` (two classes with one TTL, so holds of both share
/// a session), `fence` (the SIGSTOP scenarios' keys) and [`HOMED_CLASSES`]
/// (homed to [`HOME_REGION`]); TTL 10 s, fenced (fixture pause-test records).
pub const CONFORMANCE_CLASSES: &[(&str, u64)] = &[("conformance", 10), ("re", 10), ("fence", 10), (HOMED_CLASSES, 10)];

/// What a client's conformance suite (clients/go, clients/python,
/// clients/java) runs against: **the dev appliance itself** (`holdfastctl
/// dev --detach`: its entity and coord etcd clusters with mTLS and
/// authentication, controller, tailers and arbiter), with the classes in
/// [`CONFORMANCE_CLASSES`] and a grant for `spiffe://holdfast.dev/conformance/`
/// dropped into its policy directory (`classes.d/conformance.toml`,
/// `grants.d/conformance.toml`) as an operator adds classes to it, and
/// published by its controller. Beside it: a PostgreSQL with the reference
/// fence's table, an arbiter in another region on the same etcd
/// (`HOLDFAST_CONFORMANCE_ELSEWHERE`: it refuses the `homed` class and
/// allows one request a second per identity) and a sealed one on an etcd
/// whose epoch was never initialised (`HOLDFAST_CONFORMANCE_SEALED`), for
/// the refusals, and a proxy to the dev arbiter that drops everything while
/// a file exists (`HOLDFAST_CONFORMANCE_CUTTABLE`, `HOLDFAST_CONFORMANCE_CUT`),
/// for a release that gets no answer. `env` is what the suites read: two workload identities
/// `conformance/{lang}-a` and `-b`, one certificate without a SPIFFE ID, the
/// dev arbiter's pid for SIGSTOP, the entity etcd's URL and etcd's
/// administrator credentials (`DIR/env-etcd-root`) for
/// clients/conformance/hold-in-etcd, and what the shared scripts need.
pub struct ConformanceLab {
    pub pg: Postgres,
    pub env: Vec<(String, String)>,
    pub elsewhere: Arbiter,
    pub sealed: Arbiter,
    /// The dev appliance's CA (its `tls/`), for more identities.
    pub pki: Pki,
    /// The dev appliance's arbiter.
    pub endpoint: String,
    arbiter_pid: u32,
    _sealed_controller: ControllerProcess,
    _sealed_etcd: Etcd,
    _dev: DevStop,
    pub dir: TestDir,
}

/// A TCP proxy on loopback to `target` that a client suite can cut: while
/// the file `cut` exists nothing passes, either way (a request sent then
/// never reaches the arbiter, and no answer comes back), and a connection
/// that lost bytes that way is closed once the file is gone, so nothing it
/// dropped is ever half-delivered; new connections pass as before. Returns
/// the proxy's `host:port`.
async fn start_cut_proxy(target: String, cut: PathBuf) -> String {
    let addr = format!("127.0.0.1:{}", free_port());
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind the cut proxy");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(relay_unless_cut(client, target.clone(), cut.clone()));
        }
    });
    addr
}

async fn relay_unless_cut(client: tokio::net::TcpStream, target: String, cut: PathBuf) {
    use tokio::io::AsyncReadExt;
    let Ok(server) = tokio::net::TcpStream::connect(&target).await else { return };
    let (mut client_in, mut client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let (mut up, mut down) = (vec![0u8; 16384], vec![0u8; 16384]);
    let mut dropped = false;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            n = client_in.read(&mut up) => if !pass_unless_cut(n, &up, &mut server_out, &cut, &mut dropped).await { return },
            n = server_in.read(&mut down) => if !pass_unless_cut(n, &down, &mut client_out, &cut, &mut dropped).await { return },
            _ = tick.tick() => if dropped && !cut.exists() { return },
        }
    }
}

/// One read of [`relay_unless_cut`]: passed on to `to`, or dropped while
/// cut. False when the connection is to close (end of stream, an error, or
/// the first bytes after a cut).
async fn pass_unless_cut(
    read: std::io::Result<usize>,
    buf: &[u8],
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    cut: &Path,
    dropped: &mut bool,
) -> bool {
    use tokio::io::AsyncWriteExt;
    let n = match read {
        Ok(0) | Err(_) => return false,
        Ok(n) => n,
    };
    if cut.exists() {
        *dropped = true;
        return true;
    }
    !*dropped && to.write_all(&buf[..n]).await.is_ok()
}

/// The pid of `parent`'s child process running the binary `name`.
fn child_running(parent: u32, name: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // pid (comm) state ppid ...: comm may hold spaces, so from the last ')'.
        let ppid: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        let exe = std::fs::read_link(e.path().join("exe")).ok()?;
        (ppid == parent && exe.file_name().is_some_and(|f| f == name)).then_some(pid)
    })
}

impl ConformanceLab {
    pub async fn start(lang: &str) -> Self {
        use holdfast_fence::Fence as _;
        let dir = TestDir::new(&format!("client-{lang}"));
        let state = dir.path.join("dev");
        let (_, dev) = dev_detach(&state);
        let root = env_file(&state.join("env-etcd-root"));
        let operator = env_file(&state.join("env"));
        let var = |env: &std::collections::HashMap<String, String>, k: &str| {
            env.get(k).cloned().unwrap_or_else(|| panic!("holdfastctl dev wrote no {k} in its env files"))
        };
        let endpoint = var(&operator, "HOLDFAST_ENDPOINT");
        let urls = |k: &str| var(&root, k).split(',').map(str::to_string).collect::<Vec<_>>();
        let (entity, coord) = (urls("HOLDFAST_ETCD_ENDPOINT"), urls("HOLDFAST_COORD_ENDPOINT"));
        let etcd_pki = EtcdPki::open_or_create(&state.join("etcd-tls")).expect("the dev appliance's etcd CA");
        let ca = DevCa::open_or_create(&state.join("tls")).expect("the dev appliance's CA");
        let server = ca.server("arbiter-conformance").expect("server cert");
        let pki = Pki { ca, server };

        // The drop-in: pause-test fixture records first (a fenced class
        // without one is published demoted, and a 10 s advisory class is
        // refused), then the files the dev controller rescans.
        let fixtures: Vec<FixtureClass> = CONFORMANCE_CLASSES
            .iter()
            .map(|(ns, ttl)| {
                let class = FixtureClass::new(ns, Duration::from_secs(*ttl));
                if *ns == HOMED_CLASSES { class.homed(HOME_REGION) } else { class }
            })
            .collect();
        let pausetest = etcd_pki.config_as(holdfast_store::roles::PAUSETEST.name, coord.clone()).expect("pausetest credentials");
        holdfast_fixtures::policy::record_pause_tests(&pausetest, &fixtures).await.expect("record the fixture pause tests on coord");
        let identities = format!("spiffe://{DEV_TRUST_DOMAIN}/conformance/");
        holdfast_fixtures::policy::write_files(&state.join("policy"), "conformance", &identities, &fixtures, "")
            .expect("write the conformance drop-in");

        let a = pki.workload(&format!("{lang}-a"), &format!("conformance/{lang}-a"));
        let b = pki.workload(&format!("{lang}-b"), &format!("conformance/{lang}-b"));
        let plain = pki.no_spiffe(&format!("{lang}-plain"));
        // Published once the dev arbiter inspects a conformance key (the
        // controller rescans every 2 s).
        let client = Client::connect(&pki.client_config(&endpoint, &a)).await.expect("connect to the dev arbiter");
        let probe = holdfast_model::LockKey::parse("conformance/probe").expect("key");
        let end = std::time::Instant::now() + Duration::from_secs(60);
        while let Err(e) = client.inspect(&probe).await {
            assert!(std::time::Instant::now() < end, "the dev appliance did not publish the conformance classes in 60 s: {e}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // Beside the dev arbiter: one in another region, on the same etcd
        // clusters with the arbiter's etcd role, that allows one request a
        // second per identity (WRONG_REGION, RESOURCE_EXHAUSTED), and one on
        // an etcd whose epoch was never initialised (SEALED).
        let as_arbiter = |urls: &[String]| EtcdConfig {
            request_timeout: Duration::from_secs(2),
            ..etcd_pki.config_as(holdfast_store::roles::ARBITER.name, urls.to_vec()).expect("arbiter credentials")
        };
        let (entity_cfg, coord_cfg) = (as_arbiter(&entity), as_arbiter(&coord));
        let elsewhere = Arbiter::start_with(&dir.path, "arbiter-hall-b", &entity, &pki, &|c| {
            c.etcd = entity_cfg.clone();
            c.coord = Some(coord_cfg.clone());
            c.cluster_name = "dev".into();
            c.region = Some("hall-b".into());
            c.limits.requests_per_second = 1;
            c.limits.request_burst = 5;
        });
        let sealed_dir = dir.path.join("sealed");
        std::fs::create_dir_all(&sealed_dir).expect("sealed dir");
        let sealed_etcd = Etcd::start(&sealed_dir, 1).await;
        let sealed_controller = sealed_etcd.publish_policy(&sealed_dir, CONFORMANCE_CLASSES, "").await;
        let sealed = Arbiter::start(&sealed_dir, "arbiter-sealed", &sealed_etcd.endpoints(), &pki);
        let pg = Postgres::start(&dir.path);
        let config: tokio_postgres::Config = pg.url().parse().expect("postgres URL");
        holdfast_fence::PgFence::connect(&config, "holdfast_fence", holdfast_fence::FenceMode::Correct)
            .await
            .expect("connect to postgres")
            .setup()
            .await
            .expect("create the fence table");
        let supervisor: u32 = std::fs::read_to_string(state.join("dev.pid")).ok().and_then(|p| p.trim().parse().ok()).expect("DIR/dev.pid");
        let arbiter_pid = child_running(supervisor, "holdfast-arbiter").expect("the dev appliance's arbiter process");
        // The unanswered-release scenario's way to the dev arbiter.
        let cut = dir.path.join("cut");
        let cuttable = start_cut_proxy(endpoint.clone(), cut.clone()).await;
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/conformance");
        let scripts = scripts.canonicalize().expect("clients/conformance");
        let path = |p: &Path| p.display().to_string();
        let env = vec![
            ("HOLDFAST_CONFORMANCE".into(), "1".into()),
            ("HOLDFAST_ENDPOINT".into(), endpoint.clone()),
            ("HOLDFAST_CA".into(), path(&pki.ca.ca_path())),
            ("HOLDFAST_CERT".into(), path(&a.cert)),
            ("HOLDFAST_KEY".into(), path(&a.key)),
            ("HOLDFAST_CONFORMANCE_CERT2".into(), path(&b.cert)),
            ("HOLDFAST_CONFORMANCE_KEY2".into(), path(&b.key)),
            ("HOLDFAST_CONFORMANCE_PLAIN_CERT".into(), path(&plain.cert)),
            ("HOLDFAST_CONFORMANCE_PLAIN_KEY".into(), path(&plain.key)),
            ("HOLDFAST_CONFORMANCE_ARBITER_PID".into(), arbiter_pid.to_string()),
            ("HOLDFAST_CONFORMANCE_ETCD".into(), entity[0].clone()),
            ("HOLDFAST_CONFORMANCE_ETCD_CA".into(), var(&root, "HOLDFAST_ETCD_CA")),
            ("HOLDFAST_CONFORMANCE_ETCD_CERT".into(), var(&root, "HOLDFAST_ETCD_CERT")),
            ("HOLDFAST_CONFORMANCE_ETCD_KEY".into(), var(&root, "HOLDFAST_ETCD_KEY")),
            ("HOLDFAST_CONFORMANCE_TTL".into(), "10".into()),
            ("HOLDFAST_CONFORMANCE_IDENTITY".into(), format!("conformance/{lang}-a")),
            ("HOLDFAST_CONFORMANCE_SCRIPTS".into(), path(&scripts)),
            ("HOLDFAST_CONFORMANCE_PG_URL".into(), pg.url()),
            ("HOLDFAST_CONFORMANCE_HOLDFASTCTL".into(), path(&bin("holdfastctl"))),
            ("HOLDFAST_CONFORMANCE_ELSEWHERE".into(), elsewhere.endpoint()),
            ("HOLDFAST_CONFORMANCE_SEALED".into(), sealed.endpoint()),
            ("HOLDFAST_CONFORMANCE_CUTTABLE".into(), cuttable),
            ("HOLDFAST_CONFORMANCE_CUT".into(), path(&cut)),
        ];
        ConformanceLab {
            pg,
            env,
            elsewhere,
            sealed,
            pki,
            endpoint,
            arbiter_pid,
            _sealed_controller: sealed_controller,
            _sealed_etcd: sealed_etcd,
            _dev: dev,
            dir,
        }
    }

    /// The arbiter's pid (the suites SIGSTOP it; resume it with [`sigcont`]
    /// whatever they did).
    pub fn arbiter_pid(&self) -> u32 {
        self.arbiter_pid
    }
}
