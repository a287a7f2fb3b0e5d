//! The `[etcd]` section every holdfast daemon and tool shares: where the
//! members are and how to authenticate to them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of every member (list all of them: restore detection asks
    /// each member and needs a majority to answer).
    pub endpoints: Vec<String>,
    /// Time allowed for one etcd call before it counts as failed.
    #[serde(default = "default_request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// PEM CA that signed the etcd server certificates (for https endpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd, if etcd requires one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Key of `cert_file`. Must not be world-readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl EtcdConfig {
    /// Plain-HTTP endpoints with the default timeout and no credentials.
    pub fn plain(endpoints: Vec<String>) -> Self {
        EtcdConfig { endpoints, request_timeout: default_request_timeout(), ca_file: None, cert_file: None, key_file: None }
    }
}

impl EtcdConfig {
    /// Checks that parse cannot, each message naming the `etcd.` key and the
    /// fix: certificate files exist, the key is private, endpoints have a
    /// scheme, the timeout is sane.
    pub fn problems(&self) -> Vec<String> {
        self.problems_in("etcd")
    }

    /// [`EtcdConfig::problems`] for the section named `section` (`etcd`,
    /// `coord`).
    pub fn problems_in(&self, section: &str) -> Vec<String> {
        let mut p = Vec::new();
        let (ca, cert) = (format!("{section}.ca_file"), format!("{section}.cert_file"));
        for (key, file) in [(ca.as_str(), self.ca_file.as_ref()), (cert.as_str(), self.cert_file.as_ref())] {
            if let Some(file) = file
                && let Err(e) = std::fs::metadata(file)
            {
                p.push(format!("{key} = {:?}: {e}; point it at a PEM file", file.display().to_string()));
            }
        }
        if let Some(file) = &self.key_file
            && let Some(problem) = crate::arbiter::secret_file_problem(file)
        {
            p.push(format!("{section}.key_file = {:?}: {problem}", file.display().to_string()));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            p.push(format!("{section}.cert_file and {section}.key_file go together; set both or neither"));
        }
        if self.endpoints.is_empty() {
            p.push(format!("{section}.endpoints is empty; list the client URL of every etcd member, e.g. [\"https://10.0.0.1:2379\"]"));
        }
        for e in &self.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                p.push(format!("{section}.endpoints: {e:?} needs a scheme, e.g. \"https://{e}\""));
            } else if plaintext_off_host(e) {
                p.push(format!("{section}.endpoints: {e:?} {PLAINTEXT_OFF_HOST}"));
            }
        }
        if self.request_timeout < Duration::from_millis(100) {
            p.push(format!("{section}.request_timeout is below 100ms; etcd cannot commit that fast under load"));
        }
        p
    }
}

/// Why a plain `http://` URL to another host is refused (etcd's and
/// ClickHouse's): the rest of the sentence after the URL.
pub const PLAINTEXT_OFF_HOST: &str = "is plain http:// to a host off this machine: credentials, and revisions from which tokens \
     follow, would cross the network in clear; use https:// (plain http:// is accepted on loopback only, where \
     holdfastctl dev and the tests run)";

/// Whether `url` is plain `http://` to a host that is not loopback
/// (`localhost`, 127.0.0.0/8, `::1`).
pub fn plaintext_off_host(url: &str) -> bool {
    let Some(rest) = url.trim().strip_prefix("http://") else { return false };
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    };
    !(host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

pub(crate) fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

    use super::*;

    #[test]
    fn plain_http_is_refused_off_loopback_only() {
        for off in
            ["http://10.0.0.1:2379", "http://etcd-a1:2379", "http://[2001:db8::1]:2379/", "http://u:p@10.0.0.1:8123", "http://8.8.8.8"]
        {
            assert!(plaintext_off_host(off), "{off}");
        }
        for ok in
            ["http://127.0.0.1:2379", "http://127.3.4.5:2379/x", "http://localhost:2379", "http://[::1]:2379", "https://10.0.0.1:2379"]
        {
            assert!(!plaintext_off_host(ok), "{ok}");
        }
        let mut c = EtcdConfig::plain(vec!["http://127.0.0.1:2379".into()]);
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        c.endpoints.push("http://10.0.0.2:2379".into());
        let p = c.problems().join("\n");
        assert!(p.contains("etcd.endpoints: \"http://10.0.0.2:2379\" is plain http:// to a host off this machine"), "{p}");
        assert!(p.contains("use https://"), "{p}");
    }
}
