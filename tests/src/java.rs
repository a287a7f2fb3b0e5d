//! Running Maven on the Java client (clients/java) from the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// clients/java.
pub fn java_client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/java")
}

const INSTALL: &str =
    "the Java client's tests need a JDK 17+ and Maven 3.8+ (apt-get install openjdk-17-jdk-headless maven, or scripts/install-deps)";

fn mvn(build: &Path) -> Command {
    let mvn = holdfast_devkit::process::which("mvn").unwrap_or_else(|| panic!("mvn is not installed: {INSTALL}"));
    holdfast_devkit::process::which("javac").unwrap_or_else(|| panic!("javac is not installed: {INSTALL}"));
    let mut cmd = Command::new(mvn);
    cmd.current_dir(java_client_dir())
        .arg("-B")
        .arg(format!("-Dmaven.repo.local={}", crate::cargo_target_dir().join("m2").display()))
        .arg(format!("-Dholdfast.buildDir={}", build.display()))
        // Only the tests that ask for it reach an arbiter.
        .env_remove("HOLDFAST_CONFORMANCE");
    cmd
}

/// `mvn -B -o` in clients/java, with the local repository `target/m2` and
/// the build output in `build` (outside the source tree; one per caller,
/// as the end-to-end suites run side by side, one per etcd target). Every
/// plugin and dependency is downloaded first, under a file lock, by a build
/// that runs one unit test class in `target/java-build/warm`; the returned
/// command then runs offline. Panics when Maven or the JDK is missing, or
/// when the download fails: the Java client's tests fail then, never skip.
pub fn mvn_in_clients(build: &Path) -> Command {
    let target = crate::cargo_target_dir();
    {
        std::fs::create_dir_all(target.join("m2")).expect("create target/m2");
        let lock = std::fs::File::create(target.join("m2.lock")).expect("create target/m2.lock");
        lock.lock().expect("lock target/m2.lock");
        let mut warm = mvn(&target.join("java-build/warm"));
        warm.args(["-q", "test", "-Dtest=TokenTest"]);
        let out = crate::Ran::of(&mut warm);
        assert_eq!(out.code, 0, "{warm:?} failed:\n{out}");
        // Unlocked when `lock` drops.
    }
    let mut cmd = mvn(build);
    cmd.arg("-o");
    cmd
}

/// The outcome of every test case in surefire's XML reports under `build`
/// (`TEST-*.xml` in `surefire-reports`): test name (the method's) →
/// "passed", "failed", "error" or "skipped".
pub fn surefire_results(build: &Path) -> std::collections::BTreeMap<String, String> {
    let mut last = std::collections::BTreeMap::new();
    let dir = build.join("surefire-reports");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return last;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("TEST-") && name.ends_with(".xml")) {
            continue;
        }
        let xml = std::fs::read_to_string(entry.path()).unwrap_or_else(|e| panic!("read {}: {e}", entry.path().display()));
        for case in xml.split("<testcase ").skip(1) {
            let Some(rest) = case.split_once("name=\"").map(|(_, r)| r) else {
                continue;
            };
            let Some((test, _)) = rest.split_once('"') else {
                continue;
            };
            // A self-closed <testcase .../> passed; else its children say.
            let open = case.split_once('>').map_or("", |(head, _)| head);
            let body = if open.ends_with('/') { "" } else { case.split("</testcase>").next().unwrap_or("") };
            let outcome = if body.contains("<failure") {
                "failed"
            } else if body.contains("<error") {
                "error"
            } else if body.contains("<skipped") {
                "skipped"
            } else {
                "passed"
            };
            last.insert(test.to_string(), outcome.to_string());
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::surefire_results;

    #[test]
    fn reads_every_outcome_of_a_surefire_report() {
        let dir = tempfile::tempdir().unwrap();
        let reports = dir.path().join("surefire-reports");
        std::fs::create_dir_all(&reports).unwrap();
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="dev.holdfast.client.ConformanceTest" tests="5" errors="1" skipped="1" failures="1">
  <testcase name="closed" classname="C" time="0.1"/>
  <testcase name="withOutput" classname="C" time="0.1"><system-out><![CDATA[FENCE-MARGIN java: &lt;failure]]></system-out></testcase>
  <testcase name="failed" classname="C" time="0.1"><failure message="no" type="org.opentest4j.AssertionFailedError"/></testcase>
  <testcase name="errored" classname="C" time="0.1"><error message="boom" type="java.lang.IllegalStateException"/></testcase>
  <testcase name="skipped" classname="C" time="0"><skipped message="assumption"/></testcase>
</testsuite>"#;
        std::fs::write(reports.join("TEST-dev.holdfast.client.ConformanceTest.xml"), xml).unwrap();
        std::fs::write(reports.join("dev.holdfast.client.ConformanceTest.txt"), "<testcase name=\"ignored\"/>").unwrap();
        let got = surefire_results(dir.path());
        let want: Vec<(String, String)> =
            [("closed", "passed"), ("errored", "error"), ("failed", "failed"), ("skipped", "skipped"), ("withOutput", "passed")]
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .to_vec();
        assert_eq!(got.into_iter().collect::<Vec<_>>(), want);
    }
}
