//! The arbiter's metrics, served as Prometheus text on `metrics_listen`.
//!
//! Names follow `holdfast_arbiter_<thing>_<unit|total>`. Labels are only
//! `namespace`, `class`, `tier` and `cluster`, with values drawn from
//! configuration (the configured `cluster_name` and the published class
//! set), never from request contents: a label value exists only for a class
//! the set declares. Counters of a call whose key has a class (acquire
//! outcomes after the grant check, ValidateToken answers) carry all four
//! ([`ClassLabels`]); process-wide ones (denials, seals, renewals, waiters,
//! grant latency) carry `cluster` alone. A test scrapes the endpoint and
//! fails on any other label and on a missing one. Per-key questions go to
//! `holdfastctl inspect`.

pub use holdfast_daemon::metrics::Labels;
use holdfast_daemon::metrics::ProcessMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;

/// The process's metrics. Call [`init`] first with the configured name.
pub static METRICS: ProcessMetrics<Metrics> = ProcessMetrics::new(Metrics::new);

/// Sets the `cluster` label value (from configuration). First call wins.
pub fn init(cluster: &str) {
    METRICS.init(cluster);
}

/// Increments a counter of this process.
pub fn inc(f: fn(&Metrics) -> &Family<Labels, Counter>) {
    let m = &*METRICS;
    f(m).get_or_create(&m.labels).inc();
}

/// Labels of per-class counters: the class of the call's key, from the
/// published set (so the values are bounded by it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub namespace: String,
    pub class: String,
    pub tier: String,
    pub cluster: String,
}

type Counters = Family<Labels, Counter>;
type ClassCounters = Family<ClassLabels, Counter>;

pub struct Metrics {
    registry: Registry,
    labels: Labels,
    pub grant_latency: Family<Labels, Histogram>,
    pub hold_duration: Family<Labels, Histogram>,
    pub granted: ClassCounters,
    pub contention: ClassCounters,
    pub leak: ClassCounters,
    pub denied: Counters,
    pub sealed_refusals: Counters,
    pub waited: Counters,
    pub grant_attempts: Counters,
    pub renewal_failures: Counters,
    pub unconfirmed_keepalives: Counters,
    pub keepalives_held_for_deposed_leader: Counters,
    pub deposed_leader_waits: Counters,
    pub keepalive_streams_stalled: Counters,
    pub auth_race_resends: Counters,
    pub expiries_without_release: Counters,
    pub unprotected_granted: ClassCounters,
    pub fail_open: Family<Labels, Gauge>,
    pub spool_bytes: Family<Labels, Gauge>,
    pub waiters: Family<Labels, Gauge>,
    pub key_watches: Family<Labels, Gauge>,
    pub sealed: Family<Labels, Gauge>,
    pub policy_version: Family<Labels, Gauge>,
    pub validate_valid: ClassCounters,
    pub validate_invalid: ClassCounters,
    pub validate_refused: ClassCounters,
    pub rate_limited: Counters,
    pub quota_refusals: Counters,
    pub tls_handshake_failures: Counters,
    pub tls_reloads: Counters,
    pub connections_turned_away: Counters,
    pub connections_open: Family<Labels, Gauge>,
    pub holds: Family<ClassLabels, Gauge>,
    pub holds_quota: Family<ClassLabels, Gauge>,
    pub limit_requests_per_second: Family<Labels, Gauge>,
    pub limit_request_burst: Family<Labels, Gauge>,
    pub limit_sessions_per_identity: Family<Labels, Gauge>,
    pub limit_holds_per_identity: Family<Labels, Gauge>,
    pub limit_holds_per_namespace: Family<Labels, Gauge>,
    pub limit_durable_waiters_per_namespace: Family<Labels, Gauge>,
}

impl Metrics {
    pub fn new(cluster: &str) -> Self {
        let mut registry = Registry::with_prefix("holdfast_arbiter");
        let latency = || Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.0005, 2.0, 16)));
        let hold = || Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 2.0, 20)));
        let m = Metrics {
            registry: Registry::default(),
            labels: Labels { cluster: cluster.to_string() },
            grant_latency: latency(),
            hold_duration: hold(),
            granted: Default::default(),
            contention: Default::default(),
            leak: Default::default(),
            denied: Default::default(),
            sealed_refusals: Default::default(),
            waited: Default::default(),
            grant_attempts: Default::default(),
            renewal_failures: Default::default(),
            unconfirmed_keepalives: Default::default(),
            keepalives_held_for_deposed_leader: Default::default(),
            deposed_leader_waits: Default::default(),
            keepalive_streams_stalled: Default::default(),
            auth_race_resends: Default::default(),
            expiries_without_release: Default::default(),
            unprotected_granted: Default::default(),
            fail_open: Default::default(),
            spool_bytes: Default::default(),
            waiters: Default::default(),
            key_watches: Default::default(),
            sealed: Default::default(),
            policy_version: Default::default(),
            validate_valid: Default::default(),
            validate_invalid: Default::default(),
            validate_refused: Default::default(),
            rate_limited: Default::default(),
            quota_refusals: Default::default(),
            tls_handshake_failures: Default::default(),
            tls_reloads: Default::default(),
            connections_turned_away: Default::default(),
            connections_open: Default::default(),
            holds: Default::default(),
            holds_quota: Default::default(),
            limit_requests_per_second: Default::default(),
            limit_request_burst: Default::default(),
            limit_sessions_per_identity: Default::default(),
            limit_holds_per_identity: Default::default(),
            limit_holds_per_namespace: Default::default(),
            limit_durable_waiters_per_namespace: Default::default(),
        };
        registry.register_with_unit(
            "grant_latency",
            "Latency of successful grant transactions",
            prometheus_client::registry::Unit::Seconds,
            m.grant_latency.clone(),
        );
        registry.register_with_unit(
            "hold_duration",
            "Time from grant to release, for released holds",
            prometheus_client::registry::Unit::Seconds,
            m.hold_duration.clone(),
        );
        registry.register("acquire_granted", "Acquires that were granted", m.granted.clone());
        registry.register(
            "acquire_contention",
            "Acquires refused because another session held the key until the deadline",
            m.contention.clone(),
        );
        registry.register(
            "acquire_leak",
            "Acquires refused because the same identity held the key through another session",
            m.leak.clone(),
        );
        registry.register(
            "acquire_denied",
            "Acquires refused by the class set (no grant, no set, wrong region, another TTL) or for bad input",
            m.denied.clone(),
        );
        registry.register("acquire_sealed", "Acquires refused because the arbiter was sealed or not serving", m.sealed_refusals.clone());
        registry.register(
            "acquire_waited",
            "Acquires that found the key held and waited (contention ratio = waited / granted)",
            m.waited.clone(),
        );
        registry.register("grant_attempts", "Grant transactions sent to etcd", m.grant_attempts.clone());
        registry.register("renewal_failures", "Keepalives that failed or were not confirmed", m.renewal_failures.clone());
        registry.register(
            "unconfirmed_keepalives",
            "Keepalives acknowledged in a Raft term a quorum read did not confirm",
            m.unconfirmed_keepalives.clone(),
        );
        registry.register(
            "keepalives_held_for_deposed_leader",
            "Keepalives renewed by etcd but not counted: answered in a Raft term not every member answered in yet, for a session granted before it (a deposed leader may still revoke the lease)",
            m.keepalives_held_for_deposed_leader.clone(),
        );
        registry.register(
            "deposed_leader_waits",
            "New etcd Raft terms in which a member did not answer in the new term for over a second (each may be a deposed leader that revokes leases when it wakes)",
            m.deposed_leader_waits.clone(),
        );
        registry.register(
            "keepalive_streams_stalled",
            "etcd keepalive streams closed because a renewal waited past the stream's stall bound (4 x its p99, 250 ms to the request timeout); its renewals moved to a new stream",
            m.keepalive_streams_stalled.clone(),
        );
        registry.register(
            "etcd_auth_race_resends",
            "etcd requests sent again because etcd refused them while its users or roles changed (nothing of them was applied)",
            m.auth_race_resends.clone(),
        );
        registry.register(
            "unprotected_grants",
            "Grants of on_quorum_loss = \"open\" classes made from memory with token 0 while etcd was out of reach, per class",
            m.unprotected_granted.clone(),
        );
        registry.register(
            "fail_open",
            "1 while this arbiter grants open classes from memory: a cluster holding an on_quorum_loss = \"open\" class has been out of reach longer than fail_open.after",
            m.fail_open.clone(),
        );
        registry.register(
            "unprotected_spool_bytes",
            "Bytes in the spool of unprotected grants not yet shipped to the audit store",
            m.spool_bytes.clone(),
        );
        registry.register(
            "expiries_without_release",
            "Holds granted by this arbiter that ended because their session lease expired, not by Release or CloseSession \
             (counted only by the granting arbiter; stays 0 when [waiters] watch = false, which opens no watches)",
            m.expiries_without_release.clone(),
        );
        // Present (at 0) from the start, so its help text is visible and a
        // rate can be taken before the first expiry.
        let _ = m.expiries_without_release.get_or_create(&m.labels);
        registry.register("waiters", "Waiters queued in this arbiter", m.waiters.clone());
        registry.register(
            "key_watches",
            "Keys with waiters here whose releases this arbiter follows with an etcd watch (one per key; 0 with [waiters] watch = false)",
            m.key_watches.clone(),
        );
        registry.register("sealed", "1 while the arbiter grants nothing (sealed or not yet verified)", m.sealed.clone());
        registry.register(
            "policy_version",
            "Version of the published class set in force here (0: none yet, granting nothing)",
            m.policy_version.clone(),
        );
        let _ = m.policy_version.get_or_create(&m.labels);
        // Outcomes are metric names, not labels (like acquire_*).
        registry.register("validate_token_valid", "ValidateToken calls answered valid, per class", m.validate_valid.clone());
        registry.register("validate_token_invalid", "ValidateToken calls answered invalid, per class", m.validate_invalid.clone());
        registry.register(
            "validate_token_refused",
            "ValidateToken calls refused (rate limit, sealed, not serving, etcd unavailable), per class",
            m.validate_refused.clone(),
        );
        registry.register(
            "rate_limited",
            "Requests refused past limits.requests_per_second (RESOURCE_EXHAUSTED, RATE_LIMITED)",
            m.rate_limited.clone(),
        );
        registry.register(
            "quota_refusals",
            "Sessions and acquires refused by a session or hold quota (RESOURCE_EXHAUSTED, QUOTA)",
            m.quota_refusals.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "Connections closed before or during the TLS handshake (untrusted, expired or missing client certificate, timeout)",
            m.tls_handshake_failures.clone(),
        );
        registry.register(
            "tls_reloads",
            "Times the server certificate, key or client CA bundle changed and was loaded for new connections",
            m.tls_reloads.clone(),
        );
        let _ = m.rate_limited.get_or_create(&m.labels);
        let _ = m.quota_refusals.get_or_create(&m.labels);
        registry.register(
            "connections_turned_away",
            "Connections closed before their TLS handshake by limits.max_connections, max_connections_per_address, \
             handshakes_per_second or handshakes_per_second_per_address",
            m.connections_turned_away.clone(),
        );
        registry.register("connections_open", "Client connections open (TLS or handshaking)", m.connections_open.clone());
        let _ = m.connections_turned_away.get_or_create(&m.labels);
        let _ = m.tls_handshake_failures.get_or_create(&m.labels);
        let _ = m.tls_reloads.get_or_create(&m.labels);
        // Cluster-wide counters exist at 0 from the start, so an alert on
        // their increase (and a dashboard panel) has a series before the
        // first event; the seal gauge starts at 1: nothing is verified yet.
        for c in [
            &m.sealed_refusals,
            &m.waited,
            &m.grant_attempts,
            &m.renewal_failures,
            &m.unconfirmed_keepalives,
            &m.keepalives_held_for_deposed_leader,
            &m.deposed_leader_waits,
            &m.keepalive_streams_stalled,
            &m.auth_race_resends,
            &m.expiries_without_release,
        ] {
            let _ = c.get_or_create(&m.labels);
        }
        m.sealed.get_or_create(&m.labels).set(1);
        let _ = m.fail_open.get_or_create(&m.labels);
        let _ = m.spool_bytes.get_or_create(&m.labels);
        let _ = m.waiters.get_or_create(&m.labels);
        let _ = m.key_watches.get_or_create(&m.labels);
        registry.register("holds", "Holds in the class's namespace in the cluster, as this arbiter's watch sees them", m.holds.clone());
        registry.register(
            "holds_quota",
            "Hold quota of the class's namespace (limits.max_holds_per_namespace or its override)",
            m.holds_quota.clone(),
        );
        registry.register(
            "limit_requests_per_second",
            "limits.requests_per_second: requests per identity per second here",
            m.limit_requests_per_second.clone(),
        );
        registry.register("limit_request_burst", "limits.request_burst", m.limit_request_burst.clone());
        registry.register("limit_sessions_per_identity", "limits.max_sessions_per_identity", m.limit_sessions_per_identity.clone());
        registry.register("limit_holds_per_identity", "limits.max_holds_per_identity", m.limit_holds_per_identity.clone());
        registry.register(
            "limit_holds_per_namespace",
            "limits.max_holds_per_namespace (the default hold quota of a namespace)",
            m.limit_holds_per_namespace.clone(),
        );
        registry.register(
            "limit_durable_waiters_per_namespace",
            "limits.max_durable_waiters_per_namespace (waiters of durable classes queued in a namespace)",
            m.limit_durable_waiters_per_namespace.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The labels of a per-class counter.
    pub fn class_labels(&self, class: &holdfast_policy::Class) -> ClassLabels {
        ClassLabels {
            namespace: class.namespace.clone(),
            class: class.name.clone(),
            tier: crate::cluster::tier_name(class.tier).into(),
            cluster: self.labels.cluster.clone(),
        }
    }

    pub fn counter(&self, f: fn(&Metrics) -> &Family<Labels, Counter>) -> u64 {
        f(self).get_or_create(&self.labels).get()
    }

    pub fn encode(&self) -> String {
        holdfast_daemon::metrics::encode(&self.registry)
    }
}

/// Increments a per-class counter of this process.
pub fn inc_class(f: fn(&Metrics) -> &ClassCounters, class: &holdfast_policy::Class) {
    let m = &*METRICS;
    f(m).get_or_create(&m.class_labels(class)).inc();
}

/// Exports the configured caps.
pub fn set_limits(c: &holdfast_config::arbiter::LimitsConfig) {
    let m = &*METRICS;
    let l = &m.labels;
    m.limit_requests_per_second.get_or_create(l).set(i64::from(c.requests_per_second));
    m.limit_request_burst.get_or_create(l).set(i64::from(c.request_burst));
    m.limit_sessions_per_identity.get_or_create(l).set(c.max_sessions_per_identity as i64);
    m.limit_holds_per_identity.get_or_create(l).set(c.max_holds_per_identity as i64);
    m.limit_holds_per_namespace.get_or_create(l).set(c.max_holds_per_namespace as i64);
    m.limit_durable_waiters_per_namespace.get_or_create(l).set(c.max_durable_waiters_per_namespace as i64);
}

/// Records the class-set version now in force.
pub fn set_policy_version(version: u64) {
    let m = &*METRICS;
    m.policy_version.get_or_create(&m.labels).set(version as i64);
}

/// Serves `GET /metrics` (anything else: 404) over plain HTTP/1.1.
pub async fn serve(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    holdfast_daemon::serve_metrics(addr, || METRICS.encode()).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_expiry_counter_says_when_it_stays_zero() {
        let text = super::Metrics::new("unit").encode();
        let help = text.lines().find(|l| l.starts_with("# HELP holdfast_arbiter_expiries_without_release")).expect(&text);
        assert!(help.contains("[waiters] watch = false"), "{help}");
    }
}
