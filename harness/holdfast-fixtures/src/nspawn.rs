//! A booted Debian 12 (bookworm) system container for the install test:
//! a root made once with `debootstrap` and cached, copied per test, booted
//! with `systemd-nspawn -b`, driven with `nsenter`.
//!
//! - The root is `debootstrap --variant=minbase` plus [`BASE_PACKAGES`] and
//!   the caller's packages (what the holdfast packages depend on), cached
//!   under `/var/cache/holdfast/nspawn/bookworm-<hash of the package list>/`
//!   (`HOLDFAST_NSPAWN_CACHE` overrides the parent directory). A root is
//!   complete only when its `complete` marker exists: an interrupted build
//!   is never used. Delete the directory to rebuild.
//! - The Debian mirror is read from the host's apt sources
//!   (`/etc/apt/sources.list`, `/etc/apt/sources.list.d/*.list|*.sources`),
//!   or `HOLDFAST_DEBIAN_MIRROR`: no mirror is named here.
//! - Each [`Container`] boots a copy of the cached root (`cp -a
//!   --reflink=auto`) with `systemd-nspawn -b --register=no --keep-unit
//!   --console=read-only --private-network` (without `--keep-unit` nspawn
//!   asks the host's systemd for a scope over D-Bus and fails with "Failed
//!   to open system bus" on a host not booted with systemd): the container has only its
//!   own loopback, so whatever it listens on never meets the host's ports
//!   and all its traffic stays in its own network namespace. Commands run
//!   inside with `nsenter` into the container's PID 1 (no machined, no
//!   registration needed); files are copied in through the root directory.
//! - [`Container::boot_with`] takes [`BootOptions`]: a network namespace
//!   to join instead of a private one (several containers on one test
//!   network, e.g. each on its own loopback address), and files written
//!   into the copy before it boots (a service's listen address).
//! - Dropping the container powers it off (SIGTERM to nspawn, which asks
//!   the container's systemd to halt), kills it after a grace period, and
//!   removes the copy.

use anyhow::{Context, bail};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What every cached root has beside `minbase`: a booting systemd, D-Bus
/// for `systemctl`, and what the test itself uses inside.
pub const BASE_PACKAGES: &[&str] = &["systemd", "systemd-sysv", "dbus", "ca-certificates", "iproute2", "procps"];

/// The Debian release the root is made of.
pub const SUITE: &str = "bookworm";

/// The host tools this fixture runs, each with the Debian package that has it.
const TOOLS: &[(&str, &str)] =
    &[("debootstrap", "debootstrap"), ("systemd-nspawn", "systemd-container"), ("nsenter", "util-linux"), ("cp", "coreutils")];

fn need_tools() -> anyhow::Result<()> {
    for (tool, pkg) in TOOLS {
        let found = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false);
        if !found {
            bail!("`{tool}` not found: install Debian's {pkg} (scripts/install-deps)");
        }
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("the nspawn fixture needs root (debootstrap, systemd-nspawn, nsenter)");
    }
    Ok(())
}

/// The parent directory of cached roots.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("HOLDFAST_NSPAWN_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/cache/holdfast/nspawn"))
}

/// The package list a root is made with: [`BASE_PACKAGES`] and `extra`,
/// sorted and without duplicates (so the cache key does not depend on order).
pub fn package_list(extra: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = BASE_PACKAGES.iter().chain(extra).map(|s| s.to_string()).collect();
    all.sort();
    all.dedup();
    all
}

/// FNV-1a, 64 bit: a stable name for a package list (std's hasher is
/// randomly seeded).
fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `<cache>/bookworm-<hash>` for this package list.
pub fn cache_path(packages: &[String]) -> PathBuf {
    cache_dir().join(format!("{SUITE}-{:016x}", fnv1a(&format!("{SUITE}:minbase:{}", packages.join(",")))))
}

/// The Debian archive URL from the host's apt sources: the first `deb`
/// source whose suite is `bookworm` (not `-security`, `-updates`), or
/// `HOLDFAST_DEBIAN_MIRROR`.
pub fn mirror() -> anyhow::Result<String> {
    if let Ok(m) = std::env::var("HOLDFAST_DEBIAN_MIRROR") {
        return Ok(m);
    }
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        let name = f.to_string_lossy();
        let found = if name.ends_with(".sources") {
            mirror_deb822(&text)
        } else if name.ends_with(".list") {
            mirror_one_line(&text)
        } else {
            None
        };
        if let Some(m) = found {
            return Ok(m);
        }
    }
    bail!(
        "no `deb` source for {SUITE} in /etc/apt/sources.list or /etc/apt/sources.list.d: set HOLDFAST_DEBIAN_MIRROR to a Debian archive URL"
    )
}

fn mirror_one_line(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        if words.first() != Some(&"deb") {
            return None;
        }
        // `deb [options] URL SUITE COMPONENTS...`: options never hold "://".
        let at = words.iter().position(|w| w.contains("://"))?;
        (words.get(at + 1) == Some(&SUITE)).then(|| words[at].to_string())
    })
}

fn mirror_deb822(text: &str) -> Option<String> {
    for stanza in text.split("\n\n") {
        let field =
            |name: &str| stanza.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_string()));
        let types = field("Types").unwrap_or_default();
        if !types.split_whitespace().any(|t| t == "deb") {
            continue;
        }
        let suites = field("Suites").unwrap_or_default();
        if !suites.split_whitespace().any(|s| s == SUITE) {
            continue;
        }
        if let Some(uri) = field("URIs").and_then(|u| u.split_whitespace().next().map(str::to_string)) {
            return Some(uri);
        }
    }
    None
}

/// The cached root for `extra` packages (beside [`BASE_PACKAGES`]), made
/// with debootstrap if it is not there yet. Returns the root directory
/// and how long making it took (zero when it was cached).
///
/// `prepare` runs once on a fresh root before it is marked complete
/// (e.g. to mask a unit a package enables).
pub fn cached_root(extra: &[&str], prepare: impl FnOnce(&Path) -> anyhow::Result<()>) -> anyhow::Result<(PathBuf, Duration)> {
    need_tools()?;
    let packages = package_list(extra);
    let dir = cache_path(&packages);
    let root = dir.join("root");
    if dir.join("complete").is_file() {
        return Ok((root, Duration::ZERO));
    }
    let started = Instant::now();
    std::fs::create_dir_all(cache_dir()).with_context(|| format!("creating {}", cache_dir().display()))?;
    // One debootstrap per root at a time: a test that asks while another
    // (the install test beside the fleet test) is making it waits, then
    // takes the finished root, instead of making a second copy side by side.
    let lock_path = dir.with_extension("lock");
    let lock = std::fs::File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    lock.lock().with_context(|| format!("locking {}", lock_path.display()))?;
    if dir.join("complete").is_file() {
        return Ok((root, Duration::ZERO));
    }
    // Build beside, rename into place: a build that dies leaves no root
    // that looks complete.
    let building = cache_dir().join(format!("{}.building-{}", dir.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir_all(&building)?;
    let mirror = mirror()?;
    let log = building.join("debootstrap.log");
    let out = std::fs::File::create(&log)?;
    let status = Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--include={}", packages.join(",")))
        .arg(SUITE)
        .arg(building.join("root"))
        .arg(&mirror)
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .context("running debootstrap")?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
        bail!("debootstrap {SUITE} from {mirror} failed ({status}); log {}:\n{}", log.display(), tail.join("\n"));
    }
    // apt's package cache is not needed in a test root.
    let _ = Command::new("sh").arg("-c").arg(format!("rm -rf {}/var/cache/apt/archives/*.deb", building.join("root").display())).status();
    prepare(&building.join("root"))?;
    std::fs::write(building.join("packages"), packages.join("\n") + "\n")?;
    std::fs::write(building.join("complete"), format!("made in {:?}\n", started.elapsed()))?;
    match std::fs::rename(&building, &dir) {
        Ok(()) => {}
        Err(_) if dir.join("complete").is_file() => {
            let _ = std::fs::remove_dir_all(&building);
        }
        Err(e) => return Err(e).with_context(|| format!("moving {} to {}", building.display(), dir.display())),
    }
    Ok((root, started.elapsed()))
}

/// A finished command inside the container.
#[derive(Debug, Clone)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// How long each part of bringing a container up took.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    /// Copying the cached root.
    pub copy: Duration,
    /// From starting nspawn to `systemctl is-system-running --wait` returning.
    pub boot: Duration,
}

/// How [`Container::boot_with`] boots a container beyond [`Container::boot`].
#[derive(Debug, Clone, Default)]
pub struct BootOptions {
    /// Join this network namespace (e.g. `/run/netns/NAME`, made with `ip
    /// netns add`) with `--network-namespace-path=` instead of
    /// `--private-network`: containers booted into the same namespace share
    /// its interfaces and reach each other. `None`: a private network.
    pub network_namespace: Option<PathBuf>,
    /// Files written into the copied root before it boots, as (absolute path
    /// inside, contents); parent directories are created. Written after the
    /// fixture's own `/etc/hostname` and `/etc/hosts`, so they may replace them.
    pub files: Vec<(String, String)>,
}

/// A booted container. Dropping it powers it off and removes its root.
pub struct Container {
    pub name: String,
    /// The container's root directory on the host.
    pub root: PathBuf,
    /// The per-test directory holding the root and nspawn's console log.
    dir: PathBuf,
    /// nspawn's output (the console, read-only).
    pub console_log: PathBuf,
    child: Option<Child>,
    /// The container's PID 1 (systemd), as the host sees it.
    pub leader: i32,
    pub timings: Timings,
}

/// PIDs whose parent is `parent` (from /proc/*/stat).
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_string)))
                .flatten()
                .and_then(|pp| pp.parse::<i32>().ok())
                == Some(parent)
        })
        .collect()
}

/// True if `pid` is PID 1 of its own PID namespace (NSpid: `host 1`).
fn is_ns_init(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("NSpid:")).map(|l| l.split_whitespace().last() == Some("1")))
        .unwrap_or(false)
}

impl Container {
    /// Copies `base` (a root from [`cached_root`]) into `work/<name>/root`,
    /// boots it and waits until systemd says the system is up (`running`
    /// or `degraded`; a degraded boot lists its failed units in the log).
    pub fn boot(base: &Path, work: &Path, name: &str) -> anyhow::Result<Self> {
        Self::boot_with(base, work, name, &BootOptions::default())
    }

    /// [`Container::boot`] with [`BootOptions`]: another network namespace,
    /// files written before boot.
    pub fn boot_with(base: &Path, work: &Path, name: &str, options: &BootOptions) -> anyhow::Result<Self> {
        need_tools()?;
        let dir = work.join(name);
        let root = dir.join("root");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let started = Instant::now();
        let st = Command::new("cp").arg("-a").arg("--reflink=auto").arg(base).arg(&root).status().context("cp -a")?;
        if !st.success() {
            bail!("copying {} to {} failed ({st})", base.display(), root.display());
        }
        let copy = started.elapsed();
        // A fresh machine ID per container (an empty file makes systemd
        // generate one at boot).
        std::fs::write(root.join("etc/machine-id"), "")?;
        std::fs::write(root.join("etc/hostname"), format!("{name}\n"))?;
        // debootstrap writes no /etc/hosts (the installer does): without
        // one, `localhost` goes to DNS, which a private network cannot reach.
        std::fs::write(
            root.join("etc/hosts"),
            format!("127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        )?;
        for (path, contents) in &options.files {
            let to = root.join(path.trim_start_matches('/'));
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&to, contents).with_context(|| format!("writing {name}:{path} before boot"))?;
        }
        let network = match &options.network_namespace {
            Some(ns) => format!("--network-namespace-path={}", ns.display()),
            None => "--private-network".to_string(),
        };
        let console_log = dir.join("console.log");
        let log = std::fs::File::create(&console_log)?;
        let booting = Instant::now();
        let child = Command::new("systemd-nspawn")
            .args(["-b", "--register=no", "--keep-unit", "--console=read-only", &network, "--quiet", "-M", name, "-D"])
            .arg(&root)
            .env("SYSTEMD_NSPAWN_TMPFS_TMP", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting systemd-nspawn")?;
        let mut c = Container {
            name: name.to_string(),
            root,
            dir,
            console_log,
            leader: 0,
            child: Some(child),
            timings: Timings { copy, boot: Duration::ZERO },
        };
        c.leader = c.find_leader(Duration::from_secs(30))?;
        // Until PID 1 has exec'd systemd and its bus is up, systemctl says
        // "offline": ask again until it says something else.
        let deadline = Instant::now() + Duration::from_secs(180);
        let state = loop {
            let wait = c.exec(&["timeout", "180", "systemctl", "is-system-running", "--wait"])?;
            let state = wait.stdout.trim().to_string();
            if (state != "offline" && !state.is_empty()) || Instant::now() > deadline {
                break state;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if state != "running" && state != "degraded" {
            let failed = c.exec(&["systemctl", "--failed", "--no-legend"]).map(|o| o.stdout).unwrap_or_default();
            bail!("container {name} did not boot: is-system-running says {state:?}\nfailed units:\n{failed}\nconsole:\n{}", c.console());
        }
        if state == "degraded" {
            let failed = c.exec(&["systemctl", "--failed", "--no-legend"]).map(|o| o.stdout).unwrap_or_default();
            eprintln!("container {name}: booted degraded; failed units:\n{failed}");
        }
        c.timings.boot = booting.elapsed();
        Ok(c)
    }

    fn find_leader(&mut self, within: Duration) -> anyhow::Result<i32> {
        let deadline = Instant::now() + within;
        let nspawn = self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!("systemd-nspawn exited ({status}) before the container booted:\n{}", self.console());
            }
            // nspawn's child is the container's PID 1 (in a new PID namespace).
            if let Some(pid) = children_of(nspawn).into_iter().find(|&p| is_ns_init(p)) {
                return Ok(pid);
            }
            if Instant::now() > deadline {
                bail!("no container init under systemd-nspawn (pid {nspawn}) after {within:?}:\n{}", self.console());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The console output so far (the last 60 lines).
    pub fn console(&self) -> String {
        let text = std::fs::read_to_string(&self.console_log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    fn nsenter(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg("-t").arg(self.leader.to_string()).args(["-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"]);
        c.arg("env").arg("-i");
        c.arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        c.arg("LANG=C.UTF-8").arg("HOME=/root").arg("TERM=dumb").arg("SYSTEMD_PAGER=").arg("DEBIAN_FRONTEND=noninteractive");
        c
    }

    /// Runs `argv` inside the container (as root, a clean environment) and
    /// waits for it.
    pub fn exec(&self, argv: &[&str]) -> anyhow::Result<Output> {
        let mut c = self.nsenter();
        c.args(argv).stdin(Stdio::null());
        let out = c.output().with_context(|| format!("nsenter into {}: {argv:?}", self.name))?;
        Ok(Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Runs a shell script inside the container (`sh -ec SCRIPT`).
    pub fn sh(&self, script: &str) -> anyhow::Result<Output> {
        self.exec(&["sh", "-ec", script])
    }

    /// Starts `argv` inside the container without waiting (stdout and
    /// stderr piped) for a client loop running beside other steps.
    pub fn spawn(&self, argv: &[&str]) -> anyhow::Result<Child> {
        let mut c = self.nsenter();
        c.args(argv).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().with_context(|| format!("nsenter into {}: {argv:?}", self.name))
    }

    /// The host path of `path` inside the container.
    pub fn host_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Copies a host file into the container at `dest` (an absolute path
    /// inside; parent directories are created).
    pub fn copy_in(&self, src: &Path, dest: &str) -> anyhow::Result<()> {
        let to = self.host_path(dest);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(src, &to).with_context(|| format!("copying {} into {}:{dest}", src.display(), self.name))?;
        Ok(())
    }

    /// Writes `contents` to `dest` inside the container.
    pub fn write(&self, dest: &str, contents: &str) -> anyhow::Result<()> {
        let to = self.host_path(dest);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&to, contents).with_context(|| format!("writing {}:{dest}", self.name))
    }

    /// Reads `path` inside the container.
    pub fn read(&self, path: &str) -> anyhow::Result<String> {
        std::fs::read_to_string(self.host_path(path)).with_context(|| format!("reading {}:{path}", self.name))
    }

    /// Powers the container off and waits (up to `grace`), then kills it.
    pub fn poweroff(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else { return };
        // SIGTERM to nspawn: it asks the container's systemd to halt.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        if self.leader > 0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.leader), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = child.wait();
        let mut rest = String::new();
        let _ = child.stdout.take().map(|mut s| s.read_to_string(&mut rest));
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.poweroff(Duration::from_secs(20));
        if std::env::var_os("HOLDFAST_KEEP_CONTAINER").is_some() {
            eprintln!("container {}: root kept at {} (HOLDFAST_KEEP_CONTAINER)", self.name, self.root.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_from_sources_formats() {
        let deb822 = "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n";
        assert_eq!(mirror_deb822(deb822).as_deref(), Some("http://mirror.invalid/debian"));
        let list =
            "# comment\ndeb-src http://x.invalid/debian bookworm main\ndeb [arch=amd64] http://mirror.invalid/debian bookworm main\n";
        assert_eq!(mirror_one_line(list).as_deref(), Some("http://mirror.invalid/debian"));
        assert_eq!(mirror_one_line("deb http://mirror.invalid/debian-security bookworm-security main\n"), None);
    }

    #[test]
    fn cache_key_ignores_order() {
        assert_eq!(cache_path(&package_list(&["a", "b"])), cache_path(&package_list(&["b", "a", "a"])));
        assert_ne!(cache_path(&package_list(&["a"])), cache_path(&package_list(&["b"])));
    }
}
