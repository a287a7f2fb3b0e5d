//! The system under test: three etcd members and two arbiters, each in its
//! own network namespace. Arbiter 0 talks to every member directly; arbiter 1
//! goes through the gate's TCP proxies (delay and stall faults) and runs
//! under libfaketime (clock faults).

use super::net::{Host, Net};
use super::proxy::{self, Controls};
use anyhow::Context;
use holdfast_config::EtcdConfig;
use holdfast_config::arbiter::ArbiterConfig;
use holdfast_devkit::arbiter::{ArbiterProcess, Launch};
use holdfast_devkit::etcd::{ClusterSpec, EtcdBinary, EtcdProcess, MemberSpec};
use holdfast_devkit::pki::{DevCa, EtcdPki, Issued};
use holdfast_store::etcd::Etcd;
use holdfast_store::roles;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub const ARBITER_PORT: u16 = 7443;
/// Arbiter 1's clock runs slow by this factor (libfaketime), from its start.
pub const ARBITER1_CLOCK_RATE: f64 = 0.9;
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// etcd's election timeout in the gate (heartbeat 50 ms).
pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(500);

pub struct ArbiterProc {
    pub host: Host,
    pub launch: Launch,
    pub process: Option<ArbiterProcess>,
    /// libfaketime's control file, when the arbiter runs under it.
    pub clock_file: Option<PathBuf>,
}

/// What the gate changes in every arbiter's config: group commit, and (test
/// builds) one deliberate bug.
#[derive(Debug, Clone, Default)]
pub struct ArbiterOptions {
    pub group_commit: bool,
    pub mutation: Option<String>,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub bin: EtcdBinary,
    pub spec: ClusterSpec,
    pub members: Vec<Option<EtcdProcess>>,
    pub arbiters: Vec<ArbiterProc>,
    /// Byte ranges of arbiter logs (arbiter, from, to) written while a
    /// restore was expected to seal them: seals there are not false.
    pub expected_seals: Vec<(usize, u64, u64)>,
    /// Snapshots taken and restores done so far (they name files and dirs).
    snapshots: u32,
    restores: u32,
    pub proxies: Vec<Arc<Controls>>,
    /// Client 0 reaches arbiter a through `client_proxies[a]`
    /// (gateway:24790+a), for the `client-link` fault.
    pub client_proxies: Vec<Arc<Controls>>,
    client_proxied: Vec<String>,
    pub ca: DevCa,
    pub client_cert: Issued,
    /// etcd's own CA: the members run client and peer TLS with
    /// `--client-cert-auth` and authentication on, each tool with its role.
    pub etcd_pki: EtcdPki,
    /// Two dr-operators: every epoch advance is a request they both sign.
    pub approvals: crate::approvals::Approvals,
    /// The controller that published the `gate` class (host namespace,
    /// outside every fault).
    pub controller: Option<holdfast_devkit::controller::ControllerProcess>,
    /// The coord cluster: one member on the gateway's address in the host
    /// namespace (outside every network fault), plain HTTP; epochs are
    /// allocated, approval nonces recorded and the class set published
    /// there, and the arbiters grant the `gatecoord` class's keys on it
    /// under its own epoch. The restore fault restores it too.
    pub coord: ClusterSpec,
    coord_process: Option<EtcdProcess>,
}

/// The namespace of the entity-tier keys the gate's clients lock.
pub const GATE_NAMESPACE: &str = "gate";
/// The namespace of the coord-tier keys (its class has `tier = "coord"`).
pub const COORD_NAMESPACE: &str = "gatecoord";
/// The namespace of the `quorum-loss` fault's keys: an efficiency class
/// that fails open (`on_quorum_loss = "open"`, advisory, TTL
/// [`OPEN_CLASS_TTL`]); the clients never lock it.
pub const OPEN_NAMESPACE: &str = "gateopen";
pub const OPEN_CLASS_TTL: Duration = Duration::from_secs(30);
/// The arbiters' `fail_open.after`.
pub const FAIL_OPEN_AFTER: Duration = Duration::from_secs(2);
/// The arbiters' names for the two clusters (`cluster_name`,
/// `coord_cluster_name`).
pub const ENTITY_CLUSTER: &str = "gate";
pub const COORD_CLUSTER: &str = "gate-coord";

impl Cluster {
    /// Starts the members in `net.hosts[0..3]` and the arbiters in
    /// `net.hosts[3..5]`, initialises the epoch and waits for READY=1.
    pub async fn start(dir: &Path, net: &Net, bin: EtcdBinary, options: &ArbiterOptions, say: &dyn Fn(&str)) -> anyhow::Result<Self> {
        let arbiter_bin = holdfast_devkit::arbiter::locate()?;
        let ca = DevCa::open_or_create(&dir.join("tls"))?;
        let client_cert = ca.workload("gate-client", "gate/client")?;
        // One member certificate for every member's address and the gateway
        // (arbiter 1 reaches the members through proxies there).
        let etcd_pki = EtcdPki::open_or_create(&dir.join("etcd-tls"))?;
        let mut names: Vec<&str> = net.hosts[0..3].iter().map(|h| h.ip.as_str()).collect();
        names.push(&net.gateway);
        let member_tls = etcd_pki.member_tls(&names)?;
        let spec = ClusterSpec {
            members: (0..3)
                .map(|i| MemberSpec {
                    name: format!("e{i}"),
                    host: net.hosts[i].ip.clone(),
                    data_dir: dir.join(format!("etcd-e{i}")),
                    client_port: 2379,
                    peer_port: 2380,
                    advertised_peer_port: None,
                    tls: Some(member_tls.clone()),
                    metrics_port: None,
                })
                .collect(),
            token: format!("holdfast-gate-{}", std::process::id()),
        };
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            bin,
            spec,
            members: Vec::new(),
            arbiters: Vec::new(),
            expected_seals: Vec::new(),
            snapshots: 0,
            restores: 0,
            proxies: Vec::new(),
            client_proxies: Vec::new(),
            client_proxied: Vec::new(),
            ca,
            client_cert,
            etcd_pki,
            approvals: crate::approvals::Approvals::create(dir)?,
            controller: None,
            coord: ClusterSpec {
                members: vec![MemberSpec {
                    name: "coord".into(),
                    host: net.gateway.clone(),
                    data_dir: dir.join("coord-etcd"),
                    client_port: holdfast_devkit::ports::free_port(),
                    peer_port: holdfast_devkit::ports::free_port(),
                    advertised_peer_port: None,
                    // TLS as the entity members (the member certificate
                    // names the gateway): plain http:// off loopback is
                    // refused by every holdfast etcd client.
                    tls: Some(member_tls.clone()),
                    metrics_port: None,
                }],
                token: format!("holdfast-gate-coord-{}", std::process::id()),
            },
            coord_process: None,
        };
        cluster.start_coord().await?;
        for i in 0..3 {
            let p = cluster.spawn_member(i, net)?;
            cluster.members.push(Some(p));
        }
        let urls = cluster.spec.client_urls();
        holdfast_devkit::etcd::wait_ready_with(&cluster.etcd_config(roles::ROOT)?, Duration::from_secs(60))
            .await
            .context("the gate's etcd cluster did not start; see etcd-e*.log")?;
        let changes = roles::ensure(&mut cluster.etcd().await?, true).await.context("creating the etcd roles")?;
        say(&format!("etcd over mTLS, authentication on: {} roles ({} change(s))", roles::ROLES.len(), changes.len()));
        // The coord cluster's own epoch first (1, for the coord tier's
        // grants), then the entity cluster's, allocated there (2). In this
        // order an advance by one from the entity cluster's restored record
        // (`advance_from_restored_record`) asks for an epoch the restored
        // allocator has not seen, one only the arbiters remember serving.
        let coord = cluster.coord_etcd().await?;
        holdfast_store::epoch::init(&coord, |m| say(m)).await.context("initialising the coord cluster's epoch")?;
        let etcd = cluster.holdfast_etcd().await?;
        holdfast_store::epoch::init_via(&etcd, Some(&coord), |m| say(m))
            .await
            .context("initialising the epoch (allocated on the coord cluster)")?;
        // Policy on: the `gate` class (entity tier) and the `gatecoord`
        // class (coord tier), both with the clients' TTL, and a grant for
        // the gate's identities, published on coord by a real controller.
        let classes = [
            holdfast_fixtures::policy::FixtureClass::new(GATE_NAMESPACE, crate::CLIENT_TTL),
            holdfast_fixtures::policy::FixtureClass::new(COORD_NAMESPACE, crate::CLIENT_TTL).on_coord(),
            holdfast_fixtures::policy::FixtureClass::new(OPEN_NAMESPACE, OPEN_CLASS_TTL).open(),
        ];
        let (controller, _) = holdfast_fixtures::policy::publish(
            holdfast_devkit::controller::locate()?,
            dir,
            cluster.coord_config()?,
            &cluster.coord_config()?,
            "spiffe://holdfast.dev/gate/",
            &classes,
            "",
        )
        .await
        .context("publishing the gate's class set; see controller.log")?;
        cluster.controller = Some(controller);
        say(&format!(
            "class set published on coord: classes {GATE_NAMESPACE} (entity tier) and {COORD_NAMESPACE} (coord tier), TTL {}s, fenced; \
             {OPEN_NAMESPACE} (entity tier, TTL {}s, advisory, on_quorum_loss = \"open\", for the quorum-loss fault)",
            crate::CLIENT_TTL.as_secs(),
            OPEN_CLASS_TTL.as_secs()
        ));

        // Proxies for arbiter 1: gateway:23790+i -> member i.
        let mut proxied = Vec::new();
        for (i, m) in cluster.spec.members.iter().enumerate() {
            let controls = Arc::new(Controls::default());
            let listen = format!("{}:{}", net.gateway, 23790 + i);
            proxy::start(&listen, format!("{}:{}", m.host, m.client_port), controls.clone()).await?;
            cluster.proxies.push(controls);
            proxied.push(format!("https://{listen}"));
        }
        for (a, endpoints) in [(0usize, urls), (1, proxied)] {
            let host = net.hosts[3 + a].clone();
            // The gateway's address too: client 0 reaches the arbiter
            // through a proxy there.
            let server = cluster.ca.issue(
                &format!("arbiter{a}"),
                &[&host.ip, &net.gateway],
                &[&format!("spiffe://holdfast.dev/holdfast/arbiter{a}")],
            )?;
            let mut config =
                ArbiterConfig::new(cluster.ca.arbiter_tls(&server), EtcdConfig { endpoints, ..cluster.etcd_config(roles::ARBITER.name)? });
            let ip: std::net::IpAddr = host.ip.parse().with_context(|| format!("arbiter address {}", host.ip))?;
            config.listen = (ip, ARBITER_PORT).into();
            config.metrics_listen = (ip, 9100).into();
            config.cluster_name = ENTITY_CLUSTER.into();
            config.coord = Some(cluster.coord_config()?);
            config.coord_cluster_name = Some(COORD_CLUSTER.into());
            config.state_dir = dir.join(format!("arbiter{a}-state"));
            config.drain_timeout = Duration::from_secs(2);
            config.seal.check_interval = Duration::from_millis(500);
            config.seal.watermark_interval = Duration::from_secs(2);
            config.fail_open.after = FAIL_OPEN_AFTER;
            config.grants.group_commit = options.group_commit;
            // Every gate client is one identity; the gate checks grants
            // under faults, not the rate limit.
            config.limits.requests_per_second = 50_000;
            config.limits.request_burst = 100_000;
            if let Some(m) = options.mutation.as_ref().filter(|m| !crate::GATE_MUTATIONS.contains(&m.as_str())) {
                config.mutation.set(m).map_err(|e| anyhow::anyhow!("--mutation: {e}"))?;
            }
            let mut launch = Launch::new(arbiter_bin.clone(), config, dir, &format!("arbiter{a}"));
            launch.written_by = "Written by holdfast-gate".into();
            launch.wrapper = net.wrapper(&host);
            launch.env.push(("HOLDFAST_LOG".into(), "info".into()));
            let clock_file = (a == 1).then(|| dir.join("arbiter1.faketime"));
            if let Some(f) = &clock_file {
                super::faults::write_clock_spec(f, 0, ARBITER1_CLOCK_RATE)?;
                launch.env.extend([
                    ("LD_PRELOAD".into(), LIBFAKETIME.into()),
                    ("FAKETIME_TIMESTAMP_FILE".into(), f.display().to_string()),
                    ("FAKETIME_CACHE_DURATION".into(), "1".into()),
                ]);
            }
            cluster.arbiters.push(ArbiterProc { host, launch, process: None, clock_file });
        }
        // Proxies for client 0: gateway:24790+a -> arbiter a.
        for a in 0..cluster.arbiters.len() {
            let controls = Arc::new(Controls::default());
            let listen = format!("{}:{}", net.gateway, 24790 + a);
            proxy::start(&listen, format!("{}:{ARBITER_PORT}", cluster.arbiters[a].host.ip), controls.clone()).await?;
            cluster.client_proxies.push(controls);
            cluster.client_proxied.push(listen);
        }
        for a in 0..cluster.arbiters.len() {
            cluster.start_arbiter(a, net)?;
        }
        Ok(cluster)
    }

    fn spawn_member(&self, i: usize, net: &Net) -> anyhow::Result<EtcdProcess> {
        EtcdProcess::start_wrapped(&self.bin, &self.spec, i, &self.dir.join(format!("etcd-e{i}.log")), &net.wrapper(&net.hosts[i]))
    }

    pub fn restart_member(&mut self, i: usize, net: &Net) -> anyhow::Result<()> {
        let p = self.spawn_member(i, net)?;
        self.members[i] = Some(p);
        Ok(())
    }

    /// Saves a snapshot of member `i` (etcdctl, from the host namespace)
    /// into the run's directory; returns the file and etcd's revision just
    /// before it (at most the snapshot's).
    pub async fn snapshot(&mut self, i: usize) -> anyhow::Result<(PathBuf, i64)> {
        let url = self.spec.members[i].client_url();
        let root = EtcdConfig { endpoints: vec![url], ..self.etcd_config(roles::ROOT)? };
        let revision = Etcd::connect(&root).await?.client.get("/", None).await?.header().map(|h| h.revision());
        let file = self.dir.join(format!("snapshot-{}.db", self.snapshots));
        self.snapshots += 1;
        holdfast_devkit::etcd::snapshot_save(&self.bin, &root, &file)?;
        Ok((file, revision.context("no revision in etcd's answer")?))
    }

    async fn start_coord(&mut self) -> anyhow::Result<()> {
        let log = self.dir.join("coord-etcd.log");
        self.coord_process = Some(EtcdProcess::start(&self.bin, &self.coord, 0, &log)?);
        holdfast_devkit::etcd::wait_ready_with(&self.coord_config()?, Duration::from_secs(60))
            .await
            .context("the gate's coord etcd did not start; see coord-etcd.log")
    }

    /// The coord cluster's client config (mTLS on the gateway's address,
    /// authentication off: any certificate of the gate's etcd CA), with the
    /// gate's 2 s request timeout.
    pub fn coord_config(&self) -> anyhow::Result<EtcdConfig> {
        let c = self.etcd_pki.config_as(roles::ROOT, self.coord.client_urls())?;
        Ok(EtcdConfig { request_timeout: Duration::from_secs(2), ..c })
    }

    /// The coord cluster.
    pub async fn coord_etcd(&self) -> anyhow::Result<Etcd> {
        Etcd::connect(&self.coord_config()?).await
    }

    /// Saves a snapshot of the coord cluster into the run's directory;
    /// returns the file and the coord revision just before it.
    pub async fn snapshot_coord(&mut self) -> anyhow::Result<(PathBuf, i64)> {
        let revision = self.coord_etcd().await?.client.get("/", None).await?.header().map(|h| h.revision());
        let file = self.dir.join(format!("coord-snapshot-{}.db", self.snapshots));
        holdfast_devkit::etcd::snapshot_save(&self.bin, &self.coord_config()?, &file)?;
        Ok((file, revision.context("no revision in the coord cluster's answer")?))
    }

    /// Stops the coord member, restores `snapshot` into a fresh data
    /// directory with the same token and peer URL, and starts it again.
    pub async fn restore_coord(&mut self, snapshot: &Path) -> anyhow::Result<()> {
        if let Some(mut p) = self.coord_process.take() {
            p.stop(Duration::from_secs(10));
        }
        self.coord.members[0].data_dir = self.dir.join(format!("coord-etcd-restored{}", self.restores));
        holdfast_devkit::etcd::snapshot_restore(&self.bin, snapshot, &self.coord, 0).context("restoring the coord cluster")?;
        self.start_coord().await
    }

    /// Stops every member, restores `snapshot` into fresh data directories
    /// with the same cluster token and peer URLs (so the cluster and member
    /// IDs stay the same: only the log offset shows the rewind), and starts
    /// the restored members in their namespaces.
    pub async fn restore(&mut self, snapshot: &Path, net: &Net) -> anyhow::Result<()> {
        for i in 0..self.members.len() {
            self.kill_member(i);
        }
        let n = self.restores;
        self.restores += 1;
        for (i, m) in self.spec.members.iter_mut().enumerate() {
            m.data_dir = self.dir.join(format!("etcd-e{i}-restored{n}"));
        }
        for i in 0..self.spec.members.len() {
            holdfast_devkit::etcd::snapshot_restore(&self.bin, snapshot, &self.spec, i).with_context(|| format!("restoring member {i}"))?;
        }
        for i in 0..self.spec.members.len() {
            self.restart_member(i, net)?;
        }
        holdfast_devkit::etcd::wait_ready_with(&self.etcd_config(roles::ROOT)?, Duration::from_secs(60))
            .await
            .context("the restored cluster did not start")
    }

    /// Whether every arbiter has logged that it serves `epoch` on the
    /// entity cluster.
    pub fn all_serve(&self, epoch: u32) -> bool {
        let serving = format!("cluster={ENTITY_CLUSTER} state=serving epoch {epoch}");
        self.arbiters.iter().all(|a| std::fs::read_to_string(&a.launch.log).is_ok_and(|t| t.contains(serving.as_str())))
    }

    /// Whether every arbiter answers ServerStatus sealed on both clusters.
    pub async fn all_sealed(&self) -> bool {
        for a in 0..self.arbiters.len() {
            let Some(s) = self.arbiter_status(a).await else { return false };
            if !s.sealed || s.clusters.len() != 2 || !s.clusters.iter().all(|c| c.sealed) {
                return false;
            }
        }
        true
    }

    /// Arbiter `a`'s ServerStatus, if it answers within 2 s.
    pub async fn arbiter_status(&self, a: usize) -> Option<holdfast_proto::v1::ServerStatusResponse> {
        let status = async { self.arbiter_client(a).await.ok()?.server_status().await.ok() };
        tokio::time::timeout(Duration::from_secs(2), status).await.ok().flatten()
    }

    /// Whether every arbiter answers ServerStatus serving epoch `entity` on
    /// the entity cluster and `coord` on the coord cluster (now, not at some
    /// time in its log: an epoch minted again after a restore was served
    /// before).
    pub async fn all_serving_now(&self, entity: u32, coord: u32) -> bool {
        for a in 0..self.arbiters.len() {
            let Some(s) = self.arbiter_status(a).await else { return false };
            let serves = |name: &str, epoch: u32| s.clusters.iter().any(|c| c.name == name && c.serving && c.epoch == epoch);
            if !(serves(ENTITY_CLUSTER, entity) && serves(COORD_CLUSTER, coord)) {
                return false;
            }
        }
        true
    }

    /// The highest epoch any arbiter reports having served (what
    /// `holdfastctl epoch advance-request` asks them); every arbiter must
    /// answer.
    pub async fn served_high(&self) -> anyhow::Result<u32> {
        let mut high = 0;
        for a in 0..self.arbiters.len() {
            let s = self.arbiter_status(a).await.with_context(|| format!("arbiter {a} did not answer ServerStatus"))?;
            high = s.served.iter().map(|e| e.epoch).fold(high, u32::max);
        }
        Ok(high)
    }

    pub fn member_pid(&self, i: usize) -> Option<u32> {
        self.members[i].as_ref().and_then(EtcdProcess::pid)
    }

    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.kill();
        }
    }

    /// Starts arbiter `a` and waits for READY=1.
    pub fn start_arbiter(&mut self, a: usize, _net: &Net) -> anyhow::Result<()> {
        let process = ArbiterProcess::start(&self.arbiters[a].launch, Duration::from_secs(60)).with_context(|| format!("arbiter {a}"))?;
        self.arbiters[a].process = Some(process);
        Ok(())
    }

    /// Arbiter `a`'s fail-open spool.
    pub fn arbiter_spool(&self, a: usize) -> PathBuf {
        self.arbiters[a].launch.config.state_dir.join("unprotected.spool")
    }

    /// A lock.v1 client of arbiter `a` with the gate's own certificate.
    pub async fn arbiter_client(&self, a: usize) -> anyhow::Result<holdfast_client::Client> {
        let config = holdfast_client::ClientConfig {
            endpoint: self.arbiter_endpoints()[a].clone(),
            ca: self.ca.ca_path(),
            cert: self.client_cert.cert.clone(),
            key: self.client_cert.key.clone(),
        };
        Ok(holdfast_client::Client::connect(&config).await?)
    }

    pub fn arbiter_pid(&self, a: usize) -> Option<u32> {
        self.arbiters[a].process.as_ref().and_then(ArbiterProcess::pid)
    }

    pub fn kill_arbiter(&mut self, a: usize) {
        if let Some(mut p) = self.arbiters[a].process.take() {
            p.kill();
        }
    }

    pub fn arbiter_endpoints(&self) -> Vec<String> {
        self.arbiters.iter().map(|a| format!("{}:{ARBITER_PORT}", a.host.ip)).collect()
    }

    /// The arbiters as client `process` reaches them: client 0 through the
    /// gate's proxies, the others directly.
    pub fn arbiter_endpoints_for(&self, process: u64) -> Vec<String> {
        if process == 0 { self.client_proxied.clone() } else { self.arbiter_endpoints() }
    }

    /// The member every reachable member names as leader, if they agree.
    pub async fn leader(&self) -> Option<usize> {
        leader_of(&self.etcd_config(roles::OBSERVER.name).ok()?).await
    }

    /// Each member's raft applied index, if it answers.
    pub async fn applied(&self) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        let Ok(observer) = self.etcd_config(roles::OBSERVER.name) else { return vec![None; self.spec.members.len()] };
        for url in self.spec.client_urls() {
            out.push(status(&url, &observer).await.map(|s| s.raft_applied_index()));
        }
        out
    }

    /// Every member, as the etcd user `user` (a certificate with that CN
    /// from the gate's etcd CA), with the gate's 2 s request timeout.
    pub fn etcd_config(&self, user: &str) -> anyhow::Result<EtcdConfig> {
        let c = self.etcd_pki.config_as(user, self.spec.client_urls())?;
        Ok(EtcdConfig { request_timeout: Duration::from_secs(2), ..c })
    }

    /// The epoch administrator's etcd handle over every member (epoch
    /// init, advance, and reading the epoch), as the DR procedure has it.
    pub async fn holdfast_etcd(&self) -> anyhow::Result<Etcd> {
        Etcd::connect(&self.etcd_config(roles::EPOCH.name)?).await
    }

    /// etcd's administrator over every member (from the host namespace):
    /// the recorder reads the whole log with it.
    pub async fn etcd(&self) -> anyhow::Result<etcd_client::Client> {
        Ok(Etcd::connect(&self.etcd_config(roles::ROOT)?).await?.client)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.arbiters {
            if let Some(mut p) = a.process.take() {
                if let Some(pid) = p.pid() {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGCONT);
                }
                p.stop(Duration::from_secs(5));
            }
        }
        for m in self.members.iter_mut().flatten() {
            if let Some(pid) = m.pid() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGCONT);
            }
            m.stop(Duration::from_secs(5));
        }
    }
}

/// The epoch in `/sys/epoch` now.
pub async fn epoch_of(etcd: &Etcd) -> anyhow::Result<u32> {
    let sys = holdfast_store::epoch::read_sys(etcd).await?;
    Ok(sys.epoch.context("the epoch is not initialised")?.0.epoch)
}

/// One member's Status, with `creds`'s certificate and a short deadline.
async fn status(url: &str, creds: &EtcdConfig) -> Option<etcd_client::StatusResponse> {
    let quick = EtcdConfig { request_timeout: Duration::from_millis(300), ..creds.clone() };
    let one = EtcdConfig { endpoints: vec![url.to_string()], ..quick };
    let status = async {
        let mut c = holdfast_store::etcd::connect_client(&one).await.ok()?;
        c.status().await.ok()
    };
    tokio::time::timeout(Duration::from_millis(700), status).await.ok().flatten()
}

/// The member that every member reachable at `creds.endpoints` names as
/// leader, if they agree (a majority at least must answer).
pub async fn leader_of(creds: &EtcdConfig) -> Option<usize> {
    let urls = &creds.endpoints;
    let mut ids = Vec::new();
    let mut leaders = Vec::new();
    for url in urls {
        match status(url, creds).await {
            Some(s) => {
                ids.push(s.header().map(|h| h.member_id()).unwrap_or(0));
                leaders.push(s.leader());
            }
            None => ids.push(0),
        }
    }
    if leaders.len() * 2 <= urls.len() {
        return None;
    }
    let first = *leaders.first()?;
    if first == 0 || leaders.iter().any(|l| *l != first) {
        return None;
    }
    ids.iter().position(|id| *id == first)
}
