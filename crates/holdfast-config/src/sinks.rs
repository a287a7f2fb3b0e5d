//! The `[clickhouse]` and `[archive]` tables of `tailer.toml`: the audit
//! sinks an operator can turn on beside the embedded store.
//!
//! The sinks themselves live in `holdfast-audit-sinks` (which the tailer
//! links); their configs live here, so `holdfastctl` and `holdfast-tailer
//! check` validate a `tailer.toml` without linking an HTTP or S3 client.
//! Secrets are never inline: `*_file` keys, refused if world-readable.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `[clickhouse]` table of `tailer.toml`: audit events into a
/// ClickHouse table over its HTTP interface. No secret inside (the
/// password is in `password_file`), so `Debug` is derived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseConfig {
    /// Base URL of ClickHouse's HTTP interface, e.g. `http://127.0.0.1:8123`
    /// (`https://` is verified against the system's trust store).
    pub url: String,
    /// The database; created if missing. Letters, digits and `_`.
    #[serde(default = "default_database")]
    pub database: String,
    /// The table; created if missing. Letters, digits and `_`.
    #[serde(default = "default_table")]
    pub table: String,
    /// The ClickHouse user (ClickHouse's own default, `default`, when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A file whose first line is that user's password; refused if
    /// world-readable (systemd: `LoadCredential=`, then the path under
    /// `/run/credentials/<unit>/`). Unset: no password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// How long one request (a batch's insert, a query) may take in all.
    #[serde(default = "default_clickhouse_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_database() -> String {
    "holdfast".into()
}
fn default_table() -> String {
    "audit_events".into()
}
fn default_clickhouse_timeout() -> Duration {
    Duration::from_secs(10)
}

impl ClickHouseConfig {
    /// A config for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        ClickHouseConfig {
            url: url.into(),
            database: default_database(),
            table: default_table(),
            user: None,
            password_file: None,
            timeout: default_clickhouse_timeout(),
        }
    }

    /// Checks that parsing cannot, each with its fix; empty when the config
    /// is usable. Reads the password file's permissions, not its content.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let url = self.url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            p.push(format!(
                "clickhouse.url = {:?}: must start with http:// or https:// (ClickHouse's HTTP interface, e.g. http://127.0.0.1:8123)",
                self.url
            ));
        } else if crate::etcd::plaintext_off_host(url) {
            p.push(format!("clickhouse.url = {:?} {}", self.url, crate::etcd::PLAINTEXT_OFF_HOST));
        } else if url.contains('?') || url.contains('#') || url.contains('@') {
            p.push(format!(
                "clickhouse.url = {:?}: give only scheme, host, port and path; credentials go in clickhouse.user and clickhouse.password_file",
                self.url
            ));
        }
        for (key, value, default) in [("database", &self.database, "holdfast"), ("table", &self.table, "audit_events")] {
            if !is_identifier(value) {
                p.push(format!(
                    "clickhouse.{key} = {value:?}: use letters, digits and _ only, not starting with a digit (default {default:?})"
                ));
            }
        }
        if self.password_file.is_some() && self.user.is_none() {
            p.push("clickhouse.password_file is set without clickhouse.user: name the user the password belongs to".into());
        }
        if let Some(path) = &self.password_file
            && let Some(problem) = secret_file_problem(path)
        {
            p.push(format!("clickhouse.password_file = {:?}: {problem}", path.display().to_string()));
        }
        if self.timeout < Duration::from_millis(100) || self.timeout > Duration::from_secs(600) {
            p.push("clickhouse.timeout must be between 100ms and 10m (default 10s)".into());
        }
        p
    }

    /// The password: the first line of `password_file` (its line ending
    /// removed, nothing else), `None` when unset. An empty file is an error.
    pub fn password(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.password_file else { return Ok(None) };
        let shown = path.display().to_string();
        if let Some(problem) = secret_file_problem(path) {
            return Err(format!("clickhouse.password_file = {shown:?}: {problem}"));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("clickhouse.password_file = {shown:?}: cannot read it: {e}"))?;
        match text.lines().next() {
            Some(line) if !line.is_empty() => Ok(Some(line.to_string())),
            _ => Err(format!(
                "clickhouse.password_file = {shown:?} is empty: put the password on its first line, \
                 or remove password_file for a user without a password"
            )),
        }
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The default archive retention: 2557 days, seven years of which two are
/// leap years.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(2557 * 24 * 3600);

/// The `[archive]` table of `tailer.toml`: force-release records into an
/// S3-compatible bucket under object lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveConfig {
    /// Base URL of the S3 API, `https://host[:port]`, e.g.
    /// `https://s3.eu-west-1.amazonaws.com`. Requests are path-style:
    /// `<endpoint>/<bucket>/<key>`. `https://` is verified against the
    /// system's trust store.
    pub endpoint: String,
    /// The bucket. It must exist: create it with object lock enabled.
    pub bucket: String,
    /// The region requests are signed for.
    #[serde(default = "default_region")]
    pub region: String,
    /// Prefix of every object key: empty, or ending in `/`.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// How long each object is locked, from when it is written.
    #[serde(default = "default_retention", with = "humantime_serde")]
    pub retention: Duration,
    /// A file holding the access key id. Unset: `AWS_ACCESS_KEY_ID` from
    /// the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id_file: Option<PathBuf>,
    /// A file holding the secret access key; refused if world-readable.
    /// Unset: `AWS_SECRET_ACCESS_KEY` from the environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key_file: Option<PathBuf>,
    /// Allow an `http://` endpoint. Requests are signed, so the secret is
    /// never sent, but the records travel in clear: for a store on loopback
    /// and tests only.
    #[serde(default)]
    pub allow_http: bool,
    /// Refuse to start when the bucket has no object lock, instead of
    /// warning and archiving without retention.
    #[serde(default)]
    pub require_object_lock: bool,
    /// How long one request may take in all.
    #[serde(default = "default_archive_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_region() -> String {
    "us-east-1".into()
}
fn default_prefix() -> String {
    "holdfast/".into()
}
fn default_retention() -> Duration {
    DEFAULT_RETENTION
}
fn default_archive_timeout() -> Duration {
    Duration::from_secs(30)
}

impl ArchiveConfig {
    /// A config for `bucket` at `endpoint` with every other key at its
    /// default.
    pub fn new(endpoint: impl Into<String>, bucket: impl Into<String>) -> Self {
        ArchiveConfig {
            endpoint: endpoint.into(),
            bucket: bucket.into(),
            region: default_region(),
            prefix: default_prefix(),
            retention: default_retention(),
            access_key_id_file: None,
            secret_access_key_file: None,
            allow_http: false,
            require_object_lock: false,
            timeout: default_archive_timeout(),
        }
    }

    /// Checks that parsing cannot, each with its fix; empty when the config
    /// is usable. Reads the key files' permissions, not the environment.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let endpoint = self.endpoint.trim();
        match endpoint.split_once("://") {
            Some(("https", rest)) | Some(("http", rest)) => {
                let authority = rest.strip_suffix('/').unwrap_or(rest);
                if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
                    p.push(format!(
                        "archive.endpoint = {:?}: give only scheme, host and port (the bucket goes in archive.bucket, \
                         credentials in the key files or the environment)",
                        self.endpoint
                    ));
                }
                if endpoint.starts_with("http://") && !self.allow_http {
                    p.push(format!(
                        "archive.endpoint = {:?} is plain HTTP: use https://, or set archive.allow_http = true for a store on loopback",
                        self.endpoint
                    ));
                }
            }
            _ => p.push(format!("archive.endpoint = {:?}: must start with https:// (or http:// with allow_http)", self.endpoint)),
        }
        let b = &self.bucket;
        let bucket_ok = (3..=63).contains(&b.len())
            && b.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'.' || c == b'-')
            && b.starts_with(|c: char| c.is_ascii_alphanumeric())
            && b.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !bucket_ok {
            p.push(format!("archive.bucket = {b:?}: an S3 bucket name is 3 to 63 lowercase letters, digits, '.' and '-'"));
        }
        if self.region.is_empty() || !self.region.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-') {
            p.push(format!("archive.region = {:?}: a region such as \"us-east-1\" (the default)", self.region));
        }
        let prefix_ok = self.prefix.is_empty()
            || (self.prefix.ends_with('/')
                && !self.prefix.starts_with('/')
                && !self.prefix.contains("//")
                && self.prefix.bytes().all(|c| c.is_ascii_alphanumeric() || b"/_.-".contains(&c)));
        if !prefix_ok {
            p.push(format!(
                "archive.prefix = {:?}: empty, or letters, digits, '_', '.', '-' and '/' ending in '/' (default \"holdfast/\")",
                self.prefix
            ));
        }
        if self.retention < Duration::from_secs(24 * 3600) || self.retention > Duration::from_secs(36500 * 24 * 3600) {
            p.push("archive.retention must be between 1d and 36500d (default 2557d, seven years)".into());
        }
        if self.timeout < Duration::from_secs(1) || self.timeout > Duration::from_secs(600) {
            p.push("archive.timeout must be between 1s and 10m (default 30s)".into());
        }
        if let Some(path) = &self.access_key_id_file
            && let Err(e) = std::fs::metadata(path)
        {
            p.push(format!("archive.access_key_id_file = {:?}: {e}", path.display().to_string()));
        }
        if let Some(path) = &self.secret_access_key_file
            && let Some(problem) = secret_file_problem(path)
        {
            p.push(format!("archive.secret_access_key_file = {:?}: {problem}", path.display().to_string()));
        }
        p
    }

    /// `s3://bucket/prefix at endpoint`: no credentials.
    pub fn describe(&self) -> String {
        format!("s3://{}/{} at {}", self.bucket, self.prefix, self.endpoint.trim().trim_end_matches('/'))
    }
}

/// Why a secret file cannot be used, if it cannot: it must exist and must
/// not be readable by other users.
pub fn secret_file_problem(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(e) => Some(e.to_string()),
        Ok(m) if m.permissions().mode() & 0o004 != 0 => {
            Some(format!("is world-readable (mode {:o}); run `chmod o-rwx {}`", m.permissions().mode() & 0o777, path.display()))
        }
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write_mode(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_clickhouse_table_takes_defaults_and_refuses_unknown_keys() {
        let c: ClickHouseConfig = toml::from_str("url = \"http://127.0.0.1:8123\"").unwrap();
        assert_eq!(c, ClickHouseConfig::new("http://127.0.0.1:8123"));
        assert_eq!((c.database.as_str(), c.table.as_str(), c.timeout), ("holdfast", "audit_events", Duration::from_secs(10)));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert_eq!(c.password(), Ok(None));
        let c: ClickHouseConfig =
            toml::from_str("url = \"https://ch:8443\"\ntimeout = \"30s\"\nuser = \"audit\"\npassword_file = \"/run/credentials/pw\"")
                .unwrap();
        assert_eq!(c.timeout, Duration::from_secs(30));
        let text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<ClickHouseConfig>(&text).unwrap(), c);
        let err = toml::from_str::<ClickHouseConfig>("url = \"http://x\"\ntabel = \"t\"").unwrap_err().to_string();
        assert!(err.contains("tabel"), "{err}");
        // An inline password is not a key.
        let err = toml::from_str::<ClickHouseConfig>("url = \"http://x\"\npassword = \"pw\"").unwrap_err().to_string();
        assert!(err.contains("password") && err.contains("password_file"), "{err}");
    }

    #[test]
    fn bad_clickhouse_values_are_each_reported_with_their_key() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("pw");
        write_mode(&open, "secret\n", 0o644);
        let mut c = ClickHouseConfig::new("127.0.0.1:8123");
        c.table = "audit-events".into();
        c.database = "1db".into();
        c.password_file = Some(open.clone());
        c.timeout = Duration::ZERO;
        let p = c.problems().join("\n");
        for needle in
            ["clickhouse.url", "clickhouse.table", "clickhouse.database", "without clickhouse.user", "world-readable", "clickhouse.timeout"]
        {
            assert!(p.contains(needle), "{needle} not in {p}");
        }
        assert!(c.password().unwrap_err().contains("world-readable"));
        assert!(!ClickHouseConfig::new("http://u:p@host:8123").problems().is_empty());
        // Plain http:// only on loopback; https:// anywhere.
        let remote = ClickHouseConfig::new("http://clickhouse.example:8123").problems().join("\n");
        assert!(remote.contains("is plain http:// to a host off this machine"), "{remote}");
        assert!(ClickHouseConfig::new("https://clickhouse.example:8443").problems().is_empty());
        assert!(ClickHouseConfig::new("http://127.0.0.1:8123").problems().is_empty());
    }

    #[test]
    fn the_clickhouse_password_is_the_first_line_of_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        write_mode(&path, " pass word \nignored\n", 0o600);
        let mut c = ClickHouseConfig::new("http://127.0.0.1:8123");
        c.user = Some("audit".into());
        c.password_file = Some(path.clone());
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert_eq!(c.password().unwrap().as_deref(), Some(" pass word "));
        assert!(!format!("{c:?}").contains("pass word"));
        write_mode(&path, "\n", 0o600);
        assert!(c.password().unwrap_err().contains("is empty"));
        c.password_file = Some(dir.path().join("missing"));
        assert!(c.problems().join("\n").contains("clickhouse.password_file"));
    }

    #[test]
    fn an_archive_table_takes_defaults_and_names_its_problems() {
        let c: ArchiveConfig = toml::from_str("endpoint = \"https://s3.eu-west-1.amazonaws.com\"\nbucket = \"holdfast-force\"").unwrap();
        assert_eq!(c, ArchiveConfig::new("https://s3.eu-west-1.amazonaws.com", "holdfast-force"));
        assert_eq!((c.region.as_str(), c.prefix.as_str(), c.retention), ("us-east-1", "holdfast/", DEFAULT_RETENTION));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        assert_eq!(c.describe(), "s3://holdfast-force/holdfast/ at https://s3.eu-west-1.amazonaws.com");
        let text = toml::to_string(&c).unwrap();
        assert_eq!(toml::from_str::<ArchiveConfig>(&text).unwrap(), c, "{text}");
        let e = toml::from_str::<ArchiveConfig>("endpoint = \"https://s3\"\nbucket = \"b-1\"\nretention_days = 7").unwrap_err().to_string();
        assert!(e.contains("retention_days"), "{e}");

        let mut c = ArchiveConfig::new("http://127.0.0.1:9", "Bad_Bucket");
        c.prefix = "/holdfast".into();
        c.retention = Duration::from_secs(3600);
        let p = c.problems().join("\n");
        for needle in ["archive.endpoint", "allow_http", "archive.bucket", "archive.prefix", "archive.retention"] {
            assert!(p.contains(needle), "{needle} not in {p}");
        }
    }
}
