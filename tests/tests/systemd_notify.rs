//! The arbiter speaks systemd's notify protocol: READY=1 only once it can
//! serve (listener bound and etcd answered), STOPPING=1 on SIGTERM.

use holdfast_tests::*;
use std::time::Duration;

#[tokio::test]
async fn ready_is_sent_only_once_the_arbiter_can_serve() {
    let dir = TestDir::new("notify");
    let pki = Pki::new(&dir.path);
    // etcd is not there yet: the arbiter must not claim readiness.
    let port = holdfast_devkit::ports::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut arbiter = Arbiter::spawn(&dir.path, "arbiter", std::slice::from_ref(&endpoint), &pki);
    let early = arbiter.wait_ready(Duration::from_secs(3));
    assert!(early.is_err(), "READY=1 before etcd answered");
    assert!(!arbiter.notify.messages().iter().any(|m| m.contains("READY=1")));

    // Start etcd on that port; the same arbiter becomes ready by itself.
    let mut etcd = Etcd::start_on(&dir.path, &[port]).await;
    arbiter.wait_ready(Duration::from_secs(20)).expect("READY=1 once etcd answers");
    let mut real = arbiter;
    let client = real.client(&pki, &pki.workload("w", "team/w")).await;
    // Ready but sealed: the epoch is not initialised yet, and it says so.
    let status = client.server_status().await.unwrap();
    assert!(status.sealed && status.sealed_reason.contains("epoch init"), "{status:?}");
    etcd.init_epoch().await;
    real.wait_sealed(&client, false, Duration::from_secs(10)).await;

    // STOPPING=1 on SIGTERM, and a clean exit.
    let mut child = real.child.take().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "arbiter exit status {status}");
    real.notify.drain();
    assert!(real.notify.messages().iter().any(|m| m.contains("STOPPING=1")), "{:?}", real.notify.messages());
    etcd.stop_all();
}
