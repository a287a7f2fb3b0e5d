//! holdfast-controller: one active per cluster (an etcd election), it
//! validates the policy directory (`classes.d/`, `grants.d/`) with the one
//! validation function (`holdfast_policy::validate`) and publishes the
//! compiled set to `/sys/policy`, which every arbiter enforces. An invalid
//! change is never published: the last good set stays in force and the
//! refusal is logged, counted and written to `/sys/policy-status`.
//!
//! - [`publish`]: one leader round: read, validate, publish or refuse.
//! - [`source`]: the directory's Git commit.
//! - [`check`]: `holdfast-controller check` (config and class set).
//! - [`server`]: the loop: standby and leader, signals, systemd notify.
//! - [`metrics`]: Prometheus metrics.
//!
//! The election (lease, keepalive, campaign) is `holdfast_daemon::election`.
//! The config file's struct is `holdfast_config::controller`; the documents
//! and transactions are `holdfast_store::policy`.

pub mod check;
pub mod metrics;
pub mod publish;
pub mod server;
pub mod source;

pub use holdfast_daemon::now_unix_ms;
