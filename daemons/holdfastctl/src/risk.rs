//! `holdfastctl risk-register`: every advisory class, who owns its risk and
//! how its waiver stands. Works on a set that is invalid only because
//! waivers expired (`holdfast_policy::advisory_classes`).

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
This lists them all, soonest expiry first, with a status:

  expired   waiver_expires is before today (a waiver expiring today still
            counts, as in `class check`); `class check` now fails on it too
  expiring  it expires today or within --warn-days days
  ok        later

\"Today\" is the UTC date, or --today. The register reads the classes even when
the directory fails validation only because waivers expired (that is what it
is for); any other problem stops it (exit 65).

It reads the class set from DIR on this host (the files the controller
publishes from), not from etcd. The holdfastctl package ships a daily timer:
holdfast-risk-register.timer starts holdfast-risk-register.service, which
runs `holdfastctl risk-register --dir /etc/holdfast` as user
holdfast-controller and fails whenever this exits non-zero: alert on that
unit's failed state. Enable it on one host that has the class set:
  systemctl enable --now holdfast-risk-register.timer
Run it by hand before renewing waivers, or with --today to see what will
have expired by a date.

Output: a table (CLASS, NAMESPACE, RISK OWNER, WAIVER EXPIRES, DAYS LEFT,
STATUS; DAYS LEFT is negative once expired) and a summary line. --json prints
an array of objects, in the same order: class, namespace, risk_owner,
waiver_expires (YYYY-MM-DD), days_left, status. With --audit-store (or
HOLDFAST_AUDIT_STORE) a GRANTS column (`grants` in JSON) counts the grants
the audit tailer recorded for each class: how much the unfenced class is used.

Examples:
  holdfastctl risk-register
  holdfastctl risk-register --dir ./policy --warn-days 60 --json
  holdfastctl risk-register --dir ./policy --today 2027-01-01
  holdfastctl risk-register --audit-store /var/lib/holdfast/audit

Exit status:
  0   no waiver has expired (some may be expiring)
  1   at least one waiver has expired
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
}

/// One row of the register.
struct Row<'a> {
    class: &'a Class,
    risk_owner: &'a str,
    expires: Date,
    days_left: i64,
    status: WaiverStatus,
    /// Grants recorded in the audit store (with --audit-store).
    grants: Option<u64>,
}

pub fn run(args: RiskArgs) -> u8 {
    let dir = args.dir.display().to_string();
    let today = args.today.unwrap_or_else(Date::today_utc);
    let sources = match Sources::read(&args.dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::CONFIG;
        }
    };
    let classes = match holdfast_policy::advisory_classes(&sources, today) {
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
        .filter_map(|class| match &class.enforcement {
            Enforcement::Advisory { risk_owner, waiver_expires } => Some(Row {
                class,
                risk_owner,
                expires: *waiver_expires,
                days_left: today.days_until(*waiver_expires),
                status: waiver_status(*waiver_expires, today, args.warn_days),
                grants: grants.as_ref().map(|g| g.get(&class.name).copied().unwrap_or(0)),
            }),
            Enforcement::Fenced => None,
        })
        .collect();
    if args.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let mut v = serde_json::json!({
                    "class": r.class.name,
                    "namespace": r.class.namespace,
                    "risk_owner": r.risk_owner,
                    "waiver_expires": r.expires,
                    "days_left": r.days_left,
                    "status": r.status,
                });
                if let Some(g) = r.grants {
                    v["grants"] = g.into();
                }
                v
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        print!("{}", table(&dir, today, args.warn_days, &rows));
    }
    if rows.iter().any(|r| r.status == WaiverStatus::Expired) { EXPIRED } else { exit::OK }
}

fn table(dir: &str, today: Date, warn_days: u32, rows: &[Row<'_>]) -> String {
    if rows.is_empty() {
        return format!("{dir}: no advisory class, so the risk register is empty (today is {today}, UTC)\n");
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
            let mut row = vec![
                r.class.name.clone(),
                r.class.namespace.clone(),
                r.risk_owner.to_string(),
                r.expires.to_string(),
                r.days_left.to_string(),
            ];
            if let Some(g) = r.grants {
                row.push(g.to_string());
            }
            row.push(r.status.as_str().to_string());
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
    let count = |s: WaiverStatus| rows.iter().filter(|r| r.status == s).count();
    let expired = count(WaiverStatus::Expired);
    out.push_str(&format!(
        "{dir}: {} advisory class(es) on {today} (UTC): {expired} expired, {} expiring within {warn_days} day(s), {} ok",
        rows.len(),
        count(WaiverStatus::Expiring),
        count(WaiverStatus::Ok)
    ));
    if expired > 0 {
        out.push_str("; for each expired class: fence it, or have its risk owner renew the waiver with a later waiver_expires");
    }
    out.push('\n');
    out
}
