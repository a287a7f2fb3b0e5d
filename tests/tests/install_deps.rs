//! `scripts/install-deps` decides "missing" exactly: the libclang that
//! bindgen needs is not satisfied by `libclang-cpp14`, which a fresh Debian
//! 12 machine may have without `libclang-dev` (the first-run failure of
//! `scripts/dev`); and `--dev` (what `scripts/dev` runs) installs only what
//! the dev appliance needs.

use holdfast_tests::pinned_etcd;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-deps")
}

/// What `install-deps --print-missing` would install with the libclang probe
/// looking under `root`.
fn missing_with_root(root: &Path) -> Vec<String> {
    missing_in(root, &[])
}

/// What `install-deps --print-missing ARGS` would install and build with
/// every probe looking under `root`.
fn missing_in(root: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new("bash").arg(script()).arg("--print-missing").args(args).env("HOLDFAST_PROBE_ROOT", root).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

fn touch(root: &Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"").unwrap();
}

#[test]
fn libclang_cpp_alone_does_not_count_as_libclang() {
    let root = tempfile::tempdir().unwrap();
    // What libclang-cpp14 and libllvm14 put on a fresh Debian 12 machine.
    touch(root.path(), "usr/lib/llvm-14/lib/libclang-cpp.so.14");
    touch(root.path(), "usr/lib/x86_64-linux-gnu/libclang-cpp.so.14");
    touch(root.path(), "usr/lib/llvm-14/lib/libLLVM-14.so");
    assert!(missing_with_root(root.path()).contains(&"libclang-dev".to_string()));
}

#[test]
fn libclang_without_resource_headers_does_not_count() {
    let root = tempfile::tempdir().unwrap();
    touch(root.path(), "usr/lib/llvm-14/lib/libclang.so");
    assert!(missing_with_root(root.path()).contains(&"libclang-dev".to_string()));
}

#[test]
fn what_libclang_dev_installs_counts_as_libclang() {
    let root = tempfile::tempdir().unwrap();
    touch(root.path(), "usr/lib/llvm-14/lib/libclang.so");
    touch(root.path(), "usr/lib/llvm-14/lib/clang/14.0.6/include/stddef.h");
    assert!(!missing_with_root(root.path()).contains(&"libclang-dev".to_string()));
}

/// On this machine (after install-deps ran), the real probe agrees with dpkg.
#[test]
fn the_real_probe_agrees_with_dpkg() {
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "libclang-dev"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false);
    let out = Command::new("bash").arg(script()).arg("--print-missing").env_remove("HOLDFAST_PROBE_ROOT").output().unwrap();
    assert!(out.status.success(), "install-deps --print-missing failed: {}", String::from_utf8_lossy(&out.stderr));
    let missing = String::from_utf8_lossy(&out.stdout).lines().any(|l| l == "libclang-dev");
    assert_eq!(missing, !installed, "probe says missing={missing}, dpkg says installed={installed}");
}

fn executable(root: &Path, rel: &str) {
    use std::os::unix::fs::PermissionsExt;
    touch(root, rel);
    std::fs::set_permissions(root.join(rel), std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Whether install-deps will find Go (it builds etcd 3.6 with it).
fn have_go() -> bool {
    Command::new("bash").args(["-c", "command -v go"]).status().map(|s| s.success()).unwrap_or(false)
}

/// The etcd the tests run (install-deps' build, linked from /usr/local/bin)
/// is the version packaging/etcd/go.mod pins, the one holdfast-etcd ships.
#[test]
fn the_tests_etcd_is_the_pinned_version() {
    assert!(have_go(), "no Go toolchain: install-deps cannot build the pinned etcd (install Go, then run scripts/install-deps)");
    let pinned = pinned_etcd();
    for (bin, args, prefix) in
        [("etcd", "--version", "etcd Version: "), ("etcdctl", "version", "etcdctl version: "), ("etcdutl", "version", "etcdutl version: ")]
    {
        let out = Command::new(format!("/usr/local/bin/{bin}"))
            .arg(args)
            .output()
            .unwrap_or_else(|e| panic!("/usr/local/bin/{bin}: {e}: run scripts/install-deps"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines().any(|l| l == format!("{prefix}{}", pinned.trim_start_matches('v'))),
            "/usr/local/bin/{bin} is not {pinned}:\n{text}"
        );
    }
}

/// `scripts/dev` runs `install-deps --dev`: on a machine with nothing, the
/// build's tools and etcd, and nothing the tests alone need (no gate tools,
/// no PostgreSQL, no packaging tools, no versitygw, grpcurl or ansible).
#[test]
fn dev_mode_installs_only_what_the_dev_appliance_needs() {
    let root = tempfile::tempdir().unwrap();
    let mut want: Vec<String> = ["protobuf-compiler", "libprotobuf-dev", "build-essential", "pkg-config"].map(String::from).to_vec();
    if have_go() {
        want.push("build: etcd".into());
    } else {
        want.extend(["etcd-server".into(), "etcd-client".into()]);
    }
    assert_eq!(missing_in(root.path(), &["--dev"]), want);
    // The full run wants all of that and the tests' own tools besides.
    let full = missing_in(root.path(), &[]);
    for w in &want {
        assert!(full.contains(w), "the full install lacks {w}: {full:?}");
    }
    for w in ["etcd-server", "postgresql", "iptables", "debootstrap", "build: ansible", "build: cargo-deb"] {
        assert!(full.contains(&w.to_string()), "the full install lacks {w}: {full:?}");
    }
}

/// The link install-deps makes from /usr/local/bin/etcd, under `root`.
fn link_etcd(root: &Path, version: &str) {
    let link = root.join("usr/local/bin/etcd");
    let _ = std::fs::remove_file(&link);
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(format!("/opt/holdfast/etcd-{version}/etcd"), link).unwrap();
}

/// With the files those packages install, `--dev` wants nothing.
#[test]
fn dev_mode_is_satisfied_by_the_exact_files() {
    let root = tempfile::tempdir().unwrap();
    let pinned = pinned_etcd();
    for f in ["usr/bin/protoc", "usr/bin/cc", "usr/bin/pkg-config", "usr/bin/etcd", "usr/bin/etcdctl"] {
        executable(root.path(), f);
    }
    for b in ["etcd", "etcdctl", "etcdutl"] {
        executable(root.path(), &format!("opt/holdfast/etcd-{pinned}/{b}"));
    }
    touch(root.path(), "usr/include/google/protobuf/descriptor.proto");
    let wants_etcd = |root: &Path| missing_in(root, &["--dev"]).contains(&"build: etcd".to_string());
    if have_go() {
        assert!(wants_etcd(root.path()), "the pinned binaries without the link /usr/local/bin/etcd are not installed");
        // Another etcd linked from /usr/local/bin is not the pinned one.
        link_etcd(root.path(), "v3.6.16");
        assert!(wants_etcd(root.path()), "an etcd of another version counts as missing");
        link_etcd(root.path(), &pinned);
        std::fs::remove_file(root.path().join(format!("opt/holdfast/etcd-{pinned}/etcdutl"))).unwrap();
        assert!(wants_etcd(root.path()), "etcdutl is part of it");
        executable(root.path(), &format!("opt/holdfast/etcd-{pinned}/etcdutl"));
    }
    assert_eq!(missing_in(root.path(), &["--dev"]), Vec::<String>::new());
    // A header without protoc (another package's) is not the compiler.
    std::fs::remove_file(root.path().join("usr/bin/protoc")).unwrap();
    assert_eq!(missing_in(root.path(), &["--dev"]), vec!["protobuf-compiler".to_string()]);
}

/// ssh (the fleet test's Ansible connection) and ssh-keygen (the approvals'
/// signatures) come from openssh-client; both files count, not either.
#[test]
fn openssh_client_is_wanted_until_ssh_and_ssh_keygen_are_both_there() {
    let root = tempfile::tempdir().unwrap();
    let wants = |root: &Path| missing_in(root, &[]).contains(&"openssh-client".to_string());
    assert!(wants(root.path()));
    executable(root.path(), "usr/bin/ssh-keygen");
    assert!(wants(root.path()), "ssh-keygen alone is not the ssh client");
    executable(root.path(), "usr/bin/ssh");
    assert!(!wants(root.path()));
    assert!(!missing_in(root.path(), &["--dev"]).contains(&"openssh-client".to_string()), "the dev appliance needs no ssh");
}

/// A copy of the script a user other than root can read and run.
/// (with packaging/etcd, which it reads the pinned etcd version from).
fn script_copy(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let copy = dir.join("scripts/install-deps");
    let etcd = dir.join("packaging/etcd");
    for d in [copy.parent().unwrap(), etcd.as_path()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(script(), &copy).unwrap();
    for f in ["build", "go.mod", "go.sum"] {
        std::fs::copy(repo.join("packaging/etcd").join(f), etcd.join(f)).unwrap();
    }
    for p in [dir, &dir.join("scripts"), &dir.join("packaging"), etcd.as_path(), copy.as_path(), &etcd.join("build")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for f in ["go.mod", "go.sum"] {
        std::fs::set_permissions(etcd.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    copy
}

/// Not root and no sudo: it says what to do and installs nothing (it
/// stops before apt and before any build). Run as user nobody.
#[test]
fn without_root_or_sudo_it_says_so_and_installs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let copy = script_copy(dir.path());
    let empty = dir.path().join("root");
    std::fs::create_dir(&empty).unwrap();
    // A PATH with `id` and nothing else: no sudo, whatever this machine has.
    let path = dir.path().join("path");
    std::fs::create_dir(&path).unwrap();
    std::os::unix::fs::symlink("/usr/bin/id", path.join("id")).unwrap();
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/bin/bash"])
        .arg(&copy)
        .arg("--dev")
        .env("HOLDFAST_PROBE_ROOT", &empty)
        .env("PATH", &path)
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not root, and no sudo") && stderr.contains("nothing was installed"), "{stderr}");
    assert!(!stderr.contains("apt packages:"), "{stderr}");
}

/// A Go too old for etcd 3.6 is refused up front, before apt or any build,
/// with what to do; it is not asked when nothing needs building with Go.
#[test]
fn a_go_older_than_etcd_needs_is_refused_before_anything_is_installed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let go = bin.join("go");
    std::fs::write(&go, "#!/bin/sh\n[ \"$1 $2\" = \"env GOVERSION\" ] && echo go1.22.12\n").unwrap();
    std::fs::set_permissions(&go, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |root: &Path| {
        Command::new("bash")
            .arg(script())
            .arg("--dev")
            .env("HOLDFAST_PROBE_ROOT", root)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .output()
            .unwrap()
    };
    // Everything missing, etcd among it: refused.
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let out = run(&root);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let go_mod = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/etcd/go.mod")).unwrap();
    let need = go_mod.lines().find_map(|l| l.strip_prefix("go ")).expect("go.mod's go line");
    assert!(
        stderr.contains(&format!("Go 1.22.12 is too old to build etcd {}", pinned_etcd()))
            && stderr.contains(&format!("needs Go {need} or newer"))
            && stderr.contains("nothing was installed"),
        "{stderr}"
    );
    assert!(!stderr.contains("apt packages:") && !stderr.contains("building etcd"), "{stderr}");
}
