//! holdfast-controller: one active per cluster (an etcd election), it
//! validates the policy directory (`classes.d/`, `grants.d/`) with the one
//! validation function (`holdfast_policy::validate`) and publishes the
//! compiled set to `/sys/policy`, which every arbiter enforces. An invalid
//! change is never published: the last good set stays in force and the
//! refusal is logged, counted and written to `/sys/policy-status`.
//!
//! - [`election`]: the lease, its keepalive, the campaign.
//! - [`publish`]: one leader round: read, validate, publish or refuse.
//! - [`source`]: the directory's Git commit.
//! - [`check`]: `holdfast-controller check` (config and class set).
//! - [`server`]: the loop: standby and leader, signals, systemd notify.
//! - [`metrics`]: Prometheus metrics.
//!
//! The config file's struct is `holdfast_config::controller`; the documents
//! and transactions are `holdfast_store::policy`.

pub mod check;
pub mod election;
pub mod metrics;
pub mod publish;
pub mod server;
pub mod source;

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// This controller's name in the election and in the documents it writes:
/// `HOST pid PID`.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "unknown-host".to_string() } else { host };
    format!("{host} pid {}", std::process::id())
}
