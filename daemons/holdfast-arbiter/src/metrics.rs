//! The arbiter's metrics, served as Prometheus text on `metrics_listen`.
//!
//! Names follow `holdfast_arbiter_<thing>_<unit|total>`. Labels are only
//! `namespace`, `class`, `tier` and `cluster`, with values drawn from
//! configuration, never from request contents (a test scrapes the endpoint
//! and fails on any other label). Until class files exist, the only label is
//! `cluster` (the configured `cluster_name`); per-key questions go to
//! `holdfastctl inspect`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::{LazyLock, OnceLock};

static CLUSTER: OnceLock<String> = OnceLock::new();

/// The process's metrics. Call [`init`] first with the configured name.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics::new(CLUSTER.get().map(String::as_str).unwrap_or("default")));

/// Sets the `cluster` label value (from configuration). First call wins.
pub fn init(cluster: &str) {
    let _ = CLUSTER.set(cluster.to_string());
    LazyLock::force(&METRICS);
}

/// Increments a counter of this process.
pub fn inc(f: fn(&Metrics) -> &Family<Labels, Counter>) {
    let m = &*METRICS;
    f(m).get_or_create(&m.labels).inc();
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    pub cluster: String,
}

/// Labels of the per-namespace counters (ValidateToken). The namespace
/// comes from the request, so its values are bounded: see
/// [`crate::validate::namespace_label`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NsLabels {
    pub namespace: String,
    pub cluster: String,
}

type Counters = Family<Labels, Counter>;
type NsCounters = Family<NsLabels, Counter>;

pub struct Metrics {
    registry: Registry,
    labels: Labels,
    pub grant_latency: Family<Labels, Histogram>,
    pub hold_duration: Family<Labels, Histogram>,
    pub granted: Counters,
    pub contention: Counters,
    pub leak: Counters,
    pub denied: Counters,
    pub sealed_refusals: Counters,
    pub waited: Counters,
    pub grant_attempts: Counters,
    pub renewal_failures: Counters,
    pub unconfirmed_keepalives: Counters,
    pub expiries_without_release: Counters,
    pub waiters: Family<Labels, Gauge>,
    pub sealed: Family<Labels, Gauge>,
    pub validate_valid: NsCounters,
    pub validate_invalid: NsCounters,
    pub validate_refused: NsCounters,
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
            expiries_without_release: Default::default(),
            waiters: Default::default(),
            sealed: Default::default(),
            validate_valid: Default::default(),
            validate_invalid: Default::default(),
            validate_refused: Default::default(),
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
        registry.register("acquire_denied", "Acquires refused for authorisation or bad input", m.denied.clone());
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
            "expiries_without_release",
            "Holds granted by this arbiter that ended because their session lease expired, not by Release or CloseSession \
             (counted only by the granting arbiter; stays 0 when [waiters] watch = false, which opens no watches)",
            m.expiries_without_release.clone(),
        );
        // Present (at 0) from the start, so its help text is visible and a
        // rate can be taken before the first expiry.
        let _ = m.expiries_without_release.get_or_create(&m.labels);
        registry.register("waiters", "Waiters queued in this arbiter", m.waiters.clone());
        registry.register("sealed", "1 while the arbiter grants nothing (sealed or not yet verified)", m.sealed.clone());
        // Outcomes are metric names, not labels (like acquire_*).
        registry.register("validate_token_valid", "ValidateToken calls answered valid, per namespace", m.validate_valid.clone());
        registry.register("validate_token_invalid", "ValidateToken calls answered invalid, per namespace", m.validate_invalid.clone());
        registry.register(
            "validate_token_refused",
            "ValidateToken calls refused (rate limit, sealed, not serving, etcd unavailable), per namespace",
            m.validate_refused.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn labels(&self) -> &Labels {
        &self.labels
    }

    /// The labels of a per-namespace counter; `namespace` must already be
    /// bounded ([`crate::validate::namespace_label`]).
    pub fn ns_labels(&self, namespace: &str) -> NsLabels {
        NsLabels { namespace: namespace.to_string(), cluster: self.labels.cluster.clone() }
    }

    pub fn counter(&self, f: fn(&Metrics) -> &Family<Labels, Counter>) -> u64 {
        f(self).get_or_create(&self.labels).get()
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
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
