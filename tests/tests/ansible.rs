//! The Ansible roles and playbooks in `ansible/` (issue #18).
//!
//! - `ansible-lint --profile production` finds nothing (warnings included).
//! - `ansible-playbook --syntax-check` passes for every playbook.
//! - `classes.yml`, run for real against localhost (`ansible_connection=local`)
//!   with the policy directory in a temp dir and the workspace's
//!   `holdfastctl`: a good class set is deployed byte for byte; a set with one
//!   bad class fails the play and leaves the policy directory byte-identical.
//!
//! The tools come from the pinned venv scripts/install-deps creates
//! ([`ANSIBLE_VENV`]); missing, the tests fail naming install-deps.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use holdfast_tests::{TestDir, bin};

/// ansible-core 2.19.14 and ansible-lint 26.10.1, pinned by scripts/install-deps.
const ANSIBLE_VENV: &str = "/opt/holdfast/ansible-2.19.14-lint-26.10.1/bin";

/// Every playbook in ansible/; a new one must be added here (and is then checked).
const PLAYBOOKS: &[&str] =
    &["site.yml", "rolling-restart.yml", "defrag.yml", "classes.yml", "force-release.yml", "epoch-advance.yml", "upgrade.yml"];

fn ansible_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("ansible")
}

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("config")
}

/// A command from the venv, run in ansible/ (so ansible.cfg applies) with the
/// venv first on PATH (ansible-lint warns otherwise) and no colour.
fn venv_tool(name: &str) -> Command {
    let venv = Path::new(ANSIBLE_VENV);
    let exe = venv.join(name);
    assert!(
        exe.is_file(),
        "{} is missing: run scripts/install-deps (it installs ansible-core and ansible-lint into {ANSIBLE_VENV})",
        exe.display()
    );
    let path = format!("{ANSIBLE_VENV}:{}", std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(exe);
    cmd.current_dir(ansible_dir())
        .env("PATH", path)
        .env("ANSIBLE_NOCOLOR", "1")
        .env("NO_COLOR", "1")
        .env("ANSIBLE_FORCE_COLOR", "0")
        .env("ANSIBLE_CONFIG", ansible_dir().join("ansible.cfg"));
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn ansible_lint_production_profile_is_clean() {
    let mut cmd = venv_tool("ansible-lint");
    // --offline: no schema refresh or collection install from the network.
    cmd.args(["--offline", "--profile", "production", "--strict", "--nocolor"]);
    let out = run(cmd);
    let all = text(&out);
    println!("{all}");
    assert!(out.status.success(), "ansible-lint --profile production failed:\n{all}");
    assert!(
        all.contains("0 failure(s), 0 warning(s)") && all.contains("Profile 'production' was required, and it passed"),
        "ansible-lint did not report a clean production profile:\n{all}"
    );
    let cfg = std::fs::read_to_string(ansible_dir().join(".ansible-lint")).expect("ansible/.ansible-lint");
    assert!(cfg.lines().any(|l| l.trim() == "profile: production"), "ansible/.ansible-lint must set profile: production");
    assert!(!cfg.lines().any(|l| l.trim_start().starts_with("skip_list")), "ansible/.ansible-lint skips rules:\n{cfg}");
}

#[test]
fn every_playbook_passes_syntax_check() {
    // Every top-level .yml in ansible/ is a playbook and is listed above.
    let mut found: Vec<String> = std::fs::read_dir(ansible_dir())
        .expect("ansible/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yml"))
        .collect();
    found.sort();
    let mut listed: Vec<String> = PLAYBOOKS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "the playbooks in ansible/ and PLAYBOOKS differ");
    for playbook in PLAYBOOKS {
        let mut cmd = venv_tool("ansible-playbook");
        cmd.args(["--syntax-check", "-i", "inventory/example.yml", playbook]);
        let out = run(cmd);
        assert!(out.status.success(), "ansible-playbook --syntax-check {playbook} failed:\n{}", text(&out));
    }
}

/// Every file under `dir`: relative path -> (mode, bytes). Directories too
/// (with no bytes), so a created or removed directory counts as a change.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Option<Vec<u8>>)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (u32, Option<Vec<u8>>)>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("dir entry")) {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("metadata");
            let rel = path.strip_prefix(root).expect("under root").to_path_buf();
            let mode = meta.permissions().mode();
            if meta.is_dir() {
                out.insert(rel, (mode, None));
                walk(root, &path, out);
            } else {
                out.insert(rel, (mode, Some(std::fs::read(&path).expect("read"))));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read_dir").map(|e| e.expect("dir entry")) {
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).expect("copy");
        }
    }
}

/// Runs classes.yml against localhost with the class set in `src`, deploying
/// into `policy`. Owner and group are left as they are (null): the test runs
/// as whoever runs it, and group holdfast need not exist here.
fn run_classes(work: &Path, src: &Path, policy: &Path) -> Output {
    let python = Path::new(ANSIBLE_VENV).join("python3");
    let inventory = work.join("inventory.yml");
    std::fs::write(
        &inventory,
        format!(
            "all:\n  children:\n    holdfast_controller:\n      hosts:\n        localhost:\n          ansible_connection: local\n          ansible_python_interpreter: {}\n",
            python.display()
        ),
    )
    .expect("write inventory");
    let vars = serde_json::json!({
        "holdfast_classes_src_dir": src,
        "holdfast_classes_policy_dir": policy,
        "holdfast_classes_staging_dir": work.join("staging"),
        "holdfast_classes_holdfastctl": bin("holdfastctl"),
        "holdfast_classes_owner": null,
        "holdfast_classes_group": null,
        "holdfast_classes_reload": false,
    });
    let vars_file = work.join("vars.json");
    std::fs::write(&vars_file, vars.to_string()).expect("write vars");
    let mut cmd = venv_tool("ansible-playbook");
    cmd.arg("-i")
        .arg(&inventory)
        .arg("-e")
        .arg(format!("@{}", vars_file.display()))
        .arg("classes.yml")
        .env("ANSIBLE_BECOME", "false")
        .env("ANSIBLE_LOCAL_TEMP", work.join("ansible-tmp"))
        .env("ANSIBLE_REMOTE_TEMP", work.join("ansible-tmp"));
    // classes.yml says become: true; as root that is a no-op, otherwise it
    // would ask sudo. Run it without privilege escalation when not root.
    if !nix::unistd::Uid::effective().is_root() {
        cmd.arg("-e").arg("ansible_become=false");
    }
    let out = run(cmd);
    println!("{}", text(&out));
    out
}

#[test]
fn classes_yml_refuses_a_bad_class_set_and_changes_nothing() {
    let dir = TestDir::new("ansible-classes");
    let policy = dir.path.join("etc-holdfast");
    std::fs::create_dir_all(&policy).expect("policy dir");
    // Something else in the policy directory must survive untouched.
    std::fs::write(policy.join("controller.toml"), "# not ours\n").expect("write");

    // A good set: config/classes.d and config/grants.d.
    let good = dir.path.join("good");
    copy_dir(&config_dir().join("classes.d"), &good.join("classes.d"));
    copy_dir(&config_dir().join("grants.d"), &good.join("grants.d"));
    let out = run_classes(&dir.path, &good, &policy);
    assert!(out.status.success(), "classes.yml failed on the good set:\n{}", text(&out));
    for sub in ["classes.d", "grants.d"] {
        let want = snapshot(&good.join(sub));
        let got = snapshot(&policy.join(sub));
        let names = |m: &BTreeMap<PathBuf, (u32, Option<Vec<u8>>)>| m.keys().cloned().collect::<Vec<_>>();
        assert_eq!(names(&got), names(&want), "{sub}: deployed files differ from the source");
        for (name, (mode, bytes)) in &got {
            assert_eq!(bytes, &want[name].1, "{sub}/{}: deployed bytes differ", name.display());
            assert_eq!(mode & 0o777, 0o640, "{sub}/{}: mode {:o}", name.display(), mode & 0o777);
        }
    }
    let before = snapshot(&policy);

    // A bad set: the same, plus one class holdfastctl class check refuses,
    // and one good file dropped (which a deploy would remove).
    let bad = dir.path.join("bad");
    copy_dir(&good, &bad);
    std::fs::write(
        bad.join("classes.d").join("broken.toml"),
        "[class.broken]\nnamespace = \"broken\"\npurpose = \"correctness\"\nenforcement = \"sometimes\"\nttl = \"1s\"\ntier = \"entity\"\n",
    )
    .expect("write broken class");
    std::fs::remove_file(bad.join("grants.d").join("dev.toml")).expect("remove grant");
    let out = run_classes(&dir.path, &bad, &policy);
    let all = text(&out);
    assert!(!out.status.success(), "classes.yml accepted a bad class set:\n{all}");
    assert!(
        all.contains("holdfastctl class check refused the class set") && all.contains("broken.toml"),
        "the failure does not come from holdfastctl class check naming the bad file:\n{all}"
    );
    assert!(snapshot(&policy) == before, "classes.yml changed {} although the class set was refused", policy.display());
}
