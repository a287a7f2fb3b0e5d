//! C1 across an etcd restore ([`etcd_log::check_restore`]): every ok grant
//! after the restore carries a token above every ok grant's token before
//! it, whatever the keys. Each edge of the rule (below, equal, above; the
//! highest token, not the last; ok acquires only, on both sides) has a test
//! here, so a comparison turned around or a filter dropped makes one fail.

mod common;

use common::B;
use holdfast_checkers::history::make_token;
use holdfast_checkers::{History, OpRef, Outcome, Rule, etcd_log};

fn rules(r: &holdfast_checkers::Report) -> Vec<Rule> {
    r.violations.iter().map(|v| v.rule).collect()
}

fn client(h: &History, index: usize) -> OpRef {
    OpRef::Client { index, invoke_ns: h.ops[index].invoke_ns, complete_ns: h.ops[index].complete_ns }
}

/// Index in [`before_the_restore`] of its highest token (revision 9).
const TOP: usize = 1;

/// Before the restore, in epoch 1: grants at revisions 5, 9 and 7, in that
/// order. The highest token (9, on `ns/b`) is not the last one granted (7).
fn before_the_restore() -> B {
    let mut b = B::new();
    b.ok_acq("ns/a", 1, 0, 10, 5);
    b.ok_acq("ns/b", 2, 20, 30, 9);
    b.ok_acq("ns/a", 3, 40, 50, 7);
    b
}

#[test]
fn restore_passes_a_grant_above_every_token_granted_before_it() {
    let before = before_the_restore();
    // After the advance: epoch 2, and a revision far below the old ones.
    let mut after = B::new();
    let i = after.ok_acq("ns/c", 4, 0, 10, 3);
    after.h.ops[i].token = Some(make_token(2, 3));
    after.ok_acq("ns/d", 5, 20, 30, 10); // epoch 1, but above revision 9
    let r = etcd_log::check_restore(&before.h, &after.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(r.checked, 2);
}

#[test]
fn restore_catches_a_grant_below_the_highest_token_before_it() {
    // Revision 8 is above the last grant before the restore (7), below the
    // highest (9), and on a key the highest was not granted on.
    let before = before_the_restore();
    let mut after = B::new();
    let i = after.ok_acq("ns/c", 4, 100, 110, 8);
    let r = etcd_log::check_restore(&before.h, &after.h);
    assert_eq!(rules(&r), [Rule::TokenNotAboveRestore], "{:?}", r.violations);
    let v = &r.violations[0];
    assert_eq!(v.key, "ns/c");
    assert_eq!(v.ops, [client(&after.h, i), client(&before.h, TOP)]);
    assert!(v.explanation.contains("epoch 1 at revision 8"), "{}", v.explanation);
    assert!(v.explanation.contains("epoch 1 revision 9"), "{}", v.explanation);
}

#[test]
fn restore_catches_a_grant_equal_to_the_highest_token_before_it() {
    // A restored log reissues revision 9 in the unchanged epoch: the same
    // token twice.
    let before = before_the_restore();
    let mut after = B::new();
    after.ok_acq("ns/a", 4, 100, 110, 10);
    let i = after.ok_acq("ns/d", 5, 120, 130, 9);
    let r = etcd_log::check_restore(&before.h, &after.h);
    assert_eq!(rules(&r), [Rule::TokenNotAboveRestore], "{:?}", r.violations);
    assert_eq!(r.violations[0].key, "ns/d");
    assert_eq!(r.violations[0].ops, [client(&after.h, i), client(&before.h, TOP)]);
    assert_eq!(r.checked, 2);
}

#[test]
fn restore_ignores_tokens_before_it_of_anything_but_ok_acquires() {
    // Before the restore, only ok acquires set the bar: a failed acquire, a
    // release and a write carrying tokens above 9 do not raise it.
    let mut before = before_the_restore();
    before.acq("ns/e", 6, 60, 70, Outcome::Fail, Some(20));
    before.rel("ns/b", 2, 80, 90, Outcome::Ok, 25);
    before.write("ns/b", "r", 2, 30, 100, Outcome::Ok, None);
    let mut after = B::new();
    after.ok_acq("ns/c", 4, 0, 10, 10);
    let r = etcd_log::check_restore(&before.h, &after.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(r.checked, 1);
}

#[test]
fn restore_checks_after_it_only_ok_acquires() {
    // After the restore, releases, writes and failed acquires with tokens
    // at or below 9 are neither flagged nor counted.
    let before = before_the_restore();
    let mut after = B::new();
    after.acq("ns/c", 4, 0, 10, Outcome::Fail, Some(4));
    let i = after.ok_acq("ns/c", 5, 20, 30, 3);
    after.h.ops[i].token = Some(make_token(2, 3));
    after.rel("ns/c", 5, 40, 50, Outcome::Ok, 5);
    after.write("ns/c", "r", 5, 6, 60, Outcome::Ok, None);
    after.rel("ns/a", 1, 70, 80, Outcome::Fail, 7);
    let r = etcd_log::check_restore(&before.h, &after.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(r.checked, 1);
    // The same tokens on ok acquires are each flagged, in history order.
    let mut flagged = B::new();
    let low = [4, 5, 6, 7].map(|rev| flagged.ok_acq("ns/c", 5, rev * 10, rev * 10 + 5, rev));
    let r = etcd_log::check_restore(&before.h, &flagged.h);
    let ops: Vec<OpRef> = r.violations.iter().map(|v| v.ops[0].clone()).collect();
    assert_eq!(ops, low.map(|i| client(&flagged.h, i)), "{:?}", r.violations);
    assert_eq!(r.checked, 4);
}

#[test]
fn restore_with_no_grants_before_it_flags_nothing_and_counts_the_grants_after() {
    let mut before = B::new();
    before.acq("ns/a", 1, 0, 10, Outcome::Fail, Some(9));
    let mut after = B::new();
    after.ok_acq("ns/a", 2, 0, 10, 1);
    after.ok_acq("ns/b", 3, 20, 30, 2);
    let r = etcd_log::check_restore(&before.h, &after.h);
    assert!(r.passed(), "{:?}", r.violations);
    assert_eq!(r.checked, 2);
}
