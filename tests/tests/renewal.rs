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

/// A keepalive stream that stops answering (as one whose next request waits
/// inside etcd: etcd answers a stream in order) is noticed within its stall
/// bound — four times its own p99, at least 250 ms — not etcd's 5 s request
/// timeout, and its renewals move to a fresh stream: every session stays
/// healthy (no keepalive fails, so no client drains), granting never
/// pauses, and the arbiter counts the stalled stream. The stall is the
/// test build's `HOLDFAST_FAULT_STALL_KEEPALIVE_AFTER`: the arbiter's first
/// etcd keepalive stream hands on 40 answers, then none.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_keepalive_stream_is_replaced_within_its_p99_bound_and_pauses_nothing() {
    let app = Appliance::start_env("renewal-stalled-stream", 1, &[("HOLDFAST_FAULT_STALL_KEEPALIVE_AFTER", "40")]).await;
    let clients = [app.client("team/a").await, app.client("team/a").await];
    let mut sessions = Vec::new();
    for i in 0..200 {
        // TTL 5 s: a keepalive about every 1.7 s; ~3 sessions per etcd stream.
        sessions.push(clients[i % 2].open_session(Duration::from_secs(5)).await.unwrap());
    }
    let degraded = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for s in &sessions {
        let mut h = s.health();
        let degraded = degraded.clone();
        tokio::spawn(async move {
            while h.changed().await.is_ok() {
                if *h.borrow_and_update() != Health::Healthy {
                    degraded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
    }
    let stalled =
        || async { sample(&scrape(app.arbiter.metrics_port).await, "holdfast_arbiter_keepalive_streams_stalled_total{cluster=\"test\"}") };
    let key = holdfast_model::LockKey::parse("expiry/renewal-stalled").unwrap();
    // The first stream stalls once it has handed on 40 answers (its slot's
    // p99 is known by then); grants go on meanwhile.
    let started = std::time::Instant::now();
    let mut grants = 0;
    while stalled().await < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(90), "no keepalive stream was seen stalled in 90 s");
        let hold = sessions[0].acquire(&key, Duration::ZERO).await.expect("a grant while a keepalive stream is stalled");
        hold.release().await.unwrap();
        grants += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Two more keepalive rounds after the stall.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let hold = sessions[1].acquire(&key, Duration::ZERO).await.expect("a grant after the stall");
    hold.release().await.unwrap();
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(*s.health().borrow(), Health::Healthy, "session {i} is not healthy after its stream stalled");
    }
    assert_eq!(
        degraded.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a session left Healthy: a renewal on the stalled stream failed instead of moving to a fresh stream in time"
    );
    let log = std::fs::read_to_string(&app.arbiter.log).unwrap();
    assert!(log.contains("etcd keepalive stream stalled; its renewals moved to a new stream"), "the stall is not in the log");
    assert!(!log.contains("granting paused"), "granting paused while etcd was up:\n{log}");
    println!("stalled streams {}, grants during the wait {grants}", stalled().await);
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

/// What a leader change does to a lease's remaining TTL, on the etcd under
/// test, with lease checkpointing and its persistence on (as every member
/// runs): the new leader gives a lease of five minutes or less its **full
/// TTL again** (plus its election extension); it never shortens it.
///
/// etcd checkpoints a lease's remaining TTL to the followers only when it
/// is longer than the checkpoint interval (`scheduleCheckpointIfNeeded` in
/// server/lease/lessor.go), and that interval is fixed at five minutes:
/// `defaultLeaseCheckpointInterval` is used whenever
/// `config.ServerConfig.LeaseCheckpointInterval` is zero, and neither a
/// flag (server/embed/config.go) nor the embed server config
/// (server/embed/etcd.go) sets it, in 3.6.17 as in 3.4. So every class TTL
/// (5-300 s) restarts on a leader change: a lapsed holder's key stays held
/// up to one TTL longer (liveness), and no lease ends early (safety; the
/// holder's own deadline is its confirmed keepalive's, not etcd's). If an
/// etcd release carries the remaining TTL across, this test fails: then
/// docs/etcd-versions.md and the class docs change with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_change_restarts_a_short_leases_full_ttl_and_never_shortens_it() {
    const TTL: i64 = 60;
    let dir = TestDir::new("lease-leader-change");
    let mut etcd = Etcd::start(&dir.path, 3).await;
    let mut client = etcd.client().await;
    let lease = client.lease_grant(TTL, None).await.unwrap().id();
    let granted = std::time::Instant::now();
    // 60 % of the TTL.
    tokio::time::sleep(Duration::from_secs(36)).await;
    let left_before = client.lease_time_to_live(lease, None).await.unwrap().ttl();
    let mut leader = None;
    for (i, url) in etcd.endpoints().iter().enumerate() {
        let mut c = etcd_client::Client::connect([url.as_str()], None).await.unwrap();
        let s = c.status().await.unwrap();
        if s.leader() == s.header().unwrap().member_id() {
            leader = Some(i);
        }
    }
    let leader = leader.expect("a leader");
    etcd.members[leader].take().unwrap().kill();
    let killed = granted.elapsed();
    // The new leader's view, from a surviving member.
    let other = etcd.endpoints()[(leader + 1) % 3].clone();
    let mut survivor = etcd_client::Client::connect([other.as_str()], None).await.unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let left_after = loop {
        match survivor.lease_time_to_live(lease, None).await {
            Ok(r) if r.ttl() > 0 => break r.ttl(),
            _ => {
                assert!(std::time::Instant::now() < end, "no new leader answered within 30 s");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let should_have_left = TTL - killed.as_secs() as i64;
    println!(
        "etcd {}: TTL {TTL} s, leader killed at {killed:?}: {left_before} s left before, {left_after} s after on the new leader",
        etcd.bin.version_string()
    );
    assert!(left_after >= should_have_left - 1, "a leader change shortened the lease: {left_after} s left, {should_have_left} s expected");
    assert!(
        left_after >= TTL - 2,
        "the new leader carried the remaining TTL ({left_after} s of {TTL}); etcd now checkpoints short leases: update docs/etcd-versions.md and this test"
    );
}

/// The member of `etcd` that leads now: its index and its member ID.
async fn leader_of(etcd: &Etcd) -> (usize, u64) {
    for _ in 0..100 {
        for (i, url) in etcd.endpoints().iter().enumerate() {
            let Ok(mut c) = etcd_client::Client::connect([url.as_str()], None).await else { continue };
            if let Ok(s) = c.status().await
                && s.leader() != 0
                && s.leader() == s.header().unwrap().member_id()
            {
                return (i, s.leader());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no etcd member leads");
}

/// Waits until member `asked` names a leader other than `old` (30 s at most).
async fn wait_new_leader(etcd: &Etcd, asked: usize, old: u64) {
    let url = etcd.endpoints()[asked].clone();
    let mut c = etcd_client::Client::connect([url.as_str()], None).await.unwrap();
    for _ in 0..300 {
        if let Ok(s) = c.status().await
            && s.leader() != 0
            && s.leader() != old
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no new leader within 30 s");
}

/// A stopped etcd leader wakes with the lease expiries it had: leases the
/// new leader renewed meanwhile look expired to it, and its lessor revokes
/// them before it learns it was deposed (`holdfast_arbiter::deposed`). So
/// while it is silent, the arbiter counts no keepalive of a session granted
/// before the new term: such a session ends at its deadline, while one
/// granted in the new term (no earlier leader knew its lease) stays
/// renewing throughout. Once every member answers in the new term, the
/// arbiter's keepalives count again.
#[tokio::test(flavor = "multi_thread")]
async fn while_a_stopped_leader_may_wake_no_renewal_of_an_older_session_counts() {
    const TTL: Duration = Duration::from_secs(5);
    let app = Appliance::start("renewal-deposed-leader", 3).await;
    let client = app.client("team/a").await;
    let older = client.open_session(TTL).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*older.health().borrow(), Health::Healthy);
    let (l, id) = leader_of(&app.etcd).await;
    let pid = app.etcd.pid(l).expect("the leader runs");
    sigstop(pid);
    let stopped = std::time::Instant::now();
    wait_new_leader(&app.etcd, (l + 1) % 3, id).await;
    // The arbiter's balanced client may still send the grant to the
    // stopped member until its Status loop routes around it.
    let mut newer = None;
    for _ in 0..3 {
        if let Ok(s) = client.open_session(TTL).await {
            newer = Some(s);
            break;
        }
    }
    let newer = newer.expect("a session opened under the new leader");
    // Two TTLs stopped, as the gate's leader-pause at most.
    let lost = tokio::time::timeout(TTL * 2 - stopped.elapsed().min(TTL), async {
        let mut h = older.health();
        while *h.borrow_and_update() != Health::Lost {
            h.changed().await.unwrap();
        }
    })
    .await;
    let lost_after = stopped.elapsed();
    assert!(lost.is_ok(), "a session granted before the stop kept renewing while the deposed leader was stopped");
    assert!(lost_after >= TTL / 3, "lost {lost_after:?} after the stop: before its last deadline could pass");
    // Lost is for good; a keepalive whose quorum read went to the stopped
    // member before the arbiter routed around it may degrade it briefly.
    assert_ne!(*newer.health().borrow(), Health::Lost, "the session granted in the new term was lost");
    tokio::time::sleep((TTL * 2).saturating_sub(stopped.elapsed())).await;
    assert_eq!(*newer.health().borrow(), Health::Healthy, "the session granted in the new term stopped renewing");
    let held =
        sample(&scrape(app.arbiter.metrics_port).await, "holdfast_arbiter_keepalives_held_for_deposed_leader_total{cluster=\"test\"}");
    assert!(held >= 1.0, "no keepalive counted as held back: {held}");
    let log = std::fs::read_to_string(&app.arbiter.log).unwrap();
    assert!(log.contains("do not answer in its term"), "the arbiter did not say why keepalives do not count:\n{log}");
    sigcont(pid);
    // Awake and deposed, the member answers in the new term: keepalives of
    // sessions opened before the next election count again, and the newer
    // session, opened before the wake, stays healthy across it.
    tokio::time::sleep(TTL).await;
    assert_eq!(*newer.health().borrow(), Health::Healthy, "the newer session stopped renewing after the old leader woke");
    assert!(log_after(&app.arbiter.log, &log).contains("keepalives count again"), "the arbiter did not say keepalives count again");
    newer.close().await.unwrap();
}

/// A leader that is killed, not stopped, has no lessor left to revoke
/// with: its port refuses connections, and the sessions granted before the
/// election keep renewing through it.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_leader_ends_no_session() {
    const TTL: Duration = Duration::from_secs(5);
    let mut app = Appliance::start("renewal-killed-leader", 3).await;
    let client = app.client("team/a").await;
    let older = client.open_session(TTL).await.unwrap();
    let mut health = older.health();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (l, id) = leader_of(&app.etcd).await;
    app.etcd.members[l].take().unwrap().kill();
    wait_new_leader(&app.etcd, (l + 1) % 3, id).await;
    // Two TTLs with the old leader gone.
    tokio::time::sleep(TTL * 2).await;
    assert_eq!(*health.borrow_and_update(), Health::Healthy, "a session ended because its leader was killed");
    assert!(!health.has_changed().unwrap());
    let held =
        sample(&scrape(app.arbiter.metrics_port).await, "holdfast_arbiter_keepalives_held_for_deposed_leader_total{cluster=\"test\"}");
    assert_eq!(held, 0.0, "a keepalive was held back for a killed leader");
    app.etcd.restart_member(l).await;
    older.close().await.unwrap();
}

/// What `path` has gained since it read `before`.
fn log_after(path: &std::path::Path, before: &str) -> String {
    std::fs::read_to_string(path).unwrap()[before.len()..].to_string()
}
