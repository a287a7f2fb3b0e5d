//! Child processes: finding a program on PATH, and the one wait-then-kill
//! helper.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Sends SIGTERM and waits; SIGKILL after `grace`.
pub fn terminate(child: &mut Child, grace: Duration) {
    signal_then_kill(child, Signal::SIGTERM, grace, false);
}

/// Sends `signal` and waits up to `grace` for the child to exit, then sends
/// SIGKILL — to its whole process group when `group` (a child that leads a
/// group of its own workers, like PostgreSQL's postmaster) — and reaps it.
pub fn signal_then_kill(child: &mut Child, signal: Signal, grace: Duration, group: bool) {
    let pid = child.id() as i32;
    let _ = kill(Pid::from_raw(pid), signal);
    let end = Instant::now() + grace;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(Pid::from_raw(if group { -pid } else { pid }), Signal::SIGKILL);
    let _ = child.wait();
}

/// The first file named `name` in a `PATH` directory.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}
