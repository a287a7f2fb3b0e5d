//! Fixtures for the lab (the gate, the fence and pause-test tests, the
//! end-to-end suite); never packaged.
//!
//! - [`postgres`]: a throwaway PostgreSQL cluster from Debian's packages.
//! - [`s3`]: a real S3-compatible server (versitygw) on loopback.
//! - [`etcdlog`]: etcd's revision history as the checkers' `EtcdLog`.
//! - [`policy`]: a class set for the lab, published by the real controller.
//! - [`nspawn`]: a booted Debian 12 system container for the install test.

pub mod clickhouse;
pub mod etcdlog;
pub mod nspawn;
pub mod policy;
pub mod postgres;
pub mod s3;
