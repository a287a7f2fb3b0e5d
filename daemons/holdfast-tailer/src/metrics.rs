//! The tailer's metrics, served as Prometheus text on `metrics_listen`.
//!
//! Names follow `holdfast_tailer_<thing>_<unit|total>`; the only label is
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
    events: Family<Labels, Counter>,
    gaps: Family<Labels, Counter>,
    leader: Family<Labels, Gauge>,
    lag_revisions: Family<Labels, Gauge>,
    checkpoint_age: Family<Labels, Gauge>,
    lag_alarm: Family<Labels, Gauge>,
    gap_alarm: Family<Labels, Gauge>,
    withheld: Family<Labels, Gauge>,
}

impl Metrics {
    pub fn new(cluster: &str) -> Self {
        let mut r = Registry::with_prefix("holdfast_tailer");
        let labels = Labels { cluster: cluster.to_string() };
        let l = &labels;
        Metrics {
            events: register(&mut r, l, "events", "Audit events stored by this tailer"),
            gaps: register(&mut r, l, "gaps", "Gap events written: etcd compacted revisions before this tailer read them"),
            leader: register(&mut r, l, "leader", "1 while this tailer is the active (elected) one, else 0"),
            lag_revisions: register(&mut r, l, "lag_revisions", "etcd's revision minus the last one stored, as last seen"),
            checkpoint_age: register(
                &mut r,
                l,
                "checkpoint_age_seconds",
                "Seconds since the store's checkpoint was written (also reported by a standby, for its own store)",
            ),
            lag_alarm: register(
                &mut r,
                l,
                "lag_alarm",
                "1 when the checkpoint is older than half the compaction window while etcd has newer revisions: history is about to be lost",
            ),
            gap_alarm: register(&mut r, l, "gap_alarm", "1 once this tailer wrote a gap event (history lost); stays until restart"),
            withheld: register(
                &mut r,
                l,
                "withheld_revisions",
                "Revisions kept out of the store and every sink because a hold they granted is still live (with the epoch, the revision is its token); stored when the hold ends",
            ),
            // Last: the fields above borrow them.
            labels,
            registry: r,
        }
    }

    /// `events` more stored. No revision is exported: on a quiet cluster
    /// the last one stored is the last grant's, which with the epoch is a
    /// live hold's token; lag is exported as a difference only.
    pub fn stored(&self, events: usize) {
        self.events.get_or_create(&self.labels).inc_by(events as u64);
    }

    pub fn gap(&self) {
        self.gaps.get_or_create(&self.labels).inc();
        self.gap_alarm.get_or_create(&self.labels).set(1);
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.get_or_create(&self.labels).set(i64::from(leader));
    }

    pub fn set_lag(&self, revisions: i64, checkpoint_age_secs: i64, alarm: bool) {
        self.lag_revisions.get_or_create(&self.labels).set(revisions.max(0));
        self.checkpoint_age.get_or_create(&self.labels).set(checkpoint_age_secs.max(0));
        self.lag_alarm.get_or_create(&self.labels).set(i64::from(alarm));
    }

    pub fn set_withheld(&self, revisions: usize) {
        self.withheld.get_or_create(&self.labels).set(revisions as i64);
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
        m.stored(3);
        m.gap();
        m.set_lag(5, 1900, true);
        m.set_withheld(2);
        let text = m.encode();
        for line in [
            "holdfast_tailer_events_total{cluster=\"unit\"} 3",
            "holdfast_tailer_gaps_total{cluster=\"unit\"} 1",
            "holdfast_tailer_gap_alarm{cluster=\"unit\"} 1",
            "holdfast_tailer_lag_alarm{cluster=\"unit\"} 1",
            "holdfast_tailer_checkpoint_age_seconds{cluster=\"unit\"} 1900",
            "holdfast_tailer_leader{cluster=\"unit\"} 0",
            "holdfast_tailer_withheld_revisions{cluster=\"unit\"} 2",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
    }
}
