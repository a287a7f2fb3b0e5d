//! Stopping a child process: the one wait-then-kill helper.

use std::process::Child;
use std::time::{Duration, Instant};

/// Sends SIGTERM and waits; SIGKILL after `grace`.
pub fn terminate(child: &mut Child, grace: Duration) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let end = Instant::now() + grace;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
