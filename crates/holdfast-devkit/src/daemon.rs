//! The one way a holdfast daemon (arbiter, controller, tailer) is started outside
//! systemd, used by `holdfastctl dev`, the correctness gate and the
//! end-to-end tests.
//!
//! The config file is rendered from the typed config (the struct the daemon
//! itself parses), the binary is started the way systemd starts it — its own
//! process group, `NOTIFY_SOCKET` set — and it counts as started only once it
//! sends `READY=1`. Stopping is SIGTERM, then SIGKILL after a grace period.

use crate::notify::NotifySocket;
use crate::process::terminate;
use anyhow::Context;
use holdfast_config::{ArbiterConfig, ControllerConfig, TailerConfig};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// A daemon's typed config, rendered to its TOML file on every start.
pub trait DaemonConfig {
    /// What the daemon is called in errors ("arbiter").
    const WHAT: &'static str;
    fn render(&self) -> anyhow::Result<String>;
}

impl DaemonConfig for ArbiterConfig {
    const WHAT: &'static str = "arbiter";
    fn render(&self) -> anyhow::Result<String> {
        self.to_toml().context("rendering the arbiter config")
    }
}

impl DaemonConfig for ControllerConfig {
    const WHAT: &'static str = "controller";
    fn render(&self) -> anyhow::Result<String> {
        self.to_toml().context("rendering the controller config")
    }
}

impl DaemonConfig for TailerConfig {
    const WHAT: &'static str = "tailer";
    fn render(&self) -> anyhow::Result<String> {
        self.to_toml().context("rendering the tailer config")
    }
}

/// Everything needed to start one daemon.
#[derive(Debug, Clone)]
pub struct Launch<C> {
    /// The binary (see `arbiter::locate`, `controller::locate`).
    pub bin: PathBuf,
    /// Rendered to `config_path` on every start.
    pub config: C,
    pub config_path: PathBuf,
    /// stdout and stderr, appended (a restarted daemon keeps one log).
    pub log: PathBuf,
    pub notify_path: PathBuf,
    /// Extra environment, e.g. `HOLDFAST_LOG` or libfaketime's variables.
    pub env: Vec<(String, String)>,
    /// A command that execs the daemon in place, e.g. `ip netns exec NS`.
    pub wrapper: Vec<String>,
    /// First line of the rendered file, after `# `.
    pub written_by: String,
}

impl<C: DaemonConfig> Launch<C> {
    /// Files named after `name` in `dir`: `NAME.toml`, `NAME.log`, `NAME.notify`.
    pub fn new(bin: PathBuf, config: C, dir: &Path, name: &str) -> Self {
        Launch {
            bin,
            config,
            config_path: dir.join(format!("{name}.toml")),
            log: dir.join(format!("{name}.log")),
            notify_path: dir.join(format!("{name}.notify")),
            env: Vec::new(),
            wrapper: Vec::new(),
            written_by: "Written by the holdfast devkit launcher".into(),
        }
    }

    /// Writes the config file.
    pub fn write_config(&self) -> anyhow::Result<()> {
        let text = self.config.render()?;
        std::fs::write(&self.config_path, format!("# {}.\n{text}", self.written_by))
            .with_context(|| format!("writing {}", self.config_path.display()))
    }
}

/// A running daemon. Dropping it stops the process.
pub struct DaemonProcess {
    pub child: Option<Child>,
    pub notify: NotifySocket,
    pub log: PathBuf,
    what: &'static str,
}

impl DaemonProcess {
    /// Writes the config and starts the binary; does not wait for READY=1.
    pub fn spawn<C: DaemonConfig>(launch: &Launch<C>) -> anyhow::Result<Self> {
        launch.write_config()?;
        let notify = NotifySocket::bind(&launch.notify_path)?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&launch.log)
            .with_context(|| format!("opening {}", launch.log.display()))?;
        let bin = launch.bin.display().to_string();
        let mut argv: Vec<&str> = launch.wrapper.iter().map(String::as_str).collect();
        argv.push(&bin);
        let (program, args) = argv.split_first().context("no program to run")?;
        let child = Command::new(program)
            .args(args)
            .arg("--config")
            .arg(&launch.config_path)
            .env("NOTIFY_SOCKET", notify.path())
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", launch.bin.display()))?;
        Ok(DaemonProcess { child: Some(child), notify, log: launch.log.clone(), what: C::WHAT })
    }

    /// Starts the daemon and waits up to `timeout` for READY=1; the error
    /// carries the end of its log.
    pub fn start<C: DaemonConfig>(launch: &Launch<C>, timeout: Duration) -> anyhow::Result<Self> {
        let mut d = Self::spawn(launch)?;
        d.wait_ready(timeout)?;
        Ok(d)
    }

    /// Waits for READY=1 (or the process's death); the error carries the
    /// end of its log.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let what = self.what;
        let child = self.child.as_mut().with_context(|| format!("the {what} is not running"))?;
        self.notify
            .wait_ready(timeout, || matches!(child.try_wait(), Ok(None)))
            .with_context(|| format!("the {what} did not become ready; the end of {}:\n{}", self.log.display(), tail(&self.log, 20)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status, if the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM (the arbiter drains, the controller resigns), then SIGKILL
    /// after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c, grace);
        }
    }

    /// SIGKILL at once (no drain, no resignation).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// The last `lines` lines of a file (empty if unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Finds the binary `name`: `$env`, else next to the running program, else
/// on `PATH`.
pub fn locate(name: &str, env: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(p.into());
    }
    let sibling = std::env::current_exe()?.with_file_name(name);
    if sibling.exists() {
        return Ok(sibling);
    }
    crate::process::which(name)
        .with_context(|| format!("{name} not found next to this program or on PATH; build it (`cargo build --release`) or set {env}"))
}
