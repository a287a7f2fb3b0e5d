//! `holdfastctl shard` against a real etcd with client TLS and
//! authentication on (`holdfastctl etcd roles`): the shard map
//! (`/sys/shardmap`) is created and edited only with the holdfast-shard
//! user, read with the observer's, every edit raises its version by one, an
//! edit that makes no sense is refused and changes nothing, and two
//! operators editing at once both land.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::EtcdConfig;
use holdfast_model::layout::SHARDMAP_KEY;
use holdfast_store::roles::{ARBITER, OBSERVER, SHARD};
use holdfast_tests::*;
use serde_json::Value;
use std::process::Command;

fn ctl(args: &[&str], cfg: &EtcdConfig) -> Ran {
    Ran::of(Command::new(bin("holdfastctl")).args(args).args(etcd_flags(cfg)))
}

/// `shard list --json` as the observer.
fn listed(observer: &EtcdConfig) -> Value {
    let r = ctl(&["shard", "list", "--json"], observer);
    assert_eq!(r.code, 0, "{r}");
    r.json()
}

fn names(layout: &Value) -> Vec<String> {
    layout["clusters"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shard_map_is_edited_with_its_own_role_and_bad_edits_change_nothing() {
    let dir = TestDir::new("shard-map");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    let roles = ctl(&["etcd", "roles"], &etcd.config());
    assert_eq!(roles.code, 0, "{roles}");
    let (shard, observer, arbiter) = (etcd.config_as(SHARD.name), etcd.config_as(OBSERVER.name), etcd.config_as(ARBITER.name));

    // No map yet: reads say so (one cluster serves every key); edits ask
    // for init.
    let r = ctl(&["shard", "list"], &observer);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("no shard map") && r.stdout.contains("shard init"), "{r}");
    let r = ctl(&["shard", "add", "entity-b", "--client-urls", "https://10.0.2.11:2379"], &shard);
    assert_eq!(r.code, 65, "{r}");
    assert!(r.stderr.contains("holdfastctl shard init"), "{r}");

    // Only the holdfast-shard user writes it.
    for (who, cfg) in [("observer", &observer), ("arbiter", &arbiter)] {
        let r = ctl(&["shard", "init", "entity-a", "--client-urls", "https://10.0.1.11:2379"], cfg);
        assert_eq!(r.code, 77, "{who}: {r}");
        assert!(r.stderr.contains("CN=holdfast-shard"), "{who}: {r}");
    }
    let r = ctl(&["shard", "init", "entity-a", "--client-urls", "https://10.0.1.11:2379,https://10.0.2.11:2379"], &shard);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("shard map version 1: entity-a (1 cluster)"), "{r}");
    let r = ctl(&["shard", "init", "entity-z", "--client-urls", "https://10.0.9.11:2379"], &shard);
    assert_eq!(r.code, 65, "{r}");
    assert!(r.stderr.contains("exists already (version 1)"), "{r}");

    // An edit changes the desired layout only, and raises the version.
    let r = ctl(&["shard", "add", "entity-b", "--client-urls", "https://10.0.1.21:2379"], &shard);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("version 2") && r.stdout.contains("a rebalancer moves the keys"), "{r}");
    let v = listed(&observer);
    assert_eq!((v["version"].as_u64(), v["pending"].as_bool()), (Some(2), Some(true)), "{v}");
    assert_eq!(names(&v["serving"]), ["entity-a"], "{v}");
    assert_eq!(names(&v["desired"]), ["entity-a", "entity-b"], "{v}");
    let r = ctl(&["shard", "assign", "big-tenant", "entity-b"], &shard);
    assert_eq!(r.code, 0, "{r}");
    let r = ctl(&["shard", "segments", "orders", "2"], &shard);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("version 4") && r.stdout.contains("big-tenant assigned to entity-b; orders: 2 segments"), "{r}");

    // Edits that make no sense: a precise error, exit 65, nothing written.
    let before = listed(&observer);
    for (args, want) in [
        (vec!["shard", "add", "entity-b", "--client-urls", "https://10.0.1.31:2379"], "already in the desired layout"),
        (vec!["shard", "add", "Entity_C", "--client-urls", "https://10.0.1.31:2379"], "use 1 to 63 of a-z"),
        (vec!["shard", "assign", "orders", "entity-q"], "not one of the clusters"),
        (vec!["shard", "remove", "entity-b"], "assign them elsewhere first"),
        (vec!["shard", "remove", "entity-q"], "not in the desired layout"),
        (vec!["shard", "segments", "orders", "17"], "1 to 16 path segments"),
    ] {
        let r = ctl(&args, &shard);
        assert_eq!(r.code, 65, "{args:?}: {r}");
        assert!(r.stderr.contains(want), "{args:?}: {r}");
    }
    assert_eq!(listed(&observer), before, "a refused edit changed the map");

    // Where a key lives, and what is pending.
    let r = ctl(&["shard", "where", "orders/shop-7/cart-1", "--json"], &observer);
    assert_eq!(r.code, 0, "{r}");
    let w = r.json();
    assert_eq!((w["cluster"].as_str(), w["unit"].as_str()), (Some("entity-a"), Some("orders/shop-7")), "{w}");
    let r = ctl(&["shard", "status"], &observer);
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("pending: the desired layout") && r.stdout.contains("no move in flight"), "{r}");

    // Two operators at once: both edits land, one version each.
    let (a, b) = (shard.clone(), shard.clone());
    let one = std::thread::spawn(move || ctl(&["shard", "add", "entity-c", "--client-urls", "https://10.0.3.11:2379"], &a));
    let two = std::thread::spawn(move || ctl(&["shard", "add", "entity-d", "--client-urls", "https://10.0.4.11:2379"], &b));
    let (one, two) = (one.join().unwrap(), two.join().unwrap());
    assert_eq!((one.code, two.code), (0, 0), "{one}\n{two}");
    let v = listed(&observer);
    assert_eq!(v["version"].as_u64(), Some(6), "{v}");
    let mut desired = names(&v["desired"]);
    desired.sort();
    assert_eq!(desired, ["entity-a", "entity-b", "entity-c", "entity-d"], "{v}");

    // A map holdfast did not write is reported, never used.
    let mut root = Etcd::client_for(&etcd.config()).await;
    root.put(SHARDMAP_KEY, "{\"version\": 0}", None).await.unwrap();
    let r = ctl(&["shard", "where", "orders/x"], &observer);
    assert_eq!(r.code, 78, "{r}");
    assert!(r.stderr.contains(SHARDMAP_KEY), "{r}");
}
