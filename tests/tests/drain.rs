//! The drain fence (docs/protocol.md): a drain marker on an entity cluster
//! refuses every grant of its range there, in etcd's own transaction, with
//! a typed MOVING refusal that says when to retry, while releases go on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use holdfast_client::{AcquireOptions, Error, ErrorReason, Fenced};
use holdfast_model::LockKey;
use holdfast_model::layout::{self, DrainRecord};
use holdfast_tests::*;
use std::time::Duration;

fn key(s: &str) -> LockKey {
    LockKey::parse(s).unwrap()
}

fn no_fence() -> impl Fn(Fenced) + Send + Sync + 'static {
    |f: Fenced| panic!("unexpected fence of {} keys", f.keys.len())
}

/// "orders" is a 30 s class; `wait` lets a refusal show it does not wait.
fn opts(wait: Duration) -> AcquireOptions {
    AcquireOptions { ttl: Some(Duration::from_secs(30)), wait }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn moving(r: Result<holdfast_client::LockGuard, Error>, what: &str) -> Duration {
    match r {
        Err(e) if e.reason() == Some(ErrorReason::Moving) => {
            assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{what}: {e}");
            e.retry_after().unwrap_or_else(|| panic!("{what}: MOVING without a retry-after: {e}"))
        }
        Err(e) => panic!("{what}: refused, but not as moving: {e}"),
        Ok(_) => panic!("{what}: granted while its range drains"),
    }
}

async fn holds(etcd: &Etcd) -> Vec<String> {
    let r = etcd.client().await.get(layout::HOLD_PREFIX, Some(etcd_client::GetOptions::new().with_prefix())).await.unwrap();
    r.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn a_drain_marker_refuses_its_ranges_grants_with_a_retry_after_and_releases_go_on() {
    let app = Appliance::start("drain", 1).await;
    let locker = app.locker("svc/drain", &[&app.arbiter], no_fence());
    // Held before the drain: its release must still work.
    let before = locker.acquire(&key("orders/eu/held"), opts(Duration::ZERO)).await.unwrap();
    let mut etcd = app.etcd.client().await;
    let until = now_ms() + 5_000;
    let record = layout::encode(&DrainRecord { since_unix_ms: now_ms(), until_unix_ms: until });
    etcd.put(layout::drain_key("orders/eu"), record.clone(), None).await.unwrap();

    // A key of the draining unit: refused at once (a wait does not wait),
    // told to come back about when the drain should end, nothing written.
    let t = std::time::Instant::now();
    let retry = moving(locker.acquire(&key("orders/eu/7"), opts(Duration::from_secs(3))).await, "orders/eu/7");
    assert!(t.elapsed() < Duration::from_secs(2), "the refusal waited {:?}", t.elapsed());
    assert!(retry > Duration::from_secs(3) && retry <= Duration::from_secs(5), "retry after {retry:?}, the drain ends in about 5 s");
    assert_eq!(holds(&app.etcd).await, ["/l/orders/eu/held"], "only the hold from before the drain");
    // Deeper keys of the unit too; another unit of the namespace is served.
    moving(locker.acquire(&key("orders/eu/7/lines"), opts(Duration::ZERO)).await, "orders/eu/7/lines");
    let other = locker.acquire(&key("orders/us/7"), opts(Duration::ZERO)).await.unwrap();
    // Releases go on: the drain waits for exactly these holds to end.
    assert!(before.release().await.unwrap(), "a hold from before the drain releases");
    assert!(other.release().await.unwrap());

    // A marker at any depth fences the keys below it, whatever segment
    // count the arbiter's map has: the namespace's, and a two-segment unit.
    etcd.put(layout::drain_key("orders"), record.clone(), None).await.unwrap();
    moving(locker.acquire(&key("orders/us/7"), opts(Duration::ZERO)).await, "orders/us/7 under a namespace marker");
    etcd.delete(layout::drain_key("orders"), None).await.unwrap();
    etcd.put(layout::drain_key("orders/us/7"), b"not a record".to_vec(), None).await.unwrap();
    let least = moving(locker.acquire(&key("orders/us/7/x"), opts(Duration::ZERO)).await, "orders/us/7/x");
    assert_eq!(least, Duration::from_millis(250), "an unreadable record: the shortest wait");
    locker.acquire(&key("orders/us/8"), opts(Duration::ZERO)).await.unwrap().release().await.unwrap();

    // The drain ends (on this cluster, the move was undone): served again.
    etcd.delete(layout::DRAIN_PREFIX, Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    let g = locker.acquire(&key("orders/eu/7"), opts(Duration::ZERO)).await.unwrap();
    assert_eq!(holds(&app.etcd).await, ["/l/orders/eu/7"]);
    assert!(g.release().await.unwrap());
}
