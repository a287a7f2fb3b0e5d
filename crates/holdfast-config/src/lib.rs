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

/// Reads, parses and validates a config file: the one `load` of every
/// config struct. Every problem is reported at once, naming the file.
pub(crate) fn load_file<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    default_path: &str,
    problems: impl Fn(&T) -> Vec<String>,
) -> Result<T, arbiter::ConfigError> {
    let err = |problems: Vec<String>| arbiter::ConfigError { path: path.display().to_string(), problems };
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(vec![format!("cannot read the file ({e}); pass --config FILE or create {default_path}")]))?;
    let config: T = toml::from_str(&text).map_err(|e| err(vec![e.to_string().trim().to_string()]))?;
    let found = problems(&config);
    if found.is_empty() { Ok(config) } else { Err(err(found)) }
}
