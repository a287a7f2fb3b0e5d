//! Running real etcd members on loopback: finding the binary, the flags for
//! each version (lease checkpointing on), starting, stopping, restoring.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An etcd server binary and its companions.
#[derive(Debug, Clone)]
pub struct EtcdBinary {
    pub etcd: PathBuf,
    pub etcdctl: Option<PathBuf>,
    pub etcdutl: Option<PathBuf>,
    /// (major, minor, patch)
    pub version: (u32, u32, u32),
}

impl EtcdBinary {
    /// `HOLDFAST_ETCD_BIN`, else `etcd` on PATH, else Debian's /usr/bin/etcd.
    pub fn locate() -> anyhow::Result<Self> {
        let etcd = match std::env::var_os("HOLDFAST_ETCD_BIN") {
            Some(p) => PathBuf::from(p),
            None => which("etcd")
                .or_else(|| Some(PathBuf::from("/usr/bin/etcd")).filter(|p| p.exists()))
                .context("no etcd binary found: run scripts/install-deps, or set HOLDFAST_ETCD_BIN to an etcd server binary")?,
        };
        Self::at(&etcd)
    }

    pub fn at(etcd: &Path) -> anyhow::Result<Self> {
        let out = Command::new(etcd).arg("--version").output().with_context(|| format!("running {} --version", etcd.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text
            .lines()
            .find_map(|l| l.strip_prefix("etcd Version: "))
            .and_then(parse_version)
            .with_context(|| format!("{} --version printed no version: {text}", etcd.display()))?;
        let dir = etcd.parent().unwrap_or(Path::new("/"));
        let sibling = |name: &str| Some(dir.join(name)).filter(|p| p.exists()).or_else(|| which(name));
        Ok(EtcdBinary { etcd: etcd.to_path_buf(), etcdctl: sibling("etcdctl"), etcdutl: sibling("etcdutl"), version })
    }

    pub fn version_string(&self) -> String {
        let (a, b, c) = self.version;
        format!("{a}.{b}.{c}")
    }

    /// Flags that turn lease checkpointing (with persistence) on for this
    /// version, so a leader change or restart does not restart every lease's
    /// full TTL. 3.6 moved the experimental flags to feature gates; 3.4 needs
    /// the zap logger or it crashes validating these flags. Neither version
    /// lets the checkpoint interval (fixed at 5 minutes) be set.
    pub fn checkpoint_flags(&self) -> Vec<String> {
        match self.version {
            (3, minor, _) if minor >= 6 => vec!["--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true".into()],
            (3, 5, _) => {
                vec!["--experimental-enable-lease-checkpoint=true".into(), "--experimental-enable-lease-checkpoint-persist=true".into()]
            }
            _ => vec![
                "--logger=zap".into(),
                "--experimental-enable-lease-checkpoint=true".into(),
                "--experimental-enable-lease-checkpoint-persist=true".into(),
            ],
        }
    }
}

fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.trim().split(['.', '-', '+']).map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

/// One member's identity and ports.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub name: String,
    /// The address it listens on (127.0.0.1, or its network namespace's).
    pub host: String,
    pub data_dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
    /// The peer port the member advertises to its peers when it is not the
    /// one it listens on (a test's proxy in between, to cut peer links on
    /// loopback); `None`: `peer_port`.
    pub advertised_peer_port: Option<u16>,
    /// Client and peer TLS with certificate authentication; `None`: plain
    /// http (tests that are not about transport security).
    pub tls: Option<MemberTls>,
    /// A plain-HTTP `/metrics` listener on the member's host
    /// (`--listen-metrics-urls`), for scrapers without a client
    /// certificate (the benchmark). `None`: metrics only on the client URL.
    pub metrics_port: Option<u16>,
}

/// A member's TLS files: one certificate serves clients and peers, and both
/// must present a certificate from `ca` (`--client-cert-auth`,
/// `--peer-client-cert-auth`); a peer's must also carry the member CN
/// ([`crate::pki::MEMBER_CN`], `--peer-cert-allowed-cn`): the tools' client
/// certificates come from the same CA and must not reach the peer port.
#[derive(Debug, Clone)]
pub struct MemberTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl MemberSpec {
    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
    pub fn client_url(&self) -> String {
        format!("{}://{}:{}", self.scheme(), self.host, self.client_port)
    }
    pub fn peer_url(&self) -> String {
        format!("{}://{}:{}", self.scheme(), self.host, self.peer_port)
    }
    /// The peer URL the member advertises ([`MemberSpec::advertised_peer_port`]).
    pub fn advertised_peer_url(&self) -> String {
        format!("{}://{}:{}", self.scheme(), self.host, self.advertised_peer_port.unwrap_or(self.peer_port))
    }
}

/// A cluster's shape: members and the token used to create it.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub members: Vec<MemberSpec>,
    pub token: String,
}

impl ClusterSpec {
    pub fn initial_cluster(&self) -> String {
        self.members.iter().map(|m| format!("{}={}", m.name, m.advertised_peer_url())).collect::<Vec<_>>().join(",")
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(MemberSpec::client_url).collect()
    }

    /// The command line of member `i`.
    pub fn args(&self, bin: &EtcdBinary, i: usize) -> Vec<String> {
        let m = &self.members[i];
        let mut args = vec![
            format!("--name={}", m.name),
            format!("--data-dir={}", m.data_dir.display()),
            format!("--listen-client-urls={}", m.client_url()),
            format!("--advertise-client-urls={}", m.client_url()),
            format!("--listen-peer-urls={}", m.peer_url()),
            format!("--initial-advertise-peer-urls={}", m.advertised_peer_url()),
            format!("--initial-cluster={}", self.initial_cluster()),
            format!("--initial-cluster-token={}", self.token),
            "--initial-cluster-state=new".into(),
            "--heartbeat-interval=50".into(),
            "--election-timeout=500".into(),
            "--snapshot-count=10000".into(),
            "--log-level=warn".into(),
        ];
        args.extend(bin.checkpoint_flags());
        if let Some(port) = m.metrics_port {
            args.push(format!("--listen-metrics-urls=http://{}:{port}", m.host));
        }
        if let Some(tls) = &m.tls {
            let (cert, key, ca) = (tls.cert.display(), tls.key.display(), tls.ca.display());
            args.extend([
                format!("--cert-file={cert}"),
                format!("--key-file={key}"),
                format!("--trusted-ca-file={ca}"),
                "--client-cert-auth".into(),
                format!("--peer-cert-file={cert}"),
                format!("--peer-key-file={key}"),
                format!("--peer-trusted-ca-file={ca}"),
                "--peer-client-cert-auth".into(),
                format!("--peer-cert-allowed-cn={}", crate::pki::MEMBER_CN),
            ]);
        }
        args
    }
}

/// A running etcd member. Dropping it kills the process.
pub struct EtcdProcess {
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl EtcdProcess {
    pub fn start(bin: &EtcdBinary, cluster: &ClusterSpec, i: usize, log: &Path) -> anyhow::Result<Self> {
        Self::start_wrapped(bin, cluster, i, log, &[])
    }

    /// Starts member `i` under `wrapper` (e.g. `ip netns exec NS`), which
    /// must exec etcd in place so that the child's pid is etcd's.
    pub fn start_wrapped(bin: &EtcdBinary, cluster: &ClusterSpec, i: usize, log: &Path, wrapper: &[String]) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&cluster.members[i].data_dir)?;
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let etcd = bin.etcd.display().to_string();
        let (program, prefix) = match wrapper.split_first() {
            Some((p, rest)) => (p.as_str(), rest.iter().map(String::as_str).chain([etcd.as_str()]).collect::<Vec<_>>()),
            None => (etcd.as_str(), Vec::new()),
        };
        let child = Command::new(program)
            .args(prefix)
            .args(cluster.args(bin, i))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.etcd.display()))?;
        Ok(EtcdProcess { child: Some(child), log: log.to_path_buf() })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, grace);
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

pub use crate::process::terminate;
use crate::process::which;

/// Waits until every member answers Status and a leader is known.
pub async fn wait_ready(endpoints: &[String], timeout: Duration) -> anyhow::Result<()> {
    wait_ready_with(&holdfast_config::EtcdConfig::plain(endpoints.to_vec()), timeout).await
}

/// [`wait_ready`] with the credentials of `config` (any etcd user may ask
/// for Status).
pub async fn wait_ready_with(config: &holdfast_config::EtcdConfig, timeout: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + timeout;
    let mut last = String::new();
    let config = holdfast_config::EtcdConfig { request_timeout: Duration::from_secs(1), ..config.clone() };
    while Instant::now() < end {
        let mut ok = 0;
        for e in &config.endpoints {
            let one = holdfast_config::EtcdConfig { endpoints: vec![e.clone()], ..config.clone() };
            match holdfast_store::etcd::connect_client(&one).await {
                Ok(mut c) => match c.status().await {
                    Ok(s) if s.leader() != 0 => ok += 1,
                    Ok(_) => last = format!("{e}: no leader yet"),
                    Err(err) => last = format!("{e}: {err}"),
                },
                Err(err) => last = format!("{e}: {err}"),
            }
        }
        if ok == config.endpoints.len() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("etcd not ready within {timeout:?}: {last}")
}

/// Saves a snapshot from the first member of `etcd.endpoints`, with its
/// TLS files (etcd's root: with authentication on, only root may).
pub fn snapshot_save(bin: &EtcdBinary, etcd: &holdfast_config::EtcdConfig, file: &Path) -> anyhow::Result<()> {
    let etcdctl = bin.etcdctl.as_ref().context("etcdctl not found next to etcd or on PATH")?;
    let endpoint = etcd.endpoints.first().context("no etcd endpoint to snapshot")?;
    let mut cmd = Command::new(etcdctl);
    cmd.env("ETCDCTL_API", "3").arg(format!("--endpoints={endpoint}"));
    for (flag, file) in [("--cacert", &etcd.ca_file), ("--cert", &etcd.cert_file), ("--key", &etcd.key_file)] {
        if let Some(f) = file {
            cmd.arg(format!("{flag}={}", f.display()));
        }
    }
    run(cmd.args(["snapshot", "save"]).arg(file))
}

/// Restores a snapshot into member `i`'s (new, absent) data dir, with the
/// cluster's token and peer URLs: `etcdutl` where it exists (3.5+), else
/// `etcdctl snapshot restore` (3.4).
pub fn snapshot_restore(bin: &EtcdBinary, file: &Path, cluster: &ClusterSpec, i: usize) -> anyhow::Result<()> {
    let m = &cluster.members[i];
    let tool = match (&bin.etcdutl, &bin.etcdctl) {
        (Some(u), _) if bin.version.1 >= 5 => u.clone(),
        (_, Some(c)) => c.clone(),
        _ => bail!("neither etcdutl nor etcdctl found for snapshot restore"),
    };
    run(Command::new(tool)
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "restore"])
        .arg(file)
        .arg(format!("--name={}", m.name))
        .arg(format!("--data-dir={}", m.data_dir.display()))
        .arg(format!("--initial-cluster={}", cluster.initial_cluster()))
        .arg(format!("--initial-cluster-token={}", cluster.token))
        .arg(format!("--initial-advertise-peer-urls={}", m.advertised_peer_url())))
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
