//! Hand-made histories: linearizable ones must pass, violating ones must fail
//! under the rule named in the test.

mod common;

use common::{B, tok};
use holdfast_checkers::{History, Outcome, Rule, etcd_log, fence, linearizable};

fn c3_default(h: &History) -> holdfast_checkers::Report {
    linearizable::check(h, &linearizable::Config::default())
}

// ---------- C1 ----------

#[test]
fn c1_passes_sequential_grants_that_match_etcd() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.hold("ns/a", 2, 100, 7);
    b.hold("ns/b", 1, 200, 9);
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(r.checked, 2);
}

#[test]
fn c1_catches_overlapping_holds_in_etcd_log() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 20, 30, 6);
    b.put("ns/a", 6, 2);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::HolderIntervalOverlap), "{:?}", r.violations);
}

#[test]
fn c1_catches_grant_without_etcd_event() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.ok_acq("ns/a", 2, 100, 110, 42); // a token from a local counter
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::GrantWithoutEtcdEvent), "{:?}", r.violations);
}

#[test]
fn c1_catches_grant_in_a_stale_epoch() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.h.ops[0].token = Some(holdfast_checkers::history::make_token(0, 5));
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::GrantWrongEpoch), "{:?}", r.violations);
}

/// An epoch advance at revision 10 deletes the hold and the session; the
/// next grant carries epoch 2. Holds of the old epoch end like expiries.
fn across_an_advance(new_grant_epoch: u64) -> B {
    use holdfast_checkers::history::{EpochChange, SessionEnd, make_token};
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.h.etcd.epoch_changes.push(EpochChange { revision: 10, epoch: 2 });
    b.h.etcd.session_ends.push(SessionEnd { lease: 1, revision: 10 });
    b.del("ns/a", 10, 5, 1, true);
    let i = b.ok_acq("ns/a", 2, 100, 110, 12);
    b.h.ops[i].token = Some(make_token(new_grant_epoch, 12));
    b.put("ns/a", 12, 2);
    b
}

#[test]
fn grants_across_an_epoch_advance_pass_every_checker() {
    let b = across_an_advance(2);
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(b.h.stats().expiries, 0, "the advance's deletes are not expiries");
}

#[test]
fn c1_catches_a_grant_in_the_old_epoch_after_an_advance() {
    let r = etcd_log::check(&across_an_advance(1).h);
    assert!(r.has(Rule::GrantWrongEpoch), "{:?}", r.violations);
}

#[test]
fn c1_catches_a_hold_created_on_a_session_whose_record_was_deleted() {
    use holdfast_checkers::history::SessionEnd;
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.del("ns/a", 6, 5, 1, false);
    b.h.etcd.session_ends.push(SessionEnd { lease: 1, revision: 7 });
    b.hold("ns/a", 1, 100, 8);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::GrantOnEndedSession), "{:?}", r.violations);
    // The same history with the record deleted after the grant is fine.
    b.h.etcd.session_ends[0].revision = 9;
    let r = etcd_log::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c1_catches_grant_whose_etcd_put_is_on_another_lease() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 2);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::GrantEventMismatch), "{:?}", r.violations);
}

#[test]
fn c1_catches_reused_token_across_keys() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.ok_acq("ns/b", 2, 100, 110, 5);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::TokenReused), "{:?}", r.violations);
}

#[test]
fn c1_allows_equal_tokens_on_keys_that_etcd_created_in_one_commit() {
    // Group commit: two keys created by one multi-key transaction share the
    // revision, and so the token. etcd's log shows both puts at it.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.ok_acq("ns/b", 2, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.put("ns/b", 5, 2);
    let r = etcd_log::check(&b.h);
    assert!(!r.has(Rule::TokenReused), "{:?}", r.violations);
}

#[test]
fn c1_catches_token_below_one_granted_earlier_in_real_time() {
    let mut b = B::new();
    // etcd: session 2 held at 6..7, session 1 at 8..9; but the client saw
    // session 1's grant (token 8) complete before session 2's (token 6) began.
    b.put("ns/a", 6, 2);
    b.del("ns/a", 7, 6, 2, false);
    b.put("ns/a", 8, 1);
    b.del("ns/a", 9, 8, 1, false);
    b.ok_acq("ns/a", 1, 0, 10, 8);
    b.ok_acq("ns/a", 2, 20, 30, 6);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::RealTimeOrder), "{:?}", r.violations);
    assert!(!c3_default(&b.h).passed());
}

#[test]
fn retried_acquire_returning_the_same_hold_is_not_a_reuse() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 1, 20, 30, 5); // retry after a lost answer
    b.rel("ns/a", 1, 40, 50, Outcome::Ok, 5);
    b.del("ns/a", 6, 5, 1, false);
    assert!(etcd_log::check(&b.h).passed(), "{:?}", etcd_log::check(&b.h).violations);
    assert!(c3_default(&b.h).passed());
    // The same token returned to another session is a reuse.
    b.h.ops[1].session = Some(2);
    assert!(etcd_log::check(&b.h).has(Rule::TokenReused));
    assert!(!c3_default(&b.h).passed());
}

#[test]
fn c1_catches_etcd_log_out_of_order() {
    let mut b = B::new();
    b.put("ns/a", 8, 1);
    b.del("ns/a", 7, 8, 1, false);
    let r = etcd_log::check(&b.h);
    assert!(r.has(Rule::EtcdLogOutOfOrder), "{:?}", r.violations);
}

#[test]
fn c1_ignores_unknown_and_failed_grants() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.acq("ns/a", 2, 100, 110, Outcome::Unknown, None);
    b.acq("ns/a", 3, 100, 110, Outcome::Fail, None);
    assert!(etcd_log::check(&b.h).passed());
}

// ---------- C2 ----------

fn fenced_base() -> B {
    let mut b = B::new();
    b.write("ns/a", "r", 1, 5, 0, Outcome::Ok, Some(true));
    b.write("ns/a", "r", 1, 5, 10, Outcome::Ok, Some(true));
    b.write("ns/a", "r", 2, 7, 20, Outcome::Ok, Some(true));
    b
}

#[test]
fn c2_passes_writes_in_token_order_with_stale_write_rejected() {
    let mut b = fenced_base();
    b.write("ns/a", "r", 1, 5, 30, Outcome::Fail, Some(false)); // zombie, rejected
    b.write("ns/a", "r", 2, 7, 40, Outcome::Ok, Some(true));
    b.counter("r", 4);
    let r = fence::check(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c2_catches_stale_write_accepted_after_newer() {
    let mut b = fenced_base();
    b.write("ns/a", "r", 3, 6, 30, Outcome::Ok, Some(true));
    b.counter("r", 4);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::FenceTokenDecreased), "{:?}", r.violations);
    assert!(!r.has(Rule::FenceInterleaving));
}

#[test]
fn c2_catches_holder_interleaving_aba() {
    let mut b = fenced_base();
    b.write("ns/a", "r", 1, 5, 30, Outcome::Ok, Some(true));
    b.counter("r", 4);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::FenceInterleaving), "{:?}", r.violations);
}

#[test]
fn c2_catches_lost_increment() {
    let mut b = fenced_base();
    b.counter("r", 2);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::LostUpdate), "{:?}", r.violations);
}

#[test]
fn c2_catches_lost_increment_without_fence_log() {
    // An unfenced resource: no accept log, only the counter.
    let mut b = fenced_base();
    b.h.fence.clear();
    b.counter("r", 2);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::LostUpdate), "{:?}", r.violations);
    assert!(!r.has(Rule::CounterMismatch));
}

#[test]
fn c2_catches_phantom_increment() {
    let mut b = fenced_base();
    b.counter("r", 4);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::PhantomUpdate), "{:?}", r.violations);
}

#[test]
fn c2_allows_unknown_increment_to_count_or_not() {
    for (accepted, fin) in [(true, 4), (false, 3)] {
        let mut b = fenced_base();
        b.write("ns/a", "r", 2, 7, 30, Outcome::Unknown, Some(accepted));
        b.counter("r", fin);
        let r = fence::check(&b.h);
        assert!(r.passed(), "{:?}", r.violations);
    }
}

#[test]
fn c2_catches_counter_that_disagrees_with_fence_log() {
    let mut b = fenced_base();
    b.write("ns/a", "r", 2, 7, 30, Outcome::Unknown, Some(false));
    b.counter("r", 4);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::CounterMismatch), "{:?}", r.violations);
}

#[test]
fn c2_catches_acknowledged_write_rejected_at_fence() {
    let mut b = fenced_base();
    b.write("ns/a", "r", 2, 7, 30, Outcome::Ok, Some(false));
    b.counter("r", 3);
    let r = fence::check(&b.h);
    assert!(r.has(Rule::AckedButRejected), "{:?}", r.violations);
}

// ---------- C3 ----------

#[test]
fn c3_passes_sequential_acquire_release() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.hold("ns/a", 2, 100, 7);
    b.hold("ns/a", 1, 200, 9);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_passes_concurrent_acquires_ordered_by_release() {
    let mut b = B::new();
    // Both invoked at 0; session 2 waits until session 1 releases.
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 0, 50, 7);
    b.rel("ns/a", 1, 20, 40, Outcome::Ok, 5);
    b.del("ns/a", 6, 5, 1, false);
    b.put("ns/a", 7, 2);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_catches_two_overlapping_ok_acquires() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
    assert!(!r.violations[0].ops.is_empty());
}

#[test]
fn c3_passes_grant_after_expiry_at_its_revision() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 1, true);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_catches_grant_before_the_expiry_that_freed_it() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 20, 30, 6);
    b.put("ns/a", 6, 2);
    b.del("ns/a", 7, 5, 1, true);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_catches_release_by_non_holder() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.rel("ns/a", 2, 20, 30, Outcome::Ok, 5);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_catches_stale_release_deleting_the_next_holder() {
    // "release not guarded by create revision": session 1's hold expired,
    // session 2 acquired, session 1's late release deletes session 2's hold,
    // and session 3 acquires while session 2 still believes it holds.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 1, true);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    b.rel("ns/a", 1, 40, 50, Outcome::Ok, 5);
    b.del("ns/a", 8, 7, 2, false);
    b.ok_acq("ns/a", 3, 60, 70, 9);
    b.put("ns/a", 9, 3);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
    assert!(r.has(Rule::UnexplainedDelete), "{:?}", r.violations);
}

#[test]
fn c3_unknown_release_that_took_effect_explains_later_grant() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.rel("ns/a", 1, 20, 0, Outcome::Unknown, 5); // timed out
    b.del("ns/a", 6, 5, 1, false);
    b.ok_acq("ns/a", 2, 30, 40, 7);
    b.put("ns/a", 7, 2);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // Without the unknown release nobody explains etcd's delete.
    b.h.ops.remove(1);
    assert!(c3_default(&b.h).has(Rule::UnexplainedDelete));
    // And without etcd's evidence either, the grant overlaps the hold.
    b.h.etcd.events.remove(1);
    assert!(c3_default(&b.h).has(Rule::NotLinearizable));
}

#[test]
fn c3_unknown_release_invoked_too_late_does_not_explain_grant() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    b.rel("ns/a", 1, 50, 0, Outcome::Unknown, 5);
    b.del("ns/a", 8, 5, 1, false);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_unknown_acquire_seen_in_etcd_explains_its_expiry() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.acq("ns/a", 2, 100, 0, Outcome::Unknown, None);
    b.put("ns/a", 7, 2);
    b.del("ns/a", 8, 7, 2, true);
    b.ok_acq("ns/a", 3, 200, 210, 9);
    b.put("ns/a", 9, 3);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // Without the unknown acquire the expiry of lease 2 frees nothing.
    b.h.ops.remove(2);
    assert!(c3_default(&b.h).has(Rule::NotLinearizable));
}

#[test]
fn c3_unknown_acquire_cannot_take_effect_while_lock_is_held() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.acq("ns/a", 2, 20, 0, Outcome::Unknown, None);
    b.put("ns/a", 7, 2); // etcd shows it, but session 1 still holds
    b.rel("ns/a", 1, 30, 40, Outcome::Ok, 5);
    b.del("ns/a", 8, 5, 1, false);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_unknown_acquire_absent_from_etcd_may_never_take_effect() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.acq("ns/a", 2, 20, 0, Outcome::Unknown, None);
    b.rel("ns/a", 1, 30, 40, Outcome::Ok, 5);
    b.del("ns/a", 6, 5, 1, false);
    b.ok_acq("ns/a", 3, 50, 60, 7);
    b.put("ns/a", 7, 3);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}

#[test]
fn c3_reports_inconclusive_instead_of_searching_forever() {
    let mut b = B::new();
    // Many concurrent unknown acquires and a non-linearizable tail: the
    // search must explore, and a tiny budget must stop it.
    for s in 10..30 {
        b.acq("ns/a", s, 0, 0, Outcome::Unknown, None);
        // An expiry of that lease whose hold etcd's log does not name.
        b.del("ns/a", 100 + s as u64, 0, s, true);
    }
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/a", 2, 20, 30, 7);
    b.put("ns/a", 7, 2);
    let config = linearizable::Config { max_steps_per_key: 50, ..linearizable::Config::default() };
    let r = linearizable::check(&b.h, &config);
    assert!(!r.passed());
    assert_eq!(r.inconclusive.len(), 1, "{:?}", r);
    let config = linearizable::Config { max_ops_per_key: 3, ..linearizable::Config::default() };
    assert_eq!(linearizable::check(&b.h, &config).inconclusive.len(), 1);
}

#[test]
fn c3_keys_are_checked_independently() {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.ok_acq("ns/b", 2, 0, 10, 6);
    b.put("ns/b", 6, 2);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(r.checked, 2);
}

// ---------- all ----------

#[test]
fn history_and_reports_round_trip_through_json() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.write("ns/a", "r", 1, 5, 5, Outcome::Ok, Some(true));
    b.counter("r", 1);
    let text = serde_json::to_string(&b.h).unwrap();
    let back: History = serde_json::from_str(&text).unwrap();
    assert_eq!(back, b.h);
    let reports = holdfast_checkers::check_all(&back, &linearizable::Config::default());
    assert!(reports.iter().all(|r| r.passed()), "{reports:?}");
    let mut bad = b.h.clone();
    bad.ops[0].token = Some(tok(99));
    let reports = holdfast_checkers::check_all(&bad, &linearizable::Config::default());
    let text = serde_json::to_string(&reports).unwrap();
    let back: Vec<holdfast_checkers::Report> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, reports);
}

#[test]
fn c3_decides_a_long_contended_key_quickly() {
    // 1500 holds on one key; each acquire was invoked while the previous
    // holder still held (contention), so intervals overlap.
    let mut b = B::new();
    let mut rev = 2;
    for i in 0..1500u64 {
        let s = (i % 7) as i64 + 1;
        let t = i * 100;
        b.ok_acq("ns/a", s, t.saturating_sub(150), t + 10, rev);
        b.put("ns/a", rev, s);
        if i % 3 == 0 {
            b.del("ns/a", rev + 1, rev, s, true);
        } else {
            b.rel("ns/a", s, t + 20, t + 90, Outcome::Ok, rev);
            b.del("ns/a", rev + 1, rev, s, false);
        }
        rev += 2;
    }
    let started = std::time::Instant::now();
    let reports = holdfast_checkers::check_all(&b.h, &linearizable::Config::default());
    assert!(reports.iter().all(|r| r.passed()), "{reports:?}");
    assert!(started.elapsed().as_secs() < 5, "took {:?}", started.elapsed());
}

#[test]
fn stats_count_lock_ops_expiries_and_rejected_writes() {
    let mut b = B::new();
    b.hold("ns/a", 1, 0, 5);
    b.ok_acq("ns/a", 2, 100, 110, 7);
    b.put("ns/a", 7, 2);
    b.del("ns/a", 8, 7, 2, true);
    b.acq("ns/a", 3, 100, 0, Outcome::Unknown, None);
    b.write("ns/a", "r", 2, 7, 120, Outcome::Ok, Some(true));
    b.write("ns/a", "r", 1, 5, 130, Outcome::Fail, Some(false));
    // Deadlines a client recorded are counted apart, never as operations.
    b.deadline(2, 140, 150);
    b.deadline(2, 160, 170);
    let s = b.h.stats();
    assert_eq!((s.ops, s.lock_ops, s.ok_grants, s.unknown_ops), (6, 4, 2, 1));
    assert_eq!((s.expiries, s.accepted_writes, s.stale_rejected), (1, 1, 1));
    assert_eq!(s.deadlines, 2);
}

#[test]
fn c3_unobserved_acquire_cannot_absorb_an_expiry_of_a_known_grant() {
    // Session 2's release answered ok but etcd never deleted its hold: the
    // hold (created at 5) expired at 8 instead. A later unknown acquire of
    // session 2 that left no trace in etcd must not "use up" that expiry.
    let mut b = B::new();
    b.ok_acq("ns/a", 2, 0, 10, 5);
    b.put("ns/a", 5, 2);
    b.rel("ns/a", 2, 20, 30, Outcome::Ok, 5);
    b.acq("ns/a", 2, 40, 0, Outcome::Unknown, None);
    b.del("ns/a", 8, 5, 2, true);
    b.ok_acq("ns/a", 3, 50, 60, 9);
    b.put("ns/a", 9, 3);
    let r = c3_default(&b.h);
    assert!(r.has(Rule::NotLinearizable), "{:?}", r.violations);
}

#[test]
fn c3_many_pending_unknown_acquires_do_not_blow_up_the_search() {
    // 200 acquires that timed out and left no trace, pending for the whole
    // run, next to 1000 clean holds.
    let mut b = B::new();
    for s in 100..300 {
        b.acq("ns/a", s, 0, 0, Outcome::Unknown, None);
    }
    for i in 0..1000u64 {
        b.hold("ns/a", (i % 5) as i64 + 1, 10 + i * 100, 2 + i * 2);
    }
    let started = std::time::Instant::now();
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?} {:?}", r.violations, r.inconclusive);
    assert!(started.elapsed().as_secs() < 5, "took {:?}", started.elapsed());
}

#[test]
fn c3_allows_the_arbiter_to_withdraw_a_grant_that_never_reached_its_client() {
    // Session 1's acquire timed out; etcd shows its grant, deleted without
    // expiry and without a client release, and the withdrawal marker naming
    // that hold at the delete's revision (the arbiter withdrew it). Then
    // session 2 acquires.
    let mut b = B::new();
    b.acq("ns/a", 1, 0, 0, Outcome::Unknown, None);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 1, false);
    b.withdrawn("ns/a", 6, 5, 1);
    b.ok_acq("ns/a", 2, 30, 40, 7);
    b.put("ns/a", 7, 2);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
    // The same withdrawal of a grant that did reach its client is unexplained.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.del("ns/a", 6, 5, 1, false);
    b.withdrawn("ns/a", 6, 5, 1);
    b.ok_acq("ns/a", 2, 30, 40, 7);
    b.put("ns/a", 7, 2);
    assert!(c3_default(&b.h).has(Rule::UnexplainedDelete));
}

#[test]
fn c3_a_retried_release_that_succeeded_explains_the_delete_not_the_timed_out_first_try() {
    // The first release timed out (unknown) and did nothing; the retry
    // deleted the hold (ok). etcd shows one delete.
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.put("ns/a", 5, 1);
    b.rel("ns/a", 1, 20, 0, Outcome::Unknown, 5);
    b.rel("ns/a", 1, 100, 110, Outcome::Ok, 5);
    b.del("ns/a", 9, 5, 1, false);
    b.ok_acq("ns/a", 2, 120, 130, 12);
    b.put("ns/a", 12, 2);
    let r = c3_default(&b.h);
    assert!(r.passed(), "{:?}", r.violations);
}
