//! The standard gRPC health service (`grpc.health.v1.Health`), so
//! `grpc_health_probe`, `grpcurl` and load balancers can ask the arbiter
//! whether it grants: SERVING only while the seal check says it serves an
//! epoch; NOT_SERVING while sealed, before etcd has answered a full check,
//! after an etcd error, and while draining on SIGTERM. The overall status
//! (service "") and `lock.v1.Lock` always agree.

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The service name clients ask about besides "" (the whole server).
pub const LOCK_SERVICE: &str = "lock.v1.Lock";

/// Publishes the serving state to the health service. Cheap to clone; the
/// latest `set` wins.
#[derive(Clone)]
pub struct Health {
    tx: tokio::sync::watch::Sender<bool>,
}

impl Health {
    /// Starts NOT_SERVING and returns the gRPC service to add to the server.
    pub fn start() -> (Self, tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>) {
        let (reporter, service) = tonic_health::server::health_reporter();
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(publish(reporter, rx));
        (Health { tx }, service)
    }

    /// Records whether the arbiter grants now (from the seal check loop, or
    /// `false` when draining).
    pub fn set(&self, serving: bool) {
        self.tx.send_if_modified(|s| std::mem::replace(s, serving) != serving);
    }
}

async fn publish(reporter: HealthReporter, mut rx: tokio::sync::watch::Receiver<bool>) {
    loop {
        let status = if *rx.borrow_and_update() { ServingStatus::Serving } else { ServingStatus::NotServing };
        reporter.set_service_status("", status).await;
        reporter.set_service_status(LOCK_SERVICE, status).await;
        if rx.changed().await.is_err() {
            return;
        }
    }
}
