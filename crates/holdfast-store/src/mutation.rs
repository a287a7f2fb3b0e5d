//! Test builds only (the `mutations` feature): deliberate bugs that the
//! correctness gate must catch, switched on by `[mutation]` in arbiter.toml.
//! A build without the feature has none of this code.

use holdfast_config::arbiter::MutationConfig;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Release deletes the hold without its create-revision and lease guard.
pub static RELEASE_UNGUARDED: AtomicBool = AtomicBool::new(false);
/// The grant transaction does not compare `/sys/epoch`.
pub static NO_EPOCH_COMPARE: AtomicBool = AtomicBool::new(false);
/// The grant transaction does not compare the session record.
pub static NO_SESSION_COMPARE: AtomicBool = AtomicBool::new(false);
/// A withdrawal deletes the hold without writing its marker.
pub static NO_WITHDRAWAL_MARKER: AtomicBool = AtomicBool::new(false);
/// Restore detection off (the arbiter never seals on a rewound log).
pub static NO_SEAL_CHECK: AtomicBool = AtomicBool::new(false);
/// Keepalives count without confirming the answering leader's term.
pub static NO_KEEPALIVE_CONFIRMATION: AtomicBool = AtomicBool::new(false);
/// Keepalives count while a member that may be a deposed leader is silent.
pub static NO_DEPOSED_LEADER_CHECK: AtomicBool = AtomicBool::new(false);
/// Tokens come from a local counter instead of the commit revision.
pub static TOKEN_FROM_COUNTER: AtomicBool = AtomicBool::new(false);
/// The arbiter ignores the record of the epochs it served.
pub static FORGET_SERVED_EPOCHS: AtomicBool = AtomicBool::new(false);
/// Fail-open grants every class, not only `on_quorum_loss = "open"` ones.
pub static FAIL_OPEN_ANY_CLASS: AtomicBool = AtomicBool::new(false);
/// The grant transaction does not compare the key's drain markers.
pub static NO_DRAIN_COMPARE: AtomicBool = AtomicBool::new(false);
static COUNTER: AtomicU64 = AtomicU64::new(0);

pub fn on(flag: &AtomicBool) -> bool {
    flag.load(Ordering::Relaxed)
}

/// Switches on every mutation the config names; returns their names.
pub fn enable(config: &MutationConfig) -> Vec<&'static str> {
    for (on, flag) in [
        (config.release_unguarded, &RELEASE_UNGUARDED),
        (config.no_epoch_compare, &NO_EPOCH_COMPARE),
        (config.no_session_compare, &NO_SESSION_COMPARE),
        (config.token_from_counter, &TOKEN_FROM_COUNTER),
        (config.no_withdrawal_marker, &NO_WITHDRAWAL_MARKER),
        (config.no_seal_check, &NO_SEAL_CHECK),
        (config.no_keepalive_confirmation, &NO_KEEPALIVE_CONFIRMATION),
        (config.no_deposed_leader_check, &NO_DEPOSED_LEADER_CHECK),
        (config.forget_served_epochs, &FORGET_SERVED_EPOCHS),
        (config.fail_open_any_class, &FAIL_OPEN_ANY_CLASS),
        (config.no_drain_compare, &NO_DRAIN_COMPARE),
    ] {
        flag.store(on, Ordering::Relaxed);
    }
    config.on()
}

/// The revision a token is minted from: the commit revision, or with
/// `token_from_counter` the next value of a local counter.
pub fn token_revision(revision: i64) -> i64 {
    if on(&TOKEN_FROM_COUNTER) { COUNTER.fetch_add(1, Ordering::Relaxed) as i64 + 1 } else { revision }
}
