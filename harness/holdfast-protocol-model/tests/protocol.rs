#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The protocol model, checked: the unmutated protocol passes every property
//! in every scenario at the CI bound (the whole space explored), and each
//! of the eleven mutations fails the property it is meant to break, with a
//! shortest counterexample printed as a trace.
//!
//! `HOLDFAST_MODEL_DEEP=1` explores the deeper bound (minutes, not for CI).

use holdfast_protocol_model::*;

fn deep() -> bool {
    std::env::var("HOLDFAST_MODEL_DEEP").is_ok_and(|v| v == "1")
}

/// The whole space of a scenario: no property may fail.
fn passes(scenario: Scenario) {
    let cfg = if deep() { Config::deep(scenario) } else { Config::ci(scenario) };
    let bound = if deep() { "deep" } else { "CI" };
    let o = check(cfg, 2, None);
    println!("unmutated, {scenario:?} scenario, {bound} bound: {}", o.summary());
    for (name, trace) in &o.traces {
        println!("counterexample for {name}:\n{trace}");
    }
    assert!(o.traces.is_empty(), "the unmutated protocol fails {:?}", o.traces.keys().collect::<Vec<_>>());
    assert!(o.unique_states > 100, "the {scenario:?} scenario explored almost nothing: {}", o.summary());
}

/// A mutation must break its property; the trace is the shortest (BFS, one
/// worker).
fn fails(m: Mutation) {
    let o = check(Config::ci(m.scenario()).with(m), 1, Some(m.violates()));
    let Some(trace) = o.traces.get(m.violates()) else {
        panic!("{m:?} found no counterexample for {:?} ({}); found {:?}", m.violates(), o.summary(), o.lengths)
    };
    println!("{m:?} ({:?} scenario), {} steps, {}:\n{trace}", m.scenario(), o.lengths[m.violates()], o.summary());
}

#[test]
fn unmutated_restore_scenario_passes() {
    passes(Scenario::Restore);
}

#[test]
fn unmutated_move_scenario_passes() {
    passes(Scenario::Move);
}

#[test]
fn unmutated_time_scenario_passes() {
    passes(Scenario::Time);
}

#[test]
fn unmutated_leader_scenario_passes() {
    passes(Scenario::Leader);
}

#[test]
fn unmutated_liveness_scenario_passes() {
    passes(Scenario::Liveness);
}

/// The liveness property is not vacuous: a waiter that does not retry after
/// a refusal is left waiting, and the checker says so.
#[test]
fn liveness_fails_when_the_waiter_gives_up() {
    let mut cfg = Config::ci(Scenario::Liveness);
    cfg.waiter_polls = false;
    let o = check(cfg, 1, Some(WAITER_GRANTED));
    let trace = o.traces.get(WAITER_GRANTED).expect("a waiter that never retries must starve");
    println!("waiter gives up:\n{trace}");
}

#[test]
fn mutation_no_epoch_compare() {
    fails(Mutation::NoEpochCompare);
}

#[test]
fn mutation_token_from_counter() {
    fails(Mutation::TokenFromCounter);
}

#[test]
fn mutation_no_seal_check() {
    fails(Mutation::NoSealCheck);
}

#[test]
fn mutation_advance_by_one_from_the_restored_record() {
    fails(Mutation::AdvanceByOne);
}

#[test]
fn mutation_arbiter_forgets_served_epochs() {
    fails(Mutation::ForgetServedEpochs);
}

#[test]
fn mutation_move_without_advancing_the_destination() {
    fails(Mutation::MoveWithoutAdvance);
}

#[test]
fn mutation_move_without_draining() {
    fails(Mutation::MoveWithoutDrain);
}

/// The drain needs a fence in the source store: with the map alone, an
/// arbiter whose watch lags grants the range on the source after the
/// rebalancer saw it empty.
#[test]
fn mutation_drain_by_the_map_only() {
    fails(Mutation::DrainByMapOnly);
}

#[test]
fn mutation_keepalive_deadline_from_receive_time() {
    fails(Mutation::DeadlineFromReceiveTime);
}

#[test]
fn mutation_release_without_the_create_revision_guard() {
    fails(Mutation::ReleaseUnguarded);
}

#[test]
fn mutation_no_keepalive_confirmation() {
    fails(Mutation::NoKeepaliveConfirmation);
}

#[test]
fn tokens_pack_epoch_above_revision() {
    assert_eq!(state::token(1, 5), (1 << 48) | 5);
    assert_eq!(state::show_token(state::token(3, 7)), "e3r7");
    assert!(state::token(2, 1) > state::token(1, (1 << 48) - 1));
}

/// What the protocol rests on: an arbiter must see a failed call between a
/// restore and its next grant on the restored cluster. If its connection
/// survived (same cluster token, no error), its per-grant check
/// (`revision <= highest_before`) covers only revisions it saw itself, and
/// a token another arbiter issued before the restore is issued again
/// before its next check round.
#[test]
fn a_restore_the_arbiters_do_not_notice_reissues_tokens() {
    let mut cfg = Config::ci(Scenario::Restore);
    cfg.restore_breaks_connections = false;
    let o = check(cfg, 1, Some(NO_TOKEN_TWICE));
    let trace = o.traces.get(NO_TOKEN_TWICE).expect("a token issued again on the restored cluster before any check");
    println!("restore unnoticed by the arbiters, {} steps:\n{trace}", o.lengths[NO_TOKEN_TWICE]);
}

/// What the protocol rests on: a client must not acquire a key again on a
/// session while a release of that key from that session may still be in
/// flight. An acquire that finds the session's own hold is answered with
/// that hold's token (`attempt_txn`: the retry of a lost grant answer), and
/// the release, arriving later, deletes the hold the client now believes
/// it has: another client is granted the key.
#[test]
fn a_reacquire_while_the_release_is_in_flight_loses_the_hold() {
    let mut cfg = Config::ci(Scenario::Time);
    cfg.reacquire_waits_for_release = false;
    let o = check(cfg, 1, Some(NO_TWO_LIVE_HOLDERS));
    let trace = o.traces.get(NO_TWO_LIVE_HOLDERS).expect("the in-flight release deletes the re-granted hold");
    println!("re-acquire while the release is in flight, {} steps:\n{trace}", o.lengths[NO_TWO_LIVE_HOLDERS]);
}
