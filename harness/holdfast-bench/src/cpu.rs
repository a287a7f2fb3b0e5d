//! CPU time of the processes under test, from `/proc/<pid>/stat`: the
//! arbiter, etcd and this benchmark, sampled at the start and end of each
//! measured window and divided by the acquire+release pairs completed in it.
//! CPU time per pair is stable on a shared machine where throughput is not,
//! and it says what separate hosts would do.

/// Which processes to sample; `None` where the pid is unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pids {
    pub arbiter: Option<u32>,
    pub etcd: Option<u32>,
}

/// Cumulative user+system CPU seconds of each process at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub arbiter: Option<f64>,
    pub etcd: Option<f64>,
    pub bench: Option<f64>,
}

impl Pids {
    pub fn sample(&self) -> Sample {
        Sample {
            arbiter: self.arbiter.and_then(cpu_seconds),
            etcd: self.etcd.and_then(cpu_seconds),
            bench: cpu_seconds(std::process::id()),
        }
    }
}

/// CPU microseconds per pair of each process between two samples.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerPair {
    pub arbiter: Option<f64>,
    pub etcd: Option<f64>,
    pub bench: Option<f64>,
}

impl PerPair {
    pub fn between(a: &Sample, b: &Sample, pairs: usize) -> Self {
        let per = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if pairs > 0 && y >= x => Some((y - x) * 1e6 / pairs as f64),
            _ => None,
        };
        PerPair { arbiter: per(a.arbiter, b.arbiter), etcd: per(a.etcd, b.etcd), bench: per(a.bench, b.bench) }
    }
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times (USER_HZ).
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the C library; no memory is shared.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// User+system CPU seconds the process has used (all its threads, also the
/// ones that have ended), or `None` if it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (utime, stime) = parse_stat_times(&text)?;
    Some((utime + stime) as f64 / ticks_per_second())
}

/// `utime` and `stime` (fields 14 and 15) of a `/proc/<pid>/stat` line. The
/// command name (field 2) is in parentheses and may itself hold spaces and
/// parentheses, so the fields are counted from after the last `)`.
pub fn parse_stat_times(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the `)`: state is field 3, so utime (14) is the 12th field.
    let utime = fields.nth(11)?.parse().ok()?;
    let stime = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// The TCP port of an endpoint written `host:port`, `scheme://host:port`
/// or `scheme://host:port/path`.
pub fn endpoint_port(endpoint: &str) -> Option<u16> {
    let rest = endpoint.split_once("://").map(|(_, r)| r).unwrap_or(endpoint);
    let authority = rest.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

pub use holdfast_devkit::ports::listener_pid;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_are_read_after_the_last_parenthesis() {
        // A command name holding spaces and parentheses must not shift the fields.
        let line = "4242 (we ird) (x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 317 42 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat_times(line), Some((317, 42)));
        assert_eq!(parse_stat_times("4242 (short"), None);
    }

    #[test]
    fn our_own_cpu_time_is_readable() {
        let t = cpu_seconds(std::process::id());
        assert!(t.is_some_and(|t| t >= 0.0), "{t:?}");
    }

    #[test]
    fn ports_of_endpoints() {
        assert_eq!(endpoint_port("127.0.0.1:2379"), Some(2379));
        assert_eq!(endpoint_port("https://127.0.0.1:2379"), Some(2379));
        assert_eq!(endpoint_port("http://[::1]:9/metrics"), Some(9));
        assert_eq!(endpoint_port("no-port"), None);
    }

    #[test]
    fn per_pair_needs_pairs_and_both_samples() {
        let a = Sample { arbiter: Some(1.0), etcd: None, bench: Some(2.0) };
        let b = Sample { arbiter: Some(1.5), etcd: Some(3.0), bench: Some(2.1) };
        let p = PerPair::between(&a, &b, 1000);
        assert_eq!(p.arbiter, Some(500.0));
        assert_eq!(p.etcd, None);
        assert!(p.bench.is_some_and(|x| (x - 100.0).abs() < 1e-6));
        assert!(PerPair::between(&a, &b, 0).arbiter.is_none());
    }
}
