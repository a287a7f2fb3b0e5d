//! A `NOTIFY_SOCKET` listener: what systemd does for `Type=notify`, so that
//! `holdfastctl dev` and the tests wait for READY=1 exactly as a unit does.

use anyhow::Context;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct NotifySocket {
    path: PathBuf,
    socket: UnixDatagram,
    seen: Vec<String>,
}

impl NotifySocket {
    pub fn bind(path: &Path) -> anyhow::Result<Self> {
        let _ = std::fs::remove_file(path);
        let socket = UnixDatagram::bind(path).with_context(|| format!("binding notify socket {}", path.display()))?;
        Ok(NotifySocket { path: path.to_path_buf(), socket, seen: Vec::new() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every datagram received so far, one string per message.
    pub fn messages(&self) -> &[String] {
        &self.seen
    }

    /// Reads datagrams until one contains `READY=1`, or the timeout passes,
    /// or `alive()` says the process died.
    pub fn wait_ready(&mut self, timeout: Duration, mut alive: impl FnMut() -> bool) -> anyhow::Result<()> {
        let end = Instant::now() + timeout;
        self.socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let mut buf = vec![0u8; 4096];
        loop {
            if self.seen.iter().any(|m| m.lines().any(|l| l == "READY=1")) {
                return Ok(());
            }
            if Instant::now() > end {
                anyhow::bail!("no READY=1 within {timeout:?}");
            }
            if !alive() {
                anyhow::bail!("the process exited before READY=1");
            }
            match self.socket.recv(&mut buf) {
                Ok(n) => self.seen.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Collects whatever arrived without waiting.
    pub fn drain(&mut self) {
        let _ = self.socket.set_nonblocking(true);
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.socket.recv(&mut buf) {
            self.seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        let _ = self.socket.set_nonblocking(false);
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
