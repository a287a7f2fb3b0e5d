//! `holdfastctl dev`: a whole appliance on loopback, like `vault server -dev`.
//!
//! Two single-member etcd clusters (the coord tier, where epochs are
//! allocated and approval nonces recorded, and the entity tier, where locks
//! live), the arbiter, the controller and the audit tailer (the real binaries,
//! started the way systemd starts them: each must send READY=1 on
//! NOTIFY_SOCKET), a throwaway CA with server and client certificates, the
//! epoch initialised, and the dev class set published. Nothing listens beyond
//! 127.0.0.1.

use anyhow::{Context, bail};
use holdfast_cli::exit;
use holdfast_config::arbiter::ArbiterConfig;
use holdfast_config::{ControllerConfig, TailerConfig};
use holdfast_devkit::arbiter::{self, ArbiterProcess, Launch, tail};
use holdfast_devkit::controller::{self, ControllerLaunch, ControllerProcess};
use holdfast_devkit::tailer::{self, TailerLaunch, TailerProcess};

/// The dev class set (`config/` in the source tree), written to DIR/policy.
const DEV_CLASSES: &str = include_str!("../../../config/classes.d/dev.toml");
const DEV_GRANTS: &str = include_str!("../../../config/grants.d/dev.toml");
use holdfast_devkit::etcd::{ClusterSpec, EtcdBinary, EtcdProcess, MemberSpec};
use holdfast_devkit::pki::{DevCa, EtcdPki};
use holdfast_devkit::ports::free_port;
use holdfast_store::etcd::Etcd;
use holdfast_store::roles;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(after_long_help = "\
Examples:
  holdfastctl dev                          # foreground; Ctrl-C stops everything
  holdfastctl dev --detach --dir /tmp/hf   # background; writes /tmp/hf/env
  source /tmp/hf/env && holdfastctl lock exec demo/job -- echo hello
  holdfastctl dev stop --dir /tmp/hf

Files in DIR: env (export lines for spiffe://holdfast.dev/dev/operator, and
etcd's read-only observer credentials), env-second (the same for a second
identity, dev/second), env-etcd-root (etcd's administrator: for `holdfastctl
etcd roles`; `holdfast-bench --dev-dir DIR` makes its own etcd user with it), tls/ (CA, certificates), etcd-tls/ (etcd's
own CA and a client certificate per etcd user), etcd/ (the entity cluster's data), coord-etcd/
(the coord cluster's), policy/ (the dev class set: classes.d/,
grants.d/; edit it and the controller publishes each valid change),
arbiter.toml, controller.toml, tailer.toml, audit/ (the tailer's store), tailer-coord.toml and
audit-coord/ (the coord cluster's tailer and its store: coord-tier classes' holds), etcd.log,
coord-etcd.log, arbiter.log, controller.log, tailer.log, tailer-coord.log, dev.log
(detached supervisor).")]
pub struct DevArgs {
    #[command(subcommand)]
    action: Option<DevAction>,
    /// Keep state in DIR (certificates, etcd data, logs) and reuse it on the
    /// next start. Without it, a temporary directory is used and removed on exit.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Return once the appliance is ready and leave it running in the
    /// background; stop it with `holdfastctl dev stop --dir DIR`.
    #[arg(long)]
    detach: bool,
    /// Start the arbiter with group commit on (`[grants] group_commit`).
    #[arg(long)]
    group_commit: bool,
}

#[derive(clap::Subcommand)]
enum DevAction {
    /// Stop a detached appliance.
    Stop {
        /// The --dir the appliance was started with.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Restore one of the running appliance's etcd clusters from a
    /// snapshot, as an operator restores a cluster (same cluster token and
    /// peer URL): for the DR drill. After a restore the arbiter seals that
    /// cluster's tier (entity: most classes; coord: coord-tier classes);
    /// the two-person epoch advance of that cluster lifts it. A coord
    /// restore also rolls the epoch allocator and the approval nonces back,
    /// and the arbiters' own record of the epochs they served still keeps
    /// every new epoch above the ones used.
    ///
    /// Take the snapshot with etcd's root credentials (DIR/env-etcd-root;
    /// the coord cluster: $HOLDFAST_COORD_ENDPOINT):
    ///   etcdctl --endpoints $HOLDFAST_ETCD_ENDPOINT --cacert $HOLDFAST_ETCD_CA \
    ///     --cert $HOLDFAST_ETCD_CERT --key $HOLDFAST_ETCD_KEY snapshot save FILE
    Restore {
        /// The --dir the appliance was started with.
        #[arg(long)]
        dir: PathBuf,
        /// The snapshot file (`etcdctl snapshot save`).
        #[arg(long)]
        snapshot: PathBuf,
        /// Which cluster to restore: `entity` (the locks of entity-tier
        /// classes) or `coord` (coord-tier classes' locks, the epoch
        /// allocator, approval nonces, the class set).
        #[arg(long, value_parser = ["entity", "coord"], default_value = "entity")]
        cluster: String,
    },
}

const DETACHED_ENV: &str = "HOLDFAST_DEV_SUPERVISOR";

pub async fn run(args: DevArgs) -> u8 {
    let result = match args.action {
        Some(DevAction::Stop { dir }) => stop(&dir),
        Some(DevAction::Restore { dir, snapshot, cluster }) => restore(&dir, &snapshot, &cluster),
        None if args.detach && std::env::var_os(DETACHED_ENV).is_none() => detach(args.dir, args.group_commit),
        None => supervise(args.dir, std::env::var_os(DETACHED_ENV).is_some(), args.group_commit).await,
    };
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("holdfastctl dev: {e:#}");
            exit::SOFTWARE
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

fn read_pid(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("dev.pid")).ok()?.trim().parse().ok()
}

fn stop(dir: &Path) -> anyhow::Result<()> {
    let pid =
        read_pid(dir).with_context(|| format!("no {}/dev.pid: is an appliance running with --dir {}?", dir.display(), dir.display()))?;
    if !pid_alive(pid) {
        let _ = std::fs::remove_file(dir.join("dev.pid"));
        println!("not running (stale pid file removed)");
        return Ok(());
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)?;
    let end = Instant::now() + Duration::from_secs(40);
    while pid_alive(pid) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    if pid_alive(pid) {
        bail!("the appliance (pid {pid}) did not stop within 40s; see {}/dev.log", dir.display());
    }
    println!("stopped");
    Ok(())
}

/// One of the appliance's etcd clusters: the entity tier (`etcd`, the locks)
/// or the coord tier (`coord-etcd`, the epoch allocator and approval nonces).
struct Tier {
    /// `entity` or `coord`, as `dev restore --cluster` names it.
    name: &'static str,
    /// Its data directory's name in DIR (also of its log and token files).
    base: &'static str,
    cluster: ClusterSpec,
    process: Option<EtcdProcess>,
}

impl Tier {
    fn log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.log", self.base))
    }
}

/// `dev restore`: the cluster's etcd is stopped, the snapshot named in
/// DIR/restore.request is restored into a fresh data directory with the
/// cluster's own token and peer URL (so etcd keeps its cluster and member
/// IDs: only the rewound log shows), and etcd starts again; the daemons run
/// on. The old data directory is kept as `<base>.before-restore-<unix time>`.
async fn restore_in_place(dir: &Path, bin: &EtcdBinary, tier: &mut Tier, root: &holdfast_config::EtcdConfig) -> anyhow::Result<String> {
    let request = std::fs::read_to_string(dir.join("restore.request")).context("DIR/restore.request")?;
    let snapshot = PathBuf::from(request.lines().next().unwrap_or_default().trim());
    if !snapshot.is_file() {
        bail!("{} is not a snapshot file", snapshot.display());
    }
    let data = dir.join(tier.base);
    let restoring = dir.join(format!("{}.restoring", tier.base));
    let _ = std::fs::remove_dir_all(&restoring);
    tier.cluster.members[0].data_dir = restoring.clone();
    let restored = holdfast_devkit::etcd::snapshot_restore(bin, &snapshot, &tier.cluster, 0);
    tier.cluster.members[0].data_dir = data.clone();
    restored.context("etcdutl snapshot restore")?;
    if let Some(mut e) = tier.process.take() {
        e.stop(Duration::from_secs(10));
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let kept = dir.join(format!("{}.before-restore-{now}", tier.base));
    std::fs::rename(&data, &kept).with_context(|| format!("moving {} aside", data.display()))?;
    std::fs::rename(&restoring, &data).with_context(|| format!("moving the restored data to {}", data.display()))?;
    // The restored member must keep its peer URL (it is in the restored
    // membership) and its client port (the daemons know it): a port taken
    // while etcd was down is waited for, not changed (10 starts, 1 s apart).
    for attempt in 1.. {
        let log = tier.log(dir);
        match start_etcd(bin, tier, &log, root).await {
            Ok(()) => break,
            Err(StartFailure { port_taken: true, .. }) if attempt < 10 => {
                eprintln!(
                    "holdfastctl dev: the restored {} etcd could not bind its ports ({}); starting it again in 1 s",
                    tier.name,
                    holders(&tier.cluster)
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(StartFailure { error, .. }) => return Err(error.context(format!("the restored {} etcd did not start", tier.name))),
        }
    }
    let next = match tier.name {
        "coord" => {
            "the arbiter seals the coord tier (coord-tier classes) until the coord cluster's epoch is advanced with two approvals (docs/runbook-dr.md); \
             the epoch allocator and the approval nonces went back with it, and the arbiters' record of the epochs they served keeps every later advance above them"
        }
        _ => "the arbiter seals itself: advance the epoch with two approvals (docs/runbook-dr.md)",
    };
    Ok(format!(
        "{} etcd restored from {} with the same cluster token and peer URL (the old data is in {}); {next}",
        tier.name,
        snapshot.display(),
        kept.display()
    ))
}

/// Asks a running appliance to restore its `cluster` etcd from `snapshot`
/// and waits.
fn restore(dir: &Path, snapshot: &Path, cluster: &str) -> anyhow::Result<()> {
    let pid = read_pid(dir).filter(|p| pid_alive(*p)).with_context(|| format!("no appliance is running in {}", dir.display()))?;
    let snapshot = snapshot.canonicalize().with_context(|| format!("{}", snapshot.display()))?;
    let result = dir.join("restore.result");
    let _ = std::fs::remove_file(&result);
    std::fs::write(dir.join("restore.request"), format!("{}\n{cluster}\n", snapshot.display()))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGUSR1)?;
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        // The supervisor ends its answer with a newline (and renames it into
        // place whole): anything else is not an answer yet.
        if let Ok(text) = std::fs::read_to_string(&result)
            && text.ends_with('\n')
        {
            let text = text.trim();
            if let Some(ok) = text.strip_prefix("ok: ") {
                println!("{ok}");
                return Ok(());
            }
            bail!("{}", text.strip_prefix("error: ").unwrap_or(text));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("no answer within 120s; see {}/dev.log", dir.display())
}

/// Starts the supervisor in the background and waits until it is ready.
fn detach(dir: Option<PathBuf>, group_commit: bool) -> anyhow::Result<()> {
    let dir = match dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("holdfast-dev-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    if let Some(pid) = read_pid(&dir).filter(|p| pid_alive(*p)) {
        bail!(
            "an appliance is already running in {} (pid {pid}); stop it with `holdfastctl dev stop --dir {}`",
            dir.display(),
            dir.display()
        );
    }
    let _ = std::fs::remove_file(dir.join("ready"));
    let log = std::fs::File::create(dir.join("dev.log"))?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["dev", "--dir"])
        .arg(&dir)
        .args(group_commit.then_some("--group-commit"))
        .env(DETACHED_ENV, "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()?;
    let end = Instant::now() + Duration::from_secs(180);
    loop {
        if dir.join("ready").exists() {
            print!("{}", std::fs::read_to_string(dir.join("banner.txt")).unwrap_or_default());
            println!("\nRunning in the background (pid {}). Stop it with:\n  holdfastctl dev stop --dir {}", child.id(), dir.display());
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the appliance exited ({status}) before it was ready:\n{}", tail(&dir.join("dev.log"), 30));
        }
        if Instant::now() > end {
            bail!("the appliance was not ready within 180s; see {}/dev.log", dir.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Children {
    tailer: Option<TailerProcess>,
    /// The tailer recording the coord cluster (the holds of coord-tier classes).
    coord_tailer: Option<TailerProcess>,
    controller: Option<ControllerProcess>,
    arbiter: Option<ArbiterProcess>,
    /// The entity cluster, then the coord cluster.
    tiers: Vec<Tier>,
}

impl Drop for Children {
    fn drop(&mut self) {
        for mut t in [self.tailer.take(), self.coord_tailer.take()].into_iter().flatten() {
            t.stop(Duration::from_secs(10));
        }
        if let Some(mut c) = self.controller.take() {
            c.stop(Duration::from_secs(10));
        }
        if let Some(mut a) = self.arbiter.take() {
            a.stop(Duration::from_secs(15));
        }
        for tier in &mut self.tiers {
            if let Some(mut e) = tier.process.take() {
                e.stop(Duration::from_secs(10));
            }
        }
    }
}

struct DirGuard {
    dir: PathBuf,
    remove: bool,
}

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join("dev.pid"));
        let _ = std::fs::remove_file(self.dir.join("ready"));
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

async fn supervise(dir: Option<PathBuf>, detached: bool, group_commit: bool) -> anyhow::Result<()> {
    let keep = dir.is_some();
    let dir = match dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("holdfast-dev-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    if let Some(pid) = read_pid(&dir).filter(|p| pid_alive(*p) && *p != std::process::id() as i32) {
        bail!(
            "an appliance is already running in {} (pid {pid}); stop it with `holdfastctl dev stop --dir {}`",
            dir.display(),
            dir.display()
        );
    }
    std::fs::write(dir.join("dev.pid"), std::process::id().to_string())?;
    let _dir_guard = DirGuard { dir: dir.clone(), remove: !keep };
    let say = |m: &str| eprintln!("holdfastctl dev: {m}");

    // Certificates.
    let ca = DevCa::open_or_create(&dir.join("tls"))?;
    let server = ca.server("arbiter")?;
    let client = ca.workload("client", "dev/operator")?;
    // A second identity, for the tour's second shell: the same identity
    // under another session is a leaked hold (exit 76), not contention.
    let second = ca.workload("second", "dev/second")?;

    // Ports: reuse the last ones when the directory is kept.
    let ports_file = dir.join("ports");
    let saved: Vec<u16> =
        std::fs::read_to_string(&ports_file).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect();
    const PORTS: usize = 11;
    let ports: Vec<u16> = match saved.len() {
        PORTS if saved.iter().all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()) => saved.clone(),
        _ => (0..PORTS).map(|_| free_port()).collect(),
    };
    std::fs::write(&ports_file, ports.iter().map(u16::to_string).collect::<Vec<_>>().join(" "))?;
    // Entity etcd client, peer; arbiter, its metrics; the controller's
    // metrics; entity etcd metrics; the tailer's metrics; coord etcd
    // client, peer, metrics; the coord tailer's metrics.
    let (arbiter_port, metrics_port, controller_metrics_port, etcd_metrics_port, tailer_metrics_port) =
        (ports[2], ports[3], ports[4], ports[5], ports[6]);
    let coord_tailer_metrics_port = ports[10];
    // A kept port checked free above can be taken while etcd starts (by any
    // process drawing free ports: the test suite does, in parallel): each
    // daemon's port is checked again just before the daemon starts, and
    // replaced if taken (the env files and the banner are written after).
    let still_free = |port: u16, what: &str| {
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
        let fresh = free_port();
        say(&format!("{what} port {port} was taken while etcd started; using {fresh}"));
        fresh
    };

    // etcd's own CA: client and peer TLS, a client certificate per etcd
    // user (its CN), authentication on with one role per tool.
    let etcd_pki = EtcdPki::open_or_create(&dir.join("etcd-tls"))?;

    // The two etcd clusters: entity (the locks) and coord (the epoch
    // allocator and approval nonces).
    let bin = EtcdBinary::locate()?;
    say(&format!("starting etcd {} ({}): an entity cluster and a coord cluster", bin.version_string(), bin.etcd.display()));
    let mut children = Children { tailer: None, coord_tailer: None, controller: None, arbiter: None, tiers: Vec::new() };
    let root_of = |tier: &Tier| etcd_pki.config_as(roles::ROOT, tier.cluster.client_urls());
    for (name, base, at) in [("entity", "etcd", [0, 1, 5]), ("coord", "coord-etcd", [7, 8, 9])] {
        let mut tier =
            Tier { name, base, cluster: tier_spec(&dir, base, &etcd_pki, [ports[at[0]], ports[at[1]], ports[at[2]]])?, process: None };
        // Ports are probed free, but another process may bind one before
        // etcd does: then etcd exits at once, and other ports are tried (3
        // starts).
        for attempt in 1.. {
            let root = root_of(&tier)?;
            match start_etcd(&bin, &mut tier, &dir.join(format!("{base}.log")), &root).await {
                Ok(()) => break,
                Err(StartFailure { port_taken: true, .. }) if attempt < 3 => {
                    say(&format!("the {name} etcd could not bind its ports ({}); trying others", holders(&tier.cluster)));
                    let m = &mut tier.cluster.members[0];
                    (m.client_port, m.peer_port, m.metrics_port) = (free_port(), free_port(), Some(free_port()));
                }
                Err(StartFailure { error, .. }) => return Err(error.context(format!("the {name} etcd did not start"))),
            }
        }
        let changes = roles::ensure(&mut Etcd::connect(&root_of(&tier)?).await?.client, true)
            .await
            .with_context(|| format!("creating the etcd roles on the {name} cluster (holdfastctl etcd roles)"))?;
        say(&format!("{name} etcd: {} holdfast roles, {} change(s), authentication on", roles::ROLES.len(), changes.len()));
        children.tiers.push(tier);
    }
    let (entity, coord) = (&children.tiers[0].cluster, &children.tiers[1].cluster);
    let (entity_urls, coord_urls) = (entity.client_urls(), coord.client_urls());
    let etcd_metrics_port = entity.members[0].metrics_port.unwrap_or(etcd_metrics_port);
    let as_user = |user: &str| etcd_pki.config_as(user, entity_urls.clone());

    // Epoch: allocated from the coord cluster.
    let etcd = Etcd::connect(&as_user(roles::EPOCH.name)?).await?;
    let coord_etcd = Etcd::connect(&etcd_pki.config_as(roles::EPOCH.name, coord_urls.clone())?).await?;
    match holdfast_store::epoch::init_via(&etcd, Some(&coord_etcd), |m| say(m)).await {
        Ok(r) => say(&format!("initialised epoch {} (allocated on the coord cluster)", r.epoch)),
        Err(holdfast_store::epoch::EpochError::AlreadyInitialised(n)) => say(&format!("epoch {n} already initialised")),
        Err(e) => return Err(e).context("initialising the epoch"),
    }
    // The coord cluster's own epoch (the keys of coord-tier classes, such as
    // the dev set's `jobs`, live there), from the same allocator.
    match holdfast_store::epoch::init_via(&coord_etcd, None, |m| say(&format!("coord: {m}"))).await {
        Ok(r) => say(&format!("initialised the coord cluster's epoch {} (coord-tier classes)", r.epoch)),
        Err(holdfast_store::epoch::EpochError::AlreadyInitialised(n)) => say(&format!("coord epoch {n} already initialised")),
        Err(e) => return Err(e).context("initialising the coord cluster's epoch"),
    }

    // The dev class set, published by a controller before the arbiter
    // starts (an arbiter reads the published set before READY, so the first
    // lock after the banner never meets NO_POLICY). Written only if absent:
    // edits survive a restart, and the controller republishes on change.
    let policy = dir.join("policy");
    for (sub, text) in [("classes.d", DEV_CLASSES), ("grants.d", DEV_GRANTS)] {
        let file = policy.join(sub).join("dev.toml");
        if !policy.join(sub).exists() {
            std::fs::create_dir_all(policy.join(sub))?;
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        }
    }
    // The controller publishes on the coord cluster (and campaigns there).
    let mut cconfig = ControllerConfig::new(etcd_pki.config_as(roles::CONTROLLER.name, coord_urls.clone())?);
    cconfig.policy_dir = policy.clone();
    let controller_metrics_port = still_free(controller_metrics_port, "the controller's metrics");
    cconfig.metrics_listen = ([127, 0, 0, 1], controller_metrics_port).into();
    cconfig.cluster_name = "dev".into();
    let claunch = ControllerLaunch::new(controller::locate()?, cconfig, &dir, "controller");
    say(&format!("starting the controller ({}), publishing {}", claunch.bin.display(), policy.display()));
    let mut c = ControllerProcess::spawn(&claunch)?;
    c.wait_ready(Duration::from_secs(60))?;
    children.controller = Some(c);

    // After a restore of a cluster its tailer's store is ahead of etcd's
    // revision, and the tailer refuses to record into it (the revisions
    // will be reused): as docs/runbook-dr.md says, the store is kept aside
    // and a new one started.
    for (store, at, name) in [("audit", &etcd, "entity"), ("audit-coord", &coord_etcd, "coord")] {
        let audit = dir.join(store);
        if let Ok(Some(checkpoint)) = holdfast_audit::store::read_checkpoint(&audit) {
            let revision = at
                .client
                .clone()
                .status()
                .await
                .with_context(|| format!("asking the {name} etcd for its revision"))?
                .header()
                .map(|h| h.revision());
            if revision.is_some_and(|r| checkpoint.revision > r) {
                let kept = dir.join(format!(
                    "{store}.before-restore-{}",
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
                ));
                std::fs::rename(&audit, &kept).with_context(|| format!("moving {} aside", audit.display()))?;
                say(&format!(
                    "the {name} audit store recorded up to revision {}, past the restored etcd's {}: kept it as {} (the audit trail up to the restore); the tailer starts a new one",
                    checkpoint.revision,
                    revision.unwrap_or_default(),
                    kept.display()
                ));
            }
        }
    }

    // The audit tailer, recording the entity cluster into DIR/audit from its
    // first revision; it campaigns on the coord cluster.
    let mut tconfig = TailerConfig::new(as_user(roles::TAILER.name)?);
    tconfig.coord = Some(etcd_pki.config_as(roles::TAILER.name, coord_urls.clone())?);
    tconfig.store_dir = dir.join("audit");
    let tailer_metrics_port = still_free(tailer_metrics_port, "the tailer's metrics");
    tconfig.metrics_listen = ([127, 0, 0, 1], tailer_metrics_port).into();
    tconfig.cluster_name = "dev".into();
    let tlaunch = TailerLaunch::new(tailer::locate()?, tconfig, &dir, "tailer");
    say(&format!("starting the audit tailer ({}), recording into {}", tlaunch.bin.display(), dir.join("audit").display()));
    let mut t = TailerProcess::spawn(&tlaunch)?;
    t.wait_ready(Duration::from_secs(60))?;
    children.tailer = Some(t);
    // A second tailer records the coord cluster (the holds of coord-tier
    // classes) into DIR/audit-coord, campaigning there in an election of
    // its own.
    let mut tconfig = TailerConfig::new(etcd_pki.config_as(roles::TAILER.name, coord_urls.clone())?);
    tconfig.election.name = format!("{}-coord", holdfast_model::layout::TAILER_ELECTION);
    tconfig.store_dir = dir.join("audit-coord");
    let coord_tailer_metrics_port = still_free(coord_tailer_metrics_port, "the coord tailer's metrics");
    tconfig.metrics_listen = ([127, 0, 0, 1], coord_tailer_metrics_port).into();
    tconfig.cluster_name = "coord".into();
    let tlaunch = TailerLaunch::new(tailer::locate()?, tconfig, &dir, "tailer-coord");
    say(&format!("starting the coord cluster's audit tailer, recording into {}", dir.join("audit-coord").display()));
    let mut t = TailerProcess::spawn(&tlaunch)?;
    t.wait_ready(Duration::from_secs(60))?;
    children.coord_tailer = Some(t);

    // Arbiter.
    let mut config = ArbiterConfig::new(ca.arbiter_tls(&server), as_user(roles::ARBITER.name)?);
    // The class set is read from the coord cluster, where the keys of
    // coord-tier classes live too.
    config.coord = Some(etcd_pki.config_as(roles::ARBITER.name, coord_urls.clone())?);
    let (arbiter_port, metrics_port) = (still_free(arbiter_port, "the arbiter's"), still_free(metrics_port, "the arbiter's metrics"));
    let (m, c) = (&children.tiers[0].cluster.members[0], &children.tiers[1].cluster.members[0]);
    let ports = [
        m.client_port,
        m.peer_port,
        arbiter_port,
        metrics_port,
        controller_metrics_port,
        etcd_metrics_port,
        tailer_metrics_port,
        c.client_port,
        c.peer_port,
        c.metrics_port.unwrap_or_default(),
        coord_tailer_metrics_port,
    ];
    std::fs::write(&ports_file, ports.iter().map(u16::to_string).collect::<Vec<_>>().join(" "))?;
    config.listen = ([127, 0, 0, 1], arbiter_port).into();
    config.metrics_listen = ([127, 0, 0, 1], metrics_port).into();
    config.cluster_name = "dev".into();
    config.state_dir = dir.join("arbiter-state");
    config.grants.group_commit = group_commit;
    // holdfast-bench drives the dev appliance from one identity (the dev
    // operator) with dozens of clients: above the production default rate.
    config.limits.requests_per_second = 50_000;
    config.limits.request_burst = 100_000;
    let mut launch = Launch::new(arbiter::locate()?, config, &dir, "arbiter");
    launch.notify_path = dir.join("notify.sock");
    launch.written_by = "Written by `holdfastctl dev`".into();
    say(&format!("starting the arbiter ({})", launch.bin.display()));
    children.arbiter = Some(ArbiterProcess::start(&launch, Duration::from_secs(60))?);

    // Tell the user. The shells get etcd's read-only observer credentials
    // (`holdfastctl status`); env-etcd-root has etcd's administrator, for
    // `holdfastctl etcd roles` (and `holdfast-bench --dev-dir`, which makes
    // its own non-root etcd user for its direct paths with it).
    let etcd_env = |user: &str| -> anyhow::Result<String> {
        let c = as_user(user)?;
        let path = |p: Option<PathBuf>| p.map(|p| p.display().to_string()).unwrap_or_default();
        Ok(format!(
            "export HOLDFAST_ETCD_ENDPOINT={}\nexport HOLDFAST_ETCD_CA={}\nexport HOLDFAST_ETCD_CERT={}\nexport HOLDFAST_ETCD_KEY={}\nexport HOLDFAST_ETCD_METRICS=http://127.0.0.1:{etcd_metrics_port}/metrics\nexport HOLDFAST_COORD_ENDPOINT={}\n",
            c.endpoints.join(","),
            path(c.ca_file),
            path(c.cert_file),
            path(c.key_file),
            coord_urls.join(","),
        ))
    };
    let observer = etcd_env(roles::OBSERVER.name)?;
    let env_for = |cert: &holdfast_devkit::pki::Issued| {
        format!(
            "export HOLDFAST_ENDPOINT=127.0.0.1:{arbiter_port}\nexport HOLDFAST_CA={}\nexport HOLDFAST_CERT={}\nexport HOLDFAST_KEY={}\nexport HOLDFAST_AUDIT_STORE={}\n{observer}",
            ca.ca_path().display(),
            cert.cert.display(),
            cert.key.display(),
            dir.join("audit").display(),
        )
    };
    let env = env_for(&client);
    std::fs::write(dir.join("env-second"), env_for(&second))?;
    std::fs::write(dir.join("env"), &env)?;
    std::fs::write(dir.join("env-etcd-root"), etcd_env(roles::ROOT)?)?;
    let banner = format!(
        "\nholdfast dev appliance is ready (etcd {ver}, epoch initialised)\n\n  arbiter   https://127.0.0.1:{arbiter_port}   (mTLS; client identity spiffe://holdfast.dev/dev/operator)\n  etcd      {etcd_url}   (the entity cluster: the locks of entity-tier classes; mTLS, authentication on; one role per tool: holdfastctl etcd roles --list)\n  coord     {coord_url}   (the coord cluster: the locks of coord-tier classes such as jobs, the class set, the controller's and the tailer's elections, the epoch allocator, approval nonces)\n  metrics   http://127.0.0.1:{metrics_port}/metrics\n  audit     {dir}/audit   (the tailer's store: holdfastctl audit; metrics http://127.0.0.1:{tailer_metrics_port}/metrics)\n            {dir}/audit-coord   (coord-tier classes such as jobs: holdfastctl audit --store {dir}/audit-coord)\n  classes   {dir}/policy   (classes.d, grants.d; the controller publishes each valid change)\n  state     {dir}   (logs: arbiter.log, controller.log, tailer.log, etcd.log)\n\nIn another shell:\n\n  source {dir}/env\n  holdfastctl lock exec demo/report -- sh -c 'echo \"token $HOLDFAST_TOKEN\"; sleep 20'\n  holdfastctl inspect demo/report\n  holdfastctl epoch status\n  holdfastctl audit demo/report   # who held it, and how each hold ended\n\nA second identity (spiffe://holdfast.dev/dev/second), for a second shell:\n\n  source {dir}/env-second\n  holdfastctl lock exec demo/report --wait 0 -- true; echo $?   # 75 while held\n\n",
        ver = bin.version_string(),
        etcd_url = entity_urls.join(","),
        coord_url = coord_urls.join(","),
        dir = dir.display(),
    );
    std::fs::write(dir.join("banner.txt"), &banner)?;
    std::fs::write(dir.join("ready"), "")?;
    if !detached {
        println!("{banner}Press Ctrl-C to stop.");
    } else {
        say("ready");
    }

    // Run until a signal, or until a child dies.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    let why = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break "interrupted".to_string(),
            _ = term.recv() => break "terminated".to_string(),
            _ = usr1.recv() => {
                let request = std::fs::read_to_string(dir.join("restore.request")).unwrap_or_default();
                let name = request.lines().nth(1).unwrap_or("entity").trim().to_string();
                let tier = children.tiers.iter_mut().find(|t| t.name == name);
                let result = match tier {
                    None => Err(anyhow::anyhow!("no cluster named {name:?}: entity or coord")),
                    Some(tier) => match root_of(tier) {
                        Ok(root) => restore_in_place(&dir, &bin, tier, &root).await,
                        Err(e) => Err(e),
                    },
                };
                let result = match result {
                    Ok(what) => { say(&what); format!("ok: {what}\n") }
                    Err(e) => { say(&format!("restore failed: {e:#}")); format!("error: {e:#}\n") }
                };
                // Written whole, then renamed: `dev restore` polls for the
                // file and must never read it half written (it once read an
                // empty one and failed with an empty message).
                std::fs::write(dir.join("restore.result.partial"), result)?;
                std::fs::rename(dir.join("restore.result.partial"), dir.join("restore.result"))?;
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if let Some(s) = children.tailer.as_mut().and_then(TailerProcess::exited) {
            break format!("the tailer exited ({s}); see {}", dir.join("tailer.log").display());
        }
        if let Some(s) = children.coord_tailer.as_mut().and_then(TailerProcess::exited) {
            break format!("the coord tailer exited ({s}); see {}", dir.join("tailer-coord.log").display());
        }
        if let Some(s) = children.controller.as_mut().and_then(ControllerProcess::exited) {
            break format!("the controller exited ({s}); see {}", dir.join("controller.log").display());
        }
        if let Some(s) = children.arbiter.as_mut().and_then(ArbiterProcess::exited) {
            break format!("the arbiter exited ({s}); see {}", dir.join("arbiter.log").display());
        }
        if let Some(t) = children.tiers.iter_mut().find_map(|t| t.process.as_mut().is_some_and(|e| !e.is_running()).then_some(&*t)) {
            break format!("the {} etcd exited; see {}", t.name, t.log(&dir).display());
        }
    };
    say(&format!("{why}; stopping the tailer, the controller and the arbiter, then etcd"));
    drop(children);
    say("stopped");
    if why.starts_with("the ") {
        bail!("{why}");
    }
    Ok(())
}

/// Waits for etcd to answer with a leader; fails at once if it exits.
async fn etcd_up(etcd: &mut EtcdProcess, config: &holdfast_config::EtcdConfig) -> anyhow::Result<()> {
    let ready = holdfast_devkit::etcd::wait_ready_with(config, Duration::from_secs(60));
    tokio::pin!(ready);
    loop {
        tokio::select! {
            r = &mut ready => return r,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if !etcd.is_running() {
                    bail!("etcd exited before it was ready");
                }
            }
        }
    }
}

/// Why etcd did not come up: the error, with the last lines this start
/// wrote to its log, and whether those lines say a port was taken.
struct StartFailure {
    port_taken: bool,
    error: anyhow::Error,
}

/// The single-member cluster of a tier whose files in DIR start with
/// `base`, on `ports` (client, peer, metrics). Its token is kept in DIR, so
/// a restore (`dev restore`) uses the token the cluster was created with.
fn tier_spec(dir: &Path, base: &str, pki: &EtcdPki, ports: [u16; 3]) -> anyhow::Result<ClusterSpec> {
    let token_file = dir.join(format!("{base}-token"));
    let token = match std::fs::read_to_string(&token_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => {
            let t = format!("holdfast-dev-{base}-{}", std::process::id());
            std::fs::write(&token_file, &t)?;
            t
        }
    };
    Ok(ClusterSpec {
        members: vec![MemberSpec {
            name: "dev".into(),
            host: "127.0.0.1".into(),
            data_dir: dir.join(base),
            client_port: ports[0],
            peer_port: ports[1],
            advertised_peer_port: None,
            tls: Some(pki.member_tls(&[])?),
            metrics_port: Some(ports[2]),
        }],
        token,
    })
}

/// Starts member 0 of the tier's cluster and waits until it answers
/// `config` with a leader.
async fn start_etcd(bin: &EtcdBinary, tier: &mut Tier, log: &Path, config: &holdfast_config::EtcdConfig) -> Result<(), StartFailure> {
    let from = std::fs::metadata(log).map_or(0, |m| m.len());
    let started = EtcdProcess::start(bin, &tier.cluster, 0, log).map_err(|error| StartFailure { port_taken: false, error })?;
    let etcd = tier.process.insert(started);
    etcd_up(etcd, config).await.map_err(|error| {
        let written = std::fs::read(log)
            .map(|b| String::from_utf8_lossy(b.get(from as usize..).unwrap_or_default()).into_owned())
            .unwrap_or_default();
        let last: Vec<&str> = written.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect();
        StartFailure {
            port_taken: written.contains("address already in use"),
            error: error.context(format!("the last lines of this start in {}:\n{}", log.display(), last.join("\n"))),
        }
    })
}

/// Who holds etcd's client and peer ports, for a message: the process
/// listening there, or a connection's local end.
fn holders(cluster: &ClusterSpec) -> String {
    let m = &cluster.members[0];
    [("client", m.client_port), ("peer", m.peer_port)]
        .iter()
        .filter(|(_, port)| std::net::TcpListener::bind(("127.0.0.1", *port)).is_err())
        .map(|(what, port)| match holdfast_devkit::ports::listener_pid(*port) {
            Some(pid) => format!("{what} port {port}: process {pid} listens there"),
            None => format!("{what} port {port}: in use by a connection or a bind of another process"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}
