//! One round of the active controller: read the policy directory and the
//! pause-test results, validate, and publish the set if it is valid and
//! differs from the published one — or refuse it, keeping the last good set.

use crate::metrics::METRICS;
use holdfast_model::layout::PauseTestRecord;
use holdfast_policy::{Checks, CompiledSet, Date, PauseTests, Sources};
use holdfast_store::Etcd;
use holdfast_store::policy::{self, Leadership, PolicyStatus, PublishedPolicy, Refusal, RefusedProblem, Stored, WriteOutcome};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// How a round ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The set was published as this version.
    Published { version: u64, hash: String },
    /// The directory's set is the published one; nothing to do.
    Current { version: u64, hash: String },
    /// The directory's set was refused; `version` (0: none) stays in force.
    Refused { version: u64, problems: usize },
    /// The leader key is gone: this controller must stop and campaign again.
    NotLeader,
    /// `/sys/policy` changed between the read and the write: read again.
    Raced,
}

/// The directory's set, or every reason it cannot be published.
pub fn evaluate(dir: &Path, records: Vec<PauseTestRecord>, now_unix_ms: u64) -> Result<CompiledSet, Vec<RefusedProblem>> {
    let sources = match Sources::read(dir) {
        Ok(s) => s,
        Err(e) => {
            return Err(vec![RefusedProblem {
                file: dir.display().to_string(),
                line: 0,
                rule: "unreadable".into(),
                message: e.to_string(),
            }]);
        }
    };
    let checks = Checks { today: Date::today_utc(), pause_tests: PauseTests::Read { records, now_unix_ms } };
    let report = holdfast_policy::validate(&sources, &checks);
    if let Some(set) = report.publishable() {
        return Ok(set.clone());
    }
    let mut problems: Vec<RefusedProblem> = report.problems.iter().map(RefusedProblem::from).collect();
    problems.extend(report.unchecked.iter().map(|p| RefusedProblem { rule: "not-checked".into(), ..RefusedProblem::from(p) }));
    Err(problems)
}

/// The classes of `set` declared fenced but demoted, with why.
fn demoted(set: &CompiledSet) -> Vec<(&str, &str)> {
    set.classes
        .values()
        .filter_map(|c| match &c.enforcement {
            holdfast_policy::Enforcement::Demoted { reason, .. } => Some((c.name.as_str(), reason.as_str())),
            _ => None,
        })
        .collect()
}

/// The active controller's state across rounds.
pub struct Publisher {
    dir: PathBuf,
    identity: String,
    /// The problems last logged and counted, so an unchanged bad directory is
    /// reported once, not every round (SIGHUP reports it again).
    last_refused: Option<Vec<RefusedProblem>>,
    bad_records_logged: HashSet<String>,
}

impl Publisher {
    pub fn new(dir: PathBuf, identity: String) -> Self {
        Publisher { dir, identity, last_refused: None, bad_records_logged: HashSet::new() }
    }

    /// Forgets what was reported (on stepping down: a new term reports afresh).
    pub fn reset(&mut self) {
        self.last_refused = None;
        METRICS.set_demoted_classes(0);
    }

    /// One round as leader. `forced`: a SIGHUP asked for it (a refusal is
    /// reported again even if unchanged).
    pub async fn round(&mut self, etcd: &Etcd, leader: &Leadership, forced: bool) -> anyhow::Result<Outcome> {
        let Some(view) = policy::read_as_leader(etcd, leader).await? else {
            return Ok(Outcome::NotLeader);
        };
        for bad in view.bad_pause_tests {
            if self.bad_records_logged.insert(bad.clone()) {
                tracing::warn!("ignoring a pause-test result: {bad}");
            }
        }
        if let Stored::Malformed { error, .. } = &view.published {
            tracing::error!("{error}; the next valid set replaces it");
        }
        let (version, hash) = match view.published.doc() {
            Some(p) => (p.version, Some(p.hash.clone())),
            None => (0, None),
        };
        METRICS.set_published_version(version);
        METRICS.set_demoted_classes(view.published.doc().map_or(0, |p| demoted(&p.set).len()));
        let now = crate::now_unix_ms();
        match evaluate(&self.dir, view.pause_tests, now) {
            Ok(set) if hash.as_deref() == Some(set.hash.as_str()) => {
                if self.last_refused.take().is_some() {
                    tracing::info!(version, hash = %set.hash, "the policy directory is valid again and equals the published set");
                }
                let stale = view
                    .status
                    .doc()
                    .is_none_or(|s| s.version != version || s.hash.as_deref() != Some(set.hash.as_str()) || s.last_refusal.is_some());
                if stale {
                    let status = self.status(version, Some(set.hash.clone()), None);
                    if policy::write_status(etcd, leader, &status).await? == WriteOutcome::NotLeader {
                        return Ok(Outcome::NotLeader);
                    }
                }
                Ok(Outcome::Current { version, hash: set.hash })
            }
            Ok(set) => {
                let next = view.published.next_version();
                let doc = PublishedPolicy {
                    version: next,
                    hash: set.hash.clone(),
                    source_commit: crate::source::head_commit(&self.dir),
                    published_unix_ms: now,
                    published_by: self.identity.clone(),
                    set,
                };
                let status = self.status(next, Some(doc.hash.clone()), None);
                match policy::publish(etcd, leader, view.published.mod_revision(), &doc, &status).await? {
                    WriteOutcome::Written(revision) => {
                        self.last_refused = None;
                        METRICS.set_published_version(next);
                        let down = demoted(&doc.set);
                        METRICS.set_demoted_classes(down.len());
                        for (class, reason) in down {
                            tracing::warn!(
                                class,
                                version = next,
                                "class {class} is declared fenced but published DEMOTED to advisory: {reason}; no one accepted this \
                                 risk: run `holdfast-pausetest run --class {class} ...` against the resource it names until it passes \
                                 (`holdfastctl risk-register` lists it)"
                            );
                        }
                        tracing::info!(
                            version = next,
                            hash = %doc.hash,
                            classes = doc.set.classes.len(),
                            grants = doc.set.grants.len(),
                            commit = doc.source_commit.as_deref().unwrap_or("-"),
                            revision,
                            "published the policy in {} as version {next}",
                            self.dir.display()
                        );
                        Ok(Outcome::Published { version: next, hash: doc.hash })
                    }
                    WriteOutcome::NotLeader => Ok(Outcome::NotLeader),
                    WriteOutcome::Raced => Ok(Outcome::Raced),
                }
            }
            Err(problems) => {
                let count = problems.len();
                let new = forced || self.last_refused.as_ref() != Some(&problems);
                if new {
                    METRICS.refused();
                    let what =
                        if version == 0 { "nothing is published yet".to_string() } else { format!("version {version} stays in force") };
                    tracing::warn!(
                        problems = count,
                        "REFUSED the policy in {}: {count} problem(s); {what}. Fix each and the change is published on the next rescan \
                         (or at once on SIGHUP); `holdfast-controller check` prints them too",
                        self.dir.display()
                    );
                    for p in &problems {
                        tracing::warn!(rule = %p.rule, "refused: {p}");
                    }
                }
                let recorded = view.status.doc().and_then(|s| s.last_refusal.as_ref()).map(|r| &r.problems);
                let stale = recorded != Some(&problems) || view.status.doc().is_none_or(|s| s.version != version || s.hash != hash);
                if stale {
                    let refusal = Refusal { at_unix_ms: now, dir: self.dir.display().to_string(), problems: problems.clone() };
                    let status = self.status(version, hash, Some(refusal));
                    if policy::write_status(etcd, leader, &status).await? == WriteOutcome::NotLeader {
                        return Ok(Outcome::NotLeader);
                    }
                }
                self.last_refused = Some(problems);
                Ok(Outcome::Refused { version, problems: count })
            }
        }
    }

    fn status(&self, version: u64, hash: Option<String>, last_refusal: Option<Refusal>) -> PolicyStatus {
        PolicyStatus { version, hash, last_refusal, controller: self.identity.clone(), updated_unix_ms: crate::now_unix_ms() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(class: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("classes.d")).unwrap();
        std::fs::create_dir_all(t.path().join("grants.d")).unwrap();
        std::fs::write(t.path().join("classes.d/a.toml"), class).unwrap();
        t
    }

    const GOOD: &str = "[class.a]\nnamespace = \"a\"\npurpose = \"efficiency\"\nenforcement = \"advisory\"\nrisk_owner = \"me\"\nwaiver_expires = 2099-01-01\nttl = \"30s\"\ntier = \"entity\"\n";

    #[test]
    fn a_valid_directory_compiles_and_a_bad_one_names_file_and_line() {
        let t = dir_with(GOOD);
        let set = evaluate(t.path(), Vec::new(), 0).unwrap();
        assert!(set.hash.starts_with("sha256:") && set.classes.contains_key("a"));
        let t = dir_with(&GOOD.replace("ttl = \"30s\"", "ttl = \"1s\""));
        let problems = evaluate(t.path(), Vec::new(), 0).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!((problems[0].line, problems[0].rule.as_str()), (7, "ttl-out-of-range"));
        assert!(problems[0].to_string().contains("classes.d/a.toml:7:"), "{}", problems[0]);
    }

    #[test]
    fn a_fenced_class_without_a_pause_test_is_demoted_and_a_missing_dir_is_named() {
        let fenced = "[class.a]\nnamespace = \"a\"\npurpose = \"correctness\"\nenforcement = \"fenced\"\ntier = \"entity\"\n\
                      resource = \"fixture:r\"\nresource_schema_version = 1\n";
        let t = dir_with(fenced);
        let set = evaluate(t.path(), Vec::new(), 0).unwrap();
        assert_eq!(demoted(&set), [("a", "no pause-test result is recorded for it (nothing under /sys/pausetest/a/)")]);
        let problems = evaluate(&t.path().join("nope"), Vec::new(), 0).unwrap_err();
        assert_eq!((problems[0].line, problems[0].rule.as_str()), (0, "unreadable"));
    }
}
