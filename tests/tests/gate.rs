//! The correctness gate's checkers on real histories: a fault-free workload
//! with contention and lease expiries passes C1 and C3, and a deliberately
//! broken arbiter (a release not guarded by create revision) fails.
//! The fault-injecting gate itself (`holdfast-gate`) is tested in `gate_faults.rs`.

use holdfast_checkers::{etcd_log, linearizable};
use holdfast_model::LockKey;
use holdfast_tests::recorder::{Recorder, etcd_lock_log};
use holdfast_tests::*;
use std::sync::Arc;
use std::time::Duration;

fn key(s: &str) -> LockKey {
    LockKey::parse(s).unwrap()
}

/// The workload's class: 5 s, so the vanished holders' holds expire soon.
const EXPIRING: &[(&str, u64)] = &[("gate", 5)];
/// The mutants' class: 30 s, so no session expires during a test.
const LASTING: &[(&str, u64)] = &[("gate", 30)];

#[tokio::test]
async fn a_contended_workload_with_expiries_passes_c1_and_c3() {
    contended_workload("gate-ok", &defaults).await;
}

/// Group commit must not weaken any checker: the same workload, grouped.
#[tokio::test]
async fn a_contended_workload_with_group_commit_passes_c1_and_c3() {
    contended_workload("gate-grouped", &|c| c.grants.group_commit = true).await;
}

async fn contended_workload(name: &str, configure: Configure<'_>) {
    let Appliance { dir: _dir, etcd, pki, arbiter, controller: _controller } =
        Appliance::start_policy(name, 1, configure, EXPIRING, "").await;
    let rec = Arc::new(Recorder::default());
    let mut tasks = Vec::new();
    for p in 0..6u64 {
        let client = arbiter.client(&pki, &pki.workload(&format!("p{p}"), &format!("svc/p{p}"))).await;
        let rec = rec.clone();
        tasks.push(tokio::spawn(async move {
            let session = client.open_session(Duration::from_secs(5)).await.unwrap();
            for i in 0..30u64 {
                let k = key(&format!("gate/k{}", (p + i) % 3));
                if let Some(h) = rec.acquire(p, &session, &k, Duration::from_secs(3)).await {
                    tokio::time::sleep(Duration::from_millis((p * 7 + i * 3) % 20)).await;
                    let (sid, token) = (h.session_id(), h.token().expose());
                    rec.release(p, sid, &k, token, h.release()).await;
                }
            }
        }));
    }
    // Two holders that vanish without releasing: their holds end by expiry.
    for p in 100..102u64 {
        let client = arbiter.client(&pki, &pki.workload(&format!("z{p}"), &format!("svc/z{p}"))).await;
        let session = client.open_session(Duration::from_secs(5)).await.unwrap();
        let k = key(&format!("gate/k{}", p % 3));
        let hold = rec.acquire(p, &session, &k, Duration::from_secs(10)).await;
        assert!(hold.is_some());
        drop(session); // keepalives stop; the lease expires in 5 s
    }
    for t in tasks {
        t.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(7)).await;
    let history = rec.history(etcd_lock_log(&etcd.client().await).await);
    let stats = history.stats();
    eprintln!("gate smoke: {stats:?}");
    assert!(stats.ok_grants >= 100, "too few grants to mean anything: {stats:?}");
    let deletes = history.etcd.events.iter().filter(|e| matches!(e.kind, holdfast_checkers::history::EtcdEventKind::Delete)).count();
    let releases = history
        .ops
        .iter()
        .filter(|o| {
            matches!(o.kind, holdfast_checkers::history::OpKind::Release { .. }) && o.outcome == holdfast_checkers::history::Outcome::Ok
        })
        .count();
    assert_eq!(deletes, releases + 2, "etcd's log has every release plus the two expiries of the vanished holders");
    // Every unknown outcome records when the client gave up.
    history.validate().unwrap();
    for o in history.ops.iter().filter(|o| o.outcome == holdfast_checkers::history::Outcome::Unknown) {
        assert!(o.gave_up_ns.is_some_and(|g| g >= o.invoke_ns), "an unknown outcome without a give-up time: {o:?}");
    }
    let r1 = etcd_log::check(&history);
    assert!(r1.passed(), "C1: {:?}", r1.violations);
    let r3 = linearizable::check(&history, &linearizable::Config::default());
    assert!(r3.passed(), "C3: {:?} inconclusive {:?}", r3.violations, r3.inconclusive);
}

#[tokio::test]
async fn an_arbiter_whose_release_is_not_guarded_by_create_revision_fails_c3() {
    let Appliance { dir: _dir, etcd, pki, arbiter, controller: _controller } =
        Appliance::start_policy("gate-mutant", 1, &|c| c.mutation.release_unguarded = true, LASTING, "").await;
    let rec = Recorder::default();
    let k = key("gate/stale");
    let a = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let b = arbiter.client(&pki, &pki.workload("b", "svc/b")).await;
    let c = arbiter.client(&pki, &pki.workload("c", "svc/c")).await;
    let sa = a.open_session(Duration::from_secs(30)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(30)).await.unwrap();
    let sc = c.open_session(Duration::from_secs(30)).await.unwrap();
    let ha = rec.acquire(1, &sa, &k, Duration::ZERO).await.unwrap();
    let (a_id, a_token) = (ha.session_id(), ha.token().expose());
    assert!(rec.release(1, a_id, &k, a_token, ha.release()).await);
    let hb = rec.acquire(2, &sb, &k, Duration::ZERO).await.unwrap();
    // A retried (stale) release of A's old hold: the broken arbiter deletes B's hold.
    let req = holdfast_proto::v1::ReleaseRequest { session_id: a_id, namespace: "gate".into(), key: "stale".into(), token: a_token };
    let mut rpc = a.rpc();
    rec.release(
        1,
        a_id,
        &k,
        a_token,
        async move { Ok(rpc.release(req).await.map_err(holdfast_client::Error::from)?.into_inner().released) },
    )
    .await;
    // C now gets the key while B still believes it holds it.
    let hc = rec.acquire(3, &sc, &k, Duration::ZERO).await;
    assert!(hc.is_some(), "the mutation did not take effect");
    let history = rec.history(etcd_lock_log(&etcd.client().await).await);
    let r3 = linearizable::check(&history, &linearizable::Config::default());
    // A violation, not merely a key too large to decide (which also fails
    // `passed`).
    assert!(
        r3.has(holdfast_checkers::report::Rule::NotLinearizable) || r3.has(holdfast_checkers::report::Rule::UnexplainedDelete),
        "C3 must catch the unguarded release with a violation: {:?}, inconclusive {:?}",
        r3.violations,
        r3.inconclusive
    );
    assert!(r3.inconclusive.is_empty(), "this key's few operations are always decided: {:?}", r3.inconclusive);
    eprintln!("C3 caught: {:?}", r3.violations.iter().map(|v| format!("{:?}: {}", v.rule, v.explanation)).collect::<Vec<_>>());
    drop(hb);
}

#[tokio::test]
async fn an_arbiter_minting_tokens_from_a_local_counter_fails_c1() {
    let Appliance { dir: _dir, etcd, pki, arbiter, controller: _controller } =
        Appliance::start_policy("gate-counter", 1, &|c| c.mutation.token_from_counter = true, LASTING, "").await;
    let rec = Recorder::default();
    let client = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    for i in 0..5 {
        let k = key(&format!("gate/c{i}"));
        let h = rec.acquire(1, &session, &k, Duration::ZERO).await.unwrap();
        let (sid, t) = (h.session_id(), h.token().expose());
        rec.release(1, sid, &k, t, h.release()).await;
    }
    let history = rec.history(etcd_lock_log(&etcd.client().await).await);
    let r1 = etcd_log::check(&history);
    assert!(
        r1.has(holdfast_checkers::report::Rule::GrantWithoutEtcdEvent),
        "C1 must see grants with no etcd event at their revision: {:?}",
        r1.violations
    );
}

#[tokio::test]
async fn an_arbiter_that_does_not_compare_the_epoch_fails_c1_after_an_advance() {
    // A long check interval keeps the arbiter serving its cached epoch after
    // the advance, as it would between two checks.
    let configure = |c: &mut ArbiterConfig| {
        c.seal.check_interval = Duration::from_secs(30);
        c.mutation.no_epoch_compare = true;
    };
    let Appliance { dir: _dir, etcd, pki, arbiter, controller: _controller } =
        Appliance::start_policy("gate-epoch", 1, &configure, LASTING, "").await;
    let rec = Recorder::default();
    let client = arbiter.client(&pki, &pki.workload("a", "svc/a")).await;
    let k = key("gate/epoch");
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let h = rec.acquire(1, &session, &k, Duration::ZERO).await.unwrap();
    let (sid, t) = (h.session_id(), h.token().expose());
    rec.release(1, sid, &k, t, h.release()).await;
    // The advance: epoch 2. This arbiter still serves epoch 1 until its next check.
    let record = holdfast_store::epoch::advance(&etcd.holdfast().await, 1).await.unwrap();
    let session = client.open_session(Duration::from_secs(30)).await.unwrap();
    let stale = rec.acquire(1, &session, &k, Duration::ZERO).await;
    assert!(stale.is_some(), "the mutant granted after the advance");
    let history = rec.history(etcd_lock_log(&etcd.client().await).await);
    assert_eq!(history.etcd.epoch_changes.last().map(|c| c.epoch), Some(record.epoch as u64), "etcd's log shows the advance");
    let r1 = etcd_log::check(&history);
    let wrong: Vec<_> = r1.violations.iter().filter(|v| v.rule == holdfast_checkers::report::Rule::GrantWrongEpoch).collect();
    assert_eq!(wrong.len(), 1, "C1 must see exactly the grant after the advance in a stale epoch: {:?}", r1.violations);
}

/// A key too large for the linearizability search proves nothing: `holdfast-gate
/// check` fails on an inconclusive key just as on a violation.
#[test]
fn gate_check_fails_on_an_inconclusive_key() {
    use holdfast_checkers::history::make_token;
    use holdfast_checkers::{ClientOp, EtcdEvent, EtcdEventKind, History, OpKind, Outcome};
    let mut h = History::default();
    h.etcd.epoch = 1;
    for (i, rev) in [5u64, 7, 9].into_iter().enumerate() {
        let (s, t) = (i as i64 + 1, i as u64 * 100);
        let key = "ns/a".to_string();
        h.ops.push(ClientOp {
            process: s as u64,
            kind: OpKind::Acquire { key: key.clone() },
            session: Some(s),
            token: Some(make_token(1, rev)),
            invoke_ns: t,
            complete_ns: Some(t + 10),
            outcome: Outcome::Ok,
            gave_up_ns: None,
        });
        h.ops.push(ClientOp {
            process: s as u64,
            kind: OpKind::Release { key },
            session: Some(s),
            token: Some(make_token(1, rev)),
            invoke_ns: t + 20,
            complete_ns: Some(t + 30),
            outcome: Outcome::Ok,
            gave_up_ns: None,
        });
        h.etcd.events.push(EtcdEvent {
            kind: EtcdEventKind::Put,
            key: "/l/ns/a".into(),
            revision: rev,
            create_revision: rev,
            lease: s,
            expired: None,
        });
        h.etcd.events.push(EtcdEvent {
            kind: EtcdEventKind::Delete,
            key: "/l/ns/a".into(),
            revision: rev + 1,
            create_revision: rev,
            lease: s,
            expired: Some(false),
        });
    }
    let dir = TestDir::new("gate-check");
    let file = dir.path.join("history.json");
    std::fs::write(&file, serde_json::to_vec(&h).unwrap()).unwrap();
    let check = |extra: &[&str]| {
        std::process::Command::new(bin("holdfast-gate")).arg("check").args(extra).arg(&file).output().expect("holdfast-gate check")
    };
    let ok = check(&[]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stdout));
    let out = check(&["--max-ops-per-key", "4"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "an inconclusive key must fail the check:\n{text}");
    assert!(text.contains("inconclusive on ns/a"), "{text}");

    // A give-up time on an acknowledged operation is a malformed history:
    // exit 2 and say which operation, rather than check something else.
    h.ops[0].gave_up_ns = Some(15);
    std::fs::write(&file, serde_json::to_vec(&h).unwrap()).unwrap();
    let bad = check(&[]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(err.contains("malformed") && err.contains("op 0"), "{err}");
}
