//! Errors of the provisioning library. Each message says what to do next.

use std::path::PathBuf;

/// What can go wrong while provisioning.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// The config file is unreadable or invalid.
    #[error("{}: invalid config:\n  - {}", path.display(), problems.join("\n  - "))]
    Config {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// The inventory is unreadable or invalid.
    #[error("{}: invalid inventory:\n  - {}", path.display(), problems.join("\n  - "))]
    Inventory {
        /// The file.
        path: PathBuf,
        /// Every problem found.
        problems: Vec<String>,
    },
    /// No valid placement exists, or a pinned placement violates the hall rules.
    #[error("refusing to plan:\n  - {}", reasons.join("\n  - "))]
    Placement {
        /// Why, per cluster.
        reasons: Vec<String>,
    },
    /// The device already holds data and `--force` was not given.
    #[error(
        "refusing to format {device}: it holds {what}. If this is really the dedicated etcd device and its contents may be destroyed, run again with --force"
    )]
    DeviceInUse {
        /// The device.
        device: String,
        /// What was found on it.
        what: String,
    },
    /// A libcryptsetup call failed.
    #[error("{step} on {device}: {source}")]
    Crypt {
        /// What was being done.
        step: String,
        /// The device.
        device: String,
        /// libcryptsetup's error.
        #[source]
        source: libcryptsetup_rs::LibcryptErr,
    },
    /// An external tool failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The command.
        tool: String,
        /// Its stderr or exit status, and what to do.
        detail: String,
    },
    /// Tang did not give back the key: the node stays locked.
    #[error(
        "{device} stays locked: no key could be recovered from Tang ({servers}); there is no passphrase fallback. Check that the Tang servers are up and reachable from this host, then run `holdfast-provision unlock` again. Clevis said: {detail}"
    )]
    TangUnreachable {
        /// The device.
        device: String,
        /// The configured servers.
        servers: String,
        /// clevis output.
        detail: String,
    },
    /// The device is not in the state this step needs.
    #[error("{0}")]
    State(String),
    /// The fsync probe measured a p99 above the threshold.
    #[error(
        "fsync p99 {p99_us} µs exceeds the {max_us} µs threshold on {dir}: this volume is too slow for an etcd member (grant latency is the slowest member's fsync). Move etcd to a dedicated local NVMe, or accept it knowingly with --accept-slow-disk"
    )]
    SlowDisk {
        /// Measured p99 in microseconds.
        p99_us: u64,
        /// Threshold in microseconds.
        max_us: u64,
        /// Where it was measured.
        dir: String,
    },
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl ProvisionError {
    /// Wraps an I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ProvisionError::Io { what: what.into(), source }
    }
}

/// Shorthand result.
pub type Result<T, E = ProvisionError> = std::result::Result<T, E>;
