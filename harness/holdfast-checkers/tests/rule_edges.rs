//! Histories at the edge of each rule: one side of the edge passes, the
//! other fails under the rule named. A rule that is deleted, inverted or
//! moved by one makes one of these fail (scripts/mutants checks that).

mod common;

use common::{B, tok};
use holdfast_checkers::history::{DrainChange, EpochChange, SessionEnd, make_token};
use holdfast_checkers::{History, OpRef, Outcome, Rule, etcd_log, linearizable};

fn c3(h: &History) -> holdfast_checkers::Report {
    linearizable::check(h, &linearizable::Config::default())
}

fn rules(r: &holdfast_checkers::Report) -> Vec<Rule> {
    r.violations.iter().map(|v| v.rule).collect()
}

fn client(h: &History, index: usize) -> OpRef {
    OpRef::Client { index, invoke_ns: h.ops[index].invoke_ns, complete_ns: h.ops[index].complete_ns }
}

// ---------- C1: tokens increase per key in etcd order ----------

/// Epoch 2 until revision 7, then epoch 1 (a restore that went backwards):
/// each grant carries the epoch in force at its revision, the grants are
/// concurrent in real time, yet the second token is below the first.
fn epoch_going_backwards() -> B {
    let mut b = B::new();
    b.h.etcd.epoch = 2;
    b.h.etcd.epoch_changes.push(EpochChange { revision: 7, epoch: 1 });
    let a = b.ok_acq("ns/a", 1, 0, 100, 5);
    b.h.ops[a].token = Some(make_token(2, 5));
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 1, true);
    let c = b.ok_acq("ns/a", 2, 50, 150, 8);
    b.h.ops[c].token = Some(make_token(1, 8));
    b.put("ns/a", 8, 2);
    b
}

#[test]
fn c1_catches_a_token_below_the_previous_grant_in_etcd_order() {
    let b = epoch_going_backwards();
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::TokenNotIncreasing], "{:?}", r.violations);
    assert_eq!(r.violations[0].ops, [client(&b.h, 0), client(&b.h, 1)]);
}

// ---------- C1: real-time order ----------

/// etcd: session 2 holds at 6..7, then session 1 at 8..9.
fn two_holds_6_and_8() -> B {
    let mut b = B::new();
    b.put("ns/a", 6, 2);
    b.del("ns/a", 7, 6, 2, false);
    b.put("ns/a", 8, 1);
    b.del("ns/a", 9, 8, 1, false);
    b
}

#[test]
fn c1_grants_that_touch_in_real_time_are_concurrent() {
    // The token-8 grant completes at exactly the instant the token-6 grant
    // is invoked: neither completed before the other began.
    let mut b = two_holds_6_and_8();
    b.ok_acq("ns/a", 1, 0, 10, 8);
    b.ok_acq("ns/a", 2, 10, 30, 6);
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // One nanosecond apart, they are ordered, and the order is wrong.
    b.h.ops[1].invoke_ns = 11;
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::RealTimeOrder], "{:?}", r.violations);
}

#[test]
fn c1_real_time_order_compares_with_the_highest_earlier_token() {
    // Tokens 6 and 8 both completed before the token-7 grant was invoked;
    // 8 completed last. Only the highest earlier token shows the violation.
    let mut b = B::new();
    b.put("ns/a", 6, 1);
    b.del("ns/a", 7, 6, 1, false);
    b.put("ns/a", 7, 3); // revision 7 is shared with the delete (one Txn)
    b.del("ns/a", 8, 7, 3, false);
    b.put("ns/a", 8, 2);
    b.ok_acq("ns/a", 1, 0, 10, 6);
    b.ok_acq("ns/a", 2, 0, 20, 8);
    b.ok_acq("ns/a", 3, 30, 40, 7);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::RealTimeOrder), "{:?}", r.violations);
    let v = r.violations.iter().find(|v| v.rule == Rule::RealTimeOrder).unwrap();
    assert_eq!(v.ops, [client(&b.h, 1), client(&b.h, 2)]);
}

#[test]
fn c1_real_time_order_flags_an_equal_token_granted_to_another_session() {
    let mut b = B::new();
    b.put("ns/a", 6, 1);
    b.ok_acq("ns/a", 1, 0, 10, 6);
    b.ok_acq("ns/a", 2, 20, 30, 6);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::RealTimeOrder), "{:?}", r.violations);
    assert!(r.has(Rule::TokenReused), "{:?}", r.violations);
}

// ---------- C3: the model's guards ----------

#[test]
fn c3_catches_a_grant_whose_token_is_below_one_granted_before() {
    // Revision order and real time agree; only the tokens go down.
    let b = epoch_going_backwards();
    let r = c3(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_catches_a_token_granted_again_after_its_release() {
    // No etcd delete pins the release, so only the token rule orders it.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.rel("ns/a", 1, 20, 30, Outcome::Ok, 5);
    b.ok_acq("ns/a", 2, 40, 50, 5);
    let r = c3(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
    // With a fresh token the same history is fine.
    b.h.ops[2].token = Some(tok(7));
    assert!(c3(&b.h).passed(), "{:?}", c3(&b.h).violations);
}

#[test]
fn c3_an_expiry_of_another_lease_frees_nothing() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 2, true); // lease 2, not the holder's
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    let r = c3(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
    // The holder's own lease expiring frees it.
    b.h.etcd.events[1].lease = 1;
    assert!(c3(&b.h).passed(), "{:?}", c3(&b.h).violations);
}

#[test]
fn c3_an_expiry_of_another_hold_of_the_same_lease_frees_nothing() {
    // Session 1 holds the hold created at 5; etcd's expiry names a hold
    // created at 4.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 4, 1, true);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    let r = c3(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_an_expiry_without_prev_kv_frees_the_leases_hold() {
    // create_revision 0: the recorder did not know which hold; the lease's
    // expiry still ends the session's hold.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 0, 1, true);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    let r = c3(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_operations_that_touch_in_real_time_may_go_either_way() {
    // Session 1's release is sent at the very nanosecond session 2's
    // acquire returns; the release must come first, and it may.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 0, 30, 7);
    b.rel("ns/a", 1, 30, 40, Outcome::Ok, 5);
    b.del("ns/a", 6, 5, 1, false);
    b.put("ns/a", 7, 2);
    let r = c3(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // Sent one nanosecond later, it cannot have freed the lock in time.
    b.h.ops[2].invoke_ns = 31;
    let r = c3(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_matches_each_release_to_the_delete_of_the_hold_it_presented() {
    // Two clean holds; the recorder listed session 2's operations first.
    // Each release is pinned to the delete of its own hold, not to the
    // first unexplained delete in the log.
    let mut b = B::new();
    b.ok_acq("ns/a", 2, 100, 110, 7);
    b.rel("ns/a", 2, 120, 130, Outcome::Ok, 7);
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.rel("ns/a", 1, 20, 30, Outcome::Ok, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 1, false);
    b.put("ns/a", 7, 2);
    b.del("ns/a", 8, 7, 2, false);
    let r = c3(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_an_unknown_acquire_matches_only_a_grant_on_its_own_lease() {
    // Sessions 2 and 3 both timed out acquiring; etcd shows only session
    // 3's grant (revision 7), which then expired. Session 2's acquire must
    // not be taken for it.
    let mut b = B::new();
    b.acq("ns/a", 2, 0, 0, Outcome::Unknown, None);
    b.acq("ns/a", 3, 0, 0, Outcome::Unknown, None);
    b.put("ns/a", 7, 3);
    b.del("ns/a", 8, 7, 3, true);
    b.ok_acq("ns/a", 4, 50, 60, 9);
    b.put("ns/a", 9, 4);
    let r = c3(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_an_update_put_is_not_a_grant() {
    // Session 1's hold (created at 5) is rewritten at 6 (same create
    // revision); a timed-out retry of its acquire must not be taken for a
    // new grant at 6.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.h.etcd.events.push(holdfast_checkers::EtcdEvent {
        kind: holdfast_checkers::EtcdEventKind::Put,
        key: "/l/ns/a".into(),
        revision: 6,
        create_revision: 5,
        lease: 1,
        expired: None,
    });
    b.acq("ns/a", 1, 15, 0, Outcome::Unknown, None);
    b.rel("ns/a", 1, 20, 30, Outcome::Ok, 5);
    b.del("ns/a", 7, 5, 1, false);
    let r = c3(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_an_expiry_ends_an_unobserved_grant_of_its_lease() {
    // Session 2's acquire timed out and its grant's put is not in the log;
    // the expiry of a hold on lease 2 that no known grant claims ends it.
    // Without that expiry session 3's grant would be fine too (the unknown
    // acquire may never have taken effect), so the test is that the
    // expiry itself can be placed.
    let mut b = B::new();
    b.acq("ns/a", 2, 0, 0, Outcome::Unknown, None);
    b.del("ns/a", 8, 7, 2, true);
    b.ok_acq("ns/a", 3, 50, 60, 9);
    b.put("ns/a", 9, 3);
    let r = c3(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // The same expiry with no acquire of lease 2 to end cannot be placed.
    b.h.ops.remove(0);
    assert!(c3(&b.h).has(Rule::NotLinearizable));
}

#[test]
fn c3_reports_the_deepest_point_the_search_reached() {
    // Session 1's release first timed out (unknown) and was retried (ok);
    // neither shows in etcd. Then sessions 2 and 3 are both granted token 7.
    // The search's dead ends: after the unknown release alone (1 op
    // placed), and after session 2's or session 3's grant (3 ops placed);
    // the report names the first deepest one.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.rel("ns/a", 1, 12, 0, Outcome::Unknown, 5);
    b.rel("ns/a", 1, 20, 30, Outcome::Ok, 5);
    b.ok_acq("ns/a", 2, 40, 50, 7);
    b.ok_acq("ns/a", 3, 41, 50, 7);
    b.put("ns/a", 7, 2);
    let r = c3(&b.h);
    assert_eq!(rules(&r), [Rule::NotLinearizable], "{:?}", r.violations);
    let v = &r.violations[0];
    let held = format!("at best 3 of 4 required operations fit, leaving the lock held by session 2 with token {}", tok(7));
    assert!(v.explanation.contains(&held), "{}", v.explanation);
    assert_eq!(v.ops, [client(&b.h, 1), client(&b.h, 4)]);
}

#[test]
fn c3_decides_within_exactly_its_step_budget() {
    // One acquire takes one step.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    let r = linearizable::check(&b.h, &linearizable::Config { max_steps_per_key: 1, ..linearizable::Config::default() });
    assert!(r.passed(), "{:?} {:?}", r.violations, r.inconclusive);
    let r = linearizable::check(&b.h, &linearizable::Config { max_steps_per_key: 0, ..linearizable::Config::default() });
    assert_eq!(r.inconclusive.len(), 1, "{r:?}");
}

#[test]
fn c3_searches_a_key_with_exactly_the_operation_limit() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5); // acquire, release, and no expiry: 2 operations
    let r = linearizable::check(&b.h, &linearizable::Config { max_ops_per_key: 2, ..linearizable::Config::default() });
    assert!(r.passed(), "{:?} {:?}", r.violations, r.inconclusive);
    let r = linearizable::check(&b.h, &linearizable::Config { max_ops_per_key: 1, ..linearizable::Config::default() });
    assert_eq!(r.inconclusive.len(), 1, "{r:?}");
}

// ---------- C1: etcd's log ----------

#[test]
fn c1_events_of_one_transaction_share_a_revision() {
    // Group commit: two keys created at revision 5, deleted together at 6.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.ok_acq("ns/b", 2, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.put("ns/b", 5, 2);
    b.del("ns/a", 6, 5, 1, true);
    b.del("ns/b", 6, 5, 2, true);
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

fn update(b: &mut B, rev: u64, create: u64, lease: i64) {
    b.h.etcd.events.push(holdfast_checkers::EtcdEvent {
        kind: holdfast_checkers::EtcdEventKind::Put,
        key: "/l/ns/a".into(),
        revision: rev,
        create_revision: create,
        lease,
        expired: None,
    });
}

#[test]
fn c1_a_put_may_update_only_the_current_hold() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 3); // created at 3, deleted at 4
    b.ok_acq("ns/a", 2, 100, 110, 5);
    b.put("ns/a", 5, 2);
    update(&mut b, 6, 5, 2);
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // Rewriting the deleted hold created at 3 is not possible in etcd.
    b.h.etcd.events.last_mut().unwrap().create_revision = 3;
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::HolderIntervalOverlap], "{:?}", r.violations);
}

#[test]
fn c1_a_hold_on_a_session_ended_in_the_same_revision_is_not_flagged() {
    // The rule is about records deleted at an *earlier* revision.
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 8);
    b.h.etcd.session_ends.push(SessionEnd { lease: 1, revision: 8 });
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    b.h.etcd.session_ends[0].revision = 7;
    assert!(etcd_log::check(&b.h).has(Rule::GrantOnEndedSession));
}

#[test]
fn c1_a_hold_is_flagged_only_while_a_drain_marker_covering_its_key_exists() {
    let drain = |unit: &str, revision, present| DrainChange { unit: unit.into(), revision, present };
    let mut b = B::new();
    b.hold("ns/a/b", 1, 0, 8);
    // A marker written at the grant's revision is after its compare; one
    // deleted before it no longer counts; other units never do.
    b.h.etcd.drains =
        vec![drain("ns/a", 8, true), drain("ns/x", 2, true), drain("ns/a/bc", 3, true), drain("ns", 4, true), drain("ns", 5, false)];
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // Written one revision earlier, it covers the grant; so does the key's own unit.
    b.h.etcd.drains[0].revision = 7;
    assert_eq!(rules(&etcd_log::check(&b.h)), [Rule::GrantWhileDraining]);
    b.h.etcd.drains[0] = drain("ns/a/b", 7, true);
    assert_eq!(rules(&etcd_log::check(&b.h)), [Rule::GrantWhileDraining]);
    // Deleted at 8 would be in the grant's own transaction: impossible, but
    // a delete at 7 ends it before the compare.
    b.h.etcd.drains.insert(1, drain("ns/a/b", 7, false));
    b.h.etcd.drains[0].revision = 6;
    assert!(etcd_log::check(&b.h).passed());
}

#[test]
fn c1_a_later_lower_token_of_the_same_session_is_still_out_of_order() {
    // Same as two_holds_6_and_8, but one session holds both: its own
    // earlier hold is no excuse.
    let mut b = two_holds_6_and_8();
    b.h.etcd.events[0].lease = 1;
    b.h.etcd.events[1].lease = 1;
    b.ok_acq("ns/a", 1, 0, 10, 8);
    b.ok_acq("ns/a", 1, 20, 30, 6);
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::RealTimeOrder], "{:?}", r.violations);
}

// ---------- the shared pieces ----------

#[test]
fn check_all_runs_c1_c2_c3_in_that_order() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    let reports = holdfast_checkers::check_all(&b.h, &linearizable::Config::default());
    let checkers: Vec<_> = reports.iter().map(|r| (r.checker, r.checked)).collect();
    use holdfast_checkers::Checker::{C1, C2, C3};
    assert_eq!(checkers, [(C1, 1), (C2, 0), (C3, 1)]);
}

#[test]
fn client_op_key_names_the_lock_of_lock_operations_only() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.write("ns/b", "r", 1, 5, 50, Outcome::Ok, None);
    b.h.ops.push(holdfast_checkers::ClientOp {
        process: 1,
        kind: holdfast_checkers::OpKind::Keepalive,
        session: Some(1),
        token: None,
        invoke_ns: 60,
        complete_ns: Some(70),
        outcome: Outcome::Ok,
        gave_up_ns: None,
    });
    let keys: Vec<Option<&str>> = b.h.ops.iter().map(|op| op.key()).collect();
    assert_eq!(keys, [Some("ns/a"), Some("ns/a"), Some("ns/b"), None]);
}

#[test]
fn c1_real_time_violation_names_the_first_grant_to_complete_with_the_highest_token() {
    // Session 1's grant (token 8) and its retry completed before session
    // 2's grant (token 6) was invoked; the evidence is the first of them.
    let mut b = two_holds_6_and_8();
    b.ok_acq("ns/a", 1, 0, 10, 8);
    b.ok_acq("ns/a", 1, 5, 20, 8);
    b.ok_acq("ns/a", 2, 30, 40, 6);
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::RealTimeOrder], "{:?}", r.violations);
    assert_eq!(r.violations[0].ops, [client(&b.h, 0), client(&b.h, 2)]);
}

#[test]
fn c1_group_commit_excuses_only_keys_etcd_created_at_that_revision() {
    // ns/a and ns/c were created together at 5; ns/b was not, yet its grant
    // carries token 5.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.ok_acq("ns/c", 3, 0, 10, 5);
    b.ok_acq("ns/b", 2, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.put("ns/c", 5, 3);
    let r = etcd_log::check(&b.h);
    let reused: Vec<&str> = r.violations.iter().filter(|v| v.rule == Rule::TokenReused).map(|v| v.key.as_str()).collect();
    assert_eq!(reused, ["ns/b"], "{:?}", r.violations);
}

#[test]
fn stats_count_as_expiries_only_lease_expiries_of_holds() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 3); // released: explicit delete at 4
    b.put("ns/a", 5, 2);
    b.del("ns/a", 6, 5, 2, true);
    b.put("ns/a", 7, 3);
    b.del("ns/a", 8, 7, 3, true);
    b.put("ns/a", 9, 4);
    b.del("ns/a", 10, 9, 4, false);
    b.h.etcd.events.last_mut().unwrap().expired = None; // cause unknown
    b.put("ns/a", 11, 5);
    b.del("ns/a", 12, 11, 5, true);
    assert_eq!(b.h.stats().expiries, 3);
}

// ---------- C1: no client believes past its lease's end ----------

/// Session 1 believes it is alive until `until`; its record is deleted at
/// revision 10 (`at_advance`: by an epoch advance at that revision, else by
/// lease expiry); session 2's grant at revision 11 completes at 500.
fn deadline_around_an_end(until: u64, at_advance: bool) -> B {
    let mut b = B::new();
    b.deadline(1, 100, until);
    b.h.etcd.session_ends.push(SessionEnd { lease: 1, revision: 10 });
    if at_advance {
        b.h.etcd.epoch_changes.push(EpochChange { revision: 10, epoch: 1 });
    }
    b.ok_acq("ns/a", 2, 400, 500, 11);
    b.put("ns/a", 11, 2);
    b
}

/// Adds session `s`'s ok grant of `key` at revision `rev`, completing at
/// `complete`, with its put, keeping etcd's log in revision order.
fn grant_at(b: &mut B, key: &str, s: i64, complete: u64, rev: u64) {
    b.ok_acq(key, s, 200, complete, rev);
    b.put(key, rev, s);
    b.h.etcd.events.sort_by_key(|e| e.revision);
}

#[test]
fn c1_passes_a_deadline_no_later_than_the_first_grant_that_saw_the_session_end() {
    let r = etcd_log::check(&deadline_around_an_end(500, false).h);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn c1_catches_a_deadline_later_than_a_grant_that_saw_the_session_end() {
    let b = deadline_around_an_end(501, false);
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::DeadlinePastSessionEnd], "{:?}", r.violations);
    assert_eq!(r.violations[0].ops, [client(&b.h, 0), client(&b.h, 1)]);
}

#[test]
fn c1_does_not_hold_a_client_to_a_session_end_an_epoch_advance_caused() {
    let r = etcd_log::check(&deadline_around_an_end(10_000, true).h);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn c1_places_a_session_end_only_by_grants_at_or_after_its_revision() {
    // A grant at revision 9 (before the end) completing early proves
    // nothing about when revision 10 happened.
    let mut b = deadline_around_an_end(450, false);
    grant_at(&mut b, "ns/b", 3, 300, 9);
    let r = etcd_log::check(&b.h);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    // The earliest of several later grants is the one that counts.
    grant_at(&mut b, "ns/c", 4, 420, 12);
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::DeadlinePastSessionEnd], "{:?}", r.violations);
    assert_eq!(r.violations[0].ops[1], client(&b.h, 3));
}

#[test]
fn c1_counts_a_grant_at_the_session_ends_own_revision_as_having_seen_it() {
    // The rule is "at or after": a grant committed in the very revision
    // that deleted the record (completing at 300) places the end no later
    // than 300, before the later grant at 11 (completing at 500).
    let mut b = deadline_around_an_end(450, false);
    grant_at(&mut b, "ns/b", 3, 300, 10);
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::DeadlinePastSessionEnd], "{:?}", r.violations);
    assert_eq!(r.violations[0].ops[1], client(&b.h, 2));
}

#[test]
fn c1_cites_the_lowest_revision_of_grants_completing_at_the_same_moment() {
    // Two grants after the end complete at the same nanosecond: the one at
    // the lower revision (12, not 13) is the first to have seen the end.
    let mut b = deadline_around_an_end(450, false);
    grant_at(&mut b, "ns/b", 3, 420, 13);
    grant_at(&mut b, "ns/c", 4, 420, 12);
    let r = etcd_log::check(&b.h);
    assert_eq!(rules(&r), [Rule::DeadlinePastSessionEnd], "{:?}", r.violations);
    assert_eq!(r.violations[0].ops[1], client(&b.h, 3));
}
