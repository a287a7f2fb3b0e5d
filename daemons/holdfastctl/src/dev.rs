//! `holdfastctl dev`: a whole appliance on loopback, like `vault server -dev`.
//!
//! A single-member etcd, the arbiter and the controller (the real binaries,
//! started the way systemd starts them: each must send READY=1 on
//! NOTIFY_SOCKET), a throwaway CA with server and client certificates, the
//! epoch initialised, and the dev class set published. Nothing listens beyond
//! 127.0.0.1.

use anyhow::{Context, bail};
use holdfast_cli::exit;
use holdfast_config::ControllerConfig;
use holdfast_config::EtcdConfig;
use holdfast_config::arbiter::{ArbiterConfig, TlsConfig};
use holdfast_devkit::arbiter::{self, ArbiterProcess, Launch, tail};
use holdfast_devkit::controller::{self, ControllerLaunch, ControllerProcess};

/// The dev class set (`config/` in the source tree), written to DIR/policy.
const DEV_CLASSES: &str = include_str!("../../../config/classes.d/dev.toml");
const DEV_GRANTS: &str = include_str!("../../../config/grants.d/dev.toml");
use holdfast_devkit::etcd::{ClusterSpec, EtcdBinary, EtcdProcess, MemberSpec};
use holdfast_devkit::pki::DevCa;
use holdfast_devkit::ports::free_port;
use holdfast_store::etcd::Etcd;
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

Files in DIR: env (export lines for spiffe://holdfast.dev/dev/operator),
env-second (the same for a second identity, dev/second), tls/ (CA,
certificates), etcd/ (data), policy/ (the dev class set: classes.d/,
grants.d/; edit it and the controller publishes each valid change),
arbiter.toml, controller.toml, etcd.log, arbiter.log, controller.log, dev.log
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
}

const DETACHED_ENV: &str = "HOLDFAST_DEV_SUPERVISOR";

pub async fn run(args: DevArgs) -> u8 {
    let result = match args.action {
        Some(DevAction::Stop { dir }) => stop(&dir),
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
    controller: Option<ControllerProcess>,
    arbiter: Option<ArbiterProcess>,
    etcd: Option<EtcdProcess>,
}

impl Drop for Children {
    fn drop(&mut self) {
        if let Some(mut c) = self.controller.take() {
            c.stop(Duration::from_secs(10));
        }
        if let Some(mut a) = self.arbiter.take() {
            a.stop(Duration::from_secs(15));
        }
        if let Some(mut e) = self.etcd.take() {
            e.stop(Duration::from_secs(10));
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
    let ports: Vec<u16> = match saved.as_slice() {
        [a, b, c, d, e] if [*a, *b, *c, *d, *e].iter().all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()) => saved.clone(),
        _ => (0..5).map(|_| free_port()).collect(),
    };
    std::fs::write(&ports_file, ports.iter().map(u16::to_string).collect::<Vec<_>>().join(" "))?;
    let (etcd_client_port, etcd_peer_port, arbiter_port, metrics_port, controller_metrics_port) =
        (ports[0], ports[1], ports[2], ports[3], ports[4]);

    // etcd.
    let bin = EtcdBinary::locate()?;
    say(&format!("starting etcd {} ({})", bin.version_string(), bin.etcd.display()));
    let cluster = ClusterSpec {
        members: vec![MemberSpec {
            name: "dev".into(),
            host: "127.0.0.1".into(),
            data_dir: dir.join("etcd"),
            client_port: etcd_client_port,
            peer_port: etcd_peer_port,
        }],
        token: format!("holdfast-dev-{}", std::process::id()),
    };
    let mut children =
        Children { controller: None, arbiter: None, etcd: Some(EtcdProcess::start(&bin, &cluster, 0, &dir.join("etcd.log"))?) };
    holdfast_devkit::etcd::wait_ready(&cluster.client_urls(), Duration::from_secs(60))
        .await
        .with_context(|| format!("etcd did not start; see {}", dir.join("etcd.log").display()))?;

    // Epoch.
    let etcd = Etcd::connect(&EtcdConfig::plain(cluster.client_urls())).await?;
    match holdfast_store::epoch::init(&etcd, |m| say(m)).await {
        Ok(r) => say(&format!("initialised epoch {}", r.epoch)),
        Err(holdfast_store::epoch::EpochError::AlreadyInitialised(n)) => say(&format!("epoch {n} already initialised")),
        Err(e) => return Err(e).context("initialising the epoch"),
    }

    // Arbiter.
    let mut config = ArbiterConfig::new(
        TlsConfig { cert_file: server.cert.clone(), key_file: server.key.clone(), client_ca_file: ca.ca_path() },
        EtcdConfig::plain(vec![cluster.members[0].client_url()]),
    );
    config.listen = ([127, 0, 0, 1], arbiter_port).into();
    config.metrics_listen = ([127, 0, 0, 1], metrics_port).into();
    config.cluster_name = "dev".into();
    config.grants.group_commit = group_commit;
    let mut launch = Launch::new(arbiter::locate()?, config, &dir, "arbiter");
    launch.notify_path = dir.join("notify.sock");
    launch.written_by = "Written by `holdfastctl dev`".into();
    say(&format!("starting the arbiter ({})", launch.bin.display()));
    children.arbiter = Some(ArbiterProcess::start(&launch, Duration::from_secs(60))?);

    // The dev class set, published by a controller. Written only if absent:
    // edits survive a restart, and the controller republishes on change.
    let policy = dir.join("policy");
    for (sub, text) in [("classes.d", DEV_CLASSES), ("grants.d", DEV_GRANTS)] {
        let file = policy.join(sub).join("dev.toml");
        if !policy.join(sub).exists() {
            std::fs::create_dir_all(policy.join(sub))?;
            std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
        }
    }
    let mut cconfig = ControllerConfig::new(EtcdConfig::plain(vec![cluster.members[0].client_url()]));
    cconfig.policy_dir = policy.clone();
    cconfig.metrics_listen = ([127, 0, 0, 1], controller_metrics_port).into();
    cconfig.cluster_name = "dev".into();
    let claunch = ControllerLaunch::new(controller::locate()?, cconfig, &dir, "controller");
    say(&format!("starting the controller ({}), publishing {}", claunch.bin.display(), policy.display()));
    let mut c = ControllerProcess::spawn(&claunch)?;
    c.wait_ready(Duration::from_secs(60))?;
    children.controller = Some(c);

    // Tell the user.
    let env_for = |cert: &holdfast_devkit::pki::Issued| {
        format!(
            "export HOLDFAST_ENDPOINT=127.0.0.1:{arbiter_port}\nexport HOLDFAST_CA={}\nexport HOLDFAST_CERT={}\nexport HOLDFAST_KEY={}\nexport HOLDFAST_ETCD_ENDPOINT={}\n",
            ca.ca_path().display(),
            cert.cert.display(),
            cert.key.display(),
            cluster.members[0].client_url(),
        )
    };
    let env = env_for(&client);
    std::fs::write(dir.join("env-second"), env_for(&second))?;
    std::fs::write(dir.join("env"), &env)?;
    let banner = format!(
        "\nholdfast dev appliance is ready (etcd {ver}, epoch initialised)\n\n  arbiter   https://127.0.0.1:{arbiter_port}   (mTLS; client identity spiffe://holdfast.dev/dev/operator)\n  etcd      {etcd_url}\n  metrics   http://127.0.0.1:{metrics_port}/metrics\n  classes   {dir}/policy   (classes.d, grants.d; the controller publishes each valid change)\n  state     {dir}   (logs: arbiter.log, controller.log, etcd.log)\n\nIn another shell:\n\n  source {dir}/env\n  holdfastctl lock exec demo/report -- sh -c 'echo \"token $HOLDFAST_TOKEN\"; sleep 20'\n  holdfastctl inspect demo/report\n  holdfastctl epoch status\n\nA second identity (spiffe://holdfast.dev/dev/second), for a second shell:\n\n  source {dir}/env-second\n  holdfastctl lock exec demo/report --wait 0 -- true; echo $?   # 75 while held\n\n",
        ver = bin.version_string(),
        etcd_url = cluster.members[0].client_url(),
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
    let why = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break "interrupted".to_string(),
            _ = term.recv() => break "terminated".to_string(),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if let Some(s) = children.controller.as_mut().and_then(ControllerProcess::exited) {
            break format!("the controller exited ({s}); see {}", dir.join("controller.log").display());
        }
        if let Some(s) = children.arbiter.as_mut().and_then(ArbiterProcess::exited) {
            break format!("the arbiter exited ({s}); see {}", dir.join("arbiter.log").display());
        }
        if let Some(e) = children.etcd.as_mut()
            && !e.is_running()
        {
            break format!("etcd exited; see {}", dir.join("etcd.log").display());
        }
    };
    say(&format!("{why}; stopping the controller and the arbiter, then etcd"));
    drop(children);
    say("stopped");
    if why.starts_with("the ") || why.starts_with("etcd") {
        bail!("{why}");
    }
    Ok(())
}
