//! `tailer.toml`: the configuration of holdfast-tailer.
//!
//! Every field is documented here; `config/tailer.toml` is the annotated
//! example and is parsed by a test.

use crate::arbiter::ConfigError;
use crate::controller::election_problems;
use crate::etcd::EtcdConfig;
use crate::sinks::{ArchiveConfig, ClickHouseConfig};
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
    /// The coord cluster, where the tailers of this cluster campaign
    /// (`[election]` there), so a restore of the recorded cluster never
    /// rolls the election back and the recorded history holds no election
    /// traffic. Absent: they campaign on the cluster they record (the tiers
    /// share one cluster). The tailers of each entity cluster that share a
    /// coord cluster need an `election.name` of their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coord: Option<EtcdConfig>,
    /// Also write every event into a ClickHouse table (off when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clickhouse: Option<ClickHouseConfig>,
    /// Also archive force-release records into an S3-compatible bucket
    /// under object lock (off when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveConfig>,
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
            coord: None,
            clickhouse: None,
            archive: None,
        }
    }

    /// The config as `tailer.toml` text; [`TailerConfig::load`] reads it
    /// back unchanged.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        crate::load_file(path, DEFAULT_PATH, Self::problems)
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
        if let Some(coord) = &self.coord {
            p.extend(coord.problems_in("coord"));
        }
        if let Some(c) = &self.clickhouse {
            p.extend(c.problems());
        }
        if let Some(a) = &self.archive {
            p.extend(a.problems());
        }
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
    fn the_coord_section_reads_back_and_its_problems_name_it() {
        let mut c = TailerConfig::new(EtcdConfig::plain(vec!["http://127.0.0.1:2379".into()]));
        assert!(!c.to_toml().unwrap().contains("[coord]"), "no [coord] unless set");
        c.coord = Some(EtcdConfig::plain(vec!["127.0.0.1:2479".into()]));
        let back: TailerConfig = toml::from_str(&c.to_toml().unwrap()).unwrap();
        assert_eq!(back.coord, c.coord);
        let p = back.problems();
        assert!(p.iter().any(|p| p.starts_with("coord.endpoints: \"127.0.0.1:2479\" needs a scheme")), "{p:?}");
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let c: TailerConfig = toml::from_str(
            "store_dir = \"audit\"\ncheckpoint_interval = \"5m\"\ncompaction_window = \"10s\"\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n[election]\nttl = \"1s\"\n",
        )
        .unwrap();
        let p = c.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].starts_with("store_dir") && p[1].starts_with("checkpoint_interval"), "{p:?}");
        assert!(p[2].starts_with("compaction_window") && p[3].starts_with("election.ttl"), "{p:?}");
        let err = toml::from_str::<TailerConfig>("store = \"/x\"\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n").unwrap_err().to_string();
        assert!(err.contains("store_dir"), "{err}");
    }

    /// The example's commented `[clickhouse]` and `[archive]` tables, with
    /// their keys uncommented: they parse as the sinks' tables.
    #[test]
    fn the_examples_sink_tables_parse_when_uncommented() {
        let example = include_str!("../../../config/tailer.toml");
        let at = example.find("# Optional sinks").expect("the example has the sinks' section");
        let (head, sinks) = example.split_at(at);
        let uncommented: Vec<&str> = sinks
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest.split_once(" = ").is_some_and(|(k, _)| k.bytes().all(|c| c.is_ascii_lowercase() || c == b'_')) =>
                {
                    rest
                }
                _ => l,
            })
            .collect();
        let text = format!("{head}\n{}\n", uncommented.join("\n"));
        let c: TailerConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let ch = c.clickhouse.as_ref().expect("[clickhouse]");
        assert_eq!((ch.url.as_str(), ch.user.as_deref()), ("http://127.0.0.1:8123", Some("holdfast_tailer")));
        let a = c.archive.as_ref().expect("[archive]");
        assert_eq!((a.bucket.as_str(), a.retention, a.require_object_lock), ("holdfast-force", crate::sinks::DEFAULT_RETENTION, true));
        // Only the credential files, absent here, are problems.
        let p = c.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p.iter().all(|p| p.contains("_file = \"/run/credentials/")), "{p:?}");
    }

    #[test]
    fn a_config_with_both_sinks_parses_checks_and_renders() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (pw, key_id, secret) = (dir.path().join("pw"), dir.path().join("key-id"), dir.path().join("secret"));
        for f in [&pw, &key_id, &secret] {
            std::fs::write(f, "x\n").unwrap();
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let text = format!(
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\
             [clickhouse]\nurl = \"http://127.0.0.1:8123\"\nuser = \"audit\"\npassword_file = {pw:?}\n\
             [archive]\nendpoint = \"http://127.0.0.1:7070\"\nbucket = \"force-archive\"\nallow_http = true\n\
             access_key_id_file = {key_id:?}\nsecret_access_key_file = {secret:?}\nretention = \"10d\"\n"
        );
        let c: TailerConfig = toml::from_str(&text).unwrap();
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let ch = c.clickhouse.clone().unwrap();
        assert_eq!(
            (ch.database.as_str(), ch.table.as_str(), ch.password_file.as_deref()),
            ("holdfast", "audit_events", Some(pw.as_path()))
        );
        assert_eq!(ch.password().unwrap().as_deref(), Some("x"));
        let a = c.archive.clone().unwrap();
        assert_eq!((a.prefix.as_str(), a.retention, a.allow_http), ("holdfast/", Duration::from_secs(10 * 86400), true));
        let rendered = c.to_toml().unwrap();
        let back: TailerConfig = toml::from_str(&rendered).unwrap();
        assert_eq!((back.clickhouse, back.archive), (Some(ch), Some(a)), "{rendered}");
        // No sinks: nothing rendered for them.
        assert!(!TailerConfig::new(c.etcd.clone()).to_toml().unwrap().contains("clickhouse"));

        // Their problems are the tailer config's, all in one pass.
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut bad = c.clone();
        bad.clickhouse.as_mut().unwrap().table = "a-b".into();
        let p = bad.problems().join("\n");
        assert!(p.contains("clickhouse.table") && p.contains("archive.secret_access_key_file") && p.contains("world-readable"), "{p}");
        let err = toml::from_str::<TailerConfig>(
            "[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n[clickhouse]\nurl = \"http://x\"\npassword = \"pw\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("password_file"), "{err}");
    }
}
