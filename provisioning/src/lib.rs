//! holdfast-provision: prepares a bare-metal host for a holdfast etcd member.
//!
//! - [`disk`]: LUKS2 through libcryptsetup, bound to Tang with Clevis (`sss`
//!   across halls), no passphrase keyslot left; unlock through Tang only.
//! - [`probe`]: fdatasync latency with etcd's WAL pattern; p99 gate.
//! - [`tune`]: CPU affinity, I/O class and nice, as a systemd drop-in and on a
//!   running PID.
//! - [`plan`]: hall-aware placement of etcd members from an inventory.
//!
//! `main.rs` only parses arguments and prints; everything is here.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod config;
pub mod disk;
pub mod error;
pub mod plan;
pub mod probe;
pub mod tune;

pub use error::{ProvisionError, Result};
