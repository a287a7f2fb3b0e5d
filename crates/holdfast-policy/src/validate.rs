//! The one validation function ([`validate`]): every rule, every problem in
//! one pass, each with its file, line and fix.
//!
//! Files are parsed into toml's spanned document tree ([`DeTable`]) and
//! walked by hand rather than deserialised with serde: serde stops at the
//! first error, and every problem must be reported at once, with the line of
//! the key at fault.

use crate::date::Date;
use crate::problem::{Problem, Rule, line_of, suggestion};
use crate::set::{Class, CompiledSet, Enforcement, Fairness, Grant, OnQuorumLoss, Purpose, Tier};
use crate::source::{SourceFile, Sources};
use holdfast_model::layout::{self, PAUSETEST_PREFIX, PauseTestOutcome, PauseTestRecord};
use holdfast_model::ttl::{DEFAULT_TTL, MAX_TTL, MIN_TTL};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::time::Duration;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// The shortest TTL an advisory class may have: a false expiry there can
/// produce a duplicate write, so it must be rare.
pub const ADVISORY_MIN_TTL: Duration = Duration::from_secs(30);

/// The keys of a class table, in the order the docs list them.
pub const CLASS_KEYS: &[&str] = &[
    "namespace",
    "purpose",
    "enforcement",
    "resource",
    "resource_schema_version",
    "risk_owner",
    "waiver_expires",
    "ttl",
    "tier",
    "on_quorum_loss",
    "fairness",
    "home_region",
];
/// The keys of a grant table.
pub const GRANT_KEYS: &[&str] = &["identity", "lock", "inspect", "force_release"];

/// The pause-test results the fenced rule is checked against.
#[derive(Debug, Clone)]
pub enum PauseTests {
    /// Every record read from `/sys/pausetest/`, and the time they were read.
    Read { records: Vec<PauseTestRecord>, now_unix_ms: u64 },
    /// The results could not be read (offline, or etcd unreachable): the rule
    /// is reported as not checked, neither passed nor failed.
    NotAvailable { reason: String },
}

/// What the validation depends on besides the files.
#[derive(Debug, Clone)]
pub struct Checks {
    /// The date waivers are compared with (a waiver expiring today still
    /// counts). Pass [`Date::today_utc`] outside tests.
    pub today: Date,
    pub pause_tests: PauseTests,
}

/// The outcome of [`validate`].
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Every problem, ordered by file and line. Empty: the set is valid.
    pub problems: Vec<Problem>,
    /// Rules that could not be checked, one entry per class they apply to
    /// (the pause-test rule for each fenced class when the results were not
    /// available). These are neither passes nor failures.
    pub unchecked: Vec<Problem>,
    /// Why the pause-test results were not available, if they were not.
    pub pause_tests_not_checked: Option<String>,
    /// Classes declared fenced that no pause-test result counts for: the set
    /// holds them as [`Enforcement::Demoted`] (advisory in force), and these
    /// say why, one per class. Not problems: the controller publishes the
    /// set with them demoted rather than keep an unproven fence in force.
    pub demoted: Vec<Problem>,
    /// Files skipped because their name does not end in `.toml`.
    pub ignored: Vec<String>,
    /// How many classes and grants the files define.
    pub class_count: usize,
    pub grant_count: usize,
    /// The compiled set, present when there is no problem.
    pub set: Option<CompiledSet>,
}

impl Report {
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report as `class check` and `holdfast-controller check` print it:
    /// one `FILE:LINE: message` line per problem and per rule not checked,
    /// the ignored files, and a summary line about `dir` that ends, when
    /// invalid, with "Fix each and {then}".
    pub fn to_text(&self, dir: &str, then: &str) -> String {
        let mut out = String::new();
        for p in &self.problems {
            out.push_str(&format!("{p}\n"));
        }
        for u in &self.unchecked {
            out.push_str(&format!("{u}\n"));
        }
        for d in &self.demoted {
            out.push_str(&format!("{d}\n"));
        }
        for f in &self.ignored {
            out.push_str(&format!("note: ignored {f} (only *.toml files are read)\n"));
        }
        let what = format!("{} class(es), {} grant(s)", self.class_count, self.grant_count);
        let pause = match (&self.pause_tests_not_checked, self.unchecked.len()) {
            (None, _) if !self.demoted.is_empty() => format!(
                "pause-test results read from etcd; {} fenced class(es) DEMOTED to advisory (no result counts for their resource and schema version)",
                self.demoted.len()
            ),
            (None, _) => "pause-test results read from etcd".to_string(),
            (Some(why), 0) => format!("no fenced class, so the pause-test rule does not apply (results not read: {why})"),
            (Some(why), n) => format!("the pause-test rule was NOT checked for {n} fenced class(es): {why}"),
        };
        match &self.set {
            Some(set) => out.push_str(&format!("{dir}: valid: {what}, {}; {pause}\n", set.hash)),
            None => out.push_str(&format!("{dir}: INVALID: {} problem(s) in {what}; {pause}. Fix each and {then}\n", self.problems.len())),
        }
        out
    }

    /// The set, only if it is valid *and* every rule was checked: the only
    /// set a controller may publish.
    pub fn publishable(&self) -> Option<&CompiledSet> {
        if self.unchecked.is_empty() { self.set.as_ref() } else { None }
    }
}

/// Validates a policy directory's files. The one function every component
/// calls: `holdfastctl class check`, the controller before it publishes,
/// and arbiters when they load a set.
pub fn validate(sources: &Sources, checks: &Checks) -> Report {
    let mut v = Validator { problems: Vec::new(), unchecked: Vec::new(), demoted: Vec::new() };
    // Parse every file first: the walk below borrows the documents.
    let class_docs: Vec<_> = sources.classes.iter().map(|f| (f, v.parse(f))).collect();
    let grant_docs: Vec<_> = sources.grants.iter().map(|f| (f, v.parse(f))).collect();
    let mut raw_classes = Vec::new();
    for (file, doc) in &class_docs {
        if let Some((text, doc)) = doc {
            for e in v.entries(file, text, doc.get_ref(), &CLASSES) {
                raw_classes.push(v.class(e, checks));
            }
        }
    }
    // A grant's namespace is called unknown only if every class's namespace
    // is known: otherwise it may belong to a class whose file did not parse
    // or whose namespace is missing or wrong, and the fix is there.
    let all_namespaces_known = class_docs.iter().all(|(_, d)| d.is_some()) && raw_classes.iter().all(|c| c.namespace.is_some());
    let mut raw_grants = Vec::new();
    for (file, doc) in &grant_docs {
        if let Some((text, doc)) = doc {
            for e in v.entries(file, text, doc.get_ref(), &GRANTS) {
                raw_grants.push(v.grant(e));
            }
        }
    }

    // Across files: duplicate names and shared namespaces.
    let mut first_class: HashMap<&str, (&str, usize)> = HashMap::new();
    let mut first_namespace: HashMap<&str, (&str, &str, usize)> = HashMap::new();
    for c in &raw_classes {
        if let Some((file, line)) = first_class.get(c.name.as_str()) {
            v.push(c.file, c.line, Rule::DuplicateClass, format!(
                "class {:?} is already defined at {file}:{line}; class names are unique across classes.d/: rename or remove one of them",
                c.name
            ));
            continue;
        }
        first_class.insert(&c.name, (c.file, c.line));
        let Some((ns, ns_line)) = &c.namespace else { continue };
        if let Some((other, file, line)) = first_namespace.get(ns.as_str()) {
            v.push(c.file, *ns_line, Rule::OverlappingNamespace, format!(
                "class {:?} governs namespace {ns:?}, which class {other:?} ({file}:{line}) already governs; a namespace belongs to exactly one class: give one of them another namespace",
                c.name
            ));
        } else {
            first_namespace.insert(ns, (&c.name, c.file, *ns_line));
        }
    }
    let mut first_grant: HashMap<&str, (&str, usize)> = HashMap::new();
    for g in &raw_grants {
        if let Some((file, line)) = first_grant.get(g.name.as_str()) {
            v.push(
                g.file,
                g.line,
                Rule::DuplicateGrant,
                format!(
                    "grant {:?} is already defined at {file}:{line}; grant names are unique across grants.d/: rename or remove one of them",
                    g.name
                ),
            );
        } else {
            first_grant.insert(&g.name, (g.file, g.line));
        }
        if all_namespaces_known {
            for (ns, file, line, perm, prefix) in &g.namespaces {
                if !first_namespace.contains_key(ns.as_str()) {
                    v.push(file, *line, Rule::UnknownNamespace, format!(
                        "grant {:?}: {perm} prefix {prefix:?} names namespace {ns:?}, which no class declares; add a class with namespace = {ns:?} to classes.d/, or fix the prefix",
                        g.name
                    ));
                }
            }
        }
    }

    let mut problems = v.problems;
    problems.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    let mut unchecked = v.unchecked;
    unchecked.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    let mut demoted = v.demoted;
    demoted.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    let set = problems.is_empty().then(|| {
        let classes: BTreeMap<String, Class> =
            raw_classes.iter().filter_map(|c| c.class.clone()).map(|c| (c.namespace.clone(), c)).collect();
        let grants: BTreeMap<String, Grant> = raw_grants.iter().filter_map(|g| g.grant.clone()).map(|g| (g.name.clone(), g)).collect();
        CompiledSet::new(classes, grants)
    });
    let mut ignored = sources.ignored.clone();
    ignored.sort();
    Report {
        problems,
        unchecked,
        pause_tests_not_checked: match &checks.pause_tests {
            PauseTests::NotAvailable { reason } => Some(reason.clone()),
            PauseTests::Read { .. } => None,
        },
        demoted,
        ignored,
        class_count: raw_classes.len(),
        grant_count: raw_grants.len(),
        set,
    }
}

/// A kind of policy file: its table, its directory, and the other kind's.
struct Kind {
    table: &'static str,
    dir: &'static str,
    other: &'static str,
    other_dir: &'static str,
}

const CLASSES: Kind = Kind { table: "class", dir: "classes.d", other: "grant", other_dir: "grants.d" };
const GRANTS: Kind = Kind { table: "grant", dir: "grants.d", other: "class", other_dir: "classes.d" };

struct Validator {
    problems: Vec<Problem>,
    unchecked: Vec<Problem>,
    demoted: Vec<Problem>,
}

/// One `[class.<name>]` or `[grant.<name>]` table.
struct Entry<'a> {
    file: &'a str,
    text: &'a str,
    name: String,
    line: usize,
    body: &'a DeTable<'a>,
}

struct RawClass<'a> {
    file: &'a str,
    line: usize,
    name: String,
    /// The namespace, if valid, and its line.
    namespace: Option<(String, usize)>,
    /// The class, if it has no problem of its own.
    class: Option<Class>,
}

struct RawGrant<'a> {
    file: &'a str,
    line: usize,
    name: String,
    /// Every valid key prefix's namespace: (namespace, file, line, permission, prefix).
    namespaces: Vec<(String, &'a str, usize, &'static str, String)>,
    grant: Option<Grant>,
}

/// A value and where it is.
type Value<'a> = Spanned<DeValue<'a>>;

impl Validator {
    fn push(&mut self, file: &str, line: usize, rule: Rule, message: String) {
        self.problems.push(Problem { file: file.to_string(), line, rule, message });
    }

    fn at(&mut self, entry: &Entry<'_>, span: Range<usize>, rule: Rule, message: String) {
        let line = line_of(entry.text, span.start);
        self.push(entry.file, line, rule, message);
    }

    /// Parses a file; reports it if it is not UTF-8 or not TOML.
    fn parse<'a>(&mut self, file: &'a SourceFile) -> Option<(&'a str, Spanned<DeTable<'a>>)> {
        let text = match &file.text {
            Ok(t) => t.as_str(),
            Err(why) => {
                self.push(&file.name, 1, Rule::Syntax, why.clone());
                return None;
            }
        };
        let (doc, errors) = DeTable::parse_recoverable(text);
        if errors.is_empty() {
            return Some((text, doc));
        }
        for e in errors {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(1);
            self.push(&file.name, line, Rule::Syntax, format!("invalid TOML: {}; fix the syntax", e.message().trim()));
        }
        None
    }

    /// A document's `[<table>.<name>]` tables; reports unknown top-level
    /// keys and tables that are not tables.
    fn entries<'a>(&mut self, file: &'a SourceFile, text: &'a str, doc: &'a DeTable<'a>, kind: &Kind) -> Vec<Entry<'a>> {
        let Kind { table, dir, other, other_dir } = *kind;
        let mut entries = Vec::new();
        for (key, value) in doc.iter() {
            let line = line_of(text, key.span().start);
            let k = key.get_ref().as_ref();
            if k != table {
                let message = if k == other {
                    format!("unknown key {k:?}; [{other}.NAME] tables belong in {other_dir}/, not {dir}/: move it")
                } else {
                    format!("unknown key {k:?}{}; a {dir} file holds only [{table}.NAME] tables", suggestion(k, &[table]))
                };
                self.push(&file.name, line, Rule::UnknownKey, message);
                continue;
            }
            let Some(tables) = value.get_ref().as_table() else {
                self.push(&file.name, line, Rule::InvalidValue, format!("{table} must be a table; write [{table}.NAME] headers"));
                continue;
            };
            for (name, body) in tables.iter() {
                let line = line_of(text, name.span().start);
                let name = name.get_ref().to_string();
                match body.get_ref().as_table() {
                    Some(body) => entries.push(Entry { file: &file.name, text, name, line, body }),
                    None => self.push(
                        &file.name,
                        line,
                        Rule::InvalidValue,
                        format!("{table} {name:?} must be a table; write [{table}.{name}] and put its keys on the lines below it"),
                    ),
                }
            }
        }
        entries
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Fenced,
    Advisory,
}

impl Validator {
    /// A string value, or a problem saying it must be one.
    fn string<'v>(&mut self, e: &Entry<'_>, what: &str, key: &str, v: &'v Value<'_>) -> Option<&'v str> {
        match v.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.at(e, v.span(), Rule::InvalidValue, format!("{what}: {key} must be a string in quotes, not {}", a(other)));
                None
            }
        }
    }

    /// One of a few words.
    fn choice<T: Copy>(&mut self, e: &Entry<'_>, what: &str, key: &str, v: &Value<'_>, options: &[(&str, T)]) -> Option<T> {
        let s = self.string(e, what, key, v)?;
        if let Some((_, t)) = options.iter().find(|(word, _)| *word == s) {
            return Some(*t);
        }
        let allowed: Vec<String> = options.iter().map(|(word, _)| format!("{key} = {word:?}")).collect();
        self.at(e, v.span(), Rule::InvalidValue, format!("{what}: {key} = {s:?} is not allowed; write {}", allowed.join(" or ")));
        None
    }

    /// The keys of a table, each checked against `known`.
    fn fields<'a>(&mut self, e: &Entry<'a>, what: &str, known: &[&str]) -> HashMap<String, &'a Value<'a>> {
        let mut found = HashMap::new();
        for (key, value) in e.body.iter() {
            let k = key.get_ref().as_ref();
            if known.contains(&k) {
                found.insert(k.to_string(), value);
            } else {
                self.at(
                    e,
                    key.span(),
                    Rule::UnknownKey,
                    format!("{what}: unknown key {k:?}{}; the keys are {}", suggestion(k, known), known.join(", ")),
                );
            }
        }
        found
    }

    fn class<'a>(&mut self, e: Entry<'a>, checks: &Checks) -> RawClass<'a> {
        let before = self.problems.len();
        let n = e.name.clone();
        let what = format!("class {n:?}");
        if let Err(err) = layout::validate_class(&n) {
            self.push(e.file, e.line, Rule::InvalidName, format!("[class.{n}]: {}", err.message));
        }
        let f = self.fields(&e, &what, CLASS_KEYS);
        let line = |v: &Value<'_>| line_of(e.text, v.span().start);

        let namespace = match f.get("namespace") {
            None => {
                self.push(
                    e.file,
                    e.line,
                    Rule::MissingNamespace,
                    format!("{what} has no namespace; add namespace = \"NAME\", the first segment of the keys it governs (NAME/KEY)"),
                );
                None
            }
            Some(v) => match self.string(&e, &what, "namespace", v) {
                None => None,
                Some(ns) => match namespace_problem(ns) {
                    None => Some((ns.to_string(), line(v))),
                    Some(why) => {
                        self.at(&e, v.span(), Rule::InvalidNamespace, format!("{what}: namespace {why}"));
                        None
                    }
                },
            },
        };
        let purpose = match f.get("purpose") {
            None => {
                self.push(
                    e.file,
                    e.line,
                    Rule::MissingPurpose,
                    format!(
                        "{what} has no purpose; add purpose = \"correctness\" (two holders at once would corrupt data) \
                     or purpose = \"efficiency\" (two holders at once only waste work)"
                    ),
                );
                None
            }
            Some(v) => self.choice(&e, &what, "purpose", v, &[("correctness", Purpose::Correctness), ("efficiency", Purpose::Efficiency)]),
        };
        let mode = match f.get("enforcement") {
            None => {
                self.push(
                    e.file,
                    e.line,
                    Rule::MissingEnforcement,
                    format!(
                        "{what} has no enforcement; add enforcement = \"advisory\" (with risk_owner and waiver_expires), \
                     or enforcement = \"fenced\" once holdfast-pausetest has passed against the resource it guards"
                    ),
                );
                None
            }
            Some(v) => self.choice(&e, &what, "enforcement", v, &[("fenced", Mode::Fenced), ("advisory", Mode::Advisory)]),
        };
        let risk_owner = match f.get("risk_owner") {
            None => None,
            Some(v) => match self.string(&e, &what, "risk_owner", v) {
                Some(owner) if owner.trim().is_empty() => {
                    self.at(
                        &e,
                        v.span(),
                        Rule::InvalidValue,
                        format!("{what}: risk_owner is empty; name the team that accepts the risk, e.g. risk_owner = \"team-ledger\""),
                    );
                    None
                }
                other => other.map(str::to_string),
            },
        };
        let waiver = match f.get("waiver_expires") {
            None => None,
            Some(v) => {
                let date = match v.get_ref() {
                    DeValue::Datetime(dt) if dt.time.is_none() && dt.offset.is_none() => {
                        dt.date.and_then(|d| Date::new(d.year, d.month, d.day))
                    }
                    _ => None,
                };
                if date.is_none() {
                    self.at(
                        &e,
                        v.span(),
                        Rule::InvalidValue,
                        format!("{what}: waiver_expires must be a TOML date without quotes or time, e.g. waiver_expires = 2027-03-31"),
                    );
                }
                date.map(|d| (d, v))
            }
        };
        let resource = match f.get("resource") {
            None => None,
            Some(v) => match self.string(&e, &what, "resource", v) {
                None => None,
                Some(r) => match resource_problem(r) {
                    None => Some(r.to_string()),
                    Some(why) => {
                        self.at(&e, v.span(), Rule::InvalidValue, format!("{what}: resource {why}"));
                        None
                    }
                },
            },
        };
        let schema_version = match f.get("resource_schema_version") {
            None => None,
            Some(v) => {
                let n = match v.get_ref() {
                    DeValue::Integer(i) => u32::from_str_radix(i.as_str(), i.radix()).ok(),
                    _ => None,
                };
                if n.is_none() {
                    self.at(
                        &e,
                        v.span(),
                        Rule::InvalidValue,
                        format!(
                            "{what}: resource_schema_version must be a whole number from 0 to {} without quotes, e.g. \
                     resource_schema_version = 3: the schema version `holdfast-pausetest status` reports for the resource",
                            u32::MAX
                        ),
                    );
                }
                n
            }
        };
        let ttl = match f.get("ttl") {
            None => Some(DEFAULT_TTL),
            Some(v) => self.ttl(&e, &what, v),
        };
        let tier = match f.get("tier") {
            None => {
                self.push(
                    e.file,
                    e.line,
                    Rule::MissingTier,
                    format!(
                        "{what} has no tier; add tier = \"entity\" (per-entity locks on the sharded entity clusters) \
                     or tier = \"coord\" (coordination locks on the coord cluster)"
                    ),
                );
                None
            }
            Some(v) => self.choice(&e, &what, "tier", v, &[("coord", Tier::Coord), ("entity", Tier::Entity)]),
        };
        let on_quorum_loss = match f.get("on_quorum_loss") {
            None => Some(OnQuorumLoss::Closed),
            Some(v) => self.choice(&e, &what, "on_quorum_loss", v, &[("closed", OnQuorumLoss::Closed), ("open", OnQuorumLoss::Open)]),
        };
        let fairness = match f.get("fairness") {
            None => Some(Fairness::BestEffort),
            Some(v) => self.choice(&e, &what, "fairness", v, &[("best-effort", Fairness::BestEffort), ("durable", Fairness::Durable)]),
        };
        let home_region = match f.get("home_region") {
            None => None,
            Some(v) => match self.string(&e, &what, "home_region", v) {
                Some(region) if !is_name(region) => {
                    self.at(&e, v.span(), Rule::InvalidValue, format!(
                        "{what}: home_region {region:?} is not a region name; use 1..=63 of a-z, 0-9 and '-', e.g. \"hall-a\", or leave it out"
                    ));
                    None
                }
                other => other.map(str::to_string),
            },
        };

        let mut demoted = None;
        match mode {
            Some(Mode::Advisory) => {
                for key in ["resource", "resource_schema_version"] {
                    if let Some(v) = f.get(key) {
                        self.at(
                            &e,
                            v.span(),
                            Rule::ResourceOnAdvisory,
                            format!(
                                "{what} is advisory, so no fence and no pause test is checked against {key}; remove it, or make the \
                         class fenced (enforcement = \"fenced\") once holdfast-pausetest has passed against that resource"
                            ),
                        );
                    }
                }
                if !f.contains_key("risk_owner") {
                    self.push(
                        e.file,
                        e.line,
                        Rule::AdvisoryWithoutRiskOwner,
                        format!(
                            "{what} is advisory but names no risk_owner; add risk_owner = \"TEAM\", the team that accepts \
                         the risk of two holders acting at once until the class is fenced"
                        ),
                    );
                }
                match &waiver {
                    _ if !f.contains_key("waiver_expires") => self.push(
                        e.file,
                        e.line,
                        Rule::AdvisoryWithoutWaiver,
                        format!(
                            "{what} is advisory but has no waiver_expires; add waiver_expires = YYYY-MM-DD (a TOML date, \
                         no quotes): the day the risk owner must fence the class or renew the waiver"
                        ),
                    ),
                    Some((date, v)) if *date < checks.today => self.at(
                        &e,
                        v.span(),
                        Rule::WaiverExpired,
                        format!(
                            "{what}: the advisory waiver expired on {date} (today is {}); fence the class, or have the risk \
                         owner renew the waiver with a later waiver_expires",
                            checks.today
                        ),
                    ),
                    _ => {}
                }
                if let Some(t) = ttl
                    && t < ADVISORY_MIN_TTL
                {
                    let shown = humantime::format_duration(t);
                    let msg = if f.contains_key("ttl") {
                        format!(
                            "{what} is advisory with ttl = \"{shown}\"; advisory classes need at least 30s, because a false expiry there can produce a duplicate write: set ttl = \"30s\" or more"
                        )
                    } else {
                        format!(
                            "{what} is advisory and has no ttl, so it would get the {shown} default; advisory classes need at least 30s, because a false expiry there can produce a duplicate write: set ttl = \"30s\" or more"
                        )
                    };
                    match f.get("ttl") {
                        Some(v) => self.at(&e, v.span(), Rule::AdvisoryTtlTooShort, msg),
                        None => self.push(e.file, e.line, Rule::AdvisoryTtlTooShort, msg),
                    }
                }
            }
            Some(Mode::Fenced) => {
                for key in ["risk_owner", "waiver_expires"] {
                    if let Some(v) = f.get(key) {
                        self.at(&e, v.span(), Rule::WaiverOnFenced, format!(
                            "{what} is fenced, so {key} does not apply; remove it (risk_owner and waiver_expires are for advisory classes)"
                        ));
                    }
                }
                for key in ["resource", "resource_schema_version"] {
                    if !f.contains_key(key) {
                        self.push(
                            e.file,
                            e.line,
                            Rule::FencedWithoutResource,
                            format!(
                                "{what} is fenced but has no {key}; add resource = \"NAME\" and resource_schema_version = N as \
                         `holdfast-pausetest status --class {n} --resource URL --json` prints them (\"resource\" and \
                         \"current_schema_version\"): a pause-test result counts only for that resource at that schema version"
                            ),
                        );
                    }
                }
                if let (Some(resource), Some(version)) = (&resource, schema_version) {
                    demoted = self.pause_test(&e, &what, resource, version, checks);
                }
            }
            None => {}
        }
        if on_quorum_loss == Some(OnQuorumLoss::Open)
            && let Some(v) = f.get("on_quorum_loss")
        {
            if purpose == Some(Purpose::Correctness) {
                self.at(
                    &e,
                    v.span(),
                    Rule::OpenOnCorrectness,
                    format!(
                        "{what} has on_quorum_loss = \"open\" but purpose = \"correctness\": a correctness class must never \
                     grant without a majority; set on_quorum_loss = \"closed\" (or purpose = \"efficiency\" if two holders only waste work)"
                    ),
                );
            } else if mode == Some(Mode::Fenced) {
                self.at(
                    &e,
                    v.span(),
                    Rule::OpenOnFenced,
                    format!(
                        "{what} has on_quorum_loss = \"open\" but is fenced: grants made without a majority carry token 0, \
                     which a fenced resource must refuse; set on_quorum_loss = \"closed\""
                    ),
                );
            }
        }

        let clean = self.problems.len() == before;
        let class = match (clean, &namespace, purpose, mode, ttl, tier, on_quorum_loss, fairness) {
            (true, Some((ns, _)), Some(purpose), Some(mode), Some(ttl), Some(tier), Some(on_quorum_loss), Some(fairness)) => {
                let enforcement = match (mode, risk_owner, waiver) {
                    (Mode::Fenced, _, _) => match (resource, schema_version, demoted) {
                        (Some(resource), Some(schema_version), None) => Some(Enforcement::Fenced { resource, schema_version }),
                        (Some(resource), Some(schema_version), Some(reason)) => {
                            Some(Enforcement::Demoted { resource, schema_version, reason })
                        }
                        _ => None,
                    },
                    (Mode::Advisory, Some(risk_owner), Some((waiver_expires, _))) => {
                        Some(Enforcement::Advisory { risk_owner, waiver_expires })
                    }
                    _ => None,
                };
                enforcement.map(|enforcement| Class {
                    name: n.clone(),
                    namespace: ns.clone(),
                    purpose,
                    enforcement,
                    ttl,
                    tier,
                    on_quorum_loss,
                    fairness,
                    home_region,
                })
            }
            _ => None,
        };
        RawClass { file: e.file, line: e.line, name: n, namespace, class }
    }

    fn ttl(&mut self, e: &Entry<'_>, what: &str, v: &Value<'_>) -> Option<Duration> {
        let text = self.string(e, what, "ttl", v)?;
        let ttl = match humantime::parse_duration(text) {
            Ok(t) => t,
            Err(err) => {
                self.at(
                    e,
                    v.span(),
                    Rule::InvalidValue,
                    format!("{what}: ttl = {text:?} is not a duration ({err}); write e.g. ttl = \"30s\""),
                );
                return None;
            }
        };
        if ttl < MIN_TTL || ttl > MAX_TTL {
            self.at(
                e,
                v.span(),
                Rule::TtlOutOfRange,
                format!("{what}: ttl = {text:?} is outside 5s..300s; pick a TTL in that range, or leave ttl out for the 15s default"),
            );
            return None;
        }
        if ttl.subsec_nanos() != 0 {
            self.at(
                e,
                v.span(),
                Rule::InvalidValue,
                format!("{what}: ttl = {text:?} is not a whole number of seconds; etcd leases count whole seconds"),
            );
            return None;
        }
        Some(ttl)
    }

    /// The fenced rule: a passing pause-test result recorded for this class,
    /// for the resource it names and at the schema version it declares, that
    /// has not expired. Without one the class is demoted: returns why (and
    /// records it in `demoted`). With no results to read, the rule is
    /// reported as not checked and the class stays as declared.
    fn pause_test(&mut self, e: &Entry<'_>, what: &str, resource: &str, version: u32, checks: &Checks) -> Option<String> {
        let n = &e.name;
        let (records, now_unix_ms) = match &checks.pause_tests {
            PauseTests::NotAvailable { reason } => {
                self.unchecked.push(Problem {
                    file: e.file.to_string(),
                    line: e.line,
                    rule: Rule::FencedWithoutPauseTest,
                    message: format!("{what} is fenced; whether a passing pause-test result is recorded for it was NOT checked: {reason}"),
                });
                return None;
            }
            PauseTests::Read { records, now_unix_ms } => (records, *now_unix_ms),
        };
        let mine: Vec<&PauseTestRecord> = records.iter().filter(|r| r.class == *n).collect();
        let why_not = |r: &PauseTestRecord| -> Option<String> {
            if r.resource != resource {
                return Some(format!("{}: the result is for another resource than the class names ({resource:?})", r.resource));
            }
            if let Some(why) = r.invalid_because(now_unix_ms, version) {
                return Some(format!("{}: {why} (the class declares resource_schema_version = {version})", r.resource));
            }
            (r.outcome != PauseTestOutcome::Pass).then(|| format!("{}: the test failed ({})", r.resource, r.reason))
        };
        if mine.iter().any(|r| why_not(r).is_none()) {
            return None;
        }
        let why = if mine.is_empty() {
            format!("no pause-test result is recorded for it (nothing under {PAUSETEST_PREFIX}{n}/)")
        } else {
            let each: Vec<String> = mine.iter().filter_map(|r| why_not(r)).collect();
            format!("no pause-test result for it counts ({})", each.join("; "))
        };
        self.demoted.push(Problem {
            file: e.file.to_string(),
            line: e.line,
            rule: Rule::FencedWithoutPauseTest,
            message: format!(
                "{what} is fenced, but {why}: it is DEMOTED, published as advisory with no risk owner, until \
                 `holdfast-pausetest run --class {n} --resource URL ...` passes against {resource:?} at schema version {version}"
            ),
        });
        Some(why)
    }

    fn grant<'a>(&mut self, e: Entry<'a>) -> RawGrant<'a> {
        let before = self.problems.len();
        let n = e.name.clone();
        let what = format!("grant {n:?}");
        if !is_name(&n) {
            self.push(
                e.file,
                e.line,
                Rule::InvalidName,
                format!("[grant.{n}]: {n:?} is not a grant name; use 1..=63 of a-z, 0-9 and '-', not starting or ending with '-'"),
            );
        }
        let f = self.fields(&e, &what, GRANT_KEYS);
        let identity = match f.get("identity") {
            None => {
                self.push(e.file, e.line, Rule::InvalidIdentity, format!(
                    "{what} has no identity; add identity = \"spiffe://TRUST-DOMAIN/PATH\" (one workload) or a prefix ending in \"/\" (every workload under it)"
                ));
                None
            }
            Some(v) => match self.string(&e, &what, "identity", v) {
                None => None,
                Some(id) => match spiffe_problem(id) {
                    None => Some(id.to_string()),
                    Some(why) => {
                        self.at(&e, v.span(), Rule::InvalidIdentity, format!(
                            "{what}: identity {id:?} is not a SPIFFE ID or ID prefix: {why}; write one ID, e.g. \
                             \"spiffe://holdfast.dev/ns/payments/sa/ledger\", or a prefix ending in \"/\", e.g. \"spiffe://holdfast.dev/ns/payments/\""
                        ));
                        None
                    }
                },
            },
        };
        let mut namespaces = Vec::new();
        let mut lists: [Vec<String>; 3] = Default::default();
        for (i, perm) in ["lock", "inspect", "force_release"].into_iter().enumerate() {
            let Some(v) = f.get(perm) else { continue };
            let Some(items) = v.get_ref().as_array() else {
                self.at(
                    &e,
                    v.span(),
                    Rule::InvalidValue,
                    format!("{what}: {perm} must be a list of key prefixes, e.g. {perm} = [\"payments/\"], not {}", a(v.get_ref())),
                );
                continue;
            };
            for item in items.iter() {
                let Some(prefix) = self.string(&e, &what, perm, item) else { continue };
                match key_prefix(prefix) {
                    Ok(ns) => {
                        namespaces.push((ns, e.file, line_of(e.text, item.span().start), perm, prefix.to_string()));
                        lists[i].push(prefix.to_string());
                    }
                    Err(why) => self.at(
                        &e,
                        item.span(),
                        Rule::InvalidKeyPrefix,
                        format!(
                            "{what}: {perm} prefix {prefix:?} is not a key prefix: {why}; write \"NAMESPACE/\" for a whole namespace \
                         or \"NAMESPACE/KEY-PREFIX\", e.g. \"payments/\" or \"payments/ledger-\""
                        ),
                    ),
                }
            }
        }
        let declared_any = ["lock", "inspect", "force_release"]
            .into_iter()
            .filter_map(|k| f.get(k))
            .any(|v| v.get_ref().as_array().is_none_or(|a| !a.is_empty()));
        if !declared_any {
            self.push(e.file, e.line, Rule::GrantWithoutPermission, format!(
                "{what} gives no permission; list key prefixes under lock, inspect or force_release (e.g. lock = [\"payments/\"]), or delete the grant"
            ));
        }
        let [lock, inspect, force_release] = lists;
        let grant = match (self.problems.len() == before, identity) {
            (true, Some(identity)) => Some(Grant { name: n.clone(), identity, lock, inspect, force_release }),
            _ => None,
        };
        RawGrant { file: e.file, line: e.line, name: n, namespaces, grant }
    }
}

/// "a string", "an integer"…: a value's TOML type with its article.
fn a(v: &DeValue<'_>) -> String {
    let t = v.type_str();
    if t.starts_with(['a', 'e', 'i', 'o', 'u']) { format!("an {t}") } else { format!("a {t}") }
}

/// 1..=63 of `a-z 0-9 -`, not starting or ending with `-` (the rule for
/// class, grant and region names).
fn is_name(s: &str) -> bool {
    layout::validate_class(s).is_ok()
}

/// Why `ns` is not a namespace, by the lock key rules of `holdfast_model`.
/// Why `r` cannot be a class's `resource`, if it cannot: empty, with
/// whitespace, or carrying credentials (a class file is no place for a
/// password, and `holdfast-pausetest` names resources without them).
fn resource_problem(r: &str) -> Option<String> {
    if r.is_empty() {
        return Some("is empty; name the resource as `holdfast-pausetest status --json` prints it (\"resource\")".into());
    }
    if r.chars().any(char::is_whitespace) {
        return Some(format!("{r:?} contains whitespace; name the resource as `holdfast-pausetest status --json` prints it"));
    }
    if let Some((scheme, rest)) = r.split_once("://")
        && rest.split(['/', '?']).next().unwrap_or("").contains('@')
    {
        // The value is not repeated: it holds a secret.
        return Some(format!(
            "(a {scheme}:// URL) carries credentials; leave out USER:PASSWORD@ (pause-test results name resources without them)"
        ));
    }
    None
}

fn namespace_problem(ns: &str) -> Option<String> {
    match holdfast_model::LockKey::new(ns, "k") {
        Ok(_) => None,
        Err(e) if ns.contains('/') => {
            Some(format!("{}; namespaces do not nest: use the first segment as the namespace and grant key prefixes below it", e.message))
        }
        Err(e) => Some(e.message),
    }
}

/// The namespace of a grant's key prefix (`ns/` or `ns/key-prefix`), or why
/// it is not one.
fn key_prefix(prefix: &str) -> Result<String, String> {
    let Some((ns, rest)) = prefix.split_once('/') else {
        return Err(format!("it has no \"/\" (for the whole namespace write \"{prefix}/\")"));
    };
    if let Some(why) = namespace_problem(ns) {
        return Err(format!("namespace {why}"));
    }
    if !rest.is_empty() {
        let key = rest.strip_suffix('/').unwrap_or(rest);
        if key.is_empty() {
            return Err("it has an empty key segment (\"//\")".into());
        }
        if let Err(e) = holdfast_model::LockKey::new(ns, key) {
            return Err(format!("the key part {}", e.message));
        }
    }
    Ok(ns.to_string())
}

/// Why `id` is neither a SPIFFE ID (`spiffe://trust-domain/path`) nor a
/// prefix of SPIFFE IDs ending in `/`, by the SPIFFE ID specification's
/// character rules.
pub fn spiffe_problem(id: &str) -> Option<String> {
    if id.len() > 2048 {
        return Some(format!("it is {} bytes; a SPIFFE ID has at most 2048", id.len()));
    }
    let Some(rest) = id.strip_prefix("spiffe://") else {
        return Some("it does not start with \"spiffe://\"".into());
    };
    let (td, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if td.is_empty() {
        return Some("it names no trust domain".into());
    }
    if !td.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')) {
        return Some(format!("the trust domain {td:?} may contain only a-z, 0-9, '.', '-' and '_'"));
    }
    if path.is_empty() {
        return Some(format!(
            "it names only a trust domain; add the workload's path, or write \"spiffe://{td}/\" to match every ID in the trust domain"
        ));
    }
    let segments = path.strip_prefix('/').unwrap_or(path);
    let segments = segments.strip_suffix('/').unwrap_or(segments);
    if segments.is_empty() {
        return None; // "spiffe://td/": every ID in the trust domain.
    }
    for segment in segments.split('/') {
        if segment.is_empty() {
            return Some("its path has an empty segment (\"//\")".into());
        }
        if segment == "." || segment == ".." {
            return Some(format!("its path has a {segment:?} segment"));
        }
        if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')) {
            return Some(format!("the path segment {segment:?} may contain only letters, digits, '.', '-' and '_'"));
        }
    }
    None
}

#[cfg(test)]
mod tests;
