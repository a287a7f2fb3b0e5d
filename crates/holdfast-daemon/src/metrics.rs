//! What the daemons' metrics modules share: the process-wide metrics behind
//! the `cluster` label ([`ProcessMetrics`]), that label ([`Labels`]), the
//! registration of a family present from the start ([`register`]) and the
//! Prometheus text encoding ([`encode`]). Serving is
//! [`crate::serve_metrics`].

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::OnceLock;

/// The label of process-wide metrics: the configured `cluster_name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    pub cluster: String,
}

/// A daemon's metrics, built on first use with the `cluster` label set by
/// [`ProcessMetrics::init`] (`default` when used before it). Dereferences to
/// the metrics.
pub struct ProcessMetrics<M> {
    cluster: OnceLock<String>,
    metrics: OnceLock<M>,
    new: fn(&str) -> M,
}

impl<M> ProcessMetrics<M> {
    /// `new` builds the metrics for a cluster name.
    pub const fn new(new: fn(&str) -> M) -> Self {
        ProcessMetrics { cluster: OnceLock::new(), metrics: OnceLock::new(), new }
    }

    /// Sets the `cluster` label value (from configuration) and builds the
    /// metrics. First call wins.
    pub fn init(&self, cluster: &str) {
        let _ = self.cluster.set(cluster.to_string());
        let _ = self.get();
    }

    pub fn get(&self) -> &M {
        self.metrics.get_or_init(|| (self.new)(self.cluster.get().map(String::as_str).unwrap_or("default")))
    }
}

impl<M> std::ops::Deref for ProcessMetrics<M> {
    type Target = M;

    fn deref(&self) -> &M {
        self.get()
    }
}

/// Registers a family of one gauge or counter under `name`, with the series
/// of `labels` created at once: present from the start, so a rate or an
/// alert works before the first event.
pub fn register<M>(registry: &mut Registry, labels: &Labels, name: &str, help: &str) -> Family<Labels, M>
where
    M: TypedMetric + EncodeMetric + Clone + Default + std::fmt::Debug + Send + Sync + 'static,
{
    let family: Family<Labels, M> = Family::default();
    registry.register(name, help, family.clone());
    let _ = family.get_or_create(labels);
    family
}

/// The registry in the Prometheus text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::gauge::Gauge;

    struct Unit {
        registry: Registry,
        up: Family<Labels, Gauge>,
    }

    fn unit(cluster: &str) -> Unit {
        let mut registry = Registry::with_prefix("holdfast_unit");
        let up = register(&mut registry, &Labels { cluster: cluster.into() }, "up", "Up");
        Unit { registry, up }
    }

    static METRICS: ProcessMetrics<Unit> = ProcessMetrics::new(unit);

    #[test]
    fn the_cluster_label_from_init_and_present_from_the_start() {
        METRICS.init("east");
        METRICS.init("west");
        let text = encode(&METRICS.registry);
        assert!(text.contains("holdfast_unit_up{cluster=\"east\"} 0"), "{text}");
        METRICS.up.get_or_create(&Labels { cluster: "east".into() }).set(1);
        assert!(encode(&METRICS.registry).contains("holdfast_unit_up{cluster=\"east\"} 1"));
    }
}
