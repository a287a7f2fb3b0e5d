//! Session renewal at etcd: an arbiter renews its sessions over at most
//! 64 shared etcd keepalive streams (`holdfast_arbiter::renewal::STREAMS`).

use holdfast_client::Health;
use holdfast_tests::*;
use std::time::Duration;

/// `holdfast_arbiter::renewal::STREAMS` (the tests do not link the arbiter).
const ARBITER_STREAMS: f64 = 64.0;

/// LeaseKeepAlive streams etcd has accepted so far (its gRPC metrics on the
/// plain client port).
async fn keepalive_streams_started(etcd: &Etcd) -> f64 {
    let endpoint = etcd.endpoints()[0].clone();
    let port: u16 = endpoint.rsplit(':').next().unwrap().trim_end_matches('/').parse().unwrap();
    scrape(port)
        .await
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains("grpc_method=\"LeaseKeepAlive\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// 200 sessions renew over at most 64 etcd streams (one per session made
/// etcd's HTTP/2 server scan every stream on each frame it wrote: 56 % of
/// its CPU at 40,000 sessions). A lease revoked behind the arbiter's back
/// ends only its own session; the others sharing its etcd stream keep
/// renewing.
#[tokio::test]
async fn sessions_renew_over_a_few_shared_etcd_streams_and_a_lost_lease_ends_only_its_own() {
    let app = Appliance::start("renewal-shared", 1).await;
    // Two connections, 100 sessions (client keepalive streams) each.
    let clients = [app.client("team/a").await, app.client("team/a").await];
    let before = keepalive_streams_started(&app.etcd).await;
    let mut sessions = Vec::new();
    for i in 0..200 {
        // TTL 5 s: a keepalive about every 1.7 s.
        sessions.push(clients[i % 2].open_session(Duration::from_secs(5)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(*s.health().borrow(), Health::Healthy, "session {i} was not renewed");
    }
    let opened = keepalive_streams_started(&app.etcd).await - before;
    assert!(opened >= 1.0, "no keepalive reached etcd: the metric is not read right");
    let most = ARBITER_STREAMS;
    assert!(opened <= most + 1.0, "200 sessions opened {opened} etcd keepalive streams: one per session, not at most {most} shared");

    // Revoke one session's lease directly in etcd.
    let gone = sessions.remove(70);
    app.etcd.client().await.lease_revoke(gone.id() as i64).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(8), async {
        let mut h = gone.health();
        while *h.borrow_and_update() != Health::Lost {
            h.changed().await.unwrap();
        }
    })
    .await;
    assert!(lost.is_ok(), "the session whose lease was revoked was not told it is gone");
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(*s.health().borrow(), Health::Healthy, "session {i} stopped renewing after another's lease was revoked");
    }
    let key = holdfast_model::LockKey::parse("expiry/renewal-shared").unwrap();
    let hold = sessions[0].acquire(&key, Duration::ZERO).await.unwrap();
    hold.release().await.unwrap();
    for s in sessions {
        s.close().await.unwrap();
    }
}
