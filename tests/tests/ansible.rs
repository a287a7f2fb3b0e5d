//! The Ansible roles and playbooks in `ansible/` (issue #18).
//!
//! - `ansible-lint --profile production` finds nothing (warnings included).
//! - `ansible-playbook --syntax-check` passes for every playbook.
//! - One user per daemon (the packages' sysusers.d): no file in ansible/
//!   names the old shared `holdfast` user or group; each file the roles and
//!   playbooks write has the owner, group and mode the packages give it
//!   (keys readable by their own daemon's group alone, the tailer's
//!   root-only for its `LoadCredential=`), and a new tailer key restarts
//!   the tailer.
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
/// as whoever runs it, and group holdfast-controller (the role's default)
/// need not exist here.
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

/// The lines of the task (or play item) named `name` in `text`: from its
/// `- name:` line to the next line indented as far or less.
fn task<'a>(text: &'a str, file: &str, name: &str) -> Vec<&'a str> {
    let head = format!("- name: {name}");
    let mut lines = text.lines().skip_while(|l| l.trim_start() != head);
    let first = lines.next().unwrap_or_else(|| panic!("{file}: no task named {name:?}"));
    let indent = first.len() - first.trim_start().len();
    let body = lines.take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent);
    std::iter::once(first).chain(body).map(str::trim).collect()
}

#[test]
fn every_file_has_its_own_daemons_group() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").map(|e| e.expect("dir entry")) {
            let path = entry.path();
            if path.is_dir() && entry.file_name() != ".ansible" {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&ansible_dir(), &mut files);
    assert!(files.len() > 20, "ansible/ should hold the roles and playbooks: {files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        for (n, line) in text.lines().enumerate() {
            let l = line.trim().trim_start_matches("- ");
            for key in ["owner:", "group:", "holdfast_classes_owner:", "holdfast_classes_group:"] {
                if let Some(v) = l.strip_prefix(key) {
                    let v = v.trim().trim_matches('"').trim_matches('\'');
                    assert_ne!(v, "holdfast", "{}:{}: the shared holdfast user is gone (one user per daemon):\n{line}", f.display(), n + 1);
                }
            }
        }
    }

    let read = |rel: &str| std::fs::read_to_string(ansible_dir().join(rel)).unwrap_or_else(|e| panic!("ansible/{rel}: {e}"));
    // The TLS files each role copies: (file, the item as written there).
    let tls = [
        ("roles/holdfast_arbiter/vars/main.yml", r#"dest: arbiter.pem, group: root, mode: "0644""#),
        ("roles/holdfast_arbiter/vars/main.yml", r#"dest: arbiter-key.pem, group: holdfast-arbiter, mode: "0640""#),
        ("roles/holdfast_arbiter/vars/main.yml", r#"dest: clients-ca.pem, group: root, mode: "0644""#),
        ("roles/holdfast_arbiter/vars/main.yml", r#"dest: etcd-ca.pem, group: root, mode: "0644""#),
        ("roles/holdfast_arbiter/vars/main.yml", r#"dest: etcd-arbiter.pem, group: root, mode: "0644""#),
        ("roles/holdfast_arbiter/vars/main.yml", r#"dest: etcd-arbiter-key.pem, group: holdfast-arbiter, mode: "0640""#),
        ("roles/holdfast_controller/vars/main.yml", r#"dest: etcd-ca.pem, group: root, mode: "0644""#),
        ("roles/holdfast_controller/vars/main.yml", r#"dest: etcd-controller.pem, group: root, mode: "0644""#),
        ("roles/holdfast_controller/vars/main.yml", r#"dest: etcd-controller-key.pem, group: holdfast-controller, mode: "0640""#),
        ("roles/holdfast_tailer/vars/main.yml", r#"dest: etcd-ca.pem, group: root, mode: "0644""#),
        ("roles/holdfast_tailer/vars/main.yml", r#"dest: etcd-tailer.pem, group: root, mode: "0644""#),
        ("roles/holdfast_tailer/vars/main.yml", r#"dest: etcd-tailer-key.pem, group: root, mode: "0600""#),
        ("roles/holdfast_etcd/vars/main.yml", "'dest': 'etcd-ca.pem', 'group': 'root', 'mode': '0644'"),
        ("roles/holdfast_etcd/vars/main.yml", "'dest': holdfast_etcd_member ~ '.pem', 'group': 'root', 'mode': '0644'"),
        ("roles/holdfast_etcd/vars/main.yml", "'dest': holdfast_etcd_member ~ '-key.pem', 'group': 'holdfast-etcd', 'mode': '0640'"),
        ("roles/holdfast_etcd/vars/main.yml", "'dest': 'etcd-defrag.pem', 'group': 'root', 'mode': '0644'"),
        ("roles/holdfast_etcd/vars/main.yml", "'dest': 'etcd-defrag-key.pem', 'group': 'root', 'mode': '0600'"),
    ];
    for (file, item) in tls {
        assert!(read(file).contains(item), "ansible/{file} should copy {item}");
    }
    // (file, task, lines it must hold).
    let tasks: &[(&str, &str, &[&str])] = &[
        (
            "roles/holdfast_arbiter/tasks/main.yml",
            "Copy the TLS material",
            &["owner: root", r#"group: "{{ item.group }}""#, r#"mode: "{{ item.mode }}""#, "notify: reload holdfast-arbiter"],
        ),
        (
            "roles/holdfast_controller/tasks/main.yml",
            "Copy the etcd client TLS material",
            &["owner: root", r#"group: "{{ item.group }}""#, r#"mode: "{{ item.mode }}""#],
        ),
        // LoadCredential= copies the key at start: a reload would not pass it on.
        (
            "roles/holdfast_tailer/tasks/main.yml",
            "Copy the etcd client TLS material",
            &["owner: root", r#"group: "{{ item.group }}""#, r#"mode: "{{ item.mode }}""#, "notify: restart holdfast-tailer"],
        ),
        ("roles/holdfast_tailer/handlers/main.yml", "Restart holdfast-tailer", &["state: restarted", "listen: restart holdfast-tailer"]),
        (
            "roles/holdfast_etcd/tasks/main.yml",
            "Copy the member's TLS material",
            &["owner: root", r#"group: "{{ item.group }}""#, r#"mode: "{{ item.mode }}""#],
        ),
        (
            "roles/holdfast_arbiter/tasks/main.yml",
            "Render arbiter.toml (validated by holdfast-arbiter check)",
            &["owner: root", "group: holdfast-arbiter", r#"mode: "0640""#],
        ),
        (
            "roles/holdfast_controller/tasks/main.yml",
            "Render controller.toml (validated by holdfast-controller check)",
            &["owner: root", "group: holdfast-controller", r#"mode: "0640""#],
        ),
        (
            "roles/holdfast_tailer/tasks/main.yml",
            "Render tailer.toml (validated by holdfast-tailer check)",
            &["owner: root", "group: holdfast-audit", r#"mode: "0640""#],
        ),
        (
            "roles/holdfast_classes/tasks/main.yml",
            "Create the policy directories",
            &[r#"owner: "{{ holdfast_classes_owner }}""#, r#"group: "{{ holdfast_classes_group }}""#, r#"mode: "0750""#],
        ),
        (
            "roles/holdfast_classes/tasks/main.yml",
            "Deploy the checked set",
            &[r#"group: "{{ holdfast_classes_group }}""#, r#"mode: "0640""#, r#"directory_mode: "0750""#],
        ),
        ("epoch-advance.yml", "Create the requests directory", &["owner: root", "group: root", r#"mode: "0755""#]),
        ("epoch-advance.yml", "Copy the request and its signatures", &["owner: root", "group: root", r#"mode: "0644""#]),
        ("force-release.yml", "Create the requests directory", &["owner: root", "group: root", r#"mode: "0755""#]),
        ("force-release.yml", "Copy the request and its signatures", &["owner: root", "group: root", r#"mode: "0644""#]),
    ];
    for (file, name, want) in tasks {
        let text = read(file);
        let got = task(&text, file, name);
        for w in *want {
            assert!(got.contains(w), "ansible/{file}, task {name:?} should hold `{w}`:\n{}", got.join("\n"));
        }
    }
    let defaults = read("roles/holdfast_classes/defaults/main.yml");
    assert!(
        defaults.lines().any(|l| l == "holdfast_classes_owner: root")
            && defaults.lines().any(|l| l == "holdfast_classes_group: holdfast-controller"),
        "the class set is root:holdfast-controller by default:\n{defaults}"
    );
}
