//! `holdfastctl class check DIR`: validates a policy directory with the same
//! function the controller and the arbiters use (`holdfast_policy::validate`).
//! `holdfastctl class cost` lives in `cost.rs`.

use holdfast_cli::exit;
use holdfast_config::EtcdConfig;
use holdfast_model::layout::PAUSETEST_PREFIX;
use holdfast_policy::{Checks, Date, PauseTests, Report, Sources};
use holdfast_store::etcd::Etcd;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
pub struct ClassArgs {
    #[command(subcommand)]
    action: ClassAction,
}

#[derive(clap::Subcommand)]
enum ClassAction {
    /// Validate a policy directory (classes.d/ and grants.d/): every
    /// problem, each with its file, line and fix.
    ///
    /// Runs offline: in the class repository's CI, as Ansible's `validate:`,
    /// before a deploy. One rule needs etcd: a fenced class needs a passing,
    /// unexpired pause-test result under /sys/pausetest/ for the resource
    /// it names at the schema version it declares, or the controller
    /// publishes it DEMOTED to advisory. With --etcd-endpoint that rule is
    /// checked and each demotion printed; without it (or when etcd does not
    /// answer) it is reported as NOT checked. The exit status reflects the
    /// other rules only.
    #[command(after_long_help = CHECK_HELP)]
    Check(CheckArgs),
    /// What N sessions of a class cost etcd (keepalives/s), and how long a
    /// dead holder can keep its keys (the liveness bound, TTL + election
    /// timeout).
    ///
    /// Reads the class from a policy directory (which must validate) and
    /// computes; it talks to nothing.
    #[command(after_long_help = crate::cost::COST_HELP)]
    Cost(crate::cost::CostArgs),
}

const CHECK_HELP: &str = "\
DIR holds classes.d/*.toml and grants.d/*.toml (on a host, /etc/holdfast).
Both must exist; files not ending in .toml are ignored (and listed).

classes.d/payments.toml, one table per class:

  [class.payments-ledger]
  namespace = \"payments\"          # keys payments/...; one class per namespace
  purpose = \"correctness\"         # correctness | efficiency (required)
  enforcement = \"advisory\"        # fenced | advisory (required)
  # resource = \"postgresql://db:5432/app?table=ledger\"  # required when fenced:
  # resource_schema_version = 3   # as `holdfast-pausetest status --json` names them
  risk_owner = \"team-ledger\"      # required when advisory
  waiver_expires = 2027-03-31     # required when advisory: a TOML date, no quotes
  ttl = \"30s\"                     # 5s..300s, default 15s; advisory needs >= 30s
  tier = \"entity\"                 # coord | entity (required)
  on_quorum_loss = \"closed\"       # closed (default) | open: efficiency, advisory only
  fairness = \"best-effort\"        # best-effort (default) | durable
  home_region = \"hall-a\"          # optional

grants.d/payments.toml, one table per grant:

  [grant.ledger-writers]
  identity = \"spiffe://example.org/ns/payments/sa/ledger\"  # or a prefix ending in /
  lock = [\"payments/\"]            # NAMESPACE/ or NAMESPACE/KEY-PREFIX
  inspect = [\"payments/\"]
  force_release = []

Examples:
  holdfastctl class check /etc/holdfast
  holdfastctl class check ./policy --json
  holdfastctl class check ./policy --etcd-endpoint https://10.0.0.1:2379,https://10.0.0.2:2379 \\
      --etcd-ca ca.pem --etcd-cert me.pem --etcd-key me.key

Output: one line per problem, FILE:LINE: what is wrong and what to do, one
per fenced class that will be published DEMOTED (no pause-test result counts
for its resource at its schema version: none, failed, expired, or for another
version), then a summary line. --json prints one object with the same problems and stable rule
codes. Every rule and message: docs/policy.md.

Exit status:
  0   valid (the pause-test rule may be NOT checked, and classes may be
      demoted: the output says so)
  65  at least one problem (EX_DATAERR)
  78  DIR, classes.d/ or grants.d/ cannot be read (EX_CONFIG)";

#[derive(clap::Args)]
struct CheckArgs {
    /// The directory holding classes.d/ and grants.d/.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    #[command(flatten)]
    etcd: PauseTestSource,
    /// Print one JSON object: valid, problems (file, line, rule, message),
    /// unchecked, demoted, pause_tests, ignored, classes, grants, hash.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: ClassArgs) -> u8 {
    match args.action {
        ClassAction::Check(args) => check(args).await,
        ClassAction::Cost(args) => crate::cost::run(args),
    }
}

async fn check(args: CheckArgs) -> u8 {
    let dir = args.dir.display().to_string();
    let sources = match Sources::read(&args.dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::CONFIG;
        }
    };
    let (pause_tests, read) = args.etcd.read().await;
    let report = holdfast_policy::validate(&sources, &Checks { today: Date::today_utc(), pause_tests });
    if args.json {
        print_json(&dir, &report, read);
    } else {
        print!("{}", report_text(&dir, &report));
    }
    if report.is_valid() { exit::OK } else { exit::INVALID }
}

/// Where the pause-test results are read from: `class check` and
/// `risk-register` take the same flags.
#[derive(clap::Args)]
pub struct PauseTestSource {
    /// etcd client URLs, comma-separated: read the pause-test results under
    /// /sys/pausetest/ and check every fenced class. Name the cluster the
    /// controller publishes to (the coord cluster, when separate). Not read
    /// from the environment: the check is offline unless you ask.
    #[arg(long, visible_alias = "etcd", value_delimiter = ',', value_name = "URL[,URL]")]
    etcd_endpoint: Vec<String>,
    /// CA of the etcd server certificates (https endpoints).
    #[arg(long, env = "HOLDFAST_ETCD_CA", value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long, env = "HOLDFAST_ETCD_CERT", value_name = "FILE")]
    etcd_cert: Option<PathBuf>,
    /// Key of --etcd-cert.
    #[arg(long, env = "HOLDFAST_ETCD_KEY", value_name = "FILE")]
    etcd_key: Option<PathBuf>,
}

impl PauseTestSource {
    /// The pause-test results from etcd, or why there are none; and how
    /// many records were read.
    pub async fn read(&self) -> (PauseTests, Option<usize>) {
        if self.etcd_endpoint.is_empty() {
            let reason = "offline; pass --etcd-endpoint URL[,URL] to read the results under /sys/pausetest/".to_string();
            return (PauseTests::NotAvailable { reason }, None);
        }
        let cfg = EtcdConfig {
            endpoints: self.etcd_endpoint.clone(),
            request_timeout: Duration::from_secs(5),
            ca_file: self.etcd_ca.clone(),
            cert_file: self.etcd_cert.clone(),
            key_file: self.etcd_key.clone(),
        };
        let endpoints = cfg.endpoints.join(",");
        let read = async {
            let etcd = Etcd::connect(&cfg).await.map_err(|e| format!("{e:#}"))?;
            holdfast_store::policy::read_pause_tests(&etcd).await.map_err(|e| format!("reading {PAUSETEST_PREFIX}: {e}"))
        };
        let (records, bad) = match tokio::time::timeout(Duration::from_secs(10), read).await {
            Ok(Ok(read)) => read,
            Ok(Err(e)) => return (not_reachable(&endpoints, &e), None),
            Err(_) => return (not_reachable(&endpoints, "no answer within 10s"), None),
        };
        for e in bad {
            eprintln!("holdfastctl: ignoring a pause-test result: {e}");
        }
        let n = records.len();
        let now_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        (PauseTests::Read { records, now_unix_ms }, Some(n))
    }
}

fn not_reachable(endpoints: &str, why: &str) -> PauseTests {
    PauseTests::NotAvailable {
        reason: format!("etcd at {endpoints} could not be read ({why}); check the endpoints and TLS flags, or that etcd is up"),
    }
}

/// The report as `class check` prints it: one line per problem and per rule
/// not checked, `note: ignored` lines, a summary line. Each line ends in a
/// newline.
/// The text report; `class cost` prints it too when the set is invalid.
pub(crate) fn report_text(dir: &str, r: &Report) -> String {
    r.to_text(dir, &format!("run `holdfastctl class check {dir}` again"))
}

fn print_json(dir: &str, r: &Report, records_read: Option<usize>) {
    let v = serde_json::json!({
        "dir": dir,
        "valid": r.is_valid(),
        "problems": r.problems,
        "unchecked": r.unchecked,
        "demoted": r.demoted,
        "pause_tests": {
            "checked": r.pause_tests_not_checked.is_none(),
            "not_checked_because": r.pause_tests_not_checked,
            "records_read": records_read,
        },
        "ignored": r.ignored,
        "classes": r.class_count,
        "grants": r.grant_count,
        "hash": r.set.as_ref().map(|s| s.hash.clone()),
    });
    println!("{v}");
}
