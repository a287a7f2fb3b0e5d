//! What ships for monitoring (`packaging/monitoring/`): the alerting rules
//! pass `promtool check rules` and their unit tests (`promtool test rules`),
//! every alert has a `for:`, a severity and an annotation saying what to do,
//! the Grafana dashboard parses and every panel has a data source and valid
//! queries, and every metric the rules and the dashboard name is exported by
//! a running daemon (the real arbiter, controller and tailer after a
//! workload) or, for `etcd_*`, by the real etcd.
//!
//! The metric names are read from the PromQL by a small lexer
//! ([`promql_names`]): identifiers that are not functions, aggregations,
//! keywords, label names (in `{…}` or `by (…)`), strings, numbers, durations
//! or Grafana variables. A unit test shows a misspelled name is caught.

use holdfast_devkit::ports::free_port;
use holdfast_model::LockKey;
use holdfast_tests::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/monitoring")
}

fn rules_path() -> PathBuf {
    monitoring_dir().join("holdfast-alerts.yml")
}

fn dashboard_path() -> PathBuf {
    monitoring_dir().join("holdfast-dashboard.json")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Debian's `promtool` (package `prometheus`), from PATH.
fn promtool() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("promtool is missing (Debian's `prometheus` package): run scripts/install-deps, which installs it"))
}

// ---------------------------------------------------------------------------
// PromQL: the names an expression uses.

/// What a PromQL expression names.
#[derive(Debug, Default)]
struct Names {
    /// Metric names (selectors).
    metrics: BTreeSet<String>,
    /// Label names in matchers and in by/without/on/ignoring/group_* lists.
    labels: BTreeSet<String>,
    /// Each selector: its metric and the label names in its own braces.
    selectors: Vec<(String, BTreeSet<String>)>,
}

/// Aggregations, operators and modifiers: identifiers that are not metrics.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Modifiers followed by a list of label names.
const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Index after the string literal starting at `i` ("…", '…' or `…`).
fn skip_string(c: &[char], mut i: usize) -> usize {
    let quote = c[i];
    i += 1;
    while i < c.len() {
        if c[i] == '\\' && quote != '`' {
            i += 2;
        } else if c[i] == quote {
            return i + 1;
        } else {
            i += 1;
        }
    }
    c.len()
}

fn skip_space(c: &[char], mut i: usize) -> usize {
    while i < c.len() && c[i].is_whitespace() {
        i += 1;
    }
    i
}

fn read_ident(c: &[char], mut i: usize) -> (String, usize) {
    let start = i;
    while i < c.len() && ident_char(c[i]) {
        i += 1;
    }
    (c[start..i].iter().collect(), i)
}

/// The label names of the matchers `{…}` starting at `i`, and the index
/// after the closing brace.
fn matchers(c: &[char], mut i: usize) -> (BTreeSet<String>, usize) {
    let mut labels = BTreeSet::new();
    i += 1;
    while i < c.len() {
        match c[i] {
            '}' => return (labels, i + 1),
            '"' | '\'' | '`' => i = skip_string(c, i),
            ch if ident_start(ch) => {
                let (name, next) = read_ident(c, i);
                labels.insert(name);
                i = next;
            }
            _ => i += 1,
        }
    }
    (labels, i)
}

/// The metric and label names `expr` uses. Grafana variables (`$cluster`,
/// `${x}`, `$__rate_interval`) are skipped like literals.
fn promql_names(expr: &str) -> Names {
    let c: Vec<char> = expr.chars().collect();
    let mut n = Names::default();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '"' || ch == '\'' || ch == '`' {
            i = skip_string(&c, i);
        } else if ch == '$' {
            i += 1;
            if c.get(i) == Some(&'{') {
                while i < c.len() && c[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < c.len() && ident_char(c[i]) {
                    i += 1;
                }
            }
        } else if ch == '[' {
            // A range or subquery: durations and variables only.
            while i < c.len() && c[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if ch == '{' {
            // A selector without a metric name.
            let (labels, next) = matchers(&c, i);
            n.labels.extend(labels.iter().cloned());
            n.selectors.push((String::new(), labels));
            i = next;
        } else if ch.is_ascii_digit() || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number or a duration (0.99, 1e3, 0x1f, 5m).
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.' || c[i] == '_') {
                i += 1;
            }
        } else if ident_start(ch) {
            let (ident, next) = read_ident(&c, i);
            let after = skip_space(&c, next);
            let paren = c.get(after) == Some(&'(');
            if GROUPING.contains(&ident.as_str()) && paren {
                let mut j = after + 1;
                while j < c.len() && c[j] != ')' {
                    if ident_start(c[j]) {
                        let (label, k) = read_ident(&c, j);
                        n.labels.insert(label);
                        j = k;
                    } else {
                        j += 1;
                    }
                }
                i = j + 1;
            } else if paren || KEYWORDS.contains(&ident.as_str()) {
                // A function or an aggregation (its arguments are read next),
                // or an operator.
                i = next;
            } else {
                n.metrics.insert(ident.clone());
                let mut labels = BTreeSet::new();
                i = next;
                if c.get(after) == Some(&'{') {
                    let (l, k) = matchers(&c, after);
                    labels = l;
                    i = k;
                }
                n.labels.extend(labels.iter().cloned());
                n.selectors.push((ident, labels));
            }
        } else {
            i += 1;
        }
    }
    n
}

/// A Grafana template query: `label_values(METRIC_SELECTOR, LABEL)`,
/// `label_values(LABEL)`, else PromQL (`query_result(…)`).
fn template_query_names(q: &str) -> Names {
    let q = q.trim();
    if let Some(args) = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
        let (selector, label) = match args.rsplit_once(',') {
            Some((s, l)) => (Some(s), l),
            None => (None, args),
        };
        let mut n = selector.map(promql_names).unwrap_or_default();
        n.labels.insert(label.trim().to_string());
        return n;
    }
    promql_names(q.strip_prefix("query_result(").and_then(|r| r.strip_suffix(')')).unwrap_or(q))
}

// ---------------------------------------------------------------------------
// The Prometheus text format: what a /metrics page exports.

/// A scraped exposition: each family's type (from `# TYPE`) and each sample
/// name with the label names its samples carry.
struct Exposition {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, BTreeSet<String>>,
}

impl Exposition {
    fn parse(text: &str) -> Self {
        let mut types = BTreeMap::new();
        let mut samples: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    types.insert(name.to_string(), kind.trim().to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let labels = samples.entry(line[..end].to_string()).or_default();
            if line[end..].starts_with('{') {
                let c: Vec<char> = line[end..].chars().collect();
                labels.extend(matchers(&c, 0).0);
            }
        }
        Exposition { types, samples }
    }

    /// Whether `name` is a series this exposition serves: a sample name, or
    /// a declared family's name with its type's suffix (counter `_total`,
    /// histogram `_bucket`/`_sum`/`_count`, summary `_sum`/`_count`). (The
    /// daemons' prometheus-client writes no `# TYPE` for a family without a
    /// label set yet, so the workload below creates them.)
    fn exports(&self, name: &str) -> bool {
        if self.samples.contains_key(name) {
            return true;
        }
        self.types.iter().any(|(base, kind)| {
            let suffixes: &[&str] = match kind.as_str() {
                "counter" => &["_total"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            suffixes.iter().any(|s| name.strip_prefix(base.as_str()) == Some(*s))
        })
    }
}

/// The used names `expositions` (by metric-name prefix) do not export.
fn missing(used: &BTreeSet<String>, expositions: &[(&str, &Exposition)]) -> Vec<String> {
    used.iter()
        .filter(|name| match expositions.iter().find(|(prefix, _)| name.starts_with(prefix)) {
            Some((_, e)) => !e.exports(name),
            None => true,
        })
        .cloned()
        .collect()
}

// ---------------------------------------------------------------------------
// The rule file, read line by line (it is written in one plain style: one
// `- alert:` per rule, `expr:` inline or as a block scalar). The count is
// checked against promtool's, so a rule the reader missed fails the test.

#[derive(Debug)]
struct Rule {
    name: String,
    expr: String,
    /// The rule's lines, for the for/severity/annotation checks.
    lines: Vec<String>,
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn parse_rules(text: &str) -> Vec<Rule> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rules: Vec<Rule> = Vec::new();
    let mut current: Option<Rule> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let t = line.trim();
        if let Some(name) = t.strip_prefix("- alert:").or_else(|| t.strip_prefix("- record:")) {
            rules.extend(current.take());
            current = Some(Rule { name: name.trim().to_string(), expr: String::new(), lines: Vec::new() });
        } else if t.starts_with("- name:") {
            rules.extend(current.take());
        }
        if let Some(rule) = current.as_mut() {
            rule.lines.push(line.to_string());
            if let Some(value) = t.strip_prefix("expr:") {
                let value = value.trim();
                if value.starts_with('|') || value.starts_with('>') {
                    let mut body = Vec::new();
                    while i + 1 < lines.len() && (lines[i + 1].trim().is_empty() || indent(lines[i + 1]) > indent(line)) {
                        i += 1;
                        body.push(lines[i].trim());
                        rule.lines.push(lines[i].to_string());
                    }
                    rule.expr = body.join("\n");
                } else if value.starts_with('"') {
                    rule.expr = serde_json::from_str(value).unwrap_or_else(|e| panic!("expr {value}: {e}"));
                } else if let Some(v) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
                    rule.expr = v.replace("''", "'");
                } else {
                    rule.expr = value.to_string();
                }
            }
        }
        i += 1;
    }
    rules.extend(current);
    rules
}

/// (where, query) pairs.
type Queries = Vec<(String, String)>;

/// Every PromQL query of the dashboard: (where, query), panels' targets and
/// the template variables' queries separately.
fn dashboard_queries(dash: &serde_json::Value) -> (Queries, Queries) {
    let mut targets = Vec::new();
    let mut panels: Vec<&serde_json::Value> = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            targets.push((format!("panel {:?} target {}", p["title"], t["refId"]), expr.to_string()));
        }
    }
    let mut templates = Vec::new();
    for v in dash["templating"]["list"].as_array().expect("templating.list") {
        if v["type"] == "query" {
            let q = v["query"]["query"].as_str().or_else(|| v["query"].as_str()).unwrap_or_default();
            templates.push((format!("variable {}", v["name"]), q.to_string()));
        }
    }
    (targets, templates)
}

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read(&dashboard_path())).unwrap_or_else(|e| panic!("{}: not JSON: {e}", dashboard_path().display()))
}

/// Every (where, names) of the rules and the dashboard.
fn everything_used() -> Vec<(String, Names)> {
    let mut used = Vec::new();
    for rule in parse_rules(&read(&rules_path())) {
        used.push((format!("alert {}", rule.name), promql_names(&rule.expr)));
    }
    let (targets, templates) = dashboard_queries(&dashboard());
    used.extend(targets.into_iter().map(|(w, q)| (w, promql_names(&q))));
    used.extend(templates.into_iter().map(|(w, q)| (w, template_query_names(&q))));
    used
}

/// Label names the metrics carry: holdfast's four (docs: metrics.rs of each
/// daemon), the histogram bucket bound, and the two Prometheus adds to every
/// scraped series.
const LABELS: &[&str] = &["namespace", "class", "tier", "cluster", "le", "instance", "job"];

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------

#[test]
fn the_name_reader_finds_metrics_and_nothing_else() {
    let n = promql_names(
        r#"histogram_quantile(0.99, sum by (cluster, le) (rate(holdfast_arbiter_grant_latency_seconds_bucket{cluster=~"$cluster", tier!="x"}[$__rate_interval]))) > 1e-3"#,
    );
    assert_eq!(n.metrics, set(&["holdfast_arbiter_grant_latency_seconds_bucket"]));
    assert_eq!(n.labels, set(&["cluster", "le", "tier"]));
    let n = promql_names(
        r#"max by (cluster) (a_total offset 5m) / on(instance) group_left(namespace) b unless c{job="x"} or label_replace(d, "dst", "$1", "src", "(.*)") and sum without (le) (e) > bool 0.5"#,
    );
    assert_eq!(n.metrics, set(&["a_total", "b", "c", "d", "e"]));
    assert_eq!(n.labels, set(&["cluster", "instance", "namespace", "job", "le"]));
    let n = template_query_names("label_values(holdfast_arbiter_sealed{cluster!=\"\"}, cluster)");
    assert_eq!(n.metrics, set(&["holdfast_arbiter_sealed"]));
    assert_eq!(n.labels, set(&["cluster"]));
}

/// The check fails on a misspelled name, on the wrong suffix for the type,
/// and on a name no daemon's prefix owns; it accepts a family declared with
/// no samples yet (a label set not created).
#[test]
fn a_misspelled_metric_name_is_reported_missing() {
    let text = "# HELP holdfast_arbiter_acquire_granted Acquires that were granted.\n\
                # TYPE holdfast_arbiter_acquire_granted counter\n\
                holdfast_arbiter_acquire_granted_total{namespace=\"a\",class=\"a\",tier=\"entity\",cluster=\"t\"} 2\n\
                # TYPE holdfast_arbiter_grant_latency_seconds histogram\n\
                # UNIT holdfast_arbiter_grant_latency_seconds seconds\n\
                # TYPE holdfast_arbiter_sealed gauge\n\
                holdfast_arbiter_sealed{cluster=\"t\"} 0\n";
    let e = Exposition::parse(text);
    let check = |expr: &str| missing(&promql_names(expr).metrics, &[("holdfast_arbiter_", &e)]);
    assert!(check(r#"sum(rate(holdfast_arbiter_acquire_granted_total{cluster=~"$cluster"}[5m]))"#).is_empty());
    assert!(check("histogram_quantile(0.99, rate(holdfast_arbiter_grant_latency_seconds_bucket[5m]))").is_empty());
    assert!(check("holdfast_arbiter_sealed == 1").is_empty());
    assert_eq!(check("rate(holdfast_arbiter_acquire_grantd_total[5m])"), ["holdfast_arbiter_acquire_grantd_total"]);
    assert_eq!(check("rate(holdfast_arbiter_acquire_granted[5m])"), ["holdfast_arbiter_acquire_granted"]);
    assert_eq!(check("holdfast_arbiter_sealed_total"), ["holdfast_arbiter_sealed_total"]);
    assert_eq!(check("holdfast_arbiter_grant_latency_seconds_total"), ["holdfast_arbiter_grant_latency_seconds_total"]);
    assert_eq!(check("holdfst_arbiter_sealed == 1"), ["holdfst_arbiter_sealed"]);
    assert_eq!(e.samples["holdfast_arbiter_acquire_granted_total"], set(&["class", "cluster", "namespace", "tier"]));
}

#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let promtool = promtool();
    let check = Ran::of(Command::new(&promtool).arg("check").arg("rules").arg(rules_path()));
    assert_eq!(check.code, 0, "promtool check rules:\n{check}");
    let found: usize = check
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("SUCCESS: ")?.strip_suffix(" rules found")?.parse().ok())
        .unwrap_or_else(|| panic!("no rule count in:\n{check}"));
    let rules = parse_rules(&read(&rules_path()));
    assert_eq!(rules.len(), found, "this test read {} rules, promtool {found}: {rules:#?}", rules.len());
    eprintln!("promtool check rules: {found} rules");

    // Each alert: a `for:`, a severity, a summary and what to do next.
    for rule in &rules {
        assert!(!rule.expr.trim().is_empty(), "{}: empty expr", rule.name);
        let has = |prefix: &str| rule.lines.iter().any(|l| l.trim().starts_with(prefix));
        assert!(has("for:"), "{} has no `for:`", rule.name);
        assert!(has("severity: critical") || has("severity: warning"), "{} has no severity critical|warning", rule.name);
        assert!(has("summary:") && has("description:"), "{} lacks a summary or a description", rule.name);
        eprintln!("  {:34} {}", rule.name, rule.expr.replace('\n', " "));
    }
    // What issue 17 asks to alert on, each by the metric it rests on.
    let all: BTreeSet<String> = rules.iter().flat_map(|r| promql_names(&r.expr).metrics).collect();
    for needed in [
        "holdfast_arbiter_sealed",
        "holdfast_controller_published_version",
        "holdfast_controller_refusals_total",
        "holdfast_controller_demoted_classes",
        "holdfast_tailer_lag_alarm",
        "holdfast_tailer_gap_alarm",
        "holdfast_arbiter_renewal_failures_total",
        "holdfast_arbiter_expiries_without_release_total",
        "holdfast_arbiter_fail_open",
        "etcd_disk_wal_fsync_duration_seconds_bucket",
    ] {
        assert!(all.contains(needed), "no alert uses {needed}");
    }
    // The design's bound on fsync p99: 2 ms (adrs.txt).
    let fsync = rules.iter().find(|r| r.expr.contains("etcd_disk_wal_fsync_duration_seconds_bucket")).expect("fsync alert");
    assert!(fsync.expr.contains("histogram_quantile(0.99") && fsync.expr.trim_end().ends_with("> 0.002"), "{fsync:?}");

    let test = Ran::of(Command::new(&promtool).current_dir(monitoring_dir()).args(["test", "rules", "holdfast-alerts.test.yml"]));
    assert_eq!(test.code, 0, "promtool test rules:\n{test}");
    assert!(format!("{}{}", test.stdout, test.stderr).contains("SUCCESS"), "{test}");
    eprintln!("promtool test rules holdfast-alerts.test.yml: SUCCESS");
}

#[test]
fn the_dashboard_parses_and_every_panel_has_a_data_source_and_a_valid_query() {
    let dash = dashboard();
    assert!(dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion {}", dash["schemaVersion"]);
    let vars = dash["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name} variable"));
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    assert_eq!(var("cluster")["type"], "query");
    assert_eq!(var("cluster")["datasource"]["uid"], "${datasource}");

    let mut checked = 0;
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for p in dash["panels"].as_array().expect("panels") {
        if p["type"] == "row" {
            continue;
        }
        let title = &p["title"];
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {title}: data source");
        assert_eq!(p["datasource"]["type"], "prometheus", "panel {title}: data source type");
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel {title}: no targets"));
        assert!(!targets.is_empty(), "panel {title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "panel {title}: an empty query");
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {title}: target data source");
            // Every holdfast selector follows the cluster variable.
            for (metric, labels) in promql_names(expr).selectors {
                if metric.starts_with("holdfast_") {
                    assert!(labels.contains("cluster") && expr.contains("$cluster"), "panel {title}: {metric} ignores $cluster");
                }
            }
            // Valid PromQL: each query as a recording rule, Grafana's
            // variables replaced by what they expand to.
            let promql = expr.replace("$__rate_interval", "5m").replace("$cluster", ".*").replace("$etcd", ".*");
            rules.push_str(&format!(
                "      - record: dashboard:query_{checked}\n        expr: {}\n",
                serde_json::to_string(&promql).unwrap()
            ));
            checked += 1;
        }
    }
    let dir = TestDir::new("dashboard-promql");
    let file = dir.path.join("dashboard-queries.yml");
    std::fs::write(&file, &rules).unwrap();
    let out = Ran::of(Command::new(promtool()).arg("check").arg("rules").arg(&file));
    assert_eq!(out.code, 0, "a dashboard query is not valid PromQL:\n{out}\n{rules}");
    assert!(out.stdout.contains(&format!("SUCCESS: {checked} rules found")), "{out}");
    eprintln!("dashboard: {checked} queries, each valid PromQL (promtool)");
}

#[test]
fn the_rules_and_the_dashboard_use_only_labels_the_metrics_carry() {
    for (place, names) in everything_used() {
        assert!(!names.metrics.is_empty(), "{place}: no metric");
        for label in &names.labels {
            assert!(LABELS.contains(&label.as_str()), "{place}: label {label:?} is not one the metrics carry ({LABELS:?})");
        }
    }
}

/// Sends SIGCONT to a stopped process when dropped, also when an assertion
/// fails while it is stopped.
struct Thaw(u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        sigcont(self.0);
    }
}

/// Waits (20 s at most) until the sample `series` on `port` is at least `at_least`.
async fn wait_for_sample(port: u16, series: &str, at_least: f64, what: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape(port).await;
        if sample_opt(&text, series).is_some_and(|v| v >= at_least) {
            return;
        }
        assert!(std::time::Instant::now() < end, "{what}: {series} not at {at_least} after 20 s:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_metric_the_rules_and_the_dashboard_use_is_exported_by_a_running_daemon() {
    // The real etcd, controller (the lab class set) and arbiter, and a tailer.
    let app = Appliance::start("monitoring", 1).await;
    let store = app.dir.path.join("audit");
    let tailer_port = free_port();
    let _tailer = start_tailer(&app.dir.path, "tailer", app.etcd.config(), &store, tailer_port);

    // A workload, so the label sets created at a counter's first event
    // exist: grants, a contended acquire that waits, a leaked one (the same
    // identity through another session), a denied one (no class),
    // ValidateToken answers, releases.
    let a = app.client("svc/a").await;
    let b = app.client("svc/b").await;
    let opened = std::time::Instant::now();
    let sa = a.open_session(Duration::from_secs(10)).await.unwrap();
    let sa2 = a.open_session(Duration::from_secs(10)).await.unwrap();
    let sb = b.open_session(Duration::from_secs(10)).await.unwrap();
    let k = LockKey::parse("metrics/monitoring").unwrap();
    let h = sa.acquire(&k, Duration::ZERO).await.unwrap();
    assert!(sb.acquire(&k, Duration::from_millis(300)).await.is_err(), "contention");
    assert!(sa2.acquire(&k, Duration::ZERO).await.is_err(), "a leaked hold");
    assert!(sa.acquire(&LockKey::parse("no-such-class/k").unwrap(), Duration::ZERO).await.is_err(), "denied");
    let token = h.token();
    assert!(a.validate_token(&k, token).await.unwrap(), "the holder's token");
    h.release().await.unwrap();
    assert!(!a.validate_token(&k, token).await.unwrap(), "a released token");
    sb.acquire(&k, Duration::ZERO).await.unwrap().release().await.unwrap();
    tailer_caught_up(&app.etcd, &store).await;

    // etcd frozen: the arbiter stops serving (an acquire is refused as
    // sealed/unavailable, ValidateToken is refused) and a keepalive fails.
    // The sessions' keepalive streams are open by now (a round every TTL/3).
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(opened.elapsed())).await;
    let etcd_pid = app.etcd.pid(0).expect("etcd running");
    sigstop(etcd_pid);
    let thawed = Thaw(etcd_pid);
    // holdfast_arbiter_sealed (what HoldfastArbiterSealed watches) is 1
    // while the arbiter cannot verify etcd.
    wait_for_sample(app.arbiter.metrics_port, "holdfast_arbiter_sealed{cluster=\"test\"}", 1.0, "the arbiter stops serving").await;
    assert!(sa.acquire(&k, Duration::ZERO).await.is_err(), "acquire while etcd is frozen");
    assert!(a.validate_token(&k, token).await.is_err(), "ValidateToken while etcd is frozen");
    wait_for_sample(app.arbiter.metrics_port, "holdfast_arbiter_renewal_failures_total{cluster=\"test\"}", 1.0, "a failed keepalive").await;
    drop(thawed);
    app.arbiter.wait_sealed(&a, false, Duration::from_secs(30)).await;
    // The holds gauges are exported every 2 s.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // The controller's metrics port is in the config the fixture wrote.
    let controller_toml = read(&app.dir.path.join("controller.toml"));
    let controller_port: u16 = controller_toml
        .lines()
        .find_map(|l| l.trim().strip_prefix("metrics_listen")?.split('"').nth(1)?.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no metrics_listen in controller.toml:\n{controller_toml}"))
        .port();
    let etcd_port = app.etcd.spec.members[0].client_port;

    let arbiter = Exposition::parse(&scrape(app.arbiter.metrics_port).await);
    let controller = Exposition::parse(&scrape(controller_port).await);
    let tailer = Exposition::parse(&scrape(tailer_port).await);
    let etcd = Exposition::parse(&scrape(etcd_port).await);
    let expositions =
        [("holdfast_arbiter_", &arbiter), ("holdfast_controller_", &controller), ("holdfast_tailer_", &tailer), ("etcd_", &etcd)];
    for (prefix, e) in &expositions {
        assert!(e.samples.keys().any(|s| s.starts_with(prefix)), "no {prefix}* sample scraped");
    }

    let used = everything_used();
    let names: BTreeSet<String> = used.iter().flat_map(|(_, n)| n.metrics.iter().cloned()).collect();
    eprintln!("{} metric names used by the rules and the dashboard:", names.len());
    for name in &names {
        let (prefix, e) = expositions.iter().find(|(p, _)| name.starts_with(p)).map(|(p, e)| (*p, Some(*e))).unwrap_or(("?", None));
        let how = match e {
            Some(e) if e.samples.contains_key(name) => "sampled",
            Some(e) if e.exports(name) => "declared (no label set yet)",
            _ => "MISSING",
        };
        eprintln!("  {name:55} {prefix:22} {how}");
    }
    let gone = missing(&names, &expositions);
    let mut report = String::new();
    for name in &gone {
        let users: Vec<&str> = used.iter().filter(|(_, n)| n.metrics.contains(name)).map(|(w, _)| w.as_str()).collect();
        report.push_str(&format!("  {name} (used by {})\n", users.join(", ")));
    }
    assert!(gone.is_empty(), "metrics used but exported by no daemon (misspelled, or not yet counted):\n{report}");

    // A selector's labels are on that metric's samples (target labels aside).
    for (place, n) in &used {
        for (metric, labels) in &n.selectors {
            let Some((_, e)) = expositions.iter().find(|(p, _)| metric.starts_with(p)) else { continue };
            let Some(carried) = e.samples.get(metric) else { continue };
            for l in labels.iter().filter(|l| !["instance", "job"].contains(&l.as_str())) {
                assert!(carried.contains(l), "{place}: {metric} has no label {l:?} (its samples carry {carried:?})");
            }
        }
    }
}
