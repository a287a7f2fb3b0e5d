//! fdatasync latency probe with etcd's WAL write pattern: a preallocated
//! segment filled by small sequential appends, each followed by fdatasync
//! (what etcd's WAL does per Raft batch). The p99 gates readiness.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config::ProbeConfig;
use crate::error::{ProvisionError, Result};

/// Name of the probe's scratch file, removed afterwards.
pub const SCRATCH: &str = ".holdfast-fsync-probe";
/// Where the last verdict is recorded under the state directory.
pub const RESULT_FILE: &str = "probe.json";

/// Figures of one probe run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProbeReport {
    /// Directory measured.
    pub dir: PathBuf,
    /// Appends measured.
    pub samples: usize,
    /// Bytes per append.
    pub write_size: usize,
    /// Median fdatasync latency, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Worst, µs.
    pub max_us: u64,
    /// Threshold applied, µs.
    pub max_p99_us: u64,
    /// Whether p99 is within the threshold.
    pub within_threshold: bool,
    /// Whether the node is marked ready for an etcd member (within threshold, or overridden).
    pub ready: bool,
    /// Whether the operator overrode a failing figure.
    pub overridden: bool,
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Measures fdatasync latency in `dir`. `progress` is called with (done, total).
pub fn measure(dir: &Path, cfg: &ProbeConfig, mut progress: impl FnMut(usize, usize)) -> Result<ProbeReport> {
    let path = dir.join(SCRATCH);
    let io = |what: &str, e| ProvisionError::io(format!("{what} {} (is the data volume mounted and writable?)", path.display()), e);
    let file = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).map_err(|e| io("creating", e))?;
    let total = (cfg.samples * cfg.write_size) as libc::off_t;
    // Preallocate like etcd's WAL segments, so appends do not extend the file.
    // SAFETY: valid fd, integer arguments.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, total) };
    if r != 0 {
        let _ = std::fs::remove_file(&path);
        return Err(io("preallocating", std::io::Error::from_raw_os_error(r)));
    }
    file.sync_all().map_err(|e| io("syncing", e))?;
    let buf = vec![0x5au8; cfg.write_size];
    let mut lat = Vec::with_capacity(cfg.samples);
    let step = (cfg.samples / 10).max(1);
    let result = (|| {
        for i in 0..cfg.samples {
            let start = Instant::now();
            file.write_all_at(&buf, (i * cfg.write_size) as u64).map_err(|e| io("writing", e))?;
            file.sync_data().map_err(|e| io("fdatasync on", e))?;
            lat.push(start.elapsed().as_micros() as u64);
            if (i + 1) % step == 0 {
                progress(i + 1, cfg.samples);
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    result?;
    lat.sort_unstable();
    let max_p99_us = cfg.max_p99.as_micros() as u64;
    let p99_us = percentile(&lat, 99.0);
    Ok(ProbeReport {
        dir: dir.to_owned(),
        samples: cfg.samples,
        write_size: cfg.write_size,
        p50_us: percentile(&lat, 50.0),
        p99_us,
        max_us: lat.last().copied().unwrap_or(0),
        max_p99_us,
        within_threshold: p99_us <= max_p99_us,
        ready: false,
        overridden: false,
    })
}

/// Applies the gate: ready when within threshold, or when `accept_slow` overrides it.
/// Returns the report with `ready` set, or `SlowDisk` when refused.
pub fn gate(mut report: ProbeReport, accept_slow: bool) -> Result<ProbeReport> {
    report.ready = report.within_threshold || accept_slow;
    report.overridden = !report.within_threshold && accept_slow;
    if report.ready {
        Ok(report)
    } else {
        Err(ProvisionError::SlowDisk { p99_us: report.p99_us, max_us: report.max_p99_us, dir: report.dir.display().to_string() })
    }
}

/// Records the verdict (ready or not) in `state_dir/probe.json`.
pub fn record(state_dir: &Path, report: &ProbeReport) -> Result<()> {
    std::fs::create_dir_all(state_dir).map_err(|e| ProvisionError::io(format!("creating {}", state_dir.display()), e))?;
    let path = state_dir.join(RESULT_FILE);
    let tmp = state_dir.join(".probe.json.tmp");
    let text = serde_json::to_string_pretty(report).map_err(|e| ProvisionError::State(e.to_string()))?;
    let mut f = std::fs::File::create(&tmp).map_err(|e| ProvisionError::io(format!("writing {}", tmp.display()), e))?;
    f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(|e| ProvisionError::io(format!("writing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path).map_err(|e| ProvisionError::io(format!("renaming into {}", path.display()), e))
}

/// Reads the last recorded verdict, if any.
pub fn last(state_dir: &Path) -> Option<ProbeReport> {
    let text = std::fs::read_to_string(state_dir.join(RESULT_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Formats a duration in µs for people.
pub fn human_us(us: u64) -> String {
    humantime::format_duration(Duration::from_micros(us)).to_string()
}
