//! holdfast's configuration files as typed structs.
//!
//! Every struct both parses (`Deserialize`, unknown keys refused) and renders
//! (`Serialize`): the dev appliance, the correctness gate and the tests write
//! a daemon's config from the same struct the daemon reads, so a new key is
//! added in one place.
//!
//! The modules: [`arbiter`] (`arbiter.toml`), [`controller`]
//! (`controller.toml`), [`tailer`] (`tailer.toml`), [`sinks`] (its `[clickhouse]` and `[archive]`
//! tables) and [`etcd`] (the `[etcd]` section shared by every daemon and tool).

pub mod arbiter;
pub mod controller;
pub mod etcd;
pub mod sinks;
pub mod tailer;

pub use arbiter::ArbiterConfig;
pub use controller::ControllerConfig;
pub use etcd::EtcdConfig;
pub use sinks::{ArchiveConfig, ClickHouseConfig};
pub use tailer::TailerConfig;
