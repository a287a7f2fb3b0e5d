//! holdfast-tailer: one active per etcd cluster (an etcd election), it
//! reads etcd's revision stream from its store's checkpoint and records one
//! audit event per committed change (`holdfast_audit`): in the embedded
//! store, and in the sinks an operator turns on.
//!
//! - [`tail`]: the active tailer's work: resume, seed, watch, classify,
//!   store, checkpoint; a gap when etcd compacted past the checkpoint.
//! - [`server`]: the loop: standby and active, signals, systemd notify.
//! - [`sinks`]: the sinks turned on in the config.
//! - [`check`]: `holdfast-tailer check`.
//! - [`export`]: `holdfast-tailer export`: ended holds to Parquet.
//! - [`metrics`]: Prometheus metrics (lag, gaps, alarms).
//!
//! The config file's struct is `holdfast_config::tailer`.

pub mod check;
pub mod export;
pub mod metrics;
pub mod server;
pub mod sinks;
pub mod tail;
