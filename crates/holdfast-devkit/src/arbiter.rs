//! The arbiter's launcher: [`crate::daemon`] with an [`ArbiterConfig`].

pub use crate::daemon::tail;
use holdfast_config::ArbiterConfig;
use std::path::PathBuf;

/// Everything needed to start one arbiter.
pub type Launch = crate::daemon::Launch<ArbiterConfig>;

/// A running arbiter. Dropping it stops the process.
pub type ArbiterProcess = crate::daemon::DaemonProcess;

/// Finds `holdfast-arbiter`: `$HOLDFAST_ARBITER_BIN`, else next to the
/// running program, else on `PATH`.
pub fn locate() -> anyhow::Result<PathBuf> {
    crate::daemon::locate("holdfast-arbiter", "HOLDFAST_ARBITER_BIN")
}
