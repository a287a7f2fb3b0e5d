//! Long-lived watches follow the leader: a member cut off from the quorum
//! cannot hold one open and silent. `holdfast_store::Etcd::watch`, the
//! client every long-lived watch of the arbiter (expiry, policy and epoch,
//! waiters' key watches, limits) and the tailer uses, sends etcd's
//! require-leader metadata; the grants' client does not.
//!
//! Three real members on loopback; the watches sit on member 0 alone. The
//! other two are stopped (SIGSTOP), so member 0 loses its leader while its
//! gRPC port keeps answering: what an isolated member looks like to a
//! client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::EtcdConfig;
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
