//! The tailer's launcher: [`crate::daemon`] with a [`TailerConfig`].

use holdfast_config::TailerConfig;
use std::path::PathBuf;

/// Everything needed to start one tailer.
pub type TailerLaunch = crate::daemon::Launch<TailerConfig>;

/// A running tailer. Dropping it stops the process (SIGTERM: it
/// checkpoints and resigns).
pub type TailerProcess = crate::daemon::DaemonProcess;

/// Finds `holdfast-tailer`: `$HOLDFAST_TAILER_BIN`, else next to the
/// running program, else on `PATH`.
pub fn locate() -> anyhow::Result<PathBuf> {
    crate::daemon::locate("holdfast-tailer", "HOLDFAST_TAILER_BIN")
}
