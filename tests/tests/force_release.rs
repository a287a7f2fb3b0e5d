//! Force-release with two signed approvals, against a real etcd over mTLS
//! with authentication on and the force-release role: the request shows
//! whether the class is fenced; apply deletes exactly the named hold —
//! never a newer hold of the same key — and writes the force record; a
//! replay and a single signature change nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::EtcdConfig;
use holdfast_model::LockKey;
use holdfast_model::layout::{self, ForceRecord};
use holdfast_store::roles::ARBITER;
use holdfast_tests::*;
use std::time::Duration;

async fn force_record(etcd: &Etcd, request: &str) -> Option<(ForceRecord, i64)> {
    let text = std::fs::read_to_string(request).unwrap();
    let nonce = text.lines().find_map(|l| l.strip_prefix("nonce = ")).unwrap().trim_matches('"').to_string();
    let key = layout::force_key(&nonce);
    let resp = etcd.client().await.get(key.as_str(), None).await.unwrap();
    let kv = resp.kvs().first()?;
    Some((layout::decode(&key, kv.value()).unwrap(), kv.lease()))
}

async fn held(etcd: &Etcd, key: &str) -> Option<layout::HoldRecord> {
    let k = format!("{}{key}", layout::HOLD_PREFIX);
    let resp = etcd.client().await.get(k.as_str(), None).await.unwrap();
    resp.kvs().first().map(|kv| layout::decode(&k, kv.value()).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn force_release_ends_exactly_the_named_hold_with_two_approvals() {
    let dir = TestDir::new("force-release");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    // fr: fenced (10 s, a fixture pause-test result); fra: advisory (30 s).
    // The approver carol's grants allow force-releasing fra/ only.
    let carol = format!("[grant.carol]\nidentity = \"{LAB_IDENTITIES}ops/carol\"\nforce_release = [\"fra/\"]\n");
    let _controller = etcd.publish_policy(&dir.path, &[("fr", 10), ("fra", 30)], &carol).await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    let (a, b, c) = (
        arbiter.client(&pki, &pki.workload("a", "svc/a")).await,
        arbiter.client(&pki, &pki.workload("b", "svc/b")).await,
        arbiter.client(&pki, &pki.workload("c", "svc/c")).await,
    );
    let key = |k: &str| LockKey::parse(k).unwrap();
    let sa = a.open_session_for("fr", None).await.unwrap();
    let _x = sa.acquire(&key("fr/x"), Duration::ZERO).await.unwrap();
    let _w = sa.acquire(&key("fr/w"), Duration::ZERO).await.unwrap();
    let sb = b.open_session_for("fra", None).await.unwrap();
    let y1 = sb.acquire(&key("fra/y"), Duration::ZERO).await.unwrap();

    let ops = ForceOps::new(&dir.path, &etcd);

    // The request shows the hold and whether the class is fenced.
    let (fenced_req, out) = ops.request("fr/x", &[]);
    assert!(out.stdout.contains("the hold of spiffe://holdfast.dev/svc/a") && out.stdout.contains(", fenced"), "{out}");
    assert!(!out.stdout.contains("WARNING"), "{out}");
    let (advisory_req, out) = ops.request("fra/y", &[]);
    assert!(out.stdout.contains("ADVISORY") && out.stdout.contains("WARNING: fra/y is not fenced"), "{out}");
    let text = std::fs::read_to_string(&fenced_req).unwrap();
    assert!(!text.contains("revision"), "the request names no revision: {text}");

    // One signature: refused, nothing changes.
    let revision = etcd.revision().await;
    ops.sign(&fenced_req, &[0]);
    let one = ops.ctl(&["force-release", "apply", &fenced_req]);
    assert_eq!(one.code, 77, "{one}");
    assert_eq!(etcd.revision().await, revision);

    // Two: exactly fr/x is deleted, and the force record says who and why.
    ops.sign(&fenced_req, &[1]);
    let done = ops.ctl(&["force-release", "apply", &fenced_req, "--json"]);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(done.json()["released"], "fr/x");
    assert!(held(&etcd, "fr/x").await.is_none(), "fr/x is still held");
    assert!(held(&etcd, "fr/w").await.is_some(), "another hold of the session went too");
    let (record, lease) = force_record(&etcd, &fenced_req).await.expect("the force record");
    assert_eq!((record.requester.as_str(), record.approver.as_str(), record.fenced), ("alice", "bob", true));
    assert_eq!((record.namespace.as_str(), record.key.as_str(), record.holder.as_str()), ("fr", "x", "spiffe://holdfast.dev/svc/a"));
    assert_eq!(record.reason, "a stuck batch job");
    let ttl = etcd.client().await.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(ttl > 23 * 3600 && ttl <= 24 * 3600, "force record lease TTL {ttl}");

    // Replayed: refused by its nonce, nothing changes.
    let revision = etcd.revision().await;
    let replay = ops.ctl(&["force-release", "apply", &fenced_req]);
    assert_eq!(replay.code, 65, "{replay}");
    assert!(replay.stderr.contains("already carried out"), "{replay}");
    assert_eq!(etcd.revision().await, revision);

    // A newer hold of the same key, taken after the request: untouched.
    assert!(y1.release().await.unwrap());
    let sc = c.open_session_for("fra", None).await.unwrap();
    let _y2 = sc.acquire(&key("fra/y"), Duration::ZERO).await.unwrap();
    ops.sign(&advisory_req, &[0, 1]);
    let revision = etcd.revision().await;
    let stale = ops.ctl(&["force-release", "apply", &advisory_req]);
    assert_eq!(stale.code, 65, "{stale}");
    assert!(
        stale.stderr.contains("is held now by spiffe://holdfast.dev/svc/c") && stale.stderr.contains("not the hold the request names"),
        "{stale}"
    );
    assert_eq!(held(&etcd, "fra/y").await.unwrap().spiffe_id, "spiffe://holdfast.dev/svc/c");
    assert_eq!(etcd.revision().await, revision, "the refused force-release wrote to etcd");

    // What the requester wrote about the hold's cluster and class is
    // derived again at apply: a request edited before both signed it (the
    // fenced class called advisory, another class, another cluster) is
    // refused, and nothing changes.
    let _v = sa.acquire(&key("fr/v"), Duration::ZERO).await.unwrap();
    let edits = [
        ("fenced = ", "fenced = false", "the request says fenced = false, but the published class set says true"),
        ("class = ", "class = \"fra\"", "the request says class = fra, but the published class set says fr"),
        ("cluster_id = ", "cluster_id = \"12345\"", "but the request names 12345"),
    ];
    for (field, edited_line, says) in edits {
        let (req, _) = ops.request("fr/v", &[]);
        let text = std::fs::read_to_string(&req).unwrap();
        let edited: Vec<&str> = text.lines().map(|l| if l.starts_with(field) { edited_line } else { l }).collect();
        assert_ne!(edited.join("\n") + "\n", text, "no {field} line in {text}");
        std::fs::write(&req, edited.join("\n") + "\n").unwrap();
        ops.sign(&req, &[0, 1]);
        let revision = etcd.revision().await;
        let refused = ops.ctl(&["force-release", "apply", &req]);
        assert_eq!(refused.code, 65, "{refused}");
        assert!(refused.stderr.contains(says), "{refused}");
        assert_eq!(etcd.revision().await, revision, "a refused force-release wrote to etcd");
    }
    assert!(held(&etcd, "fr/v").await.is_some(), "fr/v was released by an edited request");

    // Each signer's grants bound what they may release: carol's force_release
    // covers fra/ only. Her own request for fr/v is refused, and so is one
    // she approves; nothing changes.
    let revision = etcd.revision().await;
    let hers = ops.ctl(&["force-release", "request", "fr/v", "--requester", "carol", "--reason", "outside her grants"]);
    assert_eq!(hers.code, 65, "{hers}");
    assert!(
        hers.stderr.contains("carol may not force-release fr/v")
            && hers.stderr.contains(&format!("no grant of {LAB_IDENTITIES}ops/carol lists a force_release prefix covering it")),
        "{hers}"
    );
    let (req, _) = ops.request("fr/v", &[]);
    ops.sign(&req, &[0, 2]);
    let refused = ops.ctl(&["force-release", "apply", &req]);
    assert_eq!(refused.code, 77, "{refused}");
    assert!(refused.stderr.contains("carol may not force-release fr/v"), "{refused}");
    assert_eq!(etcd.revision().await, revision, "a force-release outside a signer's grants wrote to etcd");
    assert!(held(&etcd, "fr/v").await.is_some(), "fr/v was released outside carol's grants");
    // Within her grants she may approve.
    let _z = sb.acquire(&key("fra/z"), Duration::ZERO).await.unwrap();
    let (req, _) = ops.request("fra/z", &[]);
    ops.sign(&req, &[0, 2]);
    let done = ops.ctl(&["force-release", "apply", &req]);
    assert_eq!(done.code, 0, "{done}");
    assert!(held(&etcd, "fra/z").await.is_none(), "fra/z is still held");

    // --revoke-session ends the holder's session: its other hold goes too.
    let (revoke_req, _) = ops.request("fr/w", &["--revoke-session"]);
    ops.sign(&revoke_req, &[0, 1]);
    let done = ops.ctl(&["force-release", "apply", &revoke_req]);
    assert_eq!(done.code, 0, "{done}");
    assert!(done.stdout.contains("the holder's session ended"), "{done}");
    let mut session_gone = false;
    for _ in 0..50 {
        let s = etcd.client().await.get(layout::session_key(sa.id() as i64), None).await.unwrap();
        if s.kvs().is_empty() {
            session_gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(session_gone, "the holder's session record outlived the revoke");
}

/// With a separate coord cluster the request's nonce is recorded there, so a
/// restore of the entity cluster from before the force-release (the hold is
/// back) cannot make the request run again; the coord cluster has its own
/// etcd CA here, given by the --coord-* flags.
#[tokio::test(flavor = "multi_thread")]
async fn a_force_release_recorded_on_coord_is_not_replayed_after_an_entity_restore() {
    let dir = TestDir::new("force-release-coord");
    let mut etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    let coord = Etcd::start_secure(&dir.path.join("coord"), 1).await;
    coord.enable_auth().await;
    // The arbiter here reads its class set from the entity cluster;
    // holdfastctl, given the coord cluster, reads it there, as in a
    // deployment: published on both.
    let _controller = etcd.publish_policy(&dir.path, &[("fr", 10)], "").await;
    let _coord_controller = coord.publish_policy(&dir.path.join("coord"), &[("fr", 10)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    let a = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let sa = a.open_session_for("fr", None).await.unwrap();
    let _x = sa.acquire(&LockKey::parse("fr/x").unwrap(), Duration::ZERO).await.unwrap();
    let snapshot = dir.path.join("entity.db");
    etcd.snapshot(&snapshot);

    let ops = ForceOps::new(&dir.path, &etcd);
    let user = coord.config_as(holdfast_store::roles::FORCE_RELEASE.name);
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
    let (endpoint, ca, cert, key) = (
        format!("--coord-endpoint={}", user.endpoints.join(",")),
        format!("--coord-ca={}", path(&user.ca_file)),
        format!("--coord-cert={}", path(&user.cert_file)),
        format!("--coord-key={}", path(&user.key_file)),
    );
    let (request, _) = ops.request("fr/x", &[&endpoint, &ca, &cert, &key]);
    assert!(std::fs::read_to_string(&request).unwrap().contains("fenced = true"), "the class was read on coord");
    ops.sign(&request, &[0, 1]);
    let apply = ["force-release", "apply", &request, &endpoint, &ca, &cert, &key];
    let done = ops.ctl(&apply);
    assert_eq!(done.code, 0, "{done}");
    assert!(held(&etcd, "fr/x").await.is_none(), "fr/x is still held");
    let text = std::fs::read_to_string(&request).unwrap();
    let nonce = text.lines().find_map(|l| l.strip_prefix("nonce = ")).unwrap().trim_matches('"').to_string();
    let key = layout::nonce_key(&nonce);
    let (on_coord, on_entity) = (
        coord.client().await.get(key.as_str(), None).await.unwrap().count(),
        etcd.client().await.get(key.as_str(), None).await.unwrap().count(),
    );
    assert_eq!((on_coord, on_entity), (1, 0), "the nonce is recorded on the coord cluster only");

    // The entity cluster restored from before the release: the hold is back,
    // and the replay is refused by the coord cluster's record.
    etcd.restore(&snapshot, false).await;
    assert!(held(&etcd, "fr/x").await.is_some(), "the restore brought the hold back");
    let replay = ops.ctl(&apply);
    assert_eq!(replay.code, 65, "{replay}");
    assert!(replay.stderr.contains("already carried out"), "{replay}");
    assert!(held(&etcd, "fr/x").await.is_some(), "the replay deleted the restored hold");
    assert!(force_record(&etcd, &request).await.is_none(), "the replay wrote a force record");
}
