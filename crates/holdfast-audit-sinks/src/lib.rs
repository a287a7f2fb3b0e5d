//! The audit sinks beyond the embedded store (`holdfast_audit::store`),
//! each behind `holdfast_audit::sink::Sink` and idempotent on
//! `(cluster_id, revision, index)`:
//!
//! - [`clickhouse`]: events into a ClickHouse table over its HTTP interface.
//! - [`archive`]: force-release records into an S3-compatible bucket, kept
//!   seven years under object lock in retention mode.

pub mod archive;
pub mod clickhouse;
