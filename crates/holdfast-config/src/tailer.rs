//! `tailer.toml`: the configuration of holdfast-tailer.
//!
//! Every field is documented here; `config/tailer.toml` is the annotated
//! example and is parsed by a test.

use crate::arbiter::ConfigError;
use crate::controller::election_problems;
use crate::etcd::EtcdConfig;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_PATH: &str = "/etc/holdfast/tailer.toml";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailerConfig {
    /// The embedded audit store: segment files and the checkpoint
    /// (`holdfast_audit::store`). One tailer writes it at a time.
    #[serde(default = "default_store_dir")]
    pub store_dir: PathBuf,
    /// Address of the Prometheus text endpoint (`GET /metrics`, plain HTTP).
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: SocketAddr,
    /// The `cluster` label value on every metric.
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    /// How often the active tailer records how far its store is complete.
    /// After a crash it resumes from there (nothing is stored twice).
    #[serde(default = "default_checkpoint_interval", with = "humantime_serde")]
    pub checkpoint_interval: Duration,
    /// How much history etcd keeps (its `--auto-compaction-retention`). The
    /// tailer raises its lag alarm when its checkpoint is older than half
    /// of this; past all of it, etcd has compacted revisions the tailer did
    /// not read, and it records a gap.
    #[serde(default = "default_compaction_window", with = "humantime_serde")]
    pub compaction_window: Duration,
    /// The etcd cluster whose history is recorded.
    pub etcd: EtcdConfig,
    /// Leader election among the tailers of one cluster.
    #[serde(default)]
    pub election: TailerElection,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TailerElection {
    /// The etcd election name every tailer of the cluster campaigns on.
    #[serde(default = "default_election_name")]
    pub name: String,
    /// TTL of the active tailer's lease: how long after it dies a standby
    /// takes over (and catches up from its own checkpoint). Whole seconds.
    #[serde(default = "default_election_ttl", with = "humantime_serde")]
    pub ttl: Duration,
}

impl Default for TailerElection {
    fn default() -> Self {
        TailerElection { name: default_election_name(), ttl: default_election_ttl() }
    }
}

fn default_store_dir() -> PathBuf {
    "/var/lib/holdfast/audit".into()
}
fn default_metrics_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7432))
}
fn default_cluster_name() -> String {
    "default".into()
}
fn default_checkpoint_interval() -> Duration {
    Duration::from_secs(2)
}
fn default_compaction_window() -> Duration {
    Duration::from_secs(3600)
}
fn default_election_name() -> String {
    holdfast_model::layout::TAILER_ELECTION.into()
}
fn default_election_ttl() -> Duration {
    Duration::from_secs(5)
}

impl TailerConfig {
    /// A config with every optional key at its default.
    pub fn new(etcd: EtcdConfig) -> Self {
        TailerConfig {
            store_dir: default_store_dir(),
            metrics_listen: default_metrics_listen(),
            cluster_name: default_cluster_name(),
            checkpoint_interval: default_checkpoint_interval(),
            compaction_window: default_compaction_window(),
            etcd,
            election: TailerElection::default(),
        }
    }

    /// The config as `tailer.toml` text; [`TailerConfig::load`] reads it
    /// back unchanged.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let err = |problems: Vec<String>| ConfigError { path: path.display().to_string(), problems };
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(vec![format!("cannot read the file ({e}); pass --config FILE or create {DEFAULT_PATH}")]))?;
        let config: TailerConfig = toml::from_str(&text).map_err(|e| err(vec![e.to_string().trim().to_string()]))?;
        let problems = config.problems();
        if problems.is_empty() { Ok(config) } else { Err(err(problems)) }
    }

    /// Checks that parse cannot.
    pub fn problems(&self) -> Vec<String> {
        let mut p = self.etcd.problems();
        if !self.store_dir.is_absolute() {
            p.push(format!(
                "store_dir = {:?}: must be an absolute path (default /var/lib/holdfast/audit)",
                self.store_dir.display().to_string()
            ));
        }
        if self.cluster_name.trim().is_empty() {
            p.push("cluster_name is empty; leave it out for \"default\" or name the cluster (the `cluster` metric label)".into());
        }
        if self.checkpoint_interval < Duration::from_millis(100) || self.checkpoint_interval > Duration::from_secs(60) {
            p.push("checkpoint_interval must be between 100ms and 1m (default 2s)".into());
        }
        if self.compaction_window < Duration::from_secs(60) {
            p.push("compaction_window must be at least 1m: set it to etcd's --auto-compaction-retention (default 1h)".into());
        }
        p.extend(election_problems(&self.election.name, self.election.ttl, "/sys/election/tailer", "5s"));
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_parses_and_a_rendered_config_reads_back() {
        let c: TailerConfig = toml::from_str(include_str!("../../../config/tailer.toml")).expect("config/tailer.toml parses");
        assert_eq!(c.store_dir, PathBuf::from("/var/lib/holdfast/audit"));
        assert_eq!(c.election.name, holdfast_model::layout::TAILER_ELECTION);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let text = c.to_toml().unwrap();
        assert_eq!(toml::from_str::<TailerConfig>(&text).unwrap().to_toml().unwrap(), text);
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let c: TailerConfig = toml::from_str(
            "store_dir = \"audit\"\ncheckpoint_interval = \"5m\"\ncompaction_window = \"10s\"\n[etcd]\nendpoints = [\"http://x:1\"]\n[election]\nttl = \"1s\"\n",
        )
        .unwrap();
        let p = c.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].starts_with("store_dir") && p[1].starts_with("checkpoint_interval"), "{p:?}");
        assert!(p[2].starts_with("compaction_window") && p[3].starts_with("election.ttl"), "{p:?}");
        let err = toml::from_str::<TailerConfig>("store = \"/x\"\n[etcd]\nendpoints = [\"http://x:1\"]\n").unwrap_err().to_string();
        assert!(err.contains("store_dir"), "{err}");
    }
}
