//! The controller's launcher: [`crate::daemon`] with a [`ControllerConfig`].

use holdfast_config::ControllerConfig;
use std::path::PathBuf;

/// Everything needed to start one controller.
pub type ControllerLaunch = crate::daemon::Launch<ControllerConfig>;

/// A running controller. Dropping it stops the process (SIGTERM: it resigns).
pub type ControllerProcess = crate::daemon::DaemonProcess;

/// Finds `holdfast-controller`: `$HOLDFAST_CONTROLLER_BIN`, else next to the
/// running program, else on `PATH`.
pub fn locate() -> anyhow::Result<PathBuf> {
    crate::daemon::locate("holdfast-controller", "HOLDFAST_CONTROLLER_BIN")
}
