//! Session TTLs: 5 s to 300 s, 15 s by default (design decision "How long is
//! the lease, and who chooses it?").

use std::time::Duration;

pub const MIN_TTL: Duration = Duration::from_secs(5);
pub const MAX_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// Checks a requested TTL; zero means the default. etcd leases have whole
/// seconds, so the TTL must be a whole number of seconds.
pub fn session_ttl(requested: Duration) -> Result<Duration, String> {
    if requested.is_zero() {
        return Ok(DEFAULT_TTL);
    }
    if requested < MIN_TTL || requested > MAX_TTL {
        return Err(format!(
            "ttl {}s is outside the allowed range 5s..300s; pick a TTL in that range, or omit it for the 15s default",
            requested.as_secs_f64()
        ));
    }
    if requested.subsec_nanos() != 0 {
        return Err(format!("ttl {}s is not a whole number of seconds; etcd leases count whole seconds", requested.as_secs_f64()));
    }
    Ok(requested)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_and_default() {
        assert_eq!(session_ttl(Duration::ZERO), Ok(DEFAULT_TTL));
        assert!(session_ttl(Duration::from_secs(4)).is_err());
        assert!(session_ttl(Duration::from_secs(301)).is_err());
        assert!(session_ttl(Duration::from_millis(5500)).is_err());
        assert_eq!(session_ttl(Duration::from_secs(300)), Ok(MAX_TTL));
        assert_eq!(session_ttl(Duration::from_secs(5)), Ok(MIN_TTL));
    }
}
