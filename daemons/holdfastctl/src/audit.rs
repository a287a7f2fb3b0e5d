//! `holdfastctl audit`: the lock history holdfast-tailer recorded, read
//! from its embedded store (`holdfast_audit::store`), filtered, as a table,
//! JSON or CSV; and the client-health reports.

use holdfast_audit::query::{self, Filter};
use holdfast_audit::{Event, Kind};
use holdfast_cli::exit;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

pub const AUDIT_HELP: &str = "\
Every grant, release, expiry, session close, force-release, epoch change,
seal, class-set change and gap the tailer recorded, oldest first. Filters
combine (all must match). Kinds:

  grant          a hold was created
  release        the holder released it
  expiry         its session lapsed (the client stopped keeping it alive) and
                 etcd deleted the hold
  close          its session was closed while holding
  withdrawal     the arbiter withdrew a grant it could not vouch for
  force-release  a two-person force-release ended it (requester, approver, reason)
  advance        an epoch advance ended it
  session-open, session-close, session-lapse, session-end (by an advance)
  wait, wait-end, epoch, seal, unseal, class-set, gap
  unprotected-grant, unprotected-release, unprotected-end
                 a grant of an on_quorum_loss = \"open\" class made from an
                 arbiter's memory, token 0, while etcd was out of its reach,
                 and its end (shipped from the arbiter's spool once etcd was
                 back); --unprotected lists exactly these
  record         any other holdfast key (markers, nonces, the watermark,
                 election keys): shown only with --all or --kind record

How a hold ended is read from etcd's log by construction, not guessed: see
holdfast_audit::classify. TIME is when the grant or force-release was
recorded by its writer, else when the tailer read the change.

The revision of a grant whose hold is still live is withheld (shown as -,
null in JSON): with the epoch it is the holder's token.

Reports (--report):
  expiries  holds that ended by expiry rather than release, per namespace
            and identity: clients that crash, hang or lose their network
            while holding
  longest   the longest holds of each namespace (--top N, default 10)

Examples:
  holdfastctl audit payments/ledger-7 --since 2026-12-01T03:00:00Z --until 2026-12-01T04:00:00Z
  holdfastctl audit --namespace payments --kind expiry --since 24h
  holdfastctl audit --identity spiffe://corp/ns/pay/sa/ledger --json
  holdfastctl audit --report expiries --since 7d
  holdfastctl audit --unprotected --since 24h      # what to reconcile after an outage
  holdfastctl audit --kind force-release --csv > force-releases.csv
  holdfastctl audit orders/ledger-7 --store /var/lib/holdfast/audit,/var/lib/holdfast/audit-coord
  holdfastctl audit export --since 365d --out grants-2026.parquet

Exit status:
  0   printed (possibly nothing matched)
  64  a bad flag value
  78  the store cannot be read (wrong --store, not created yet, corrupt)";

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    action: Option<AuditAction>,
    /// Only this lock key (`<namespace>/<key>`).
    #[arg(value_name = "KEY")]
    lock_key: Option<String>,
    /// The tailer's store_dir. Several (repeat, or separate with commas):
    /// one history over several clusters' stores (the entity clusters and
    /// coord), merged by time, with a CLUSTER column.
    #[arg(long, value_name = "DIR", env = "HOLDFAST_AUDIT_STORE", default_value = "/var/lib/holdfast/audit", value_delimiter = ',')]
    store: Vec<PathBuf>,
    /// Only events of this SPIFFE ID (holder, session owner).
    #[arg(long, value_name = "SPIFFE_ID")]
    identity: Option<String>,
    /// Only this namespace.
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Only this class.
    #[arg(long, value_name = "CLASS")]
    class: Option<String>,
    /// Only these kinds (repeat, or separate with commas).
    #[arg(long, value_name = "KIND", value_delimiter = ',')]
    kind: Vec<String>,
    /// From this time: RFC 3339 (2026-12-01T03:00:00Z) or a duration ago (24h, 7d).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Before this time: RFC 3339 or a duration ago.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// Include `record` events (markers, nonces, the watermark, election
    /// keys…): every change etcd committed.
    #[arg(long)]
    all: bool,
    /// Only grants made without etcd (token 0, on_quorum_loss = "open"
    /// classes during an outage) and their ends: the reconciliation list.
    #[arg(long)]
    unprotected: bool,
    /// Print a JSON array of events (or of report rows).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV with a header line.
    #[arg(long)]
    csv: bool,
    /// A client-health report instead of events: expiries or longest.
    #[arg(long, value_name = "REPORT", value_parser = ["expiries", "longest"])]
    report: Option<String>,
    /// With --report longest: how many holds per namespace.
    #[arg(long, value_name = "N", default_value_t = 10)]
    top: usize,
}

#[derive(clap::Subcommand)]
enum AuditAction {
    /// Write the grant history (every ended hold: who, which key, class,
    /// granted, ended, how, for how long; never a token) to one Parquet
    /// file, for the one-year archive. Runs `holdfast-tailer export`, which
    /// ships with the tailer where the store is.
    Export(ExportArgs),
}

#[derive(clap::Args)]
struct ExportArgs {
    /// The Parquet file to write (replaced atomically).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The tailer's store_dir.
    #[arg(long, value_name = "DIR", env = "HOLDFAST_AUDIT_STORE", default_value = "/var/lib/holdfast/audit")]
    store: PathBuf,
    /// Holds granted from this time: RFC 3339 or a duration ago (365d).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Holds granted before this time.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
}

/// `holdfast-tailer`: `$HOLDFAST_TAILER_BIN`, else next to this program,
/// else on `PATH`.
fn locate_tailer() -> Result<std::path::PathBuf, String> {
    const NAME: &str = "holdfast-tailer";
    if let Some(p) = std::env::var_os("HOLDFAST_TAILER_BIN") {
        return Ok(p.into());
    }
    if let Ok(exe) = std::env::current_exe()
        && exe.with_file_name(NAME).is_file()
    {
        return Ok(exe.with_file_name(NAME));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(NAME))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{NAME} not found next to holdfastctl or on PATH (or set HOLDFAST_TAILER_BIN)"))
}

/// Execs `holdfast-tailer export` with the same arguments.
fn export(args: ExportArgs) -> u8 {
    use std::os::unix::process::CommandExt;
    let bin = match locate_tailer() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("holdfastctl audit export: {e}; the export runs where the store is, with holdfast-tailer installed");
            return exit::CONFIG;
        }
    };
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("export").arg("--store").arg(&args.store).arg("--out").arg(&args.out);
    for (flag, value) in [("--since", &args.since), ("--until", &args.until)] {
        if let Some(v) = value {
            cmd.arg(flag).arg(v);
        }
    }
    let e = cmd.exec();
    eprintln!("holdfastctl audit export: cannot run {}: {e}", bin.display());
    exit::SOFTWARE
}

fn filter(args: &AuditArgs) -> Result<Filter, String> {
    let mut kinds = Vec::new();
    for k in &args.kind {
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        kinds.push(Kind::parse(k.trim()).ok_or_else(|| format!("--kind {k:?} is not a kind; use one of {}", names.join(", ")))?);
    }
    if let Some(key) = &args.lock_key
        && holdfast_model::LockKey::parse(key).is_err()
    {
        return Err(format!("{key:?} is not a lock key; give <namespace>/<key>, e.g. payments/ledger-7"));
    }
    Ok(Filter {
        key: args.lock_key.clone(),
        identity: args.identity.clone(),
        namespace: args.namespace.clone(),
        class: args.class.clone(),
        kinds,
        since_unix_ms: args.since.as_deref().map(|t| query::parse_time("--since", t)).transpose()?,
        until_unix_ms: args.until.as_deref().map(|t| query::parse_time("--until", t)).transpose()?,
        unprotected: args.unprotected,
    })
}

pub fn run(args: AuditArgs) -> u8 {
    if let Some(AuditAction::Export(e)) = args.action {
        return export(e);
    }
    let filter = match filter(&args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("holdfastctl audit: {e}");
            return exit::USAGE;
        }
    };
    // Each store is one cluster's trail: a live grant is found per store
    // (one etcd key can be held on two clusters over time), then the trails
    // are merged by time.
    let mut events = Vec::new();
    for store in &args.store {
        match holdfast_audit::store::read_events(store) {
            Ok(mut e) => {
                query::withhold_live_grant_revisions(&mut e);
                events.extend(e);
            }
            Err(e) => {
                eprintln!("holdfastctl audit: {e}");
                eprintln!("(pass --store with the tailer's store_dir, or set HOLDFAST_AUDIT_STORE)");
                return exit::CONFIG;
            }
        }
    }
    if args.store.len() > 1 {
        events.sort_by(|a, b| {
            (a.time_unix_ms, &a.cluster_id, a.revision, a.index).cmp(&(b.time_unix_ms, &b.cluster_id, b.revision, b.index))
        });
    }
    let all = args.all || filter.kinds.contains(&Kind::Record);
    let events: Vec<Event> = events.into_iter().filter(|e| (all || e.kind != Kind::Record) && filter.matches(e)).collect();
    let printed = match args.report.as_deref() {
        Some("expiries") => print_rows(
            &args,
            &query::expiries_without_release(&events),
            |r| vec![r.namespace.clone(), r.identity.clone(), r.expiries.to_string(), r.releases.to_string()],
            &["NAMESPACE", "IDENTITY", "EXPIRIES", "RELEASES"],
        ),
        Some(_) => print_rows(
            &args,
            &query::longest_holds(&events, args.top),
            |r| {
                vec![
                    r.namespace.clone(),
                    r.key.clone(),
                    r.identity.clone(),
                    humantime::format_duration(Duration::from_millis(r.held_ms)).to_string(),
                    r.ended_by.to_string(),
                    time_text(r.ended_unix_ms),
                ]
            },
            &["NAMESPACE", "KEY", "IDENTITY", "HELD", "ENDED BY", "ENDED"],
        ),
        None if args.store.len() > 1 => {
            let mut header = vec!["CLUSTER"];
            header.extend(EVENT_COLUMNS);
            print_rows(
                &args,
                &events,
                |e| {
                    let mut row = vec![e.cluster_id.clone()];
                    row.extend(event_row(e));
                    row
                },
                &header,
            )
        }
        None => print_rows(&args, &events, event_row, &EVENT_COLUMNS),
    };
    match printed {
        Ok(()) => exit::OK,
        // `| head`: the reader has what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
        Err(e) => {
            eprintln!("holdfastctl audit: {e}");
            exit::SOFTWARE
        }
    }
}

const EVENT_COLUMNS: [&str; 9] = ["TIME", "KIND", "KEY", "IDENTITY", "SESSION", "CLASS", "EPOCH", "REVISION", "DETAIL"];

fn time_text(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

fn event_row(e: &Event) -> Vec<String> {
    let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut detail = Vec::new();
    if let Some(h) = e.held_ms {
        detail.push(format!("held {}", humantime::format_duration(Duration::from_millis(h))));
    }
    if let Some(r) = &e.requester {
        detail.push(format!("requested by {r}"));
    }
    if let Some(a) = &e.approver {
        detail.push(format!("approved by {a}"));
    }
    if let Some(f) = e.fenced {
        detail.push(if f { "fenced".into() } else { "not fenced".into() });
    }
    if let (Some(from), Some(to)) = (e.gap_from, e.gap_to) {
        detail.push(format!("revisions {from}..={to} LOST"));
    }
    if let Some(r) = &e.reason {
        detail.push(r.clone());
    }
    if e.unprotected == Some(true) {
        detail.push("unprotected: token 0, granted without etcd".into());
    }
    if e.kind == Kind::Record {
        detail.push(e.etcd_key.clone());
    }
    vec![
        time_text(e.time_unix_ms),
        e.kind.to_string(),
        or(&e.key),
        or(&e.identity),
        or(&e.session),
        or(&e.class),
        e.epoch.map_or("-".into(), |v| v.to_string()),
        e.revision.map_or("-".into(), |v| v.to_string()),
        detail.join("; "),
    ]
}

fn print_rows<T: serde::Serialize>(
    args: &AuditArgs,
    rows: &[T],
    cells: impl Fn(&T) -> Vec<String>,
    header: &[&str],
) -> std::io::Result<()> {
    use std::io::Write;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, rows)?;
        writeln!(out)?;
        return Ok(());
    }
    if args.csv {
        let mut w = csv::Writer::from_writer(out);
        w.write_record(header.iter().map(|h| h.to_lowercase().replace(' ', "_")))?;
        for r in rows {
            w.write_record(cells(r))?;
        }
        return w.flush();
    }
    let table: Vec<Vec<String>> = rows.iter().map(&cells).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &table {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == last { c.clone() } else { format!("{c:<w$}", w = widths[i]) })
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", line(header.iter().map(|h| h.to_string()).collect()))?;
    for row in table {
        writeln!(out, "{}", line(row).trim_end())?;
    }
    writeln!(out, "({} row{})", rows.len(), if rows.len() == 1 { "" } else { "s" })?;
    Ok(())
}
