//! `controller.toml`: the configuration of holdfast-controller.
//!
//! Every field is documented here; `config/controller.toml` is the annotated
//! example and is parsed by a test. Errors name the file, the key and the
//! fix, and every error is reported in one pass.

use crate::arbiter::ConfigError;
use crate::etcd::EtcdConfig;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_PATH: &str = "/etc/holdfast/controller.toml";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// The policy directory: it holds `classes.d/*.toml` and
    /// `grants.d/*.toml`. If it is inside a Git checkout, the checkout's HEAD
    /// commit is published with the set.
    #[serde(default = "default_policy_dir")]
    pub policy_dir: PathBuf,
    /// Address of the Prometheus text endpoint (`GET /metrics`, plain HTTP).
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: SocketAddr,
    /// The `cluster` label value on every metric.
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    /// How often the active controller re-reads the policy directory and
    /// the pause-test results (SIGHUP re-reads at once), and how often a
    /// standby checks on the leader. Each round pings the systemd watchdog.
    #[serde(default = "default_rescan_interval", with = "humantime_serde")]
    pub rescan_interval: Duration,
    /// The etcd cluster the policy is published to (the lock cluster whose
    /// arbiters enforce it).
    pub etcd: EtcdConfig,
    /// Leader election among the controllers of one cluster.
    #[serde(default)]
    pub election: ElectionConfig,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElectionConfig {
    /// The etcd election name (a key prefix) the controllers of one cluster
    /// campaign on. Every controller of the cluster must use the same name.
    #[serde(default = "default_election_name")]
    pub name: String,
    /// TTL of the leader's etcd lease: how long after the active controller
    /// dies (or is cut off from etcd) a standby takes over. Whole seconds.
    #[serde(default = "default_election_ttl", with = "humantime_serde")]
    pub ttl: Duration,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        ElectionConfig { name: default_election_name(), ttl: default_election_ttl() }
    }
}

fn default_policy_dir() -> PathBuf {
    "/etc/holdfast".into()
}
fn default_metrics_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7431))
}
fn default_cluster_name() -> String {
    "default".into()
}
fn default_rescan_interval() -> Duration {
    Duration::from_secs(2)
}
fn default_election_name() -> String {
    holdfast_model::layout::CONTROLLER_ELECTION.into()
}
fn default_election_ttl() -> Duration {
    Duration::from_secs(10)
}

impl ControllerConfig {
    /// A config with every optional key at its default.
    pub fn new(etcd: EtcdConfig) -> Self {
        ControllerConfig {
            policy_dir: default_policy_dir(),
            metrics_listen: default_metrics_listen(),
            cluster_name: default_cluster_name(),
            rescan_interval: default_rescan_interval(),
            etcd,
            election: ElectionConfig::default(),
        }
    }

    /// The config as `controller.toml` text; [`ControllerConfig::load`]
    /// reads it back unchanged.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        crate::load_file(path, DEFAULT_PATH, Self::problems)
    }

    /// Checks that parse cannot. The policy directory itself is checked by
    /// `holdfast-controller check` (it is data, not configuration).
    pub fn problems(&self) -> Vec<String> {
        let mut p = self.etcd.problems();
        if self.policy_dir.as_os_str().is_empty() {
            p.push("policy_dir is empty; leave it out for /etc/holdfast or name the directory holding classes.d/ and grants.d/".into());
        }
        if self.cluster_name.trim().is_empty() {
            p.push("cluster_name is empty; leave it out for \"default\" or name the cluster (the `cluster` metric label)".into());
        }
        if self.rescan_interval < Duration::from_millis(100) || self.rescan_interval > Duration::from_secs(300) {
            p.push("rescan_interval must be between 100ms and 5m (default 2s)".into());
        }
        p.extend(election_problems(&self.election.name, self.election.ttl, "/sys/election/controller", "10s"));
        let ttl = self.election.ttl;
        if self.rescan_interval >= ttl && ttl >= Duration::from_secs(2) {
            p.push(format!(
                "rescan_interval ({}) must be shorter than election.ttl ({}): a standby checks on the leader once per rescan_interval",
                humantime::format_duration(self.rescan_interval),
                humantime::format_duration(ttl)
            ));
        }
        p
    }
}

/// The problems of an `[election]` table: `name` must be an etcd key
/// prefix, `ttl` whole seconds in 2s..=300s. `example` and `default_ttl`
/// go into the messages.
pub fn election_problems(name: &str, ttl: Duration, example: &str, default_ttl: &str) -> Vec<String> {
    let mut p = Vec::new();
    if !name.starts_with('/') || name.ends_with('/') || name.contains("//") || name.chars().any(char::is_whitespace) {
        p.push(format!(
            "election.name = {name:?}: an election name is an etcd key prefix like {example:?}: \
             starting with '/', no trailing '/', no empty segment, no spaces"
        ));
    }
    if ttl < Duration::from_secs(2) || ttl > Duration::from_secs(300) || ttl.subsec_nanos() != 0 {
        p.push(format!(
            "election.ttl = {:?}: must be whole seconds between 2s and 300s (default {default_ttl}); etcd leases count whole seconds",
            humantime::format_duration(ttl).to_string()
        ));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_config_reads_back_the_same() {
        let mut c = ControllerConfig::new(EtcdConfig::plain(vec!["http://127.0.0.1:2379".into()]));
        c.policy_dir = "/srv/policy".into();
        c.rescan_interval = Duration::from_millis(500);
        c.election.ttl = Duration::from_secs(3);
        let text = c.to_toml().unwrap();
        let back: ControllerConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.to_toml().unwrap(), text);
        assert_eq!(back.election, c.election);
        assert!(back.problems().is_empty(), "{:?}", back.problems());
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../../config/controller.toml");
        let c: ControllerConfig = toml::from_str(text).expect("config/controller.toml parses");
        assert_eq!(c.etcd.endpoints.len(), 3);
        assert_eq!(c.policy_dir, PathBuf::from("/etc/holdfast"));
        assert_eq!(c.rescan_interval, Duration::from_secs(2));
        assert_eq!(c.election.name, holdfast_model::layout::CONTROLLER_ELECTION);
        assert_eq!(c.election.ttl, Duration::from_secs(10));
    }

    #[test]
    fn defaults_fill_everything_but_etcd() {
        let c: ControllerConfig = toml::from_str("[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n").unwrap();
        assert_eq!(c.policy_dir, PathBuf::from("/etc/holdfast"));
        assert_eq!(c.rescan_interval, Duration::from_secs(2));
        assert_eq!(c.election, ElectionConfig::default());
        assert!(c.problems().is_empty(), "{:?}", c.problems());
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let c: ControllerConfig = toml::from_str(
            "cluster_name = \" \"\nrescan_interval = \"10ms\"\n[etcd]\nendpoints = [\"x:1\"]\n[election]\nname = \"ctl/\"\nttl = \"1500ms\"\n",
        )
        .unwrap();
        let p = c.problems();
        assert_eq!(p.len(), 5, "{p:?}");
        assert!(p[0].contains("needs a scheme"), "{p:?}");
        assert!(p[1].starts_with("cluster_name"), "{p:?}");
        assert!(p[2].starts_with("rescan_interval"), "{p:?}");
        assert!(p[3].starts_with("election.name"), "{p:?}");
        assert!(p[4].starts_with("election.ttl") && p[4].contains("1s 500ms"), "{p:?}");
        let c: ControllerConfig = toml::from_str("rescan_interval = \"10s\"\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n").unwrap();
        let p = c.problems();
        assert!(p.len() == 1 && p[0].contains("shorter than election.ttl"), "{p:?}");
    }

    #[test]
    fn unknown_and_renamed_keys_are_named() {
        let err = toml::from_str::<ControllerConfig>("policy_directory = \"/x\"\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("policy_directory") && err.contains("policy_dir"), "{err}");
        let err = toml::from_str::<ControllerConfig>("[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n[election]\nlease_ttl = \"5s\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lease_ttl") && err.contains("ttl"), "{err}");
    }
}
