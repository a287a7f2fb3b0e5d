//! Long-lived watches follow the leader: a member cut off from the quorum
//! cannot hold one open and silent. `holdfast_store::Etcd::watch`, the
//! client every long-lived watch of the arbiter (expiry, policy and epoch,
//! waiters' key watches, limits) and the tailer uses, sends etcd's
//! require-leader metadata; the grants' client does not.
//!
//! First three real members on loopback with the watches on member 0
//! alone; the other two are stopped (SIGSTOP), so member 0 loses its leader
//! while its gRPC port keeps answering: what an isolated member looks like
//! to a client. Then a running arbiter over all three, with each member in
//! turn cut off from its peers by proxies on the peer links
//! (`holdfast_tests::peernet`) while the other two keep the quorum.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::EtcdConfig;
use holdfast_model::LockKey;
use holdfast_tests::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// etcd's bound, from its source (`api/v3rpc/interceptor.go`,
/// `monitorLeader`): a member without a leader for `maxNoLeaderCnt` (3)
/// checks, one per election timeout, cancels every stream that required
/// one. With the lab's 500 ms election timeout: the leader is lost within
/// about two election timeouts (randomised), then three checks, one more
/// for the phase of the first: under 3.5 s. Allowed: 8 s.
const CANCEL_BOUND: Duration = Duration::from_secs(8);

fn signal(etcd: &Etcd, members: &[usize], sig: Signal) {
    for &i in members {
        kill(Pid::from_raw(etcd.pid(i).expect("member running") as i32), sig).expect("signal the member");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_member_that_lost_its_leader_ends_and_a_new_one_is_refused() {
    let dir = TestDir::new("watches-leader");
    let etcd = Etcd::start(&dir.path, 3).await;
    // Every client of this handle talks to member 0 only.
    let only_m0 = EtcdConfig::plain(vec![etcd.endpoints()[0].clone()]);
    let store = holdfast_store::Etcd::connect(&only_m0).await.unwrap();
    let mut following = store.watch.clone().watch("/watched", None).await.expect("watch on the leader-following client");
    let mut silent = store.client.clone().watch("/watched", None).await.expect("watch on the grants' client");

    // Both streams carry changes while member 0 has a leader.
    etcd.client().await.put("/watched", "1", None).await.unwrap();
    for (what, stream) in [("following", &mut following), ("grants' client", &mut silent)] {
        let event = async {
            loop {
                let resp = stream.message().await.expect(what).expect(what);
                if !resp.created() {
                    return resp;
                }
            }
        };
        let resp = tokio::time::timeout(Duration::from_secs(5), event).await.expect(what);
        assert_eq!(resp.events().len(), 1, "{what}: {resp:?}");
    }

    signal(&etcd, &[1, 2], Signal::SIGSTOP);
    let cut = Instant::now();
    let ended = tokio::time::timeout(CANCEL_BOUND, following.message()).await;
    let after = cut.elapsed();
    match ended {
        Err(_) => panic!("the require-leader watch was still open {CANCEL_BOUND:?} after member 0 lost its quorum"),
        Ok(Ok(Some(resp))) => assert!(resp.canceled(), "an event, not an end, from a member without a leader: {resp:?}"),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => assert!(e.to_string().contains("no leader"), "ended, but not for want of a leader: {e}"),
    }
    eprintln!("the require-leader watch on the isolated member ended {after:?} after its peers stopped");

    // The grants' client's watch is what every long-lived watch used to
    // be: open, and silent, on a member that no longer has a leader.
    let still = tokio::time::timeout(Duration::from_secs(2), silent.message()).await;
    assert!(still.is_err(), "the watch without require-leader ended too ({still:?}): this test no longer shows the difference");

    // A new watch there is refused at once, so a watch loop moves on to a
    // member that has a leader.
    let asked = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(3), async {
        match store.watch.clone().watch("/watched", None).await {
            Err(e) => e.to_string(),
            Ok(mut s) => match s.message().await {
                Err(e) => e.to_string(),
                Ok(m) => format!("answered: {m:?}"),
            },
        }
    })
    .await
    .expect("a new require-leader watch on a member without a leader was neither refused nor ended within 3 s");
    assert!(refused.contains("no leader"), "{refused}");
    eprintln!("a new require-leader watch was refused in {:?}: {refused}", asked.elapsed());

    signal(&etcd, &[1, 2], Signal::SIGCONT);
    etcd.wait_ready().await;
}

/// The arbiter's `holdfast_arbiter_policy_version`.
async fn policy_version(arbiter: &Arbiter) -> u64 {
    let text = scrape(arbiter.metrics_port).await;
    let line = text.lines().find(|l| l.starts_with("holdfast_arbiter_policy_version{"));
    line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no policy version in:\n{text}"))
}

/// The version at `/sys/policy` as the members other than `cut` see it.
async fn published_version(etcd: &Etcd, cut: usize) -> u64 {
    let others: Vec<String> = etcd.endpoints().into_iter().enumerate().filter(|(i, _)| *i != cut).map(|(_, e)| e).collect();
    let mut client = Etcd::client_for(&EtcdConfig::plain(others)).await;
    let resp = client.get(holdfast_model::layout::POLICY_KEY, None).await.expect("read /sys/policy");
    let kv = resp.kvs().first().expect("a published set");
    serde_json::from_slice::<serde_json::Value>(kv.value()).expect("JSON")["version"].as_u64().expect("a version")
}

/// How long after its publication a class-set change may take to reach the
/// arbiter while a member is cut off: the watch on that member ends within
/// three election timeouts of its losing the leader (about 2 s here, see
/// above), then the policy loop reads again within 0.5 s. Without
/// require-leader, a watch on the cut member waits for the heal.
const POLICY_BOUND: Duration = Duration::from_secs(6);

/// With every member cut off in turn (its client port still answering the
/// arbiter), a class-set change published meanwhile reaches the arbiter and
/// a waiter is granted within the poll bound after the holder releases.
/// Whichever member carries the arbiter's watches, one of the three turns
/// cuts it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_any_member_cut_off_policy_changes_and_waiters_still_reach_the_arbiter() {
    let dir = TestDir::new("watches-isolation");
    let etcd = Etcd::start_partitionable(&dir.path, 3).await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_lab_policy(&dir.path).await;
    let pki = Pki::new(&dir.path);
    let arbiter = Arbiter::start(&dir.path, "arbiter", &etcd.endpoints(), &pki);
    let holder = arbiter.client(&pki, &pki.workload("holder", "teams/holder")).await;
    let waiter = arbiter.client(&pki, &pki.workload("waiter", "teams/waiter")).await;
    let policy = dir.path.join("policy");

    for cut in 0..3 {
        let before = policy_version(&arbiter).await;
        etcd.isolate(cut).await;
        let isolated = Instant::now();
        // Let the cut member lose its leader, as a partition would.
        tokio::time::sleep(Duration::from_secs(2)).await;

        // A class-set change: a new advisory class.
        let class = format!(
            "[class.cut{cut}]\nnamespace = \"cut{cut}\"\npurpose = \"efficiency\"\nenforcement = \"advisory\"\n\
             risk_owner = \"holdfast-lab\"\nwaiver_expires = 2099-12-31\nttl = \"30s\"\ntier = \"entity\"\n"
        );
        std::fs::write(policy.join(format!("classes.d/cut{cut}.toml")), class).unwrap();
        let published = loop {
            if published_version(&etcd, cut).await > before {
                break Instant::now();
            }
            assert!(isolated.elapsed() < Duration::from_secs(20), "member {cut} cut off: the controller published nothing in 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let seen = loop {
            if policy_version(&arbiter).await > before {
                break published.elapsed();
            }
            assert!(
                published.elapsed() < POLICY_BOUND,
                "member {cut} cut off: the arbiter had not seen the class set published {POLICY_BOUND:?} ago"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        eprintln!("member {cut} cut off: the arbiter saw the new class set {seen:?} after it was published");

        // A waiter is granted within the poll bound of the holder's release.
        let key = LockKey::parse(&format!("a/cut{cut}")).unwrap();
        let held_by = open(&holder).await;
        let hold = acquire(&held_by, &key).await;
        let waits_in = open(&waiter).await;
        let waiting = tokio::spawn(async move {
            let h = acquire(&waits_in, &key).await;
            (h.token(), Instant::now(), waits_in)
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "the waiter was granted a held key");
        let released = Instant::now();
        assert!(hold.release().await.expect("release"), "the holder's release deleted its hold");
        let (_, at, waits_in) = waiting.await.unwrap();
        let after = at.saturating_duration_since(released);
        eprintln!("member {cut} cut off: the waiter was granted {after:?} after the release");
        assert!(after <= WAITER_BOUND, "granted {after:?} after the release; bound {WAITER_BOUND:?}");
        let _ = waits_in.close().await;
        let _ = held_by.close().await;

        etcd.heal();
        etcd.wait_ready().await;
        // The member catches up before the next one is cut off.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A session in namespace `a`, asked again while the arbiter answers
/// UNAVAILABLE (see [`acquire`]).
async fn open(client: &holdfast_client::Client) -> holdfast_client::Session {
    let start = Instant::now();
    loop {
        match client.open_session_for("a", None).await {
            Ok(s) => return s,
            Err(e) if start.elapsed() < Duration::from_secs(20) && e.reason() == Some(holdfast_client::ErrorReason::Unavailable) => {
                eprintln!("open a session: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("open a session: {e}"),
        }
    }
}

/// `key` on `session`, asked again (as a client library does) while the
/// arbiter answers UNAVAILABLE: a linearizable read it sends to the cut-off
/// member waits out its request timeout, and it pauses granting until it
/// has checked etcd again. Within 20 s.
async fn acquire(session: &holdfast_client::Session, key: &LockKey) -> holdfast_client::Hold {
    let start = Instant::now();
    loop {
        match session.acquire(key, Duration::from_secs(15)).await {
            Ok(h) => return h,
            Err(e) if start.elapsed() < Duration::from_secs(20) && e.reason() == Some(holdfast_client::ErrorReason::Unavailable) => {
                eprintln!("acquire {key}: {e}; asking again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("acquire {key}: {e}"),
        }
    }
}

/// How soon after the holder's release a waiter is granted with a member
/// cut off: the arbiter's waiter poll bound (`waiting::POLL`, 1 s). The
/// arbiter routes its calls around a member whose Status names no leader
/// (`holdfast_store::Etcd::route_around`, from its seal loop): without
/// that, the calls the balancer sends to the cut-off member wait out their
/// request timeout and each failure pauses granting (measured before: a
/// waiter granted 8.8 s after the release, a release refused UNAVAILABLE).
const WAITER_BOUND: Duration = Duration::from_secs(1);
