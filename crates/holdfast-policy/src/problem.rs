//! A problem in a class or grant file: where, which rule, and what to do.

use serde::Serialize;
use std::fmt;

/// The rule a problem breaks: a stable code that CI and scripts can branch
/// on (`--json` prints it), independent of the message's wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The file is not UTF-8 or not valid TOML.
    Syntax,
    /// A key or table the file format does not have (often a typo).
    UnknownKey,
    /// A value of the wrong TOML type, or not one of the allowed words.
    InvalidValue,
    /// `[class.<name>]` or `[grant.<name>]` with a name that is not 1..=63 of a-z, 0-9, '-'.
    InvalidName,
    MissingNamespace,
    InvalidNamespace,
    MissingPurpose,
    MissingEnforcement,
    MissingTier,
    AdvisoryWithoutRiskOwner,
    AdvisoryWithoutWaiver,
    WaiverExpired,
    /// `risk_owner` or `waiver_expires` on a fenced class.
    WaiverOnFenced,
    /// A fenced class without `resource` or `resource_schema_version`.
    FencedWithoutResource,
    /// `resource` or `resource_schema_version` on an advisory class.
    ResourceOnAdvisory,
    TtlOutOfRange,
    AdvisoryTtlTooShort,
    OpenOnCorrectness,
    OpenOnFenced,
    /// `enforcement = "fenced"` without a passing, unexpired pause-test result
    /// for the class's resource at its schema version: the class is demoted
    /// (a [`crate::Report::demoted`] entry, not a problem).
    FencedWithoutPauseTest,
    DuplicateClass,
    OverlappingNamespace,
    DuplicateGrant,
    InvalidIdentity,
    InvalidKeyPrefix,
    UnknownNamespace,
    GrantWithoutPermission,
}

impl Rule {
    /// The code as `--json` prints it (`missing-enforcement`, …).
    pub fn code(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    }
}

/// One problem, at a line of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The file as it was read (`DIR/classes.d/payments.toml`).
    pub file: String,
    /// 1-based line of the key, value or table header at fault.
    pub line: usize,
    pub rule: Rule,
    /// What is wrong and what to do about it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// The 1-based line holding byte `offset` of `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Edit distance, for "did you mean" on unknown keys.
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// ` (did you mean "x"?)` for the closest known key, if one is close.
pub(crate) fn suggestion(unknown: &str, known: &[&str]) -> String {
    known
        .iter()
        .map(|k| (distance(unknown, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_distances_and_codes() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
        assert_eq!(distance("enforcment", "enforcement"), 1);
        assert_eq!(suggestion("enforcment", &["ttl", "enforcement"]), " (did you mean \"enforcement\"?)");
        assert_eq!(suggestion("colour", &["ttl", "tier"]), "");
        assert_eq!(Rule::MissingEnforcement.code(), "missing-enforcement");
        assert_eq!(Rule::TtlOutOfRange.code(), "ttl-out-of-range");
    }
}
