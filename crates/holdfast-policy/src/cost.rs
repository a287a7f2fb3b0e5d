//! What a class costs etcd, and how long a dead holder can block its keys
//! (`holdfastctl class cost`).
//!
//! Every number here follows from the class's TTL and the client's renewal
//! schedule; nothing is measured.

use std::time::Duration;

/// The shortest renewal period of a session, whatever its TTL.
pub const RENEWAL_FLOOR: Duration = Duration::from_millis(500);

/// etcd's default `--election-timeout` (1000 ms).
pub const ETCD_DEFAULT_ELECTION_TIMEOUT: Duration = Duration::from_secs(1);

/// The consensus writes a durable-fairness class adds per waiter, as
/// [`crate::Fairness::Durable`] documents: the waiter's record under `/q/` is
/// written when it queues and removed when it leaves the queue.
pub const DURABLE_WRITES_PER_WAITER: u32 = 2;

/// How often a session of `ttl` is renewed while healthy: every TTL/3, and
/// never more often than every 500 ms. This is the period of
/// `keepalive_loop` in `crates/holdfast-client/src/session.rs`
/// (`(ttl / 3).max(Duration::from_millis(500))`); keep the two equal.
pub fn renewal_period(ttl: Duration) -> Duration {
    (ttl / 3).max(RENEWAL_FLOOR)
}

/// Keepalives per second for `sessions` healthy sessions of `ttl`:
/// `sessions / renewal_period(ttl)`, computed as `3 × sessions / TTL`
/// (exact for whole-second TTLs) rather than from the truncated period.
pub fn keepalives_per_second(ttl: Duration, sessions: u64) -> f64 {
    if ttl / 3 >= RENEWAL_FLOOR { sessions as f64 * 3.0 / ttl.as_secs_f64() } else { sessions as f64 / RENEWAL_FLOOR.as_secs_f64() }
}

/// The liveness bound: TTL + the etcd election timeout. How long after a
/// holder dies (or after the etcd leader election that follows its death:
/// a new leader restarts every lease at TTL + election timeout) until its
/// lease expires and another session may acquire its keys.
pub fn liveness_bound(ttl: Duration, election_timeout: Duration) -> Duration {
    ttl.saturating_add(election_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn renewal_period_is_a_third_of_the_ttl_with_a_floor() {
        assert_eq!(renewal_period(secs(30)), secs(10));
        assert_eq!(renewal_period(secs(15)), secs(5));
        assert_eq!(renewal_period(secs(10)), Duration::from_nanos(3_333_333_333));
        assert_eq!(renewal_period(secs(5)), Duration::from_nanos(1_666_666_666));
        assert_eq!(renewal_period(secs(1)), RENEWAL_FLOOR);
        assert_eq!(renewal_period(Duration::ZERO), RENEWAL_FLOOR);
    }

    #[test]
    fn keepalives_per_second_are_three_per_ttl_per_session() {
        assert_eq!(keepalives_per_second(secs(30), 3000), 300.0);
        assert_eq!(keepalives_per_second(secs(10), 3000), 900.0);
        assert_eq!(keepalives_per_second(secs(300), 1), 0.01);
        assert_eq!(keepalives_per_second(secs(15), 1), 0.2);
        assert!((keepalives_per_second(secs(7), 1000) - 428.571_428).abs() < 1e-3);
        // Below 1.5 s the 500 ms floor applies: two a second per session.
        assert_eq!(keepalives_per_second(secs(1), 10), 20.0);
    }

    #[test]
    fn liveness_is_ttl_plus_the_election_timeout() {
        assert_eq!(liveness_bound(secs(30), ETCD_DEFAULT_ELECTION_TIMEOUT), secs(31));
        assert_eq!(liveness_bound(secs(15), Duration::from_millis(500)), Duration::from_millis(15_500));
        assert_eq!(liveness_bound(Duration::MAX, secs(1)), Duration::MAX);
    }
}
