//! `holdfast-controller check`: the config file, then the class set in its
//! `policy_dir`, validated by the same function the controller runs before
//! it publishes. Output like `holdfastctl class check`.

use holdfast_config::ControllerConfig;
use holdfast_policy::{Checks, Date, PauseTests, Report, Sources};
use holdfast_store::Etcd;
use std::path::Path;
use std::time::Duration;

/// Exit statuses (as holdfastctl's): valid.
pub const OK: u8 = 0;
/// The class set has problems (EX_DATAERR).
pub const INVALID: u8 = 65;
/// The config file is wrong, or the policy directory cannot be read (EX_CONFIG).
pub const CONFIG: u8 = 78;

/// Runs the check and returns the exit status. `offline`: do not read the
/// pause-test results from etcd (the fenced rule is reported NOT checked).
pub async fn run(config_path: &Path, offline: bool) -> u8 {
    let config = match ControllerConfig::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-controller: {e}");
            return CONFIG;
        }
    };
    println!("{}: ok", config_path.display());
    let dir = config.policy_dir.display().to_string();
    let sources = match Sources::read(&config.policy_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfast-controller: policy_dir: {e}");
            return CONFIG;
        }
    };
    let pause_tests = if offline {
        PauseTests::NotAvailable { reason: "--offline; without it the results under /sys/pausetest/ are read from [etcd]".into() }
    } else {
        pause_tests(&config).await
    };
    let report = holdfast_policy::validate(&sources, &Checks { today: Date::today_utc(), pause_tests });
    print_text(&dir, &report);
    if report.is_valid() { OK } else { INVALID }
}

async fn pause_tests(config: &ControllerConfig) -> PauseTests {
    let endpoints = config.etcd.endpoints.join(",");
    let read = async {
        let etcd = Etcd::connect(&config.etcd).await.map_err(|e| format!("{e:#}"))?;
        holdfast_store::policy::read_pause_tests(&etcd).await.map_err(|e| format!("reading /sys/pausetest/: {e}"))
    };
    match tokio::time::timeout(Duration::from_secs(10), read).await {
        Ok(Ok((records, bad))) => {
            for b in bad {
                eprintln!("holdfast-controller: ignoring a pause-test result: {b}");
            }
            PauseTests::Read { records, now_unix_ms: crate::now_unix_ms() }
        }
        Ok(Err(e)) => not_reachable(&endpoints, &e),
        Err(_) => not_reachable(&endpoints, "no answer within 10s"),
    }
}

fn not_reachable(endpoints: &str, why: &str) -> PauseTests {
    PauseTests::NotAvailable {
        reason: format!(
            "etcd at {endpoints} could not be read ({why}); the controller will not publish a fenced class until it can check it"
        ),
    }
}

fn print_text(dir: &str, r: &Report) {
    print!("{}", r.to_text(dir, "run `holdfast-controller check` again (the controller refuses this set and keeps the last good one)"));
}
