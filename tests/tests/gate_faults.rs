//! `holdfast-gate`: the short profile (every fault kind once, on a
//! 3-member etcd in network namespaces with two arbiters and eight client
//! processes) passes all checkers with non-vacuous counts, against the etcd
//! under test; an unfenced resource loses updates under client pauses and
//! the gate says so.

use holdfast_gate::catalog;
use holdfast_tests::*;
use std::process::Command;

struct GateRun {
    _dir: TestDir,
    code: i32,
    summary: serde_json::Value,
    output: String,
}

/// One gate at a time: each runs five namespaces and a PostgreSQL cluster,
/// and the machine has two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gate(args: &[&str]) -> GateRun {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("gate-run");
    let out = Command::new(bin("holdfast-gate"))
        .args(["--json", "--dir"])
        .arg(dir.path.join("state"))
        .args(args)
        .env("HOLDFAST_ETCD_BIN", etcd_binary().etcd)
        .output()
        .expect("run holdfast-gate");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stdout.lines().last().unwrap_or_default();
    let summary: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}):\n{stdout}\n{stderr}"));
    GateRun { _dir: dir, code: out.status.code().unwrap_or(-1), summary, output: format!("{stdout}\n{stderr}") }
}

#[test]
fn the_short_profile_passes_with_every_fault_kind_and_non_vacuous_counts() {
    let run = gate(&["--profile", "short", "--resource", "postgres-local"]);
    eprintln!("{}", run.output);
    let s = &run.summary;
    assert_eq!(run.code, 0, "the gate failed");
    assert_eq!(s["violations"], 0);
    assert_eq!(s["etcd_version"].as_str().unwrap(), etcd_binary().version_string(), "the gate says which etcd it ran against");
    let faults = s["faults"].as_object().unwrap();
    // 20 kinds, on every etcd target (leader-disk-stall on 3.4.23 too,
    // since the arbiter waits out a deposed leader's revokes).
    assert_eq!(faults.len(), 20, "every fault kind struck and was confirmed: {faults:?}; unconfirmed: {}", s["faults_unconfirmed"]);
    assert!(s["deadlines"].as_u64().unwrap() >= 200, "client deadlines checked {}", s["deadlines"]);
    // The workload ran: a floor well below what runs give, not a speed
    // target (holdfast-bench measures speed). How many lock operations fit
    // in the episode depends mostly on the fault schedule (the seed: one
    // gave 4,205 and 4,273 on two builds) and on the other gate beside it:
    // 4,205-8,589 over twelve runs on two cores, both targets at once
    // (2026-12-05; the floor was 5,000 until a CI run gave 4,943).
    assert!(s["lock_ops"].as_u64().unwrap() >= 3000, "lock ops {}", s["lock_ops"]);
    // A quarter of the clients' operations lock coord-tier keys, granted
    // on the coord cluster under its own epoch and checked against its log
    // (438 of 1,633 grants in a restore + epoch-advance run, 2026-12-05).
    assert!(s["coord_grants"].as_u64().unwrap() >= 100, "coord-tier grants {}", s["coord_grants"]);
    assert!(s["expiries"].as_u64().unwrap() >= 50, "expiries {}", s["expiries"]);
    assert!(s["leader_changes"].as_u64().unwrap() >= 3, "leader changes {}", s["leader_changes"]);
    assert!(s["stale_rejected"].as_u64().unwrap() >= 20, "stale writes rejected {}", s["stale_rejected"]);
    assert_eq!(s["liveness_failures"], 0, "every key grantable within TTL + election timeout + 5 s of healing");
    assert_eq!(s["false_seals"], 0, "no arbiter sealed itself: nothing was restored");
    assert_eq!(s["inconclusive"], 0, "every key's history was decided");
    eprintln!("withdrawn grants: {}", s["withdrawals"]);
    // Clock skew: the two libfaketime clients' clocks ran slow and fast all along.
    let rates = &s["clock_rates_measured"];
    let slow = rates["client0"].as_f64().unwrap_or(1.0);
    let fast = rates["client1"].as_f64().unwrap_or(1.0);
    assert!((0.8..0.9).contains(&slow) && (1.1..1.2).contains(&fast), "clock rates seen: {rates}");
}

/// Deliberately broken arbiters (test builds with the `mutations` feature)
/// fail the whole gate, not just a hand-made scenario, against every etcd
/// target.
///
/// Each runs under the faults the gate's catalog lists for it (docs/correctness-gate.md's
/// mutation table is `holdfast-gate --list-mutations`), and must be caught
/// by one of the rules listed there.
fn mutation_gate(mutation: &str) -> GateRun {
    let m = catalog::mutation(mutation).unwrap_or_else(|| panic!("{mutation} is not in the gate's catalog"));
    let mut run = gate(&["--faults", &m.faults_arg(), "--mutation", mutation]);
    // Whether a fault meets the broken path depends on the seed (a client
    // paused between operations holds nothing to release late; a woken
    // leader revokes only leases whose expiry it passed while stopped): the
    // gate must catch the mutation within three runs, each with a seed of
    // its own. (no_deposed_leader_check with twelve leader pauses missed two
    // seeds in a row once on 3.4.23, in a fresh-clone run on 2026-12-07;
    // most runs catch it with the first.)
    for _ in 1..3 {
        if run.code != 0 {
            break;
        }
        eprintln!("{mutation} not caught with seed {}; once more with another seed", run.summary["seed"]);
        run = gate(&["--faults", &m.faults_arg(), "--mutation", mutation]);
    }
    assert_eq!(run.code, 1, "the gate must fail with {mutation}:\n{}", run.output);
    assert_eq!(run.summary["mutation"], mutation);
    eprintln!("{mutation} against etcd {}: {}", run.summary["etcd_version"], run.summary["violations_by_rule"]);
    let by_rule = &run.summary["violations_by_rule"];
    if !m.rules.is_empty() {
        assert!(m.rules.iter().any(|r| by_rule[*r].as_u64().unwrap_or(0) >= 1), "{mutation}: caught by none of {:?}: {by_rule}", m.rules);
    }
    run
}

#[test]
fn an_arbiter_with_an_unguarded_release_fails_the_gate() {
    // Retried releases delete the next holder's hold.
    mutation_gate("release_unguarded");
}

#[test]
fn an_arbiter_minting_tokens_from_a_counter_fails_the_gate() {
    mutation_gate("token_from_counter");
}

/// Without the epoch compare, an arbiter keeps granting in the old epoch
/// until its next check (500 ms here) after an advance: tokens of epoch E at
/// revisions after the advance to E+1. (Clients whose session the advance
/// ended reopen at once and race that check.)
#[test]
fn an_arbiter_without_the_epoch_compare_fails_the_gate() {
    // Advances alternate: clients racing the arbiters' switch (epochs 2
    // and 4, the ones this mutation can be caught in) and frozen clients.
    mutation_gate("no_epoch_compare");
}

/// Without the session-record compare, the old epoch's sessions, whose
/// records the advance deleted but whose leases are revoked only later,
/// still receive grants.
#[test]
fn an_arbiter_without_the_session_record_compare_fails_the_gate() {
    // Four advances: the second and fourth (to epochs 3 and 5) freeze the
    // clients until both arbiters serve the new epoch, then let them use
    // their old sessions. Whether a woken client's next acquire beats its
    // next keepalive (which learns the session is gone) is a race: one
    // frozen advance missed it in a loaded full run (2026-12-02, seed
    // 16379801867321948988: 11 old leases alive, no grant on them), so two
    // chances are given.
    mutation_gate("no_session_compare");
}

/// Without restore detection, an arbiter serves a restored etcd in the old
/// epoch: its tokens reuse revisions already handed out. The restore fault
/// catches it: C1 proves every token after the restore above every token
/// before it.
#[test]
fn an_arbiter_without_the_seal_check_fails_the_gate_after_a_restore() {
    mutation_gate("no_seal_check");
}

/// The restore phase restores a snapshot older than the episode's epoch
/// advance (the episode takes it first), with both arbiters restarted
/// across the restore: the restored epoch record and allocator are behind
/// the epoch the advance used, and only the arbiters' own records of what
/// they served keep the next epoch above it. An arbiter that forgets them
/// reports nothing, so the advance mints the used epoch again and serves
/// it: tokens at revisions the restored log reuses.
#[test]
fn an_arbiter_forgetting_the_epochs_it_served_fails_the_gate_after_an_older_restore() {
    mutation_gate("forget_served_epochs");
}

/// An arbiter that fails open for every class, not only the open ones:
/// the quorum-loss fault's own check sees a session of the correctness
/// class opened without a majority, a violation of the run.
#[test]
fn an_arbiter_failing_open_for_a_correctness_class_fails_the_gate() {
    let run = mutation_gate("fail_open_any_class");
    assert!(run.summary["violations_by_rule"]["fault/quorum-loss"].as_u64().unwrap_or(0) >= 1, "{}", run.summary["violations_by_rule"]);
    assert!(run.output.contains("opened a session of the correctness class gate without a majority"), "{}", run.output);
}

/// An arbiter whose grant does not compare the drain markers grants keys
/// of a draining range: C1 finds holds created in etcd's log while a
/// marker covering them existed.
#[test]
fn an_arbiter_without_the_drain_compare_fails_the_gate() {
    mutation_gate("no_drain_compare");
}

/// The same older-snapshot restore, advanced by one from the restored
/// epoch record (the procedure's bug, not an arbiter's): the arbiters
/// remember serving that epoch under another mint and refuse it, so they
/// stay sealed: the restore is never confirmed and the keys are never
/// grantable again. No token is reissued, and the gate still fails.
#[test]
fn an_advance_from_the_restored_epoch_record_fails_the_gate_after_an_older_restore() {
    let run = mutation_gate("advance_from_restored_record");
    let unconfirmed = run.summary["faults_unconfirmed"].to_string();
    assert!(unconfirmed.contains("restore"), "the restore is not confirmed: {unconfirmed}");
    assert!(run.summary["liveness_failures"].as_u64().unwrap_or(0) >= 1, "{}", run.summary);
    assert_eq!(run.summary["violations_by_rule"]["C1/TokenNotAboveRestore"].as_u64().unwrap_or(0), 0, "{}", run.summary);
}

/// A client that counts its session's deadline from when a keepalive's
/// answer arrived, not from when it was sent (a client-library mutation):
/// under `client-link` the answers arrive ~1.3 s late and then its
/// requests stop, so it believes in its lease past the lease's end in
/// etcd's log.
#[test]
fn a_client_counting_its_deadline_from_the_answer_fails_the_gate() {
    // Five links: whether a link catches it depends on where its delay
    // window falls against the keepalive rounds. One CI run caught it in 1
    // of 2 links against etcd 3.6.17, and a fresh-clone run of f2ea5ab in
    // 0 of 3 (earlier runs: 3 of 3, 2 of 2).
    mutation_gate("fence_from_receive_time");
}

/// Without keepalive confirmation, an arbiter counts the keepalive answers
/// of an etcd leader whose disk stalled: etcd before 3.4.25/3.5.8 keeps
/// renewing leases in the stalled leader's memory while the new leader lets
/// them expire (etcd #15247), and the clients believe in ended leases.
/// etcd 3.6 answers no such keepalive, so there the mutation is harmless
/// and the gate passes with it: asserted, so that a change in etcd shows.
#[test]
fn an_arbiter_trusting_unconfirmed_keepalives_fails_the_gate_where_etcd_answers_from_a_stalled_leader() {
    if etcd_binary().version < (3, 6, 0) {
        let run = mutation_gate("no_keepalive_confirmation");
        let by_rule = &run.summary["violations_by_rule"];
        // 26 in the first run (2026-12-03, etcd 3.4.23, two stalls); the
        // real arbiter under the same faults: 0 and 1 then (the early revoke
        // docs/gate.md describes), 0 since it waits out a deposed leader
        // (2026-12-07). Since then two stalls missed it in two runs (why
        // fewer keepalives reach the stalled leader now was not found); four
        // caught it with 17 and 6, then missed it in two seeds in a row in a
        // fresh-clone run (2026-12-07): eight since.
        assert!(by_rule["C1/DeadlinePastSessionEnd"].as_u64().unwrap_or(0) >= 2, "caught by C1: {by_rule}");
    } else {
        let faults = catalog::mutation("no_keepalive_confirmation").unwrap().faults_arg();
        let run = gate(&["--faults", &faults, "--mutation", "no_keepalive_confirmation"]);
        assert_eq!(run.code, 0, "etcd {} answered a keepalive from a stalled leader:\n{}", etcd_binary().version_string(), run.output);
        let stalls = faults.split(',').filter(|f| *f == "leader-disk-stall").count();
        assert_eq!(run.summary["faults"]["leader-disk-stall"], stalls, "every stall struck: {}", run.summary["faults_unconfirmed"]);
    }
}

/// A stopped etcd leader wakes with the lease expiries it had and revokes
/// leases the new leader renewed (docs/gate.md, "A deposed leader's
/// revokes"). An arbiter that counts keepalives answered in the new term
/// before every member answers in it tells clients their sessions live
/// past the revoke. Leader stops up to two TTLs, on every etcd target (16
/// violations in the first run on 3.6.17, 0 with the real arbiter). Twelve
/// stops: on 3.4.23 four missed it twice in a row in a CI run, and eight
/// missed it once and then caught it with one violation; twelve missed it
/// in two seeds in a row once (a fresh-clone run, 2026-12-07), hence the
/// third seed [`mutation_gate`] allows.
#[test]
fn an_arbiter_counting_keepalives_while_a_deposed_leader_is_silent_fails_the_gate() {
    mutation_gate("no_deposed_leader_check");
}

/// The same workload and client pauses (same seed) against an unfenced
/// resource and against the reference PostgreSQL fence: the unfenced one
/// loses updates and the gate reports it; the fence rejects the stale writes.
/// Three pauses: a zombie loses an update only if another holder wrote its
/// record while it was frozen, which one pause missed in about one run in
/// four (the stale write was still accepted, `C2/FenceTokenDecreased`).
#[test]
fn an_unfenced_resource_loses_updates_under_client_pauses_and_the_postgresql_fence_rejects_them() {
    let common = ["--faults", "client-pause,client-pause,client-pause", "--resource", "postgres-local", "--seed", "4242"];
    let unfenced = gate(&[&common[..], &["--fence", "unfenced"]].concat());
    let rules = &unfenced.summary["violations_by_rule"];
    assert_eq!(unfenced.code, 1, "the gate must fail on an unfenced resource:\n{}", unfenced.output);
    assert!(rules["C2/LostUpdate"].as_u64().unwrap_or(0) >= 1, "C2 reports lost updates: {rules}");
    eprintln!("unfenced: {rules}");
    let fenced = gate(&[&common[..], &["--fence", "correct"]].concat());
    assert_eq!(fenced.code, 0, "{}", fenced.output);
    assert_eq!(fenced.summary["violations"], 0);
    assert!(fenced.summary["stale_rejected"].as_u64().unwrap() > 0, "the fence rejected the zombies' writes: {}", fenced.summary);
}

/// Group commit must not weaken any checker: the gate with it on, under the
/// faults that cut grants short (arbiter killed mid-Txn, leader changes,
/// zombies), writing to the reference fence.
#[test]
fn the_gate_passes_with_group_commit_on() {
    let run = gate(&[
        "--group-commit",
        "--faults",
        "arbiter-kill,leader-pause,client-pause,asymmetric-arbiter-etcd",
        "--resource",
        "postgres-local",
    ]);
    assert_eq!(run.code, 0, "{}", run.output);
    assert_eq!(run.summary["group_commit"], true);
    assert_eq!(run.summary["violations"], 0);
    assert!(run.summary["ok_grants"].as_u64().unwrap() > 500, "{}", run.summary);
}

#[test]
fn the_audit_tailers_store_equals_etcds_log_under_faults() {
    let run = gate(&["--faults", "client-pause,member-kill,arbiter-kill,quorum-loss", "--audit"]);
    assert_eq!(run.code, 0, "the gate failed:\n{}", run.output);
    let audit = &run.summary["audit"];
    eprintln!("audit against etcd {}: {audit}", run.summary["etcd_version"]);
    assert!(audit["compared"].as_u64().unwrap() >= 1000, "{audit}");
    assert!(audit["ends_compared"].as_u64().unwrap() >= 100, "{audit}");
    assert!(audit["withheld"].as_u64().unwrap() >= 1, "the gate's hold live during the check is withheld: {audit}");
    for field in ["missing", "extra", "misclassified", "live_stored"] {
        assert_eq!(audit[field], serde_json::json!([]), "{field}: {audit}");
    }
    assert!(run.summary["expiries"].as_u64().unwrap() > 0, "the run had expiries to classify: {}", run.summary);
    // quorum-loss: six grants made without etcd and their six ends, shipped
    // from the arbiters' spools (one across a kill -9) and each stored once
    // with unprotected = true.
    assert_eq!(audit["unprotected"], 12, "{audit}");
}
