//! The system under test: three etcd members and two arbiters, each in its
//! own network namespace. Arbiter 0 talks to every member directly; arbiter 1
//! goes through the gate's TCP proxies (delay and stall faults) and runs
//! under libfaketime (clock faults).

use super::net::{Host, Net};
use super::proxy::{self, Controls};
use anyhow::Context;
use holdfast_devkit::etcd::{ClusterSpec, EtcdBinary, EtcdProcess, MemberSpec};
use holdfast_devkit::notify::NotifySocket;
use holdfast_devkit::pki::{DevCa, Issued};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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
    pub config: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
    /// libfaketime's control file, when the arbiter runs under it.
    pub clock_file: Option<PathBuf>,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub bin: EtcdBinary,
    pub spec: ClusterSpec,
    pub members: Vec<Option<EtcdProcess>>,
    pub arbiters: Vec<ArbiterProc>,
    pub proxies: Vec<Arc<Controls>>,
    pub ca: DevCa,
    pub client_cert: Issued,
    arbiter_bin: PathBuf,
}

impl Cluster {
    /// Starts the members in `net.hosts[0..3]` and the arbiters in
    /// `net.hosts[3..5]`, initialises the epoch and waits for READY=1.
    pub async fn start(dir: &Path, net: &Net, bin: EtcdBinary, extra_config: &str, say: &dyn Fn(&str)) -> anyhow::Result<Self> {
        let ca = DevCa::open_or_create(&dir.join("tls"))?;
        let client_cert = ca.workload("gate-client", "gate/client")?;
        let spec = ClusterSpec {
            members: (0..3)
                .map(|i| MemberSpec {
                    name: format!("e{i}"),
                    host: net.hosts[i].ip.clone(),
                    data_dir: dir.join(format!("etcd-e{i}")),
                    client_port: 2379,
                    peer_port: 2380,
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
            proxies: Vec::new(),
            ca,
            client_cert,
            arbiter_bin: crate::dev::locate_arbiter()?,
        };
        for i in 0..3 {
            let p = cluster.spawn_member(i, net)?;
            cluster.members.push(Some(p));
        }
        let urls = cluster.spec.client_urls();
        holdfast_devkit::etcd::wait_ready(&urls, Duration::from_secs(60)).await.context("the gate's etcd cluster did not start; see etcd-e*.log")?;
        let etcd = cluster.holdfast_etcd().await?;
        holdfast_arbiter::epoch::init(&etcd, |m| say(m)).await.context("initialising the epoch")?;

        // Proxies for arbiter 1: gateway:23790+i -> member i.
        let mut proxied = Vec::new();
        for (i, m) in cluster.spec.members.iter().enumerate() {
            let controls = Arc::new(Controls::default());
            let listen = format!("{}:{}", net.gateway, 23790 + i);
            proxy::start(&listen, format!("{}:{}", m.host, m.client_port), controls.clone()).await?;
            cluster.proxies.push(controls);
            proxied.push(format!("http://{listen}"));
        }
        for (a, endpoints) in [(0usize, urls), (1, proxied)] {
            let host = net.hosts[3 + a].clone();
            let server = cluster.ca.issue(&format!("arbiter{a}"), &[&host.ip], &[&format!("spiffe://holdfast.dev/holdfast/arbiter{a}")])?;
            let config = dir.join(format!("arbiter{a}.toml"));
            let eps = endpoints.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>().join(", ");
            std::fs::write(
                &config,
                format!(
                    "listen = \"{ip}:{ARBITER_PORT}\"\nmetrics_listen = \"{ip}:9100\"\ncluster_name = \"gate\"\ndrain_timeout = \"2s\"\n[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n[etcd]\nendpoints = [{eps}]\nrequest_timeout = \"2s\"\n[seal]\ncheck_interval = \"500ms\"\nwatermark_interval = \"2s\"\n{extra_config}",
                    server.cert.display().to_string(),
                    server.key.display().to_string(),
                    cluster.ca.ca_path().display().to_string(),
                    ip = host.ip,
                ),
            )?;
            let clock_file = (a == 1).then(|| dir.join("arbiter1.faketime"));
            if let Some(f) = &clock_file {
                super::faults::write_clock_spec(f, 0, ARBITER1_CLOCK_RATE)?;
            }
            cluster.arbiters.push(ArbiterProc { host, config, log: dir.join(format!("arbiter{a}.log")), child: None, clock_file });
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

    pub fn member_pid(&self, i: usize) -> Option<u32> {
        self.members[i].as_ref().and_then(EtcdProcess::pid)
    }

    pub fn kill_member(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.kill();
        }
    }

    /// Starts arbiter `a` and waits for READY=1.
    pub fn start_arbiter(&mut self, a: usize, net: &Net) -> anyhow::Result<()> {
        let arb = &self.arbiters[a];
        let notify_path = self.dir.join(format!("arbiter{a}.notify"));
        let _ = std::fs::remove_file(&notify_path);
        let mut notify = NotifySocket::bind(&notify_path)?;
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&arb.log)?;
        let mut cmd = Command::new("ip");
        cmd.args(&net.wrapper(&arb.host)[1..])
            .arg(&self.arbiter_bin)
            .arg("--config")
            .arg(&arb.config)
            .env("NOTIFY_SOCKET", notify.path())
            .env("HOLDFAST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        if let Some(f) = &arb.clock_file {
            cmd.env("LD_PRELOAD", LIBFAKETIME).env("FAKETIME_TIMESTAMP_FILE", f).env("FAKETIME_CACHE_DURATION", "1");
        }
        let mut child = cmd.spawn().context("starting holdfast-arbiter in its namespace")?;
        notify
            .wait_ready(Duration::from_secs(60), || matches!(child.try_wait(), Ok(None)))
            .with_context(|| format!("arbiter {a} did not become ready; see {}", self.arbiters[a].log.display()))?;
        self.arbiters[a].child = Some(child);
        Ok(())
    }

    pub fn arbiter_pid(&self, a: usize) -> Option<u32> {
        self.arbiters[a].child.as_ref().map(Child::id)
    }

    pub fn kill_arbiter(&mut self, a: usize) {
        if let Some(mut c) = self.arbiters[a].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn arbiter_endpoints(&self) -> Vec<String> {
        self.arbiters.iter().map(|a| format!("{}:{ARBITER_PORT}", a.host.ip)).collect()
    }

    /// The member every reachable member names as leader, if they agree.
    pub async fn leader(&self) -> Option<usize> {
        leader_of(&self.spec.client_urls()).await
    }

    /// Each member's raft applied index, if it answers.
    pub async fn applied(&self) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for url in self.spec.client_urls() {
            out.push(status(&url).await.map(|s| s.raft_applied_index()));
        }
        out
    }

    /// The arbiter's etcd handle over every member (for the epoch
    /// procedures).
    pub async fn holdfast_etcd(&self) -> anyhow::Result<holdfast_arbiter::etcd::Etcd> {
        Ok(holdfast_arbiter::etcd::Etcd::connect(&holdfast_arbiter::config::EtcdConfig {
            endpoints: self.spec.client_urls(),
            request_timeout: Duration::from_secs(5),
            ca_file: None,
            cert_file: None,
            key_file: None,
        })
        .await?)
    }

    /// An etcd client over every member (from the host namespace).
    pub async fn etcd(&self) -> anyhow::Result<etcd_client::Client> {
        Ok(etcd_client::Client::connect(self.spec.client_urls(), None).await?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.arbiters {
            if let Some(mut c) = a.child.take() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGCONT);
                holdfast_devkit::etcd::terminate(&mut c, Duration::from_secs(5));
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
pub async fn epoch_of(etcd: &holdfast_arbiter::etcd::Etcd) -> anyhow::Result<u32> {
    let sys = holdfast_arbiter::epoch::read_sys(etcd).await?;
    Ok(sys.epoch.context("the epoch is not initialised")?.0.epoch)
}

async fn status(url: &str) -> Option<etcd_client::StatusResponse> {
    let opts = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_millis(300)).with_timeout(Duration::from_millis(300));
    let status = async {
        let mut c = etcd_client::Client::connect([url], Some(opts)).await.ok()?;
        c.status().await.ok()
    };
    tokio::time::timeout(Duration::from_millis(700), status).await.ok().flatten()
}

/// The member that every member reachable at `urls` names as leader, if
/// they agree (a majority at least must answer).
pub async fn leader_of(urls: &[String]) -> Option<usize> {
    let mut ids = Vec::new();
    let mut leaders = Vec::new();
    for url in urls {
        match status(url).await {
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
