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

/// Stalls the whole client (a current-thread runtime) for `stall` right
/// after it reads its second keepalive answer, as a SIGSTOP between the
/// answer's arrival and its handling does; records every deadline the
/// session reports with the time it reported it.
struct StallAfterSecondAnswer {
    stall: Duration,
    answers: std::sync::atomic::AtomicU32,
    reported: std::sync::Mutex<Vec<(tokio::time::Instant, tokio::time::Instant)>>,
}

impl holdfast_client::KeepaliveObserver for StallAfterSecondAnswer {
    fn sent(&self, _session: u64) -> u64 {
        0
    }
    fn answered(&self, _session: u64, _mark: u64, outcome: holdfast_client::KeepaliveOutcome) {
        if outcome == holdfast_client::KeepaliveOutcome::Renewed && self.answers.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            std::thread::sleep(self.stall);
        }
    }
    fn deadline(&self, _session: u64, until: tokio::time::Instant) {
        self.reported.lock().unwrap().push((until, tokio::time::Instant::now()));
    }
}

/// A confirmed keepalive whose answer is handled only after the deadline
/// it sets (the client stopped in between) extends nothing: the session is
/// lost at once and no deadline already past is reported. Before the fix
/// the session reported that past deadline as its belief (the gate's C1
/// checker then saw a client "alive" seconds after its lease ended: a CI
/// run's false `DeadlinePastSessionEnd` under `client-pause`) and was
/// healthy until its next turn.
#[tokio::test]
async fn a_keepalive_answer_handled_after_its_deadline_ends_the_session() {
    let app = Appliance::start("renewal-stall", 1).await;
    let client = app.client("team/a").await;
    let ttl = Duration::from_secs(5);
    let observer = std::sync::Arc::new(StallAfterSecondAnswer { stall: ttl, answers: Default::default(), reported: Default::default() });
    let session = client.open_session_observed(ttl, observer.clone()).await.unwrap();
    let mut health = session.health();
    tokio::time::timeout(Duration::from_secs(15), health.wait_for(|h| *h == Health::Lost))
        .await
        .expect("the session outlived a renewal handled after its deadline")
        .unwrap();
    assert!(observer.answers.load(std::sync::atomic::Ordering::SeqCst) >= 2, "the stall never happened");
    assert!(!session.can_start());
    let reported = observer.reported.lock().unwrap().clone();
    assert!(reported.len() >= 2, "the open and the first renewal set deadlines: {reported:?}");
    for (until, at) in &reported {
        assert!(until > at, "a deadline already past when reported ({:?} late): {reported:?}", *at - *until);
    }
}
