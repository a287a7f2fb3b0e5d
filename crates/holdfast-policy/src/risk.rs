//! The risk register: every advisory class, its risk owner and how its
//! waiver stands, and every fenced class demoted for want of a pause-test
//! result that counts (`holdfastctl risk-register`).
//!
//! An expired waiver makes a set invalid, yet the register exists to list
//! exactly those: [`advisory_classes`] reads the classes of a set whose only
//! problems are expired waivers, with the one [`validate`] function.

use crate::date::Date;
use crate::problem::{Problem, Rule};
use crate::set::{Class, Enforcement};
use crate::source::Sources;
use crate::validate::{Checks, PauseTests, validate};
use serde::Serialize;

/// How an advisory class's waiver stands on a given day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaiverStatus {
    /// `waiver_expires` is before today (a waiver expiring today still
    /// counts, as in [`validate`]).
    Expired,
    /// It expires today or within the warning window.
    Expiring,
    Ok,
}

impl WaiverStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            WaiverStatus::Expired => "expired",
            WaiverStatus::Expiring => "expiring",
            WaiverStatus::Ok => "ok",
        }
    }
}

/// A waiver expiring on `expires`, seen on `today`, warning `warn_days` ahead:
/// expired if `expires < today`; expiring if `expires <= today + warn_days`;
/// ok otherwise.
pub fn waiver_status(expires: Date, today: Date, warn_days: u32) -> WaiverStatus {
    let left = today.days_until(expires);
    if left < 0 {
        WaiverStatus::Expired
    } else if left <= i64::from(warn_days) {
        WaiverStatus::Expiring
    } else {
        WaiverStatus::Ok
    }
}

/// The classes of a policy directory that are not fenced in force: the
/// demoted ones first (declared fenced, no pause-test result counts for
/// them: [`Enforcement::Demoted`], found only when `pause_tests` were read),
/// then the advisory ones by `waiver_expires`, each group by name. The
/// directory must validate except for expired waivers; otherwise every
/// other problem is returned.
pub fn advisory_classes(sources: &Sources, today: Date, pause_tests: &PauseTests) -> Result<Vec<Class>, Vec<Problem>> {
    let report = validate(sources, &Checks { today, pause_tests: pause_tests.clone() });
    let other: Vec<Problem> = report.problems.into_iter().filter(|p| p.rule != Rule::WaiverExpired).collect();
    if !other.is_empty() {
        return Err(other);
    }
    // Only expired waivers, if anything: on the earliest date none has
    // expired, so the same validation compiles the set.
    let report = validate(sources, &Checks { today: Date::MIN, pause_tests: pause_tests.clone() });
    let set = report.set.ok_or(report.problems)?;
    let mut classes: Vec<Class> = set.classes.into_values().filter(|c| !c.enforcement.is_fenced()).collect();
    classes.sort_by(|a, b| (waiver_of(a), &a.name).cmp(&(waiver_of(b), &b.name)));
    Ok(classes)
}

/// The class's `waiver_expires`, if it is advisory.
pub fn waiver_of(class: &Class) -> Option<Date> {
    match &class.enforcement {
        Enforcement::Advisory { waiver_expires, .. } => Some(*waiver_expires),
        Enforcement::Fenced { .. } | Enforcement::Demoted { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceFile;

    fn d(s: &str) -> Date {
        s.parse().unwrap()
    }

    fn advisory(name: &str, ns: &str, expires: &str) -> String {
        format!(
            "[class.{name}]\nnamespace = \"{ns}\"\npurpose = \"efficiency\"\nenforcement = \"advisory\"\n\
             risk_owner = \"team-{name}\"\nwaiver_expires = {expires}\nttl = \"30s\"\ntier = \"entity\"\n"
        )
    }

    const FENCED: &str = "[class.fenced]\nnamespace = \"orders\"\npurpose = \"correctness\"\nenforcement = \"fenced\"\n\
                          resource = \"postgresql://db:5432/orders?table=t\"\nresource_schema_version = 2\ntier = \"entity\"\n";

    fn offline() -> PauseTests {
        PauseTests::NotAvailable { reason: "offline".into() }
    }

    fn sources(classes: &[&str]) -> Sources {
        Sources {
            classes: classes.iter().enumerate().map(|(i, t)| SourceFile::new(format!("classes.d/{i}.toml"), *t)).collect(),
            ..Sources::default()
        }
    }

    #[test]
    fn status_by_days_left() {
        let today = d("2026-06-01");
        assert_eq!(waiver_status(d("2026-05-31"), today, 30), WaiverStatus::Expired);
        assert_eq!(waiver_status(d("2026-06-01"), today, 30), WaiverStatus::Expiring);
        assert_eq!(waiver_status(d("2026-07-01"), today, 30), WaiverStatus::Expiring);
        assert_eq!(waiver_status(d("2026-07-02"), today, 30), WaiverStatus::Ok);
        assert_eq!(waiver_status(d("2026-06-01"), today, 0), WaiverStatus::Expiring);
        assert_eq!(waiver_status(d("2026-06-02"), today, 0), WaiverStatus::Ok);
        assert_eq!(WaiverStatus::Expiring.as_str(), "expiring");
        assert_eq!(serde_json::to_value(WaiverStatus::Expired).unwrap(), "expired");
    }

    #[test]
    fn lists_advisory_classes_by_expiry_even_when_a_waiver_expired() {
        let a = advisory("late", "late", "2030-01-01");
        let b = advisory("gone", "gone", "2026-05-01");
        let c = advisory("soon", "soon", "2026-06-10");
        let s = sources(&[&a, &b, &c, FENCED]);
        let today = d("2026-06-01");
        // The set itself is invalid today: one waiver expired.
        let report = validate(&s, &Checks { today, pause_tests: PauseTests::NotAvailable { reason: "x".into() } });
        assert_eq!(report.problems.iter().map(|p| p.rule).collect::<Vec<_>>(), [Rule::WaiverExpired]);
        let classes = advisory_classes(&s, today, &offline()).unwrap();
        let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["gone", "soon", "late"]);
        assert_eq!(waiver_of(&classes[0]), Some(d("2026-05-01")));
    }

    #[test]
    fn a_fenced_class_no_result_counts_for_is_listed_first_as_demoted() {
        let a = advisory("late", "late", "2030-01-01");
        let s = sources(&[&a, FENCED]);
        let today = d("2026-06-01");
        // Offline, the demotion cannot be known: only the advisory class.
        let names = |c: &[Class]| c.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&advisory_classes(&s, today, &offline()).unwrap()), ["late"]);
        // Read from etcd with no result for it: demoted, and first.
        let read = PauseTests::Read { records: Vec::new(), now_unix_ms: 0 };
        let classes = advisory_classes(&s, today, &read).unwrap();
        assert_eq!(names(&classes), ["fenced", "late"]);
        assert!(classes[0].enforcement.is_demoted(), "{:?}", classes[0]);
        assert_eq!(waiver_of(&classes[0]), None);
    }

    #[test]
    fn other_problems_are_returned_and_expired_waivers_are_not() {
        let broken = advisory("x", "x", "2026-05-01").replace("tier = \"entity\"\n", "");
        let s = sources(&[&broken, "[class.y\n"]);
        let problems = advisory_classes(&s, d("2026-06-01"), &offline()).unwrap_err();
        let rules: Vec<Rule> = problems.iter().map(|p| p.rule).collect();
        assert_eq!(rules, [Rule::MissingTier, Rule::Syntax], "{problems:?}");
    }
}
