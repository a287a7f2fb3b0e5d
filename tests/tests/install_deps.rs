//! `scripts/install-deps` decides "missing" exactly: the libclang that
//! bindgen needs is not satisfied by `libclang-cpp14`, which a fresh Debian
//! 12 machine may have without `libclang-dev` (the first-run failure of
//! `scripts/dev`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-deps")
}

/// What `install-deps --print-missing` would install with the libclang probe
/// looking under `root`.
fn missing_with_root(root: &Path) -> Vec<String> {
    let out = Command::new("bash").arg(script()).arg("--print-missing").env("HOLDFAST_PROBE_ROOT", root).output().unwrap();
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
    let missing = String::from_utf8_lossy(&out.stdout).lines().any(|l| l == "libclang-dev");
    assert_eq!(missing, !installed, "probe says missing={missing}, dpkg says installed={installed}");
}
