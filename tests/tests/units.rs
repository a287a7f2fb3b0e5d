//! The unit files in `systemd/` (the one source for the .deb, the .rpm and
//! NixOS) as systemd 252 judges them, with the real binaries in place.
//!
//! These tests do not depend on etcd: nothing here starts an etcd member,
//! so they run once, not once per etcd target. (The etcd unit's command
//! line is proven against real etcd binaries by `config/etcd/try-unit-flags`.)
//!
//! - `systemd-analyze verify` prints nothing for every unit. It exits 0 even
//!   for unknown keys and bad values, so any output at all is a failure.
//!   It runs with `--root` on a throwaway root: the host's own units (for
//!   `sysinit.target` and friends), ours where the packages put them
//!   (`/usr/lib/systemd/system`), the workspace's freshly built
//!   `holdfast-*` binaries as `/usr/bin/holdfast-*`, and every other
//!   program a unit executes (`/usr/lib/holdfast/etcd/etcd` from the pinned
//!   build in /usr/local/bin, `/bin/kill`, ...) copied
//!   from this host, so "not executable" is caught too.
//! - `systemd-analyze security --offline=true`: the overall exposure of
//!   every service stays at or below the threshold in [`EXPOSURE`], which
//!   each unit's header states as well.
//! - The preset ships every unit disabled; sysusers.d and tmpfiles.d apply
//!   to an empty root; every user a unit runs as comes from sysusers.d.
//! - Every `ExecStartPre=`/`ExecReload=` of a holdfast binary runs its
//!   `check` subcommand, which exists (`check --help`) and takes the flags
//!   the unit passes; a reload validates before it signals.
//!
//! A missing tool fails the test naming `scripts/install-deps`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Exposure ceilings (`systemd-analyze security --offline=true`, 0 = best,
/// 10 = worst). The network daemons and the tools running as `holdfast`:
/// 2.0. etcd and its defrag: 2.5 (the same hardening; headroom for what a
/// newer etcd may need). holdfast-provision: 9.0 — it runs as root with
/// device access, mounts a volume for the whole host and so cannot have a
/// mount namespace (see its header).
const EXPOSURE: &[(&str, f64)] = &[
    ("holdfast-arbiter.service", 2.0),
    ("holdfast-controller.service", 2.0),
    ("holdfast-tailer.service", 2.0),
    ("holdfast-risk-register.service", 2.0),
    ("holdfast-epoch-advance@.service", 2.0),
    ("holdfast-etcd@.service", 2.5),
    ("holdfast-etcd-defrag@.service", 2.5),
    ("holdfast-provision.service", 9.0),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn systemd_dir() -> PathBuf {
    repo().join("systemd")
}

/// The unit files in systemd/ (services, sockets, timers).
fn unit_files() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(systemd_dir())
        .expect("systemd/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".service") || n.ends_with(".socket") || n.ends_with(".timer"))
        .collect();
    v.sort();
    assert!(v.len() >= 11, "expected the holdfast units in {}, found {v:?}", systemd_dir().display());
    v
}

/// A program the test needs; missing is a failure naming install-deps.
fn tool(name: &str) -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: run scripts/install-deps (it installs systemd 252's tools, etcd and etcd-client)");
}

/// `key=value` lines of a unit, continuation lines joined, comments dropped.
fn directives(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim_end();
        if cur.is_empty() && (t.trim_start().starts_with('#') || t.trim_start().starts_with(';') || t.trim().is_empty()) {
            continue;
        }
        if let Some(stripped) = t.strip_suffix('\\') {
            cur.push_str(stripped);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        if let Some((k, v)) = cur.split_once('=')
            && !cur.starts_with('[')
        {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
        cur.clear();
    }
    out
}

fn unit_text(name: &str) -> String {
    std::fs::read_to_string(systemd_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The program an Exec*= line runs (its prefixes `-@:+!` stripped).
fn program(exec: &str) -> String {
    exec.trim_start_matches(['-', '@', ':', '+', '!']).split_whitespace().next().unwrap_or_default().to_string()
}

const EXEC_KEYS: &[&str] = &["ExecStartPre", "ExecStart", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost", "ExecCondition"];

/// A workspace binary for /usr/bin/holdfast*, else None.
fn workspace_binary(program: &str) -> Option<PathBuf> {
    let name = program.strip_prefix("/usr/bin/")?;
    name.starts_with("holdfast").then(|| holdfast_tests::bin(name))
}

/// Where this host has a program a unit runs that a holdfast package ships:
/// the workspace's build of a holdfast binary, or the pinned etcd that
/// scripts/install-deps built (what holdfast-etcd ships in /usr/lib/holdfast/etcd).
fn packaged_program(program: &str) -> Option<PathBuf> {
    if let Some(name) = program.strip_prefix("/usr/lib/holdfast/etcd/") {
        return Some(PathBuf::from("/usr/local/bin").join(name));
    }
    workspace_binary(program)
}

fn link_or_copy(from: &Path, to: &Path) {
    // /bin/sh is a symlink to dash: link what it points at.
    let from = &std::fs::canonicalize(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
    }
}

/// A throwaway root with the host's units, ours in /usr/lib/systemd/system
/// and every program they run in /usr/bin.
struct Root {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Root {
    fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-units-").tempdir().unwrap();
        let path = dir.path().to_path_buf();
        std::fs::create_dir_all(path.join("usr/lib/systemd")).unwrap();
        std::fs::create_dir_all(path.join("usr/bin")).unwrap();
        std::fs::create_dir_all(path.join("etc/systemd/system")).unwrap();
        std::os::unix::fs::symlink("usr/bin", path.join("bin")).unwrap();
        // The host's units: sysinit.target, sockets.target, timers.target...
        let host_units = Path::new("/usr/lib/systemd/system");
        assert!(host_units.join("sysinit.target").exists(), "no systemd units on this host: run scripts/install-deps");
        let st = Command::new(tool("cp")).arg("-a").arg(host_units).arg(path.join("usr/lib/systemd/")).status().unwrap();
        assert!(st.success(), "copying {}", host_units.display());
        let dest = path.join("usr/lib/systemd/system");
        // Drop-ins shipped beside the units (holdfast-etcd@.service.d/...).
        for dir in std::fs::read_dir(systemd_dir()).unwrap().filter_map(|e| e.ok()) {
            let n = dir.file_name().to_string_lossy().into_owned();
            if [".service.d", ".socket.d", ".timer.d"].iter().any(|s| n.ends_with(s)) {
                std::fs::create_dir_all(dest.join(&n)).unwrap();
                for f in std::fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()) {
                    std::fs::copy(f.path(), dest.join(&n).join(f.file_name())).unwrap();
                }
            }
        }
        for name in unit_files() {
            std::fs::copy(systemd_dir().join(&name), dest.join(&name)).unwrap();
            for (k, v) in directives(&unit_text(&name)) {
                if EXEC_KEYS.contains(&k.as_str()) {
                    let prog = program(&v);
                    let target = path.join(prog.trim_start_matches('/'));
                    if target.exists() {
                        continue;
                    }
                    let from = match packaged_program(&prog) {
                        Some(b) => b,
                        None => {
                            let host = PathBuf::from(&prog);
                            assert!(host.is_file(), "{name} runs {prog}, which is not installed on this host: run scripts/install-deps");
                            host
                        }
                    };
                    link_or_copy(&from, &target);
                }
            }
        }
        Root { _dir: dir, path }
    }

    fn analyze(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(tool("systemd-analyze")).args(args).arg(format!("--root={}", self.path.display())).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn systemd_analyze_verify_prints_nothing_for_every_unit() {
    let root = Root::new();
    let mut failures = Vec::new();
    for name in unit_files() {
        let (ok, out, err) = root.analyze(&["verify", &name]);
        if !ok || !out.trim().is_empty() || !err.trim().is_empty() {
            failures.push(format!("{name} (exit ok: {ok}):\n{out}{err}"));
        }
    }
    assert!(failures.is_empty(), "systemd-analyze verify must print nothing:\n{}", failures.join("\n"));
}

/// A host with the etcd package but without the provisioning one: no
/// holdfast-provision.service and no drop-in requiring it. The member's
/// unit must still load cleanly (its After= alone names nothing missing).
#[test]
fn the_etcd_units_verify_on_a_host_without_provisioning() {
    let root = Root::new();
    let units = root.path.join("usr/lib/systemd/system");
    std::fs::remove_file(units.join("holdfast-provision.service")).unwrap();
    std::fs::remove_dir_all(units.join("holdfast-etcd@.service.d")).unwrap();
    for name in ["holdfast-etcd@.service", "holdfast-etcd-defrag@.service", "holdfast-etcd-defrag@.timer"] {
        let (ok, out, err) = root.analyze(&["verify", name]);
        assert!(ok && out.trim().is_empty() && err.trim().is_empty(), "{name} without provisioning:\n{out}{err}");
    }
    // And the drop-in is what adds Requires= (so it must exist in systemd/).
    let dropin = std::fs::read_to_string(systemd_dir().join("holdfast-etcd@.service.d/10-holdfast-provision.conf")).unwrap();
    assert!(dropin.contains("Requires=holdfast-provision.service"), "{dropin}");
}

/// The harness above would see a mistake: an unknown key and a missing
/// program both produce output (while verify still exits 0 for the key).
#[test]
fn verify_in_this_root_reports_an_unknown_key_and_a_missing_program() {
    let root = Root::new();
    let unit = root.path.join("usr/lib/systemd/system/holdfast-arbiter.service");
    let text = unit_text("holdfast-arbiter.service").replace("[Service]\n", "[Service]\nWatchdogSecs=30s\n");
    std::fs::write(&unit, text).unwrap();
    let (_, out, err) = root.analyze(&["verify", "holdfast-arbiter.service"]);
    assert!(format!("{out}{err}").contains("Unknown key 'WatchdogSecs'"), "verify did not report the key:\n{out}{err}");

    std::fs::remove_file(root.path.join("usr/bin/holdfast-tailer")).unwrap();
    let (_, out, err) = root.analyze(&["verify", "holdfast-tailer.service"]);
    assert!(format!("{out}{err}").contains("/usr/bin/holdfast-tailer is not executable"), "verify did not report it:\n{out}{err}");
}

fn exposure(root: &Root, name: &str) -> f64 {
    let (ok, out, err) = root.analyze(&["security", "--offline=true", name]);
    assert!(ok, "systemd-analyze security {name} failed:\n{out}{err}");
    let line = out
        .lines()
        .find(|l| l.contains("Overall exposure level for"))
        .unwrap_or_else(|| panic!("no overall exposure for {name}:\n{out}{err}"));
    let after = line.rsplit_once(": ").map(|(_, a)| a).unwrap_or_default();
    after.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("cannot read the exposure in {line:?}"))
}

#[test]
fn every_service_stays_under_its_exposure_threshold() {
    let root = Root::new();
    let table: BTreeMap<&str, f64> = EXPOSURE.iter().copied().collect();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for name in unit_files().into_iter().filter(|n| n.ends_with(".service")) {
        let Some(&max) = table.get(name.as_str()) else {
            failures.push(format!("{name}: no exposure threshold in EXPOSURE (tests/tests/units.rs)"));
            continue;
        };
        let got = exposure(&root, &name);
        report.push(format!("{name}: {got:.1} (threshold {max:.1})"));
        if got > max {
            failures.push(format!("{name}: exposure {got:.1} above {max:.1}"));
        }
        // The unit's header states the same ceiling.
        let header = unit_text(&name).replace("#\n", " ").replace("\n# ", " ");
        let stated = format!("must stay <= {max:.1}");
        if !header.contains(&stated) {
            failures.push(format!("{name}: its header does not say \"{stated}\""));
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_preset_ships_every_unit_disabled() {
    let text = std::fs::read_to_string(systemd_dir().join("presets/90-holdfast.preset")).unwrap();
    let mut disabled = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (verb, unit) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        assert_eq!(verb, "disable", "the preset may only disable: {line:?}");
        disabled.push(unit.trim().to_string());
    }
    let units = unit_files();
    for u in &units {
        assert!(disabled.contains(u), "{u} is not disabled in systemd/presets/90-holdfast.preset");
    }
    for d in &disabled {
        assert!(units.contains(d), "the preset names {d}, which is not in systemd/");
    }
}

#[test]
fn sysusers_and_tmpfiles_apply_and_provide_every_unit_user() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    let sysusers = systemd_dir().join("sysusers.d/holdfast.conf");
    let out = Command::new(tool("systemd-sysusers")).arg(format!("--root={}", root.path().display())).arg(&sysusers).output().unwrap();
    assert!(out.status.success(), "systemd-sysusers: {}", String::from_utf8_lossy(&out.stderr));
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    let group = std::fs::read_to_string(root.path().join("etc/group")).unwrap();
    let users: Vec<&str> = passwd.lines().filter_map(|l| l.split(':').next()).collect();
    let groups: Vec<&str> = group.lines().filter_map(|l| l.split(':').next()).collect();
    // One user per daemon, each the only member of its group; no shared user.
    assert!(!users.contains(&"holdfast") && !groups.contains(&"holdfast"), "the shared holdfast user is back:\n{passwd}{group}");
    for line in group.lines() {
        let members = line.rsplit(':').next().unwrap_or_default();
        assert!(members.is_empty(), "no holdfast user is in another group (PrivateUsers= would hide it): {line}");
    }
    let mut unit_users = Vec::new();
    for name in unit_files() {
        let d = directives(&unit_text(&name));
        let value = |key: &str| d.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        if let Some(v) = value("User") {
            assert!(users.contains(&v.as_str()), "{name}: User={v} is not created by sysusers.d ({passwd})");
            unit_users.push((name.clone(), v));
        }
        if let Some(v) = value("Group") {
            assert!(groups.contains(&v.as_str()), "{name}: Group={v} is not created by sysusers.d ({group})");
        }
        assert!(
            value("ConfigurationDirectory").is_none() && value("ConfigurationDirectoryMode").is_none(),
            "{name}: ConfigurationDirectory= would re-mode /etc/holdfast on every start"
        );
    }
    let user_of = |unit: &str| unit_users.iter().find(|(n, _)| n == unit).map(|(_, u)| u.as_str());
    for (unit, user) in [
        ("holdfast-arbiter.service", "holdfast-arbiter"),
        ("holdfast-controller.service", "holdfast-controller"),
        ("holdfast-tailer.service", "holdfast-tailer"),
        ("holdfast-epoch-advance@.service", "holdfast-epoch"),
        ("holdfast-etcd@.service", "holdfast-etcd"),
        ("holdfast-risk-register.service", "holdfast-controller"),
    ] {
        assert_eq!(user_of(unit), Some(user), "{unit} runs as its own user");
    }
    // The defrag unit's root-role key is root's alone, handed by LoadCredential= to a user of its own.
    let defrag = directives(&unit_text("holdfast-etcd-defrag@.service"));
    assert!(defrag.contains(&("DynamicUser".into(), "yes".into())), "defrag runs as a DynamicUser=");
    assert!(defrag.iter().any(|(k, v)| k == "LoadCredential" && v == "etcd-defrag-key.pem:/etc/holdfast/tls/etcd-defrag-key.pem"));
    let tailer = directives(&unit_text("holdfast-tailer.service"));
    for want in [
        ("Group", "holdfast-audit"),
        ("StateDirectory", "holdfast/audit"),
        ("StateDirectoryMode", "0750"),
        ("UMask", "0027"),
        ("LoadCredential", "etcd-tailer-key.pem:/etc/holdfast/tls/etcd-tailer-key.pem"),
    ] {
        assert!(tailer.contains(&(want.0.into(), want.1.into())), "holdfast-tailer.service lacks {}={}", want.0, want.1);
    }
    let arbiter = directives(&unit_text("holdfast-arbiter.service"));
    assert!(arbiter.contains(&("StateDirectory".into(), "holdfast/arbiter".into())));
    assert!(arbiter.contains(&("StateDirectoryMode".into(), "0700".into())));

    let tmpfiles = systemd_dir().join("tmpfiles.d/holdfast.conf");
    let out = Command::new(tool("systemd-tmpfiles"))
        .arg(format!("--root={}", root.path().display()))
        .arg("--create")
        .arg(&tmpfiles)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-tmpfiles: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::MetadataExt;
    let id = |file: &str, name: &str| -> u32 {
        let text = if file == "passwd" { &passwd } else { &group };
        let line = text.lines().find(|l| l.starts_with(&format!("{name}:"))).unwrap_or_else(|| panic!("{name} in /etc/{file}"));
        line.split(':').nth(2).unwrap().parse().unwrap()
    };
    for (path, mode, uid, gid) in [
        ("etc/holdfast", 0o711, 0, 0),
        ("etc/holdfast/tls", 0o711, 0, 0),
        ("etc/holdfast/classes.d", 0o750, 0, id("group", "holdfast-controller")),
        ("etc/holdfast/grants.d", 0o750, 0, id("group", "holdfast-controller")),
        ("etc/holdfast/etcd", 0o750, 0, 0),
        ("var/lib/holdfast", 0o755, 0, 0),
        ("var/lib/holdfast/requests", 0o755, 0, 0),
        ("var/lib/holdfast/epochs.log", 0o644, id("passwd", "holdfast-epoch"), 0),
    ] {
        let m = std::fs::metadata(root.path().join(path)).unwrap_or_else(|e| panic!("/{path}: {e}"));
        assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (mode, uid, gid), "/{path}: (mode, uid, gid)");
    }
}

/// `holdfastctl risk-register --help` describes the timer and service that
/// ship: their names, the schedule, the command line and the user.
#[test]
fn the_risk_register_help_describes_the_shipped_timer() {
    let out = Command::new(holdfast_tests::bin("holdfastctl")).args(["risk-register", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(out.status.success(), "{help}");
    let service = directives(&unit_text("holdfast-risk-register.service"));
    let timer = directives(&unit_text("holdfast-risk-register.timer"));
    let value = |d: &[(String, String)], key: &str| d.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()).unwrap_or_default();
    let command = value(&service, "ExecStart").replace("/usr/bin/", "");
    assert_eq!(value(&timer, "OnCalendar"), "daily");
    for said in [
        "holdfast-risk-register.timer".to_string(),
        "holdfast-risk-register.service".to_string(),
        "daily".to_string(),
        format!("`{command}`"),
        format!("as user {}", value(&service, "User")),
        "systemctl enable --now holdfast-risk-register.timer".to_string(),
    ] {
        assert!(help.contains(&said), "risk-register --help does not say {said:?}:\n{help}");
    }
    assert!(!help.contains("planned"), "{help}");
}

/// Every ExecStartPre=/ExecReload= of a holdfast binary runs `check`, which
/// exists and takes the flags given; a reload validates before it signals;
/// every long-running holdfast daemon checks before it starts.
#[test]
fn exec_start_pre_and_reload_run_a_check_that_exists() {
    let mut checked = 0;
    for name in unit_files() {
        let d = directives(&unit_text(&name));
        let start = d.iter().find(|(k, _)| k == "ExecStart").map(|(_, v)| program(v)).unwrap_or_default();
        let is_daemon = d.iter().any(|(k, v)| k == "Type" && v == "notify") && start.starts_with("/usr/bin/holdfast");
        let mut pre_check = false;
        let mut reload_checked = false;
        for (k, v) in &d {
            if k != "ExecStartPre" && k != "ExecReload" {
                continue;
            }
            let prog = program(v);
            if let Some(bin) = workspace_binary(&prog) {
                let words: Vec<&str> = v.split_whitespace().collect();
                assert_eq!(words.get(1), Some(&"check"), "{name}: {k}={v} must run the `check` subcommand");
                let help = Command::new(&bin).args(["check", "--help"]).output().unwrap();
                let text = String::from_utf8_lossy(&help.stdout).into_owned();
                assert!(
                    help.status.success(),
                    "{name}: `{} check --help` failed: {}",
                    bin.display(),
                    String::from_utf8_lossy(&help.stderr)
                );
                for flag in words.iter().skip(2).filter(|w| w.starts_with("--")) {
                    let flag = flag.split('=').next().unwrap_or_default();
                    assert!(text.contains(flag), "{name}: {k} passes {flag}, which `{prog} check --help` does not list:\n{text}");
                }
                // The config it checks is the one the daemon runs with.
                if let Some(cfg) = words.windows(2).find(|w| w[0] == "--config").map(|w| w[1]) {
                    let exec_start = d.iter().find(|(k, _)| k == "ExecStart").map(|(_, v)| v.as_str()).unwrap_or_default();
                    assert!(exec_start.contains(cfg), "{name}: {k} checks {cfg}, ExecStart= runs {exec_start}");
                }
                checked += 1;
                if k == "ExecStartPre" && prog == start {
                    pre_check = true;
                }
                if k == "ExecReload" {
                    reload_checked = true;
                }
            } else if k == "ExecReload" {
                assert!(reload_checked, "{name}: ExecReload={v} signals before any check ran");
            }
        }
        if is_daemon {
            assert!(pre_check, "{name}: a holdfast daemon must run `{start} check` in ExecStartPre=");
        }
    }
    assert!(checked >= 6, "expected the arbiter, controller, tailer and provision checks; saw {checked}");
}

/// Every command line a unit runs through a holdfast binary names
/// subcommands that exist and flags they take (`... --help` lists them), so
/// a renamed flag breaks this test, not a host at boot.
#[test]
fn every_holdfast_command_line_in_a_unit_parses() {
    let mut seen = 0;
    for name in unit_files() {
        for (k, v) in directives(&unit_text(&name)) {
            if !EXEC_KEYS.contains(&k.as_str()) {
                continue;
            }
            let Some(bin) = workspace_binary(&program(&v)) else { continue };
            let words: Vec<&str> = v.split_whitespace().skip(1).collect();
            let sub: Vec<&str> = words.iter().copied().take_while(|w| !w.starts_with('-')).collect();
            let out = Command::new(&bin).args(&sub).arg("--help").output().unwrap();
            let help = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "{name}: {k}: `{} {} --help` failed: {}",
                bin.display(),
                sub.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            for flag in words.iter().filter(|w| w.starts_with("--")) {
                let flag = flag.split('=').next().unwrap_or_default();
                assert!(help.contains(flag), "{name}: {k}={v}: {flag} is not an option of `{} {}`:\n{help}", program(&v), sub.join(" "));
            }
            seen += 1;
        }
    }
    assert!(seen >= 10, "expected the daemons', provision's and holdfastctl's command lines; saw {seen}");
}
