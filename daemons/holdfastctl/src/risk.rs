//! `holdfastctl risk-register`: every advisory class, who owns its risk and
//! how its waiver stands, and, with the pause-test results read from etcd,
//! every fenced class the controller demotes. Works on a set that is invalid
//! only because waivers expired (`holdfast_policy::advisory_classes`).

use holdfast_cli::exit;
use holdfast_policy::source::DEFAULT_DIR;
use holdfast_policy::{Class, Date, Enforcement, Sources, WaiverStatus, waiver_status};
use std::path::PathBuf;

/// Exit status when at least one waiver has expired.
pub const EXPIRED: u8 = 1;

pub const RISK_HELP: &str = "\
An advisory class has no fence: a paused holder can still write after its
lease ends. Each one names a risk_owner, the team that accepts that risk, and
a waiver_expires date by which the class is fenced or the waiver renewed.
A fenced class whose pause test no longer counts (none recorded for the
resource it names at the schema version it declares, failed, or expired) is
published DEMOTED to advisory, and no one has accepted that risk. This lists
them all, demoted classes first, then soonest expiry first, with a status:

  demoted   declared fenced, advisory in force (only with --etcd-endpoint,
            which reads the pause-test results the controller reads); run
            holdfast-pausetest against its resource until it passes
  expired   waiver_expires is before today (a waiver expiring today still
            counts, as in `class check`); `class check` now fails on it too
  expiring  it expires today or within --warn-days days
  ok        later

\"Today\" is the UTC date, or --today. The register reads the classes even when
the directory fails validation only because waivers expired (that is what it
is for); any other problem stops it (exit 65).

It reads the class set from DIR on this host (the files the controller
publishes from) and, with --etcd-endpoint, the pause-test results under
/sys/pausetest/ (as the controller does); without it, demotions are NOT
checked and the summary says so. The holdfastctl package ships a daily timer:
holdfast-risk-register.timer starts holdfast-risk-register.service, which
runs `holdfastctl risk-register --dir /etc/holdfast` as user
holdfast-controller and fails whenever this exits non-zero: alert on that
unit's failed state. To have it list demotions too, give it the controller's
etcd client in a drop-in (systemctl edit holdfast-risk-register.service):
  [Service]
  ExecStart=
  ExecStart=/usr/bin/holdfastctl risk-register --dir /etc/holdfast \\
    --etcd-endpoint https://10.0.0.1:2379 --etcd-ca /etc/holdfast/tls/etcd-ca.pem \\
    --etcd-cert /etc/holdfast/tls/etcd-controller.pem --etcd-key /etc/holdfast/tls/etcd-controller-key.pem
The controller alerts on demotions itself (HoldfastClassDemoted). Enable the
timer on one host that has the class set:
  systemctl enable --now holdfast-risk-register.timer
Run it by hand before renewing waivers, or with --today to see what will
have expired by a date.

Output: a table (CLASS, NAMESPACE, RISK OWNER, WAIVER EXPIRES, DAYS LEFT,
STATUS; DAYS LEFT is negative once expired; a demoted class has no risk owner
and no waiver: \"-\") and a summary line. --json prints an array of objects,
in the same order: class, namespace, risk_owner, waiver_expires (YYYY-MM-DD),
days_left, status; risk_owner, waiver_expires and days_left are null for a
demoted class, which adds resource, resource_schema_version and
demoted_because. With --audit-store (or
HOLDFAST_AUDIT_STORE) a GRANTS column (`grants` in JSON) counts the grants
the audit tailer recorded for each class: how much the unfenced class is used
(a grant is recorded once its revision's holds have ended: never a live one).

Examples:
  holdfastctl risk-register
  holdfastctl risk-register --dir ./policy --warn-days 60 --json
  holdfastctl risk-register --dir ./policy --today 2027-01-01
  holdfastctl risk-register --audit-store /var/lib/holdfast/audit

Exit status:
  0   no waiver has expired (some may be expiring) and no class is demoted
  1   at least one waiver has expired, or a class is demoted
  65  the directory has problems other than expired waivers (listed on stderr)
  78  DIR, classes.d/ or grants.d/ cannot be read, or the audit store";

#[derive(clap::Args)]
pub struct RiskArgs {
    /// The policy directory holding classes.d/ and grants.d/.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Call a waiver expiring within this many days "expiring".
    #[arg(long, value_name = "D", default_value_t = 30)]
    warn_days: u32,
    /// The day to judge waivers on, YYYY-MM-DD (default: today, UTC).
    #[arg(long, value_name = "YYYY-MM-DD")]
    today: Option<Date>,
    /// Add each class's grant count from the audit tailer's store (its
    /// store_dir): how much an unfenced class is actually used.
    #[arg(long, value_name = "DIR", env = "HOLDFAST_AUDIT_STORE")]
    audit_store: Option<PathBuf>,
    #[command(flatten)]
    etcd: crate::class::PauseTestSource,
}

/// One row of the register: an advisory class (with its waiver) or a
/// demoted one (without).
struct Row<'a> {
    class: &'a Class,
    waiver: Option<Waiver<'a>>,
    /// Grants recorded in the audit store (with --audit-store).
    grants: Option<u64>,
}

struct Waiver<'a> {
    risk_owner: &'a str,
    expires: Date,
    days_left: i64,
    status: WaiverStatus,
}

impl Row<'_> {
    fn status(&self) -> &'static str {
        self.waiver.as_ref().map_or("demoted", |w| w.status.as_str())
    }
}

pub async fn run(args: RiskArgs) -> u8 {
    let dir = args.dir.display().to_string();
    let today = args.today.unwrap_or_else(Date::today_utc);
    let sources = match Sources::read(&args.dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::CONFIG;
        }
    };
    let (pause_tests, _) = args.etcd.read().await;
    let demotions_unchecked = match &pause_tests {
        holdfast_policy::PauseTests::NotAvailable { reason } => Some(reason.clone()),
        holdfast_policy::PauseTests::Read { .. } => None,
    };
    let classes = match holdfast_policy::advisory_classes(&sources, today, &pause_tests) {
        Ok(c) => c,
        Err(problems) => {
            for p in &problems {
                eprintln!("{p}");
            }
            eprintln!(
                "{dir}: INVALID: {} problem(s) besides expired waivers; the risk register needs a set that is valid apart from them: \
                 fix each and run `holdfastctl class check {dir}`",
                problems.len()
            );
            return exit::INVALID;
        }
    };
    let grants = match &args.audit_store {
        None => None,
        Some(store) => match holdfast_audit::store::read_events(store) {
            Ok(events) => Some(holdfast_audit::query::grants_by_class(&events)),
            Err(e) => {
                eprintln!("holdfastctl: --audit-store: {e}");
                return exit::CONFIG;
            }
        },
    };
    let rows: Vec<Row<'_>> = classes
        .iter()
        .filter_map(|class| {
            let waiver = match &class.enforcement {
                Enforcement::Advisory { risk_owner, waiver_expires } => Some(Waiver {
                    risk_owner,
                    expires: *waiver_expires,
                    days_left: today.days_until(*waiver_expires),
                    status: waiver_status(*waiver_expires, today, args.warn_days),
                }),
                Enforcement::Demoted { .. } => None,
                Enforcement::Fenced { .. } => return None,
            };
            Some(Row { class, waiver, grants: grants.as_ref().map(|g| g.get(&class.name).copied().unwrap_or(0)) })
        })
        .collect();
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let w = r.waiver.as_ref();
                let mut v = serde_json::json!({
                    "class": r.class.name,
                    "namespace": r.class.namespace,
                    "risk_owner": w.map(|w| w.risk_owner),
                    "waiver_expires": w.map(|w| w.expires),
                    "days_left": w.map(|w| w.days_left),
                    "status": r.status(),
                });
                if let Enforcement::Demoted { resource, schema_version, reason } = &r.class.enforcement {
                    v["resource"] = resource.as_str().into();
                    v["resource_schema_version"] = (*schema_version).into();
                    v["demoted_because"] = reason.as_str().into();
                }
                if let Some(g) = r.grants {
                    v["grants"] = g.into();
                }
                v
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        print!("{}", table(&dir, today, args.warn_days, &rows));
        match &demotions_unchecked {
            Some(why) => println!("demoted classes NOT checked: {why}"),
            None => println!("demoted classes checked against the pause-test results in etcd"),
        }
    }
    if rows.iter().any(|r| matches!(r.status(), "expired" | "demoted")) { EXPIRED } else { exit::OK }
}

fn table(dir: &str, today: Date, warn_days: u32, rows: &[Row<'_>]) -> String {
    if rows.is_empty() {
        return format!("{dir}: no advisory or demoted class, so the risk register is empty (today is {today}, UTC)\n");
    }
    let with_grants = rows.iter().any(|r| r.grants.is_some());
    let mut header = vec!["CLASS", "NAMESPACE", "RISK OWNER", "WAIVER EXPIRES", "DAYS LEFT"];
    if with_grants {
        header.push("GRANTS");
    }
    header.push("STATUS");
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let w = r.waiver.as_ref();
            let mut row = vec![
                r.class.name.clone(),
                r.class.namespace.clone(),
                w.map_or("-".into(), |w| w.risk_owner.to_string()),
                w.map_or("-".into(), |w| w.expires.to_string()),
                w.map_or("-".into(), |w| w.days_left.to_string()),
            ];
            if let Some(g) = r.grants {
                row.push(g.to_string());
            }
            row.push(r.status().to_string());
            row
        })
        .collect();
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&width).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                l.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header);
    for row in &cells {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let count = |s: &str| rows.iter().filter(|r| r.status() == s).count();
    let (expired, demoted) = (count("expired"), count("demoted"));
    if demoted > 0 {
        out.push_str(&format!("{dir}: {demoted} fenced class(es) DEMOTED to advisory, with no risk owner: \n"));
        for r in rows {
            if let Enforcement::Demoted { resource, schema_version, reason } = &r.class.enforcement {
                out.push_str(&format!(
                    "  {}: {reason}; run `holdfast-pausetest run --class {} --resource URL ...` against {resource} (schema version \
                     {schema_version}) until it passes\n",
                    r.class.name, r.class.name
                ));
            }
        }
    }
    out.push_str(&format!(
        "{dir}: {} advisory class(es) on {today} (UTC): {expired} expired, {} expiring within {warn_days} day(s), {} ok",
        rows.len() - demoted,
        count("expiring"),
        count("ok")
    ));
    if expired > 0 {
        out.push_str("; for each expired class: fence it, or have its risk owner renew the waiver with a later waiver_expires");
    }
    out.push('\n');
    out
}
