//! The controller's metrics, served as Prometheus text on `metrics_listen`.
//!
//! Names follow `holdfast_controller_<thing>_<unit|total>`; the only label is
//! `cluster` (the configured `cluster_name`).

pub use holdfast_daemon::metrics::Labels;
use holdfast_daemon::metrics::{ProcessMetrics, register};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;

/// The process's metrics. Call [`init`] first with the configured name.
pub static METRICS: ProcessMetrics<Metrics> = ProcessMetrics::new(Metrics::new);

/// Sets the `cluster` label value (from configuration). First call wins.
pub fn init(cluster: &str) {
    METRICS.init(cluster);
}

pub struct Metrics {
    registry: Registry,
    labels: Labels,
    refusals: Family<Labels, Counter>,
    published_version: Family<Labels, Gauge>,
    demoted_classes: Family<Labels, Gauge>,
    leader: Family<Labels, Gauge>,
}

impl Metrics {
    pub fn new(cluster: &str) -> Self {
        let mut r = Registry::with_prefix("holdfast_controller");
        let labels = Labels { cluster: cluster.to_string() };
        let l = &labels;
        Metrics {
            refusals: register(
                &mut r,
                l,
                "refusals",
                "Changes of the policy directory refused by this controller as leader (invalid, unreadable or unchecked); the last good set stayed in force",
            ),
            published_version: register(
                &mut r,
                l,
                "published_version",
                "Version of the set at /sys/policy as this controller last read it (0: none)",
            ),
            demoted_classes: register(
                &mut r,
                l,
                "demoted_classes",
                "Classes of the set at /sys/policy, as this controller last read or published it as leader, declared fenced but demoted to advisory: no passing, unexpired pause-test result for their resource at their schema version (0 on a standby)",
            ),
            leader: register(&mut r, l, "leader", "1 while this controller is the active (elected) one, else 0"),
            // Last: the fields above borrow them.
            labels,
            registry: r,
        }
    }

    pub fn refused(&self) {
        self.refusals.get_or_create(&self.labels).inc();
    }

    pub fn refusals(&self) -> u64 {
        self.refusals.get_or_create(&self.labels).get()
    }

    pub fn set_published_version(&self, version: u64) {
        self.published_version.get_or_create(&self.labels).set(version.min(i64::MAX as u64) as i64);
    }

    pub fn set_demoted_classes(&self, n: usize) {
        self.demoted_classes.get_or_create(&self.labels).set(n.min(i64::MAX as usize) as i64);
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.get_or_create(&self.labels).set(i64::from(leader));
    }

    pub fn encode(&self) -> String {
        holdfast_daemon::metrics::encode(&self.registry)
    }
}

/// Serves `GET /metrics` (anything else: 404) over plain HTTP/1.1.
pub async fn serve(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    holdfast_daemon::serve_metrics(addr, || METRICS.encode()).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_and_the_one_label() {
        let m = super::Metrics::new("unit");
        m.refused();
        m.set_published_version(7);
        m.set_leader(true);
        m.set_demoted_classes(2);
        let text = m.encode();
        assert!(text.contains("holdfast_controller_demoted_classes{cluster=\"unit\"} 2"), "{text}");
        assert!(text.contains("holdfast_controller_refusals_total{cluster=\"unit\"} 1"), "{text}");
        assert!(text.contains("holdfast_controller_published_version{cluster=\"unit\"} 7"), "{text}");
        assert!(text.contains("holdfast_controller_leader{cluster=\"unit\"} 1"), "{text}");
    }
}
