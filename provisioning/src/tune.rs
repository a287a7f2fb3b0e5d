//! CPU pinning, I/O scheduling class and nice for the etcd member: as a
//! systemd drop-in for `holdfast-etcd@.service`, and applied to a running PID
//! (every thread of it: Go's etcd runs many).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use nix::sched::{CpuSet as NixCpuSet, sched_setaffinity};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::config::TuneConfig;
use crate::error::{ProvisionError, Result};

/// The unit the drop-in is for.
pub const ETCD_UNIT: &str = "holdfast-etcd@.service";
/// The drop-in's file name.
pub const DROPIN_NAME: &str = "50-holdfast-provision.conf";

/// A set of CPU numbers, written like `Cpus_allowed_list`: `2-5,8`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSet(pub BTreeSet<usize>);

impl FromStr for CpuSet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let a: usize = a.parse().map_err(|_| format!("{part:?} is not a CPU number or range like 2-5"))?;
            let b: usize = b.parse().map_err(|_| format!("{part:?} is not a CPU number or range like 2-5"))?;
            if a > b || b >= NixCpuSet::count() {
                return Err(format!("{part:?} is not a valid ascending CPU range"));
            }
            set.extend(a..=b);
        }
        if set.is_empty() {
            return Err("the CPU set is empty; name the CPUs reserved for etcd, e.g. \"2-5\"".into());
        }
        Ok(CpuSet(set))
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus: Vec<usize> = self.0.iter().copied().collect();
        let mut parts = Vec::new();
        let mut i = 0;
        while i < cpus.len() {
            let start = cpus[i];
            let mut end = start;
            while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
                i += 1;
                end = cpus[i];
            }
            parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
            i += 1;
        }
        f.write_str(&parts.join(","))
    }
}

impl Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// I/O scheduling class (ioprio).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoClass {
    /// IOPRIO_CLASS_RT: served first; needs CAP_SYS_ADMIN.
    Realtime,
    /// IOPRIO_CLASS_BE: the default class, with priority 0..7.
    BestEffort,
    /// IOPRIO_CLASS_IDLE: only when the disk is otherwise idle.
    Idle,
}

impl IoClass {
    fn kernel(self) -> i32 {
        match self {
            IoClass::Realtime => 1,
            IoClass::BestEffort => 2,
            IoClass::Idle => 3,
        }
    }
    /// The name systemd's `IOSchedulingClass=` takes.
    pub fn systemd(self) -> &'static str {
        match self {
            IoClass::Realtime => "realtime",
            IoClass::BestEffort => "best-effort",
            IoClass::Idle => "idle",
        }
    }
}

/// The drop-in text for `holdfast-etcd@.service`.
pub fn render_dropin(t: &TuneConfig) -> String {
    format!(
        "# Written by holdfast-provision tune from /etc/holdfast/provision.toml.\n\
         # Do not edit: change [tune] there and run `holdfast-provision tune` again.\n\
         [Service]\n\
         CPUAffinity={}\n\
         IOSchedulingClass={}\n\
         IOSchedulingPriority={}\n\
         Nice={}\n",
        t.cpus.to_string().replace(',', " "),
        t.io_class.systemd(),
        t.io_priority,
        t.nice
    )
}

/// Path of the drop-in under `unit_dir`.
pub fn dropin_path(unit_dir: &Path) -> PathBuf {
    unit_dir.join(format!("{ETCD_UNIT}.d")).join(DROPIN_NAME)
}

/// Outcome of writing the drop-in.
#[derive(Debug, Clone, Serialize)]
pub struct DropinOutcome {
    /// Where it is.
    pub path: PathBuf,
    /// Whether the file was (or, with dry-run, would be) changed.
    pub changed: bool,
    /// Its content.
    pub content: String,
}

/// Writes the drop-in if its content differs (idempotent). With `dry_run`, only reports.
pub fn write_dropin(t: &TuneConfig, dry_run: bool) -> Result<DropinOutcome> {
    let path = dropin_path(&t.unit_dir);
    let content = render_dropin(t);
    let changed = std::fs::read_to_string(&path).map(|c| c != content).unwrap_or(true);
    if changed && !dry_run {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| ProvisionError::io(format!("creating {}", dir.display()), e))?;
        }
        let tmp = path.with_extension("conf.tmp");
        std::fs::write(&tmp, &content).map_err(|e| ProvisionError::io(format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| ProvisionError::io(format!("renaming into {}", path.display()), e))?;
    }
    Ok(DropinOutcome { path, changed, content })
}

/// What a process currently has, read back from `/proc`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProcessTuning {
    /// `Cpus_allowed_list` of the main thread.
    pub cpus_allowed_list: String,
    /// ioprio class and priority.
    pub io_class: Option<IoClass>,
    /// ioprio priority level.
    pub io_priority: i32,
    /// nice value.
    pub nice: i32,
}

/// Result of applying to a PID.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyOutcome {
    /// The PID.
    pub pid: i32,
    /// Threads touched.
    pub threads: usize,
    /// Whether anything differed before.
    pub changed: bool,
    /// Tuning after (or, with dry-run, before).
    pub now: ProcessTuning,
}

fn threads_of(pid: i32) -> Result<Vec<i32>> {
    let dir = format!("/proc/{pid}/task");
    let rd = std::fs::read_dir(&dir)
        .map_err(|e| ProvisionError::io(format!("listing {dir} (is PID {pid} running? pass the etcd member's PID with --pid)"), e))?;
    let mut tids: Vec<i32> = rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    Ok(tids)
}

fn ioprio_get(tid: i32) -> Result<i32> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe {
        libc::syscall(libc::SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, tid)
    };
    if r < 0 {
        return Err(ProvisionError::io(format!("ioprio_get({tid})"), std::io::Error::last_os_error()));
    }
    Ok(r as i32)
}

fn ioprio_set(tid: i32, class: IoClass, prio: u8) -> Result<()> {
    let value = (class.kernel() << 13) | i32::from(prio);
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe {
        libc::syscall(libc::SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, tid, value)
    };
    if r < 0 {
        return Err(ProvisionError::io(
            format!("ioprio_set({tid}, {}, {prio}) (the realtime class needs CAP_SYS_ADMIN)", class.systemd()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn nice_of(tid: i32) -> Result<i32> {
    // /proc/<tid>/stat field 19 is nice; the comm field may contain spaces, so split after ')'.
    let stat =
        std::fs::read_to_string(format!("/proc/{tid}/stat")).map_err(|e| ProvisionError::io(format!("reading /proc/{tid}/stat"), e))?;
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    after
        .split_whitespace()
        .nth(16)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ProvisionError::State(format!("cannot parse nice from /proc/{tid}/stat")))
}

/// Reads a process's current CPU list, ioprio and nice.
pub fn read_process(pid: i32) -> Result<ProcessTuning> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| ProvisionError::io(format!("reading /proc/{pid}/status"), e))?;
    let cpus_allowed_list =
        status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|v| v.trim().to_string()).unwrap_or_default();
    let io = ioprio_get(pid)?;
    let io_class = match io >> 13 {
        1 => Some(IoClass::Realtime),
        2 => Some(IoClass::BestEffort),
        3 => Some(IoClass::Idle),
        _ => None, // IOPRIO_CLASS_NONE: derived from nice
    };
    Ok(ProcessTuning { cpus_allowed_list, io_class, io_priority: io & 0x1fff, nice: nice_of(pid)? })
}

/// Applies affinity, ioprio and nice to every thread of `pid`. Idempotent: re-applying the same values changes nothing.
pub fn apply_to_pid(pid: i32, t: &TuneConfig, dry_run: bool) -> Result<ApplyOutcome> {
    let before = read_process(pid)?;
    let want = ProcessTuning {
        cpus_allowed_list: t.cpus.to_string(),
        io_class: Some(t.io_class),
        io_priority: i32::from(t.io_priority),
        nice: t.nice,
    };
    let tids = threads_of(pid)?;
    let changed = before != want;
    if dry_run {
        return Ok(ApplyOutcome { pid, threads: tids.len(), changed, now: before });
    }
    let mut set = NixCpuSet::new();
    for &cpu in &t.cpus.0 {
        set.set(cpu).map_err(|e| ProvisionError::State(format!("CPU {cpu} cannot be set: {e}")))?;
    }
    for &tid in &tids {
        sched_setaffinity(Pid::from_raw(tid), &set).map_err(|e| {
            ProvisionError::State(format!(
                "sched_setaffinity({tid}, {}): {e}; check that tune.cpus names CPUs this host has (see `nproc`, /sys/devices/system/cpu/online)",
                t.cpus
            ))
        })?;
        ioprio_set(tid, t.io_class, t.io_priority)?;
        // SAFETY: setpriority with integer arguments.
        let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, t.nice) };
        if r != 0 {
            return Err(ProvisionError::io(format!("setpriority({tid}, {})", t.nice), std::io::Error::last_os_error()));
        }
    }
    Ok(ApplyOutcome { pid, threads: tids.len(), changed, now: read_process(pid)? })
}

/// The MainPID systemd reports for a unit, if it is running.
pub fn main_pid_of(unit: &str) -> Result<Option<i32>> {
    let out = std::process::Command::new("systemctl")
        .args(["show", "--property=MainPID", "--value", unit])
        .output()
        .map_err(|e| ProvisionError::io("running systemctl show (no systemd here? pass --pid)", e))?;
    if !out.status.success() {
        return Err(ProvisionError::Tool {
            tool: "systemctl show".into(),
            detail: format!("{}; pass the member's PID with --pid", String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    let pid: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0);
    Ok((pid > 0).then_some(pid))
}
