//! `arbiter.toml`: the arbiter's configuration.
//!
//! Every field is documented here; `config/arbiter.toml` is the annotated
//! example and is parsed by a test. Errors name the file, the key and the fix,
//! and every error is reported in one pass.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_PATH: &str = "/etc/holdfast/arbiter.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArbiterConfig {
    /// Address the lock.v1 gRPC server listens on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Address of the Prometheus text endpoint (`GET /metrics`, plain HTTP).
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: SocketAddr,
    /// The `cluster` label value on every metric.
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    /// Server certificate and the CA that client certificates must chain to.
    pub tls: TlsConfig,
    /// The etcd cluster holding the lock key space.
    pub etcd: EtcdConfig,
    /// Restore detection.
    #[serde(default)]
    pub seal: SealConfig,
    /// How waiters learn that a key was released.
    #[serde(default)]
    pub waiters: WaitersConfig,
    /// How grant transactions are sent.
    #[serde(default)]
    pub grants: GrantsConfig,
    /// Deliberately broken behaviour, for proving that the correctness gate
    /// catches it. Exists only in debug (test) builds: a release build
    /// refuses the `[mutation]` table as an unknown key.
    #[cfg(debug_assertions)]
    #[serde(default)]
    pub mutation: MutationConfig,
    /// How long to let in-flight calls finish after SIGTERM.
    #[serde(default = "default_drain", with = "humantime_serde")]
    pub drain_timeout: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM server certificate chain presented to clients.
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`. Must not be world-readable.
    pub key_file: PathBuf,
    /// PEM CA bundle; every client must present a certificate from it that
    /// carries exactly one `spiffe://` URI SAN.
    pub client_ca_file: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of every member (list all of them: restore detection asks
    /// each member and needs a majority to answer).
    pub endpoints: Vec<String>,
    /// Time allowed for one etcd call before it counts as failed.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// PEM CA that signed the etcd server certificates (for https endpoints).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd, if etcd requires one.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// Key of `cert_file`. Must not be world-readable.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealConfig {
    /// How often the arbiter re-checks the epoch record and the etcd log
    /// position of every member (and pings the systemd watchdog).
    #[serde(default = "default_check_interval", with = "humantime_serde")]
    pub check_interval: Duration,
    /// How often the arbiter raises the log-offset watermark.
    #[serde(default = "default_watermark_interval", with = "humantime_serde")]
    pub watermark_interval: Duration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitersConfig {
    /// Watch a held key for its release (a hint; every grant is still a full
    /// transaction). Off: waiters only poll, once a second.
    #[serde(default = "default_true")]
    pub watch: bool,
}

/// Test-build-only mutations of the arbiter (see `[mutation]`).
#[cfg(debug_assertions)]
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MutationConfig {
    /// Release deletes the hold key without checking its create revision
    /// and lease (the bug etcd #22082 describes): a stale release can end a
    /// newer holder's hold.
    #[serde(default)]
    pub release_unguarded: bool,
    /// The grant transaction does not compare `/sys/epoch`.
    #[serde(default)]
    pub no_epoch_compare: bool,
    /// Tokens come from a local counter instead of the commit revision.
    #[serde(default)]
    pub token_from_counter: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsConfig {
    /// Fold concurrent grants for different keys into one etcd transaction
    /// of nested sub-transactions. Tokens stay unique per key but two keys
    /// can carry equal tokens. Off by default.
    #[serde(default)]
    pub group_commit: bool,
}

impl Default for WaitersConfig {
    fn default() -> Self {
        WaitersConfig { watch: true }
    }
}

fn default_true() -> bool {
    true
}

impl Default for SealConfig {
    fn default() -> Self {
        SealConfig { check_interval: default_check_interval(), watermark_interval: default_watermark_interval() }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7420))
}
fn default_metrics_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7421))
}
fn default_cluster_name() -> String {
    "default".into()
}
fn default_drain() -> Duration {
    Duration::from_secs(10)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_check_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_watermark_interval() -> Duration {
    Duration::from_secs(10)
}

/// Every problem found in a config file, each naming the key and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {} problem(s); refusing to start until fixed:\n  - {}", .problems.len(), .problems.join("\n  - "))]
pub struct ConfigError {
    pub path: String,
    pub problems: Vec<String>,
}

impl ArbiterConfig {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let err = |problems: Vec<String>| ConfigError { path: path.display().to_string(), problems };
        let text = std::fs::read_to_string(path).map_err(|e| {
            err(vec![format!("cannot read the file ({e}); pass --config FILE or create {DEFAULT_PATH}")])
        })?;
        let config: ArbiterConfig = toml::from_str(&text).map_err(|e| err(vec![e.to_string().trim().to_string()]))?;
        let problems = config.problems();
        if problems.is_empty() { Ok(config) } else { Err(err(problems)) }
    }

    /// Checks that parse cannot: files exist, secrets are private, values sane.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (key, file) in [
            ("tls.cert_file", Some(&self.tls.cert_file)),
            ("tls.client_ca_file", Some(&self.tls.client_ca_file)),
            ("etcd.ca_file", self.etcd.ca_file.as_ref()),
            ("etcd.cert_file", self.etcd.cert_file.as_ref()),
        ] {
            if let Some(file) = file {
                if let Err(e) = std::fs::metadata(file) {
                    p.push(format!("{key} = {:?}: {e}; point it at a PEM file", file.display().to_string()));
                }
            }
        }
        for (key, file) in [("tls.key_file", Some(&self.tls.key_file)), ("etcd.key_file", self.etcd.key_file.as_ref())] {
            if let Some(file) = file {
                if let Some(problem) = secret_file_problem(file) {
                    p.push(format!("{key} = {:?}: {problem}", file.display().to_string()));
                }
            }
        }
        if self.etcd.cert_file.is_some() != self.etcd.key_file.is_some() {
            p.push("etcd.cert_file and etcd.key_file go together; set both or neither".into());
        }
        if self.etcd.endpoints.is_empty() {
            p.push("etcd.endpoints is empty; list the client URL of every etcd member, e.g. [\"https://10.0.0.1:2379\"]".into());
        }
        for e in &self.etcd.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                p.push(format!("etcd.endpoints: {e:?} needs a scheme, e.g. \"https://{e}\""));
            }
        }
        if self.etcd.request_timeout < Duration::from_millis(100) {
            p.push("etcd.request_timeout is below 100ms; etcd cannot commit that fast under load".into());
        }
        if self.seal.check_interval < Duration::from_millis(100) || self.seal.check_interval > Duration::from_secs(30) {
            p.push("seal.check_interval must be between 100ms and 30s (default 1s)".into());
        }
        p
    }
}

/// A secret file must exist and must not be readable by other users.
pub fn secret_file_problem(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(e) => Some(format!("{e}; point it at the PEM private key")),
        Ok(m) if m.permissions().mode() & 0o004 != 0 => Some(format!(
            "is world-readable (mode {:o}); run `chmod o-rwx {}`",
            m.permissions().mode() & 0o777,
            path.display()
        )),
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../../config/arbiter.toml");
        let c: ArbiterConfig = toml::from_str(text).expect("config/arbiter.toml parses");
        assert_eq!(c.etcd.endpoints.len(), 3);
        assert_eq!(c.seal.check_interval, Duration::from_secs(1));
    }

    #[test]
    fn unknown_and_renamed_keys_are_named() {
        let err = toml::from_str::<ArbiterConfig>(
            "listen = \"127.0.0.1:1\"\n[tls]\ncert_file=\"a\"\nkey_file=\"b\"\nclient_ca_file=\"c\"\n[etcd]\nendpoint = [\"http://x:1\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("endpoint"), "{err}");
        assert!(err.contains("endpoints"), "the message names the expected key: {err}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let c: ArbiterConfig = toml::from_str(
            "[tls]\ncert_file=\"/nonexistent/a\"\nkey_file=\"/nonexistent/b\"\nclient_ca_file=\"/nonexistent/c\"\n[etcd]\nendpoints = [\"x:1\"]\n",
        )
        .unwrap();
        let p = c.problems();
        assert!(p.iter().any(|m| m.starts_with("tls.cert_file")), "{p:?}");
        assert!(p.iter().any(|m| m.starts_with("tls.key_file")), "{p:?}");
        assert!(p.iter().any(|m| m.starts_with("tls.client_ca_file")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("needs a scheme")), "{p:?}");
    }
}
