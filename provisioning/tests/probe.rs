//! fsync probe on a real file system (a temp dir), and its 2 ms gate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bin, node_config};
use holdfast_provision::ProvisionError;
use holdfast_provision::config::ProbeConfig;
use holdfast_provision::probe;

fn cfg(max_p99: Duration) -> ProbeConfig {
    ProbeConfig { max_p99, samples: 300, write_size: 2300 }
}

#[test]
fn probe_reports_fdatasync_figures_on_a_real_file_system() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut calls = 0;
    let r = probe::measure(dir.path(), &cfg(Duration::from_millis(2)), |_, _| calls += 1).expect("measure");
    assert_eq!((r.samples, r.write_size), (300, 2300));
    assert!(r.p50_us > 0, "fdatasync takes time: {r:?}");
    assert!(r.p50_us <= r.p99_us && r.p99_us <= r.max_us, "{r:?}");
    assert_eq!(r.max_p99_us, 2000);
    assert!(calls >= 10, "progress is reported");
    assert!(!dir.path().join(probe::SCRATCH).exists(), "scratch file removed");
}

#[test]
fn probe_gate_refuses_readiness_when_p99_exceeds_the_threshold_unless_overridden() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A threshold no disk meets: refused, with the figures and the way out.
    let r = probe::measure(dir.path(), &cfg(Duration::from_nanos(1)), |_, _| {}).expect("measure");
    assert!(!r.within_threshold);
    let err = probe::gate(r.clone(), false).expect_err("must refuse");
    assert!(matches!(err, ProvisionError::SlowDisk { .. }));
    assert!(err.to_string().contains("--accept-slow-disk"), "{err}");
    let over = probe::gate(r, true).expect("override");
    assert!(over.ready && over.overridden);
    // A threshold every disk meets: ready.
    let r = probe::measure(dir.path(), &cfg(Duration::from_secs(10)), |_, _| {}).expect("measure");
    let ok = probe::gate(r, false).expect("ready");
    assert!(ok.ready && !ok.overridden);
}

#[test]
fn percentile_is_nearest_rank() {
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(probe::percentile(&v, 50.0), 50);
    assert_eq!(probe::percentile(&v, 99.0), 99);
    assert_eq!(probe::percentile(&[7], 99.0), 7);
    assert_eq!(probe::percentile(&[], 99.0), 0);
}

#[test]
fn probe_command_records_the_verdict_and_exits_65_when_too_slow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = node_config(
        dir.path(),
        std::path::Path::new("/dev/null"),
        &[("http://127.0.0.1:1".into(), "hall-a"), ("http://127.0.0.1:2".into(), "hall-b")],
        1,
    );
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data dir");

    let out =
        Command::new(bin()).args(["probe", "--max-p99", "1ns", "--dir"]).arg(&data).arg("--config").arg(&config).output().expect("run");
    assert_eq!(out.status.code(), Some(65), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("p50") && stderr.contains("p99"), "figures printed: {stderr}");
    let rec = probe::last(&dir.path().join("state")).expect("verdict recorded");
    assert!(!rec.ready);

    let v = common::run_ok_json(
        Command::new(bin()).args(["probe", "--json", "--max-p99", "10s", "--dir"]).arg(&data).arg("--config").arg(&config),
    );
    assert_eq!(v["report"]["ready"], true);
    assert!(v["report"]["p99_us"].as_u64().is_some());
    assert!(probe::last(&dir.path().join("state")).expect("recorded").ready);

    // --dry-run measures but records nothing.
    let out = Command::new(bin())
        .args(["probe", "--dry-run", "--max-p99", "1ns", "--dir"])
        .arg(&data)
        .arg("--config")
        .arg(&config)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(65));
    assert!(probe::last(&dir.path().join("state")).expect("still the old verdict").ready);
}
