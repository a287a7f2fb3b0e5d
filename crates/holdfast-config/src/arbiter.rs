//! `arbiter.toml`: the arbiter's configuration.
//!
//! Every field is documented here; `config/arbiter.toml` is the annotated
//! example and is parsed by a test. Errors name the file, the key and the fix,
//! and every error is reported in one pass.

use crate::etcd::EtcdConfig;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_PATH: &str = "/etc/holdfast/arbiter.toml";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArbiterConfig {
    /// Address the lock.v1 gRPC server listens on.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Address of the Prometheus text endpoint (`GET /metrics`, plain HTTP).
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: SocketAddr,
    /// The `cluster` label value on every metric, and the name under which
    /// this arbiter records the epochs it served (an advance request names
    /// the cluster the same way).
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    /// The arbiter's own state: `served-epochs.json`, the highest epoch it
    /// served per cluster, fsync'd before the first grant of each epoch. It
    /// must survive restarts and reinstalls of the package; losing it
    /// removes one of the guards against reissuing tokens after a restore.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The region this arbiter serves (a class's `home_region`). Keys of a
    /// class homed elsewhere are refused with a typed error naming their
    /// region. Leave it out when there is one region: every class is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Server certificate and the CA that client certificates must chain to.
    pub tls: TlsConfig,
    /// The etcd cluster holding the lock key space (the entity cluster).
    pub etcd: EtcdConfig,
    /// The coord cluster, where the controller publishes the class set
    /// (`/sys/policy`) and epochs are allocated. Left out: the `[etcd]`
    /// cluster serves both tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coord: Option<EtcdConfig>,
    /// The name the `[coord]` cluster's epochs are recorded under (in
    /// `served-epochs.json` and `ServerStatus`; an advance of that cluster
    /// names it the same way). Default "coord". Only with a `[coord]` of
    /// its own: without one, `cluster_name` names the one cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coord_cluster_name: Option<String>,
    /// Restore detection.
    #[serde(default)]
    pub seal: SealConfig,
    /// How waiters learn that a key was released.
    #[serde(default)]
    pub waiters: WaitersConfig,
    /// How grant transactions are sent.
    #[serde(default)]
    pub grants: GrantsConfig,
    /// Per-identity request rate and quotas on sessions and holds.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// What classes with `on_quorum_loss = "open"` do while etcd cannot be
    /// reached: when that starts, and how much may be spooled.
    #[serde(default)]
    pub fail_open: FailOpenConfig,
    /// Deliberately broken behaviour, for proving that the correctness gate
    /// catches it. Only an arbiter built with the `mutations` cargo feature
    /// (test builds) acts on it; any other arbiter refuses to start when a
    /// flag here is on.
    #[serde(default, skip_serializing_if = "MutationConfig::is_off")]
    pub mutation: MutationConfig,
    /// How long to let in-flight calls finish after SIGTERM.
    #[serde(default = "default_drain", with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// Span export over OTLP (OpenTelemetry). Off unless `otlp_endpoint` is set.
    #[serde(default)]
    pub tracing: TracingConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// Base URL of an OpenTelemetry collector's OTLP receiver, plain `http://`
    /// (e.g. a collector agent on the same host, which forwards with TLS).
    /// For http/protobuf `/v1/traces` is appended unless the URL has a path.
    /// Absent: nothing is exported and no connection is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (OTLP/HTTP, port 4318 by convention) or `grpc`
    /// (OTLP/gRPC, port 4317).
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// The `service.name` resource attribute of every span.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Fraction of traces recorded and exported, from 0.0 to 1.0.
    #[serde(default = "default_sampling_ratio")]
    pub sampling_ratio: f64,
    /// Time allowed for one export request.
    #[serde(default = "default_export_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            protocol: OtlpProtocol::default(),
            service_name: default_service_name(),
            sampling_ratio: default_sampling_ratio(),
            timeout: default_export_timeout(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM server certificate chain presented to clients.
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`. Must not be world-readable.
    pub key_file: PathBuf,
    /// PEM CA bundle; every client must present a certificate from it that
    /// carries exactly one `spiffe://` URI SAN.
    pub client_ca_file: PathBuf,
    /// The SPIFFE trust domain of the workloads (`example.org` in
    /// `spiffe://example.org/...`): an SVID of any other domain is refused,
    /// even from a CA in `client_ca_file`.
    pub trust_domain: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailOpenConfig {
    /// How long a cluster must have been out of reach (no verified serve
    /// state: etcd unanswered, or fewer than a majority of members answering)
    /// before keys of its `open` classes are granted from memory with token
    /// 0. Every other class is refused throughout, as before the bound.
    /// From 1s to 1h (docs/policy.md, "Fail-open").
    #[serde(default = "default_fail_open_after", with = "humantime_serde")]
    pub after: Duration,
    /// The most the spool of unprotected grants and releases
    /// (`<state_dir>/unprotected.spool`) may hold. When the next record
    /// would not fit, open-class grants are refused (nothing spooled is
    /// dropped) until the spool has been shipped to the audit store.
    #[serde(default = "default_spool_max_bytes")]
    pub spool_max_bytes: u64,
}

impl Default for FailOpenConfig {
    fn default() -> Self {
        FailOpenConfig { after: default_fail_open_after(), spool_max_bytes: default_spool_max_bytes() }
    }
}

fn default_fail_open_after() -> Duration {
    Duration::from_secs(10)
}

fn default_spool_max_bytes() -> u64 {
    64 << 20
}

impl FailOpenConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.after < Duration::from_secs(1) || self.after > Duration::from_secs(3600) {
            p.push(format!(
                "fail_open.after = {} must be between 1s and 1h (default 10s): shorter would grant without a majority on a passing \
                 leader election",
                humantime::format_duration(self.after)
            ));
        }
        if self.spool_max_bytes < 4096 {
            p.push(format!(
                "fail_open.spool_max_bytes = {} is under 4096, too small for one record; leave it out for the default (64 MiB) or set 4096 or more",
                self.spool_max_bytes
            ));
        }
        p
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitersConfig {
    /// Watch a held key for its release (a hint; every grant is still a full
    /// transaction). Off: waiters only poll, once a second.
    #[serde(default = "default_true")]
    pub watch: bool,
}

/// The names `[mutation]` takes (one per field of [`MutationConfig`]).
pub const MUTATION_NAMES: [&str; 11] = [
    "release_unguarded",
    "no_epoch_compare",
    "no_session_compare",
    "token_from_counter",
    "no_withdrawal_marker",
    "no_seal_check",
    "no_keepalive_confirmation",
    "no_deposed_leader_check",
    "forget_served_epochs",
    "fail_open_any_class",
    "no_drain_compare",
];

/// Test-build-only mutations of the arbiter (see `[mutation]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// The grant transaction does not compare the session record
    /// `/s/<lease>`: a session whose record is gone (closed, or ended by an
    /// epoch advance) but whose lease still lives can receive grants.
    #[serde(default)]
    pub no_session_compare: bool,
    /// Tokens come from a local counter instead of the commit revision.
    #[serde(default)]
    pub token_from_counter: bool,
    /// A withdrawn grant's hold is deleted without the marker that names it
    /// in etcd's log (`/sys/withdrawn/...`).
    #[serde(default)]
    pub no_withdrawal_marker: bool,
    /// Restore detection off: a rewound log (offset below the floor, or a
    /// grant at a revision already seen) does not seal the arbiter.
    #[serde(default)]
    pub no_seal_check: bool,
    /// A keepalive counts as soon as etcd answers it with a TTL, without the
    /// quorum read that confirms the answering leader's Raft term (etcd
    /// #15247: a leader whose disk stalls keeps renewing leases after a new
    /// leader was elected and let them expire).
    #[serde(default)]
    pub no_keepalive_confirmation: bool,
    /// A keepalive answered in a new Raft term counts at once, without
    /// waiting until every etcd member answers in that term: a deposed
    /// leader that stopped, and wakes with the lease expiries it had, can
    /// revoke leases whose renewals the clients were told count.
    #[serde(default)]
    pub no_deposed_leader_check: bool,
    /// The arbiter ignores its record of the epochs it served
    /// (`STATE_DIR/served-epochs.json`): an epoch record a restore brought
    /// back, or an epoch minted again, is served as if new.
    #[serde(default)]
    pub forget_served_epochs: bool,
    /// Fail-open grants every class from memory once etcd is out of reach,
    /// not only those with `on_quorum_loss = "open"`: a correctness class
    /// gets token-0 grants without a majority.
    #[serde(default)]
    pub fail_open_any_class: bool,
    /// The grant transaction does not compare the key's drain markers
    /// (`/sys/drain/...`): a range moving off this cluster is still granted
    /// here after the move's wait for its holds began.
    #[serde(default)]
    pub no_drain_compare: bool,
}

impl MutationConfig {
    /// No mutation is on (the config of every real arbiter).
    pub fn is_off(&self) -> bool {
        self.on().is_empty()
    }

    /// Turns one mutation on by its name (as in `[mutation]`).
    pub fn set(&mut self, name: &str) -> Result<(), String> {
        let flag = match name {
            "release_unguarded" => &mut self.release_unguarded,
            "no_epoch_compare" => &mut self.no_epoch_compare,
            "no_session_compare" => &mut self.no_session_compare,
            "token_from_counter" => &mut self.token_from_counter,
            "no_withdrawal_marker" => &mut self.no_withdrawal_marker,
            "no_seal_check" => &mut self.no_seal_check,
            "no_keepalive_confirmation" => &mut self.no_keepalive_confirmation,
            "no_deposed_leader_check" => &mut self.no_deposed_leader_check,
            "forget_served_epochs" => &mut self.forget_served_epochs,
            "fail_open_any_class" => &mut self.fail_open_any_class,
            "no_drain_compare" => &mut self.no_drain_compare,
            _ => return Err(format!("no mutation {name:?}; the mutations are {}", MUTATION_NAMES.join(", "))),
        };
        *flag = true;
        Ok(())
    }

    /// The names of the mutations that are on.
    pub fn on(&self) -> Vec<&'static str> {
        [
            (self.release_unguarded, "release_unguarded"),
            (self.no_epoch_compare, "no_epoch_compare"),
            (self.no_session_compare, "no_session_compare"),
            (self.token_from_counter, "token_from_counter"),
            (self.no_withdrawal_marker, "no_withdrawal_marker"),
            (self.no_seal_check, "no_seal_check"),
            (self.no_keepalive_confirmation, "no_keepalive_confirmation"),
            (self.no_deposed_leader_check, "no_deposed_leader_check"),
            (self.forget_served_epochs, "forget_served_epochs"),
            (self.fail_open_any_class, "fail_open_any_class"),
            (self.no_drain_compare, "no_drain_compare"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsConfig {
    /// Fold concurrent grants and releases for different keys into one etcd
    /// transaction of nested sub-transactions. Tokens stay unique per key
    /// but two keys can carry equal tokens. Off by default.
    #[serde(default)]
    pub group_commit: bool,
}

/// `[limits]`: what one workload may take. Refusals are `ResourceExhausted`
/// with a typed reason (`RATE_LIMITED`, `QUOTA`) and a message naming the
/// limit's key; nothing is written to etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests one identity may make per second on this arbiter, sustained
    /// (a token bucket in this process; keepalive renewals on an open stream
    /// are not counted: the session quota bounds them).
    #[serde(default = "default_requests_per_second")]
    pub requests_per_second: u32,
    /// Requests one identity may make at once after a quiet period.
    #[serde(default = "default_request_burst")]
    pub request_burst: u32,
    /// Sessions one identity may have open in the cluster (a session is not
    /// bound to a namespace, so this quota is per identity).
    #[serde(default = "default_sessions_per_identity")]
    pub max_sessions_per_identity: u64,
    /// Holds one identity may have in the cluster.
    #[serde(default = "default_holds_per_identity")]
    pub max_holds_per_identity: u64,
    /// Holds in one namespace, in the cluster, unless `namespaces` says
    /// otherwise for it.
    #[serde(default = "default_holds_per_namespace")]
    pub max_holds_per_namespace: u64,
    /// Durable waiters (of classes with `fairness = "durable"`) queued in
    /// one namespace, in the cluster: each costs two consensus writes, a
    /// prefix read and watches while it waits.
    #[serde(default = "default_durable_waiters_per_namespace")]
    pub max_durable_waiters_per_namespace: u64,
    /// Open client connections (TLS or still handshaking), in total and
    /// from one source address. Past either, a new connection is closed
    /// before its handshake: no gRPC status can be sent before TLS, and
    /// answering one would cost the handshake being limited.
    #[serde(default = "default_connections")]
    pub max_connections: u32,
    /// Open client connections from one source address (see
    /// `max_connections`).
    #[serde(default = "default_connections_per_address")]
    pub max_connections_per_address: u32,
    /// TLS handshakes started per second, in total and per source address
    /// (token buckets with a burst of one second's worth).
    #[serde(default = "default_handshakes_per_second")]
    pub handshakes_per_second: u32,
    /// TLS handshakes started per second from one source address (see
    /// `handshakes_per_second`).
    #[serde(default = "default_handshakes_per_second_per_address")]
    pub handshakes_per_second_per_address: u32,
    /// After this long a connection is asked to go away (HTTP/2 GOAWAY; its
    /// calls get another minute to finish), so the client reconnects and
    /// its certificate is checked again against the CA bundle in force.
    #[serde(default = "default_connection_age", with = "humantime_serde")]
    pub max_connection_age: Duration,
    /// Per-namespace overrides: `[limits.namespaces.payments] max_holds = 500`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub namespaces: std::collections::BTreeMap<String, NamespaceLimits>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceLimits {
    /// Holds in this namespace, in the cluster.
    pub max_holds: u64,
}

impl LimitsConfig {
    /// The hold quota of `namespace`.
    pub fn max_holds_in(&self, namespace: &str) -> u64 {
        self.namespaces.get(namespace).map_or(self.max_holds_per_namespace, |n| n.max_holds)
    }

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let positive = [
            ("limits.requests_per_second", u64::from(self.requests_per_second)),
            ("limits.request_burst", u64::from(self.request_burst)),
            ("limits.max_sessions_per_identity", self.max_sessions_per_identity),
            ("limits.max_holds_per_identity", self.max_holds_per_identity),
            ("limits.max_holds_per_namespace", self.max_holds_per_namespace),
            ("limits.max_durable_waiters_per_namespace", self.max_durable_waiters_per_namespace),
            ("limits.max_connections", u64::from(self.max_connections)),
            ("limits.max_connections_per_address", u64::from(self.max_connections_per_address)),
            ("limits.handshakes_per_second", u64::from(self.handshakes_per_second)),
            ("limits.handshakes_per_second_per_address", u64::from(self.handshakes_per_second_per_address)),
        ];
        for (key, v) in positive {
            if v == 0 {
                p.push(format!("{key} = 0 would refuse everything; leave it out for the default or set at least 1"));
            }
        }
        if self.max_connection_age < Duration::from_secs(60) {
            p.push(format!(
                "limits.max_connection_age = {} is under a minute: clients would reconnect constantly; set 1m or more (default 1h)",
                humantime::format_duration(self.max_connection_age)
            ));
        }
        for (ns, n) in &self.namespaces {
            if n.max_holds == 0 {
                p.push(format!(
                    "limits.namespaces.{ns}.max_holds = 0 would refuse every lock in {ns:?}; remove its grants instead, or set at least 1"
                ));
            }
        }
        p
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            requests_per_second: default_requests_per_second(),
            request_burst: default_request_burst(),
            max_sessions_per_identity: default_sessions_per_identity(),
            max_holds_per_identity: default_holds_per_identity(),
            max_holds_per_namespace: default_holds_per_namespace(),
            max_durable_waiters_per_namespace: default_durable_waiters_per_namespace(),
            max_connections: default_connections(),
            max_connections_per_address: default_connections_per_address(),
            handshakes_per_second: default_handshakes_per_second(),
            handshakes_per_second_per_address: default_handshakes_per_second_per_address(),
            max_connection_age: default_connection_age(),
            namespaces: Default::default(),
        }
    }
}

fn default_requests_per_second() -> u32 {
    2000
}
fn default_request_burst() -> u32 {
    4000
}
fn default_sessions_per_identity() -> u64 {
    1000
}
fn default_holds_per_identity() -> u64 {
    10_000
}
fn default_holds_per_namespace() -> u64 {
    50_000
}
fn default_durable_waiters_per_namespace() -> u64 {
    1000
}
fn default_connections() -> u32 {
    20_000
}
fn default_connections_per_address() -> u32 {
    2000
}
fn default_handshakes_per_second() -> u32 {
    2000
}
fn default_handshakes_per_second_per_address() -> u32 {
    500
}
fn default_connection_age() -> Duration {
    Duration::from_secs(3600)
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
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/holdfast/arbiter")
}

fn default_cluster_name() -> String {
    "default".into()
}
fn default_service_name() -> String {
    "holdfast-arbiter".into()
}
fn default_sampling_ratio() -> f64 {
    1.0
}
fn default_export_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_drain() -> Duration {
    Duration::from_secs(10)
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
    /// A config with every optional key at its default: what a launcher
    /// starts from before setting what it needs.
    pub fn new(tls: TlsConfig, etcd: EtcdConfig) -> Self {
        ArbiterConfig {
            listen: default_listen(),
            metrics_listen: default_metrics_listen(),
            cluster_name: default_cluster_name(),
            state_dir: default_state_dir(),
            region: None,
            tls,
            etcd,
            coord: None,
            coord_cluster_name: None,
            seal: SealConfig::default(),
            waiters: WaitersConfig::default(),
            grants: GrantsConfig::default(),
            limits: LimitsConfig::default(),
            fail_open: FailOpenConfig::default(),
            mutation: MutationConfig::default(),
            drain_timeout: default_drain(),
            tracing: TracingConfig::default(),
        }
    }

    /// The config as `arbiter.toml` text; [`ArbiterConfig::load`] reads it
    /// back unchanged.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// The coord cluster when it is another cluster than `[etcd]`: `None`
    /// when `[coord]` is left out or lists exactly `[etcd]`'s endpoints (one
    /// cluster serves both tiers).
    pub fn separate_coord(&self) -> Option<&EtcdConfig> {
        let coord = self.coord.as_ref()?;
        let set = |e: &EtcdConfig| {
            e.endpoints.iter().map(|s| s.trim().trim_end_matches('/').to_string()).collect::<std::collections::BTreeSet<_>>()
        };
        (set(coord) != set(&self.etcd)).then_some(coord)
    }

    /// The name the coord cluster's epochs are recorded under: `cluster_name`
    /// when one cluster serves both tiers.
    pub fn coord_name(&self) -> &str {
        match (self.separate_coord(), &self.coord_cluster_name) {
            (None, _) => &self.cluster_name,
            (Some(_), Some(name)) => name,
            (Some(_), None) => "coord",
        }
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        crate::load_file(path, DEFAULT_PATH, Self::problems)
    }

    /// Checks that parse cannot: files exist, secrets are private, values sane.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (key, file) in [("tls.cert_file", &self.tls.cert_file), ("tls.client_ca_file", &self.tls.client_ca_file)] {
            if let Err(e) = std::fs::metadata(file) {
                p.push(format!("{key} = {:?}: {e}; point it at a PEM file", file.display().to_string()));
            }
        }
        if let Some(problem) = secret_file_problem(&self.tls.key_file) {
            p.push(format!("tls.key_file = {:?}: {problem}", self.tls.key_file.display().to_string()));
        }
        let domain = &self.tls.trust_domain;
        if domain.is_empty() || !domain.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b)) {
            p.push(format!(
                "tls.trust_domain = {domain:?} is not a SPIFFE trust domain; use the lower-case domain of your SVIDs (\"example.org\" for spiffe://example.org/...)"
            ));
        }
        p.extend(self.etcd.problems());
        if let Some(coord) = &self.coord {
            p.extend(coord.problems_in("coord"));
        }
        match (&self.coord_cluster_name, self.separate_coord()) {
            (Some(_), None) => p.push(
                "coord_cluster_name is set, but no [coord] cluster other than [etcd] is: one cluster serves both tiers under \
                 cluster_name; remove coord_cluster_name, or add a [coord] table with the coord cluster's endpoints"
                    .into(),
            ),
            (_, Some(_)) if self.coord_name() == self.cluster_name => p.push(format!(
                "coord_cluster_name = {:?} is also cluster_name: the two clusters' epochs would be recorded as one; give the coord cluster its own name",
                self.coord_name()
            )),
            _ => {}
        }
        if self.seal.check_interval < Duration::from_millis(100) || self.seal.check_interval > Duration::from_secs(30) {
            p.push("seal.check_interval must be between 100ms and 30s (default 1s)".into());
        }
        p.extend(self.tracing.problems());
        p.extend(self.limits.problems());
        p.extend(self.fail_open.problems());
        p
    }
}

impl TracingConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if let Some(endpoint) = &self.otlp_endpoint
            && let Err(problem) = otlp_endpoint_problem(endpoint)
        {
            p.push(format!("tracing.otlp_endpoint = {endpoint:?}: {problem}"));
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            p.push(format!("tracing.sampling_ratio = {}: must be between 0.0 and 1.0 (1.0 records every trace)", self.sampling_ratio));
        }
        if self.service_name.trim().is_empty() {
            p.push("tracing.service_name is empty; leave it out for \"holdfast-arbiter\" or name the service".into());
        }
        if self.timeout < Duration::from_millis(100) || self.timeout > Duration::from_secs(60) {
            p.push("tracing.timeout must be between 100ms and 60s (default 10s)".into());
        }
        p
    }
}

fn otlp_endpoint_problem(endpoint: &str) -> Result<(), String> {
    let uri: http::Uri = endpoint.parse().map_err(|e| format!("not a URL ({e}); write e.g. \"http://127.0.0.1:4318\""))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err("only plain http is supported; send spans to a collector on this host \
                 (e.g. \"http://127.0.0.1:4318\") and let it forward with TLS"
                .into());
        }
        _ => return Err("needs the scheme, e.g. \"http://127.0.0.1:4318\"".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("names no host; write e.g. \"http://127.0.0.1:4318\"".into());
    }
    if uri.query().is_some() {
        return Err("has a query string; give the collector's base URL".into());
    }
    Ok(())
}

/// A secret file must exist and must not be readable by other users.
pub fn secret_file_problem(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(e) => Some(format!("{e}; point it at the PEM private key")),
        Ok(m) if m.permissions().mode() & 0o004 != 0 => {
            Some(format!("is world-readable (mode {:o}); run `chmod o-rwx {}`", m.permissions().mode() & 0o777, path.display()))
        }
        Ok(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mutation_name_sets_its_own_field_and_no_other() {
        for name in MUTATION_NAMES {
            let mut m = MutationConfig::default();
            m.set(name).unwrap();
            assert_eq!(m.on(), vec![name]);
        }
        let err = MutationConfig::default().set("no_such_bug").unwrap_err();
        assert!(err.contains("forget_served_epochs"), "{err}");
    }

    #[test]
    fn a_rendered_config_reads_back_the_same() {
        let mut c = ArbiterConfig::new(
            TlsConfig {
                cert_file: "/t/c.pem".into(),
                key_file: "/t/k.pem".into(),
                client_ca_file: "/t/ca.pem".into(),
                trust_domain: "example.org".into(),
            },
            EtcdConfig::plain(vec!["http://127.0.0.1:2379".into()]),
        );
        c.etcd.ca_file = Some("/t/etcd-ca.pem".into());
        c.seal.check_interval = Duration::from_millis(200);
        c.grants.group_commit = true;
        c.tracing.otlp_endpoint = Some("http://127.0.0.1:4318".into());
        let text = c.to_toml().unwrap();
        assert!(!text.contains("[mutation]"), "a real arbiter's config has no [mutation] table:\n{text}");
        let back: ArbiterConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.to_toml().unwrap(), text);
        assert_eq!(back.seal.check_interval, Duration::from_millis(200));
        assert_eq!(back.etcd, c.etcd);
        c.mutation.no_epoch_compare = true;
        let text = c.to_toml().unwrap();
        let back: ArbiterConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.mutation.on(), vec!["no_epoch_compare"]);
    }

    #[test]
    fn the_coord_section_reads_back_and_its_problems_name_it() {
        let tls = TlsConfig {
            cert_file: "/t/c.pem".into(),
            key_file: "/t/k.pem".into(),
            client_ca_file: "/t/ca.pem".into(),
            trust_domain: "example.org".into(),
        };
        let mut c = ArbiterConfig::new(tls, EtcdConfig::plain(vec!["http://127.0.0.1:2379".into()]));
        assert!(!c.to_toml().unwrap().contains("[coord]"), "no [coord] unless set");
        c.coord = Some(EtcdConfig::plain(vec!["127.0.0.1:2479".into()]));
        let text = c.to_toml().unwrap();
        let back: ArbiterConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.coord, c.coord);
        let p = c.problems();
        assert!(p.iter().any(|p| p.starts_with("coord.endpoints: \"127.0.0.1:2479\" needs a scheme")), "{p:?}");
        assert!(!p.iter().any(|p| p.starts_with("etcd.endpoints")), "{p:?}");
    }

    #[test]
    fn the_coord_cluster_is_separate_only_with_other_endpoints_and_its_name_must_differ() {
        let tls = TlsConfig {
            cert_file: "/t/c.pem".into(),
            key_file: "/t/k.pem".into(),
            client_ca_file: "/t/ca.pem".into(),
            trust_domain: "example.org".into(),
        };
        let etcd = EtcdConfig::plain(vec!["http://127.0.0.1:2379".into(), "http://127.0.0.2:2379".into()]);
        let mut c = ArbiterConfig::new(tls, etcd);
        c.cluster_name = "ams".into();
        let named = |c: &ArbiterConfig| c.problems().into_iter().filter(|p| p.contains("coord_cluster_name")).collect::<Vec<_>>();
        assert!(c.separate_coord().is_none());
        assert_eq!(c.coord_name(), "ams", "one cluster, one name");
        // The same endpoints, in another order: still one cluster.
        c.coord = Some(EtcdConfig::plain(vec!["http://127.0.0.2:2379/".into(), "http://127.0.0.1:2379".into()]));
        assert!(c.separate_coord().is_none());
        c.coord_cluster_name = Some("ams-coord".into());
        let p = named(&c);
        assert!(p.len() == 1 && p[0].contains("remove coord_cluster_name"), "{p:?}");
        c.coord = Some(EtcdConfig::plain(vec!["http://127.0.0.1:2479".into()]));
        assert!(c.separate_coord().is_some());
        assert_eq!(c.coord_name(), "ams-coord");
        assert!(named(&c).is_empty());
        c.coord_cluster_name = None;
        assert_eq!(c.coord_name(), "coord");
        c.coord_cluster_name = Some("ams".into());
        let p = named(&c);
        assert!(p.len() == 1 && p[0].contains("give the coord cluster its own name"), "{p:?}");
    }

    #[test]
    fn a_zero_limit_is_refused_naming_its_key() {
        let mut c = LimitsConfig { max_holds_per_namespace: 0, ..LimitsConfig::default() };
        c.namespaces.insert("pay".into(), NamespaceLimits { max_holds: 0 });
        let p = c.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("limits.max_holds_per_namespace = 0 would refuse everything"), "{p:?}");
        assert!(p[1].starts_with("limits.namespaces.pay.max_holds = 0"), "{p:?}");
        assert_eq!(c.max_holds_in("pay"), 0);
        assert_eq!(LimitsConfig::default().max_holds_in("pay"), 50_000);
        let parsed: LimitsConfig = toml::from_str("requests_per_second = 5\n[namespaces.pay]\nmax_holds = 7\n").unwrap();
        assert_eq!((parsed.requests_per_second, parsed.request_burst, parsed.max_holds_in("pay")), (5, 4000, 7));
        assert!(toml::from_str::<LimitsConfig>("max_holds = 1").is_err(), "unknown keys are refused");
    }

    #[test]
    fn fail_open_bounds_are_checked_and_the_example_sets_the_defaults() {
        let ok = FailOpenConfig::default();
        assert!(ok.problems().is_empty());
        assert_eq!((ok.after, ok.spool_max_bytes), (Duration::from_secs(10), 64 << 20));
        let short = FailOpenConfig { after: Duration::from_millis(500), ..FailOpenConfig::default() };
        let p = short.problems();
        assert!(p.len() == 1 && p[0].starts_with("fail_open.after = 500ms must be between 1s and 1h"), "{p:?}");
        let small = FailOpenConfig { spool_max_bytes: 100, ..FailOpenConfig::default() };
        let p = small.problems();
        assert!(p.len() == 1 && p[0].starts_with("fail_open.spool_max_bytes = 100 is under 4096"), "{p:?}");
        let parsed: FailOpenConfig = toml::from_str("after = \"3s\"").unwrap();
        assert_eq!((parsed.after, parsed.spool_max_bytes), (Duration::from_secs(3), 64 << 20));
        assert!(toml::from_str::<FailOpenConfig>("bound = \"3s\"").is_err(), "unknown keys are refused");
        let example: ArbiterConfig = toml::from_str(include_str!("../../../config/arbiter.toml")).unwrap();
        assert_eq!((example.fail_open.after, example.fail_open.spool_max_bytes), (ok.after, ok.spool_max_bytes));
    }

    #[test]
    fn the_example_config_parses() {
        let text = include_str!("../../../config/arbiter.toml");
        let c: ArbiterConfig = toml::from_str(text).expect("config/arbiter.toml parses");
        assert_eq!(c.etcd.endpoints.len(), 3);
        assert_eq!(c.seal.check_interval, Duration::from_secs(1));
        assert_eq!(c.tracing.otlp_endpoint, None, "tracing export is off in the example");
    }

    fn with_tracing(table: &str) -> ArbiterConfig {
        toml::from_str(&format!(
            "[tls]\ncert_file=\"a\"\nkey_file=\"b\"\nclient_ca_file=\"c\"\ntrust_domain=\"example.org\"\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n[tracing]\n{table}"
        ))
        .unwrap()
    }

    #[test]
    fn tracing_is_off_unless_an_endpoint_is_set() {
        let c = with_tracing("");
        assert_eq!(c.tracing.otlp_endpoint, None);
        assert!(c.tracing.problems().is_empty());
        let c = with_tracing("otlp_endpoint = \"http://127.0.0.1:4317\"\nprotocol = \"grpc\"\nsampling_ratio = 0.25");
        assert_eq!(c.tracing.protocol, OtlpProtocol::Grpc);
        assert!(c.tracing.problems().is_empty(), "{:?}", c.tracing.problems());
    }

    #[test]
    fn bad_tracing_values_are_named() {
        let c = with_tracing("otlp_endpoint = \"https://collector:4318\"\nsampling_ratio = 1.5\nservice_name = \" \"\ntimeout = \"1ms\"");
        let p = c.tracing.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].starts_with("tracing.otlp_endpoint") && p[0].contains("plain http"), "{p:?}");
        assert!(p[1].starts_with("tracing.sampling_ratio"), "{p:?}");
        assert!(p[2].starts_with("tracing.service_name"), "{p:?}");
        assert!(p[3].starts_with("tracing.timeout"), "{p:?}");
        for bad in ["127.0.0.1:4318", "http://", "http://h:1/?a=b"] {
            assert!(otlp_endpoint_problem(bad).is_err(), "{bad}");
        }
        let err = toml::from_str::<TracingConfig>("protocol = \"http/json\"").unwrap_err().to_string();
        assert!(err.contains("grpc") && err.contains("http/protobuf"), "{err}");
        let err = toml::from_str::<TracingConfig>("endpoint = \"http://h:1\"").unwrap_err().to_string();
        assert!(err.contains("otlp_endpoint"), "{err}");
    }

    #[test]
    fn unknown_and_renamed_keys_are_named() {
        let err = toml::from_str::<ArbiterConfig>(
            "listen = \"127.0.0.1:1\"\n[tls]\ncert_file=\"a\"\nkey_file=\"b\"\nclient_ca_file=\"c\"\ntrust_domain=\"example.org\"\n[etcd]\nendpoint = [\"http://127.0.0.1:1\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("endpoint"), "{err}");
        assert!(err.contains("endpoints"), "the message names the expected key: {err}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let c: ArbiterConfig = toml::from_str(
            "[tls]\ncert_file=\"/nonexistent/a\"\nkey_file=\"/nonexistent/b\"\nclient_ca_file=\"/nonexistent/c\"\ntrust_domain=\"example.org\"\n[etcd]\nendpoints = [\"x:1\"]\n",
        )
        .unwrap();
        let p = c.problems();
        assert!(p.iter().any(|m| m.starts_with("tls.cert_file")), "{p:?}");
        assert!(p.iter().any(|m| m.starts_with("tls.key_file")), "{p:?}");
        assert!(p.iter().any(|m| m.starts_with("tls.client_ca_file")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("needs a scheme")), "{p:?}");
    }
}
