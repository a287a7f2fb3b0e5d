//! Calls that go around an etcd member cut off from the quorum: each daemon
//! asks every member for its Status now and then and leaves out of its
//! balanced clients the members that name no leader
//! ([`holdfast_store::Etcd::route_around`]). The arbiter does it in its seal
//! loop, which reads every member's Status anyway; the controller and the
//! tailer run [`spawn`].

use holdfast_store::Etcd;
use holdfast_store::etcd::Rerouted;
use std::time::Duration;

/// How often [`spawn`] asks the members.
pub const EVERY: Duration = Duration::from_secs(1);

/// Logs what [`Etcd::route_around`] changed.
pub fn log(changes: &[Rerouted]) {
    for r in changes {
        match (r.back, &r.error) {
            (_, Some(e)) => tracing::warn!(member = %r.member, error = %e, "could not change the etcd members calls go to"),
            (true, None) => tracing::info!(member = %r.member, "etcd member names a leader again: calls go to it again"),
            (false, None) => tracing::warn!(
                member = %r.member,
                "etcd member names no leader (cut off from the quorum?) or did not answer its Status: calls go around it until it does"
            ),
        }
    }
}

/// Asks every member of `etcd` for its Status every [`EVERY`] and routes
/// the balanced clients around those without a leader, until the process
/// ends.
pub fn spawn(etcd: &Etcd) {
    let etcd = etcd.clone();
    tokio::spawn(async move {
        loop {
            let answers = etcd.member_status().await;
            log(&etcd.route_around(&answers).await);
            tokio::time::sleep(EVERY).await;
        }
    });
}
