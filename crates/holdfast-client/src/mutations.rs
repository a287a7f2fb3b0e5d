//! Deliberately broken client behaviour, for the correctness gate only
//! (built with the `mutations` feature, as the test suite builds; never in
//! a package). Each is off until a process switches it on; the gate's
//! mutation tests prove that the gate catches it.

use std::sync::atomic::{AtomicBool, Ordering};

/// The names [`enable`] accepts.
pub const NAMES: &[&str] = crate::MUTATION_NAMES;

static FENCE_FROM_RECEIVE_TIME: AtomicBool = AtomicBool::new(false);

/// Switches on the mutation `name` for this process.
pub fn enable(name: &str) -> Result<(), String> {
    match name {
        "fence_from_receive_time" => FENCE_FROM_RECEIVE_TIME.store(true, Ordering::SeqCst),
        other => return Err(format!("unknown client mutation {other:?}; known: {}", NAMES.join(", "))),
    }
    Ok(())
}

/// `fence_from_receive_time`: a session's local deadline counts from when
/// a keepalive's answer *arrived* instead of when the keepalive was sent.
/// An answer delayed in transit then moves the deadline past the lease's
/// real end (etcd renewed the lease when the keepalive reached it, not when
/// the answer came back).
pub fn fence_from_receive_time() -> bool {
    FENCE_FROM_RECEIVE_TIME.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let e = super::enable("no_such").unwrap_err();
        assert!(e.contains("no_such") && e.contains("fence_from_receive_time"), "{e}");
    }
}
