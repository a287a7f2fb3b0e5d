//! Free loopback ports for local processes.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

static NEXT: AtomicU16 = AtomicU16::new(0);

/// A port on 127.0.0.1 that is free right now. Ports are drawn from a
/// per-process sequence in a range chosen by PID, and checked by binding, so
/// concurrent tests in one process or several processes rarely collide.
pub fn free_port() -> u16 {
    let base = 20000 + (std::process::id() % 400) as u16 * 100;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = base + (n % 100);
        if n >= 100 {
            // Sequence exhausted: let the kernel pick.
            if let Ok(l) = TcpListener::bind(("127.0.0.1", 0))
                && let Ok(a) = l.local_addr()
            {
                return a.port();
            }
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
