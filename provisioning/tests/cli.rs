//! Every subcommand teaches through --help and takes --dry-run and --json.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

mod common;

use std::process::Command;

use common::bin;

#[test]
fn every_subcommand_has_help_with_dry_run_and_json() {
    for sub in ["check", "disk", "unlock", "probe", "tune", "plan", "status"] {
        let out = Command::new(bin()).args([sub, "--help"]).output().expect("run");
        assert!(out.status.success(), "{sub} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--dry-run") && help.contains("--json"), "{sub}:\n{help}");
        assert!(help.lines().count() > 15, "{sub} --help should explain itself:\n{help}");
    }
    let out = Command::new(bin()).arg("--help").output().expect("run");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Exit status") && help.contains("First boot"), "{help}");
}

#[test]
fn check_refuses_a_bad_config_with_exit_78_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("provision.toml");
    std::fs::write(&path, "host = \"x\"\nhall = \"y\"\nhostname = \"z\"\n").expect("write");
    let out = Command::new(bin()).args(["check", "--config"]).arg(&path).output().expect("run");
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hostname"));
    let out = Command::new(bin()).args(["check", "--config"]).arg(dir.path().join("missing.toml")).output().expect("run");
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
}

#[test]
fn status_reports_without_changing_anything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = common::node_config(
        dir.path(),
        std::path::Path::new("/nonexistent-holdfast-device"),
        &[("http://127.0.0.1:1".into(), "hall-a"), ("http://127.0.0.1:2".into(), "hall-b")],
        1,
    );
    let v = common::run_ok_json(Command::new(bin()).args(["status", "--json", "--config"]).arg(&config));
    assert_eq!(v["unlocked"], false);
    assert!(v["device_error"].as_str().expect("error").contains("does not exist"));
    assert!(!dir.path().join("state").exists());
}
