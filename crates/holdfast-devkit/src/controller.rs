//! The one launcher of `holdfast-controller` outside systemd (the tests; later
//! `holdfastctl dev`), like [`crate::arbiter`]: the config is rendered from
//! [`ControllerConfig`], the process gets its own process group and a
//! `NOTIFY_SOCKET`, and counts as started once it sends `READY=1`.

use crate::notify::NotifySocket;
use crate::process::terminate;
use anyhow::Context;
use holdfast_config::ControllerConfig;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Everything needed to start one controller.
#[derive(Debug, Clone)]
pub struct ControllerLaunch {
    pub bin: PathBuf,
    /// Rendered to `config_path` on every start.
    pub config: ControllerConfig,
    pub config_path: PathBuf,
    /// stdout and stderr, appended.
    pub log: PathBuf,
    pub notify_path: PathBuf,
    /// Extra environment, e.g. `HOLDFAST_LOG`.
    pub env: Vec<(String, String)>,
}

impl ControllerLaunch {
    /// Files named after `name` in `dir`: `NAME.toml`, `NAME.log`, `NAME.notify`.
    pub fn new(bin: PathBuf, config: ControllerConfig, dir: &Path, name: &str) -> Self {
        ControllerLaunch {
            bin,
            config,
            config_path: dir.join(format!("{name}.toml")),
            log: dir.join(format!("{name}.log")),
            notify_path: dir.join(format!("{name}.notify")),
            env: Vec::new(),
        }
    }

    pub fn write_config(&self) -> anyhow::Result<()> {
        let text = self.config.to_toml().context("rendering the controller config")?;
        std::fs::write(&self.config_path, format!("# Written by the holdfast devkit launcher.\n{text}"))
            .with_context(|| format!("writing {}", self.config_path.display()))
    }
}

/// A running controller. Dropping it stops the process (SIGTERM).
pub struct ControllerProcess {
    pub child: Option<Child>,
    pub notify: NotifySocket,
    pub log: PathBuf,
}

impl ControllerProcess {
    /// Writes the config and starts the binary; does not wait for READY=1.
    pub fn spawn(launch: &ControllerLaunch) -> anyhow::Result<Self> {
        launch.write_config()?;
        let notify = NotifySocket::bind(&launch.notify_path)?;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&launch.log)
            .with_context(|| format!("opening {}", launch.log.display()))?;
        let child = Command::new(&launch.bin)
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
        Ok(ControllerProcess { child: Some(child), notify, log: launch.log.clone() })
    }

    /// Waits for READY=1 (or the process's death); the error carries the end of its log.
    pub fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let child = self.child.as_mut().context("the controller is not running")?;
        self.notify.wait_ready(timeout, || matches!(child.try_wait(), Ok(None))).with_context(|| {
            format!("the controller did not become ready; the end of {}:\n{}", self.log.display(), crate::arbiter::tail(&self.log, 20))
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status, once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM (the controller resigns), then SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c, grace);
        }
    }

    /// SIGKILL at once: no resignation, the lease runs out.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Finds `holdfast-controller`: `$HOLDFAST_CONTROLLER_BIN`, else next to the
/// running program, else on `PATH`.
pub fn locate() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HOLDFAST_CONTROLLER_BIN") {
        return Ok(p.into());
    }
    let sibling = std::env::current_exe()?.with_file_name("holdfast-controller");
    if sibling.exists() {
        return Ok(sibling);
    }
    crate::process::which("holdfast-controller").context(
        "holdfast-controller not found next to this program or on PATH; build it (`cargo build --release`) or set HOLDFAST_CONTROLLER_BIN",
    )
}
