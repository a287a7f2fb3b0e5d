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

pub(crate) fn default_request_timeout() -> Duration {
    Duration::from_secs(5)
}
