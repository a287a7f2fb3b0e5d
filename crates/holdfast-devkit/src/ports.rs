//! Free loopback ports for local processes.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

static NEXT: AtomicU16 = AtomicU16::new(0);

/// Ports are drawn from [LOW, HIGH): below Linux's default ephemeral range
/// (32768–60999). A port in that range can be taken by any outgoing
/// connection's local end while its process is stopped (a restarted etcd
/// member once found its peer port bound by a client connection: "bind:
/// address already in use").
const LOW: u16 = 20000;
const HIGH: u16 = 32700;

/// A port on 127.0.0.1 that is free right now. Each process starts at an
/// offset chosen by its PID and walks the range, checking each port by
/// binding, so concurrent tests in one process or several processes rarely
/// collide, and no port comes from the kernel's ephemeral range.
pub fn free_port() -> u16 {
    let span = HIGH - LOW;
    let start = (std::process::id() % u32::from(span / 100)) as u16 * 100;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = LOW + (start + n) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        for p in &ports {
            assert!((LOW..HIGH).contains(p), "{p} outside {LOW}..{HIGH}");
        }
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "a port handed out twice: {ports:?}");
    }
}
