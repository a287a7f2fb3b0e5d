//! Free loopback ports for local processes.

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicU16, Ordering};

static NEXT: AtomicU16 = AtomicU16::new(0);

/// Ports are drawn from [LOW, HIGH): below Linux's default ephemeral range
/// (32768–60999). A port in that range can be taken by any outgoing
/// connection's local end while its process is stopped (a restarted etcd
/// member once found its peer port bound by a client connection: "bind:
/// address already in use").
const LOW: u16 = 20000;
const HIGH: u16 = 32700;

/// The range ports are drawn from: [LOW, HIGH), or the part of it named by
/// `HOLDFAST_TEST_PORTS=FIRST-LAST` (inclusive). The test suite gives each of
/// the suites it runs at the same time its own part, so two processes never
/// pick the same port between one's check and its daemon's bind.
/// Ports in this machine's ephemeral range (`net.ipv4.ip_local_port_range`,
/// when it differs from Linux's default) are left out.
fn range() -> (u16, u16) {
    static RANGE: std::sync::OnceLock<(u16, u16)> = std::sync::OnceLock::new();
    *RANGE.get_or_init(|| {
        let wanted = match std::env::var("HOLDFAST_TEST_PORTS") {
            Ok(v) => parse_range(&v).unwrap_or_else(|e| {
                eprintln!("holdfast: ignoring HOLDFAST_TEST_PORTS={v:?} ({e}); ports come from {LOW}-{}", HIGH - 1);
                (LOW, HIGH)
            }),
            Err(_) => (LOW, HIGH),
        };
        let Some(ephemeral) = ephemeral_range() else { return wanted };
        outside(wanted, ephemeral).unwrap_or_else(|| {
            eprintln!(
                "holdfast: fewer than 100 of ports {}-{} lie outside this machine's ephemeral range {}-{} \
                 (net.ipv4.ip_local_port_range): a port may be taken by a connection's local end",
                wanted.0,
                wanted.1 - 1,
                ephemeral.0,
                ephemeral.1
            );
            wanted
        })
    })
}

/// `net.ipv4.ip_local_port_range` (inclusive).
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

/// The larger part of `[low, high)` outside the inclusive range `ephemeral`,
/// if it holds at least 100 ports.
fn outside((low, high): (u16, u16), (first, last): (u16, u16)) -> Option<(u16, u16)> {
    let below = (low, high.min(first.max(low)));
    let above = (low.max(last.saturating_add(1)).min(high), high);
    [below, above].into_iter().filter(|(a, b)| b.saturating_sub(*a) >= 100).max_by_key(|(a, b)| b - a)
}

fn parse_range(v: &str) -> Result<(u16, u16), String> {
    let (a, b) = v.split_once('-').ok_or("expected FIRST-LAST, e.g. 20000-26349")?;
    let first: u16 = a.trim().parse().map_err(|e| format!("first port: {e}"))?;
    let last: u16 = b.trim().parse().map_err(|e| format!("last port: {e}"))?;
    if first < LOW || last >= HIGH || last < first.saturating_add(99) {
        return Err(format!("expected at least 100 ports within {LOW}-{}", HIGH - 1));
    }
    Ok((first, last + 1))
}

/// A port on 127.0.0.1 that is free right now. Each process starts at an
/// offset chosen by its PID and its start time and walks the range,
/// checking each port by binding, so concurrent tests in one process or
/// several processes rarely collide (PIDs alone repeat across fresh
/// containers that share a network), and no port comes from the kernel's
/// ephemeral range.
pub fn free_port() -> u16 {
    static START: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    let (low, high) = range();
    let span = high - low;
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        ((std::process::id() ^ nanos) % u32::from(span / 100)) as u16 * 100
    });
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = low + (start + n) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && reserve(port) {
            return port;
        }
    }
}

/// Reserves `port` for this process until it exits, against every other
/// process that draws ports here: an open-file-description lock on byte
/// `port` of one file they all share ([`LOCK_FILE`] in the temporary
/// directory). False if another living process reserved it. A port that is
/// free is not enough: a daemon a test stops and starts again on its own
/// ports (an etcd member restored from a snapshot) leaves them unbound for
/// a while, and the DR drill once found its member's peer port taken by a
/// process another test had started meanwhile ("bind: address already in
/// use"). Without the file (it cannot be opened) ports are not reserved.
fn reserve(port: u16) -> bool {
    static FILE: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    match FILE.get_or_init(open_lock_file) {
        Some(file) => try_lock(file, port),
        None => true,
    }
}

/// The file whose bytes stand for ports.
const LOCK_FILE: &str = "holdfast-ports.lock";

fn open_lock_file() -> Option<std::fs::File> {
    // Close-on-exec (std's default): a daemon started from this process
    // does not inherit the reservations; they end with this process.
    std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(std::env::temp_dir().join(LOCK_FILE)).ok()
}

/// A write lock on byte `port` of `file` (`F_OFD_SETLK`: held by this open
/// file description, so it conflicts with any other, in this process or
/// another, and is released when the description closes).
fn try_lock(file: &std::fs::File, port: u16) -> bool {
    use nix::libc;
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(port),
        l_len: 1,
        l_pid: 0,
    };
    nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLK(&lock)).is_ok()
}

/// Whether process `pid` holds a socket listening on TCP `port` on this
/// machine (its own, not only one that accepts connections there): a
/// daemon started on a free port is ready for a test when this is true,
/// and a connection to that port then reaches it and nothing else.
pub fn listens(pid: u32, port: u16) -> bool {
    let wanted = listening_sockets(port);
    !wanted.is_empty() && holds_socket(&Path::new("/proc").join(pid.to_string()).join("fd"), &wanted)
}

/// The process listening on TCP `port` on this machine: the inode of the
/// listening socket in `/proc/net/tcp{,6}`, then the process holding that
/// socket in `/proc/<pid>/fd` (only processes this user may inspect).
pub fn listener_pid(port: u16) -> Option<u32> {
    let wanted = listening_sockets(port);
    if wanted.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if holds_socket(&entry.path().join("fd"), &wanted) {
            return Some(pid);
        }
    }
    None
}

/// `socket:[inode]` for every socket listening on `port`, as `/proc/<pid>/fd`
/// links name them.
fn listening_sockets(port: u16) -> Vec<String> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| listening_inodes(&text, port))
        .map(|i| format!("socket:[{i}]"))
        .collect()
}

fn holds_socket(fd_dir: &Path, wanted: &[String]) -> bool {
    let Ok(fds) = std::fs::read_dir(fd_dir) else { return false };
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.to_str().is_some_and(|t| wanted.iter().any(|w| w == t))))
}

/// Inodes of the sockets listening (state `0A`) on `port` in a
/// `/proc/net/tcp` table.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            (local_port == port && *f.get(3)? == "0A").then(|| f.get(9).map(|s| s.to_string()))?
        })
        .collect()
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

    /// What another process sees: its own open file description of the
    /// lock file.
    #[test]
    fn a_port_handed_out_is_reserved_against_other_processes_and_theirs_against_it() {
        let port = free_port();
        let other = open_lock_file().expect("the lock file opens");
        assert!(!try_lock(&other, port), "another process could reserve port {port}, which this one handed out");
        // A port another process reserved is not handed out here, though
        // nothing listens on it.
        let theirs = (LOW..HIGH).find(|p| *p != port && try_lock(&other, *p)).unwrap();
        assert!(!reserve(theirs), "port {theirs}, reserved by another process, was reserved here too");
        drop(other);
        assert!(reserve(theirs), "the other process's reservation ended with its file description");
    }

    #[test]
    fn a_test_port_range_must_be_inside_the_range_and_hold_100_ports() {
        assert_eq!(parse_range("20000-26349"), Ok((20000, 26350)));
        assert_eq!(parse_range(" 26350 - 32699 "), Ok((26350, 32700)));
        for bad in ["20000", "1024-2000", "30000-40000", "20000-20050", "26349-20000", "a-b"] {
            assert!(parse_range(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn ports_in_the_ephemeral_range_are_left_out() {
        assert_eq!(outside((20000, 32700), (32768, 60999)), Some((20000, 32700)));
        assert_eq!(outside((20000, 32700), (28000, 60999)), Some((20000, 28000)));
        assert_eq!(outside((20000, 32700), (10000, 21000)), Some((21001, 32700)));
        assert_eq!(outside((20000, 32700), (22000, 23000)), Some((23001, 32700)));
        assert_eq!(outside((20000, 32700), (1024, 65535)), None);
        assert_eq!(outside((26350, 32700), (32650, 60999)), Some((26350, 32650)));
        assert_eq!(outside((20000, 20100), (20050, 60999)), None);
    }

    #[test]
    fn the_listener_of_a_port_is_this_process_and_no_other() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
        assert!(listens(std::process::id(), port));
        assert!(!listens(1, port), "pid 1 does not hold this test's socket");
        // A connected (not listening) socket does not count.
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let client_port = client.local_addr().unwrap().port();
        assert!(!listens(std::process::id(), client_port));
        drop(listener);
        assert!(!listens(std::process::id(), port), "a closed listener still counted");
    }
}
