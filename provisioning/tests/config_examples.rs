//! Every example file in config/ that belongs to the provisioning agent parses,
//! and bad configs fail naming the key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use std::path::{Path, PathBuf};

use holdfast_provision::config::ProvisionConfig;
use holdfast_provision::plan::Inventory;

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config")
}

#[test]
fn every_provisioning_example_in_config_parses() {
    let mut seen = 0;
    for entry in std::fs::read_dir(config_dir()).expect("config/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if name == "provision.toml" {
            ProvisionConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
        } else if name.starts_with("inventory-") && name.ends_with(".toml") {
            Inventory::load(&path).unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
        }
    }
    assert!(seen >= 4, "provision.toml and the inventories: saw {seen}");
}

fn example() -> String {
    std::fs::read_to_string(config_dir().join("provision.toml")).expect("example")
}

#[test]
fn unknown_or_renamed_keys_are_refused_by_name() {
    let text = example().replace("mapper_name =", "mapper =");
    let err = ProvisionConfig::parse(&text, Path::new("provision.toml")).expect_err("unknown key");
    assert!(err.to_string().contains("mapper"), "{err}");
    let inv = "bogus = 1\nhosts = []\nclusters = []\n";
    let err = Inventory::parse(inv, Path::new("inv.toml")).expect_err("unknown key");
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn every_problem_is_reported_in_one_pass() {
    let text = example()
        .replace("threshold = 1", "threshold = 5")
        .replace("io_priority = 0", "io_priority = 9")
        .replace("data_dir = \"/var/lib/holdfast-etcd/etcd-a1\"", "data_dir = \"/srv/etcd\"");
    let err = ProvisionConfig::parse(&text, Path::new("provision.toml")).expect_err("invalid").to_string();
    for key in ["tang.threshold", "tune.io_priority", "disk.data_dir"] {
        assert!(err.contains(key), "{key} missing from:\n{err}");
    }
}

#[test]
fn tang_servers_must_span_two_halls() {
    let text = example().replace("hall = \"hall-b\"\n# Pin", "hall = \"hall-a\"\n# Pin");
    let err = ProvisionConfig::parse(&text, Path::new("provision.toml")).expect_err("one hall").to_string();
    assert!(err.contains("at least two halls"), "{err}");
}
