//! `/etc/holdfast/provision.toml`: what this node is and what it provisions.
//!
//! Every struct denies unknown keys, so a misspelt or renamed key fails with
//! its name instead of being silently ignored. `load` reports every problem
//! it finds in one pass.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ProvisionError;
use crate::tune::{CpuSet, IoClass};

/// Default location of the node config.
pub const DEFAULT_CONFIG: &str = "/etc/holdfast/provision.toml";

/// The node config.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionConfig {
    /// This host's name, as it appears in the placement inventory.
    pub host: String,
    /// The hall (failure domain: power, cooling, network) the host stands in.
    pub hall: String,
    /// What runs on this host.
    pub roles: Roles,
    /// The dedicated data device, its LUKS2 mapping, mount and etcd data directory.
    pub disk: DiskConfig,
    /// Tang servers the disk is bound to through Clevis.
    pub tang: TangConfig,
    /// CPU pinning and I/O priority for the etcd member.
    pub tune: TuneConfig,
    /// The fsync latency probe that gates etcd readiness.
    #[serde(default)]
    pub probe: ProbeConfig,
    /// Where the agent records its results (probe figures); `status` reads them.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/holdfast-provision")
}

/// Roles of this host.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Roles {
    /// The etcd member this host runs, if any.
    #[serde(default)]
    pub etcd: Option<EtcdRole>,
    /// Whether this host runs a holdfast-arbiter.
    #[serde(default)]
    pub arbiter: bool,
    /// Whether this host runs a holdfast-tailer.
    #[serde(default)]
    pub tailer: bool,
}

/// Membership of an etcd lock cluster.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdRole {
    /// Cluster name, e.g. `entity-1` or `coord`.
    pub cluster: String,
    /// The cluster's tier.
    pub tier: Tier,
}

/// Tier of an etcd lock cluster; it fixes the member count and hall split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Entity tier: three members, one per hall.
    Entity,
    /// Coord tier: five members split 2-2-1 across three halls.
    Coord,
}

/// The data device.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// The dedicated NVMe device, by a stable path (`/dev/disk/by-id/...`). Nothing else may live on it.
    pub device: PathBuf,
    /// Device-mapper name of the unlocked volume (`/dev/mapper/<name>`).
    #[serde(default = "default_mapper")]
    pub mapper_name: String,
    /// File system created on the unlocked volume the first time it is empty.
    #[serde(default = "default_fs")]
    pub filesystem: String,
    /// Where the unlocked volume is mounted.
    #[serde(default = "default_mount")]
    pub mount_point: PathBuf,
    /// The etcd data directory (WAL and data on the same volume), created under `mount_point`.
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// Owner of the data directory (user name or numeric uid).
    #[serde(default = "default_owner")]
    pub owner: String,
    /// Group of the data directory (group name or numeric gid).
    #[serde(default = "default_owner")]
    pub group: String,
    /// Mode of the data directory, octal string; etcd requires `0700`.
    #[serde(default = "default_mode")]
    pub mode: String,
}

fn default_mapper() -> String {
    "holdfast-data".into()
}
fn default_fs() -> String {
    "ext4".into()
}
fn default_mount() -> PathBuf {
    PathBuf::from("/var/lib/holdfast-etcd")
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("/var/lib/holdfast-etcd/member-data")
}
fn default_owner() -> String {
    // The user holdfast-etcd@.service runs etcd as (systemd/sysusers.d).
    "holdfast-etcd".into()
}
fn default_mode() -> String {
    "0700".into()
}

/// Tang servers and the Shamir threshold of the Clevis `sss` policy.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TangConfig {
    /// How many Tang servers must answer to unlock (SSS threshold `t`). With `1`, any one hall's Tang unlocks.
    pub threshold: u32,
    /// The Tang servers: at least two, in at least two halls.
    pub servers: Vec<TangServer>,
}

/// One Tang server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TangServer {
    /// Base URL, e.g. `http://tang-a.mgmt:7500` (Tang on the separate management network).
    pub url: String,
    /// Hall the Tang server stands in.
    pub hall: String,
    /// Optional advertisement file (JSON from `GET /adv`) pinning the server's keys; without it the advertisement is fetched and trusted at bind time.
    #[serde(default)]
    pub adv_file: Option<PathBuf>,
}

/// CPU pinning and I/O priority of the etcd member.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TuneConfig {
    /// CPUs reserved for etcd, in `Cpus_allowed_list` syntax: `2-5,8`.
    pub cpus: CpuSet,
    /// I/O scheduling class: `realtime`, `best-effort` or `idle`.
    #[serde(default = "default_io_class")]
    pub io_class: IoClass,
    /// I/O scheduling priority within the class, 0 (highest) to 7.
    #[serde(default)]
    pub io_priority: u8,
    /// Nice value, -20 to 19.
    #[serde(default = "default_nice")]
    pub nice: i32,
    /// systemd unit directory the drop-in is written under.
    #[serde(default = "default_unit_dir")]
    pub unit_dir: PathBuf,
}

fn default_io_class() -> IoClass {
    IoClass::BestEffort
}
fn default_nice() -> i32 {
    -5
}
fn default_unit_dir() -> PathBuf {
    PathBuf::from("/etc/systemd/system")
}

/// fsync probe settings. Defaults follow etcd's WAL: 2300-byte appends, p99 under 2 ms.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeConfig {
    /// Highest acceptable fdatasync p99 (humantime, e.g. `2ms`).
    #[serde(with = "humantime_serde", default = "default_p99")]
    pub max_p99: Duration,
    /// Number of appends measured.
    #[serde(default = "default_samples")]
    pub samples: usize,
    /// Bytes per append (a typical etcd WAL entry).
    #[serde(default = "default_write_size")]
    pub write_size: usize,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig { max_p99: default_p99(), samples: default_samples(), write_size: default_write_size() }
    }
}
fn default_p99() -> Duration {
    Duration::from_millis(2)
}
fn default_samples() -> usize {
    2000
}
fn default_write_size() -> usize {
    2300
}

impl ProvisionConfig {
    /// Reads and validates a config file, reporting every problem at once.
    pub fn load(path: &Path) -> Result<Self, ProvisionError> {
        let text = std::fs::read_to_string(path).map_err(|e| ProvisionError::Config {
            path: path.to_owned(),
            problems: vec![format!("cannot read it: {e}; pass --config FILE")],
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ProvisionError> {
        let cfg: ProvisionConfig =
            toml::from_str(text).map_err(|e| ProvisionError::Config { path: path.to_owned(), problems: vec![e.to_string()] })?;
        let problems = cfg.problems();
        if problems.is_empty() { Ok(cfg) } else { Err(ProvisionError::Config { path: path.to_owned(), problems }) }
    }

    /// Every semantic problem, each naming its key and the fix.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let halls: BTreeSet<&str> = self.tang.servers.iter().map(|s| s.hall.as_str()).collect();
        if self.tang.servers.len() < 2 || halls.len() < 2 {
            p.push(format!(
                "tang.servers: {} server(s) in {} hall(s); list at least two Tang servers in at least two halls so one hall's loss does not keep nodes locked",
                self.tang.servers.len(),
                halls.len()
            ));
        }
        let n = self.tang.servers.len() as u32;
        if self.tang.threshold == 0 || self.tang.threshold > n {
            p.push(format!("tang.threshold: {} must be between 1 and the number of servers ({n})", self.tang.threshold));
        }
        for s in &self.tang.servers {
            if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
                p.push(format!("tang.servers: url {:?} must start with http:// or https://", s.url));
            }
        }
        if !self.disk.data_dir.starts_with(&self.disk.mount_point) {
            p.push(format!(
                "disk.data_dir: {} is not under disk.mount_point {}; etcd's WAL and data must live on the encrypted volume",
                self.disk.data_dir.display(),
                self.disk.mount_point.display()
            ));
        }
        if u32::from_str_radix(self.disk.mode.trim_start_matches("0o"), 8).map_or(true, |m| m > 0o7777) {
            p.push(format!("disk.mode: {:?} is not an octal mode such as \"0700\"", self.disk.mode));
        }
        if self.disk.mapper_name.is_empty() || self.disk.mapper_name.contains('/') {
            p.push(format!("disk.mapper_name: {:?} must be a non-empty name without '/'", self.disk.mapper_name));
        }
        if self.tune.io_priority > 7 {
            p.push(format!("tune.io_priority: {} must be 0 (highest) to 7", self.tune.io_priority));
        }
        if !(-20..=19).contains(&self.tune.nice) {
            p.push(format!("tune.nice: {} must be -20 to 19", self.tune.nice));
        }
        if self.probe.samples < 100 {
            p.push(format!("probe.samples: {} is too few for a p99; use at least 100", self.probe.samples));
        }
        if self.probe.write_size == 0 {
            p.push("probe.write_size: must be at least 1 byte".into());
        }
        if self.host.is_empty() || self.hall.is_empty() {
            p.push("host, hall: must not be empty".into());
        }
        p
    }

    /// The data directory mode as a number.
    pub fn data_dir_mode(&self) -> u32 {
        u32::from_str_radix(self.disk.mode.trim_start_matches("0o"), 8).unwrap_or(0o700)
    }
}
