//! The signed `.deb` packages for the tests that install them on booted
//! containers (tests/install.rs, tests/fleet.rs), and the step clock those
//! tests print their timings with.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Packages in the cached Debian 12 root (beside nspawn's base) that both
/// container tests boot, so one debootstrap serves both: what verifies the
/// packages (debsig-verify, gnupg), openssl (the quick start's CAs), and
/// what Ansible needs on a host (sshd, python3, python3-apt for the apt
/// module). No etcd: holdfast-etcd ships the one its members run (and the
/// etcdctl the playbooks' health checks use).
pub const ROOT_PACKAGES: &[&str] = &["debsig-verify", "gnupg", "openssl", "openssh-server", "python3", "python3-apt"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The signed packages: HOLDFAST_PACKAGES_DIR (with HOLDFAST_PACKAGES_KEY,
/// the `packaging/throwaway-key` directory they were signed with, for the
/// upgrade step), or built now by `packaging/build --profile dev` with a key
/// from `packaging/throwaway-key`.
/// Returns the directory and the signing key's directory (for re-signing
/// the upgrade), if the test made it.
pub fn packages(work: &Path) -> (PathBuf, Option<PathBuf>) {
    if let Some(dir) = std::env::var_os("HOLDFAST_PACKAGES_DIR") {
        return (PathBuf::from(dir), std::env::var_os("HOLDFAST_PACKAGES_KEY").map(PathBuf::from));
    }
    let root = workspace();
    for tool in ["packaging/build", "packaging/throwaway-key"] {
        assert!(
            root.join(tool).is_file(),
            "{tool} is missing: the packaging scripts are needed to build the packages (or set HOLDFAST_PACKAGES_DIR)"
        );
    }
    let key = work.join("key");
    let out = work.join("debs");
    let ran =
        Command::new(root.join("packaging/throwaway-key")).arg(&key).current_dir(&root).output().expect("running packaging/throwaway-key");
    assert!(
        ran.status.success(),
        "packaging/throwaway-key failed:\n{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    let mut build = Command::new(root.join("packaging/build"));
    build.args(["--profile", "dev", "--out"]).arg(&out).current_dir(&root);
    for (k, v) in key_env(&key) {
        build.env(k, v);
    }
    let ran = build.output().expect("running packaging/build");
    assert!(
        ran.status.success(),
        "packaging/build failed:\n{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    (out, Some(key))
}

/// The environment `packaging/build` reads the signing key from, as
/// `packaging/throwaway-key DIR` writes it (DIR/env: `export K=V` lines).
pub fn key_env(key: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(key.join("env")).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export ").unwrap_or(l.trim()).split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').trim_matches('\'').to_string()))
        .filter(|(k, _)| !k.is_empty() && !k.starts_with('#'))
        .collect()
}

/// The newest `.deb` of `name` in `dir`.
pub fn deb(dir: &Path, name: &str) -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb")))
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| panic!("no {name}_*.deb in {}", dir.display()))
}

/// Step timings, printed as they finish and again at the end.
pub struct Clock {
    label: &'static str,
    started: Instant,
    steps: Vec<(String, Duration)>,
}

impl Clock {
    /// A clock whose lines start with `== LABEL:` (e.g. "install test").
    pub fn new(label: &'static str) -> Self {
        Clock { label, started: Instant::now(), steps: Vec::new() }
    }

    pub fn step<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        eprintln!("== {}: {name}", self.label);
        let t = Instant::now();
        let out = f();
        let took = t.elapsed();
        eprintln!("== {}: {name}: {took:.1?}", self.label);
        self.steps.push((name.to_string(), took));
        out
    }

    pub fn summary(&self) {
        eprintln!("== {} timings", self.label);
        for (name, took) in &self.steps {
            eprintln!("   {name:<40} {took:>8.1?}");
        }
        eprintln!("   {:<40} {:>8.1?}", "whole test", self.started.elapsed());
    }
}
