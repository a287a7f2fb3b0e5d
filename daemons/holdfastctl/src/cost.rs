//! `holdfastctl class cost CLASS --sessions N`: what N sessions of a class
//! cost etcd, and how long a dead holder can keep its keys. Arithmetic only
//! (`holdfast_policy::cost`); the class comes from a policy directory that
//! must validate.

use holdfast_cli::exit;
use holdfast_policy::cost::{self, DURABLE_WRITES_PER_WAITER};
use holdfast_policy::source::DEFAULT_DIR;
use holdfast_policy::{Checks, Class, Date, Fairness, PauseTests, Sources};
use std::path::PathBuf;
use std::time::Duration;

pub const COST_HELP: &str = "\
What is counted, and why:

  renewal period    TTL/3, never under 500ms: a healthy session sends one
                    keepalive per period (keepalive_loop in
                    crates/holdfast-client/src/session.rs renews every
                    `(ttl / 3).max(500ms)`). While no arbiter answers, the
                    client retries every 250ms, so an outage briefly costs more.
  keepalives/s      sessions / renewal period = 3 x sessions / TTL. An arbiter
                    relays each client keepalive as one etcd LeaseKeepAlive
                    (daemons/holdfast-arbiter/src/service.rs, renew), and etcd
                    serves every LeaseKeepAlive on its leader (a follower
                    forwards it). So this is the rate of keepalive requests
                    at the etcd leader. It is NOT counted as Raft writes: the
                    leader renews a lease in memory, and appends a Raft entry
                    on a renewal only to clear a checkpointed remaining TTL,
                    which etcd records only for leases longer than its fixed
                    5-minute checkpoint interval (class TTLs are at most 300s).
                    Not counted either: each arbiter confirms keepalives with
                    linearizable reads, batched (a few per second per arbiter,
                    not one per keepalive).
  liveness bound    TTL + election timeout: the worst case from a holder's
                    death until another session may acquire its keys. A
                    holder that dies just after a renewal leaves a lease that
                    lives one more TTL. If the etcd leader changes meanwhile,
                    the new leader restarts every lease at TTL + one election
                    timeout, so the bound then counts from that leader's
                    takeover (and restarts at each further election). Not
                    included: the leader's expiry sweep (every 500ms) and the
                    commit of the revoke.
  durable fairness  only when fairness = \"durable\": two consensus writes per
                    waiter (its record under /q/ is written when it queues and
                    removed when it leaves the queue), on top of the keepalives.

CLASS is a class name ([class.NAME]) or a namespace; a name wins if one
class's name is another's namespace. The directory must validate as
`holdfastctl class check DIR` would offline (today's date, UTC; the
pause-test rule is not checked here).

Output: a header line, then one `  label  value: meaning` line per number.
--json prints one object: class, namespace, tier, enforcement, fairness,
ttl_ms, sessions, renewal_period_ms (truncated to whole ms),
keepalives_per_second (3 decimals), election_timeout_ms, liveness_bound_ms,
durable_writes_per_waiter (0 for best-effort).

Examples:
  holdfastctl class cost payments-ledger --sessions 3000
  holdfastctl class cost payments --sessions 3000 --dir ./policy --election-timeout 500ms --json

Exit status:
  0   printed
  64  CLASS is not in the directory (the known classes are listed), or --sessions 0
  65  the directory does not validate: the problems, as `class check` prints them, on stderr
  78  DIR, classes.d/ or grants.d/ cannot be read";

#[derive(clap::Args)]
pub struct CostArgs {
    /// The class: its name, or the namespace it governs.
    #[arg(value_name = "CLASS")]
    class: String,
    /// How many sessions of the class are open at once (at least 1).
    #[arg(long, value_name = "N")]
    sessions: u64,
    /// The policy directory holding classes.d/ and grants.d/.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// The etcd cluster's --election-timeout (etcd's default is 1000ms;
    /// `holdfastctl dev` runs etcd with 500ms).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    election_timeout: Duration,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: CostArgs) -> u8 {
    if args.sessions == 0 {
        eprintln!("holdfastctl: --sessions must be at least 1: the number of sessions of the class open at once");
        return exit::USAGE;
    }
    let dir = args.dir.display().to_string();
    let sources = match Sources::read(&args.dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::CONFIG;
        }
    };
    let offline = PauseTests::NotAvailable { reason: "offline (class cost does not read etcd)".into() };
    let report = holdfast_policy::validate(&sources, &Checks { today: Date::today_utc(), pause_tests: offline });
    let Some(set) = &report.set else {
        eprint!("{}", crate::class::report_text(&dir, &report));
        return exit::INVALID;
    };
    let class = set.classes.values().find(|c| c.name == args.class).or_else(|| set.class_for(&args.class));
    let Some(class) = class else {
        let mut known: Vec<String> = set.classes.values().map(|c| format!("{} (namespace {})", c.name, c.namespace)).collect();
        known.sort();
        let known = if known.is_empty() { "none: classes.d/ defines no class".to_string() } else { known.join(", ") };
        eprintln!("holdfastctl: no class or namespace {:?} in {dir}; the classes are: {known}", args.class);
        return exit::USAGE;
    };
    let c = Cost::of(class, args.sessions, args.election_timeout);
    if args.json {
        println!("{}", c.json());
    } else {
        print!("{}", c.text());
    }
    exit::OK
}

/// The numbers for one class.
struct Cost<'a> {
    class: &'a Class,
    sessions: u64,
    period: Duration,
    keepalives: f64,
    election_timeout: Duration,
    bound: Duration,
    durable: bool,
}

impl<'a> Cost<'a> {
    fn of(class: &'a Class, sessions: u64, election_timeout: Duration) -> Self {
        Cost {
            class,
            sessions,
            period: cost::renewal_period(class.ttl),
            keepalives: cost::keepalives_per_second(class.ttl, sessions),
            election_timeout,
            bound: cost::liveness_bound(class.ttl, election_timeout),
            durable: class.fairness == Fairness::Durable,
        }
    }

    fn text(&self) -> String {
        let c = self.class;
        let mut out = format!(
            "class {} (namespace {}): ttl {}, tier {}, {}, fairness {}\n",
            c.name,
            c.namespace,
            secs(c.ttl),
            word(serde_json::json!(c.tier)),
            enforcement(c),
            word(serde_json::json!(c.fairness))
        );
        let mut line = |label: &str, value: String| out.push_str(&format!("  {label:<17} {value}\n"));
        line("sessions", self.sessions.to_string());
        line("renewal period", format!("{}: each session renews every TTL/3", secs(self.period)));
        line(
            "keepalives/s",
            format!("{}: keepalive requests at the etcd leader (one LeaseKeepAlive per renewal; not Raft writes)", rate(self.keepalives)),
        );
        line(
            "liveness bound",
            format!(
                "{} = ttl {} + election timeout {}: worst case from a holder's death until another session may acquire",
                secs(self.bound),
                secs(c.ttl),
                secs(self.election_timeout)
            ),
        );
        if self.durable {
            line(
                "durable fairness",
                format!("{DURABLE_WRITES_PER_WAITER} consensus writes per waiter (its record under /q/), on top of the keepalives"),
            );
        }
        out
    }

    fn json(&self) -> serde_json::Value {
        let c = self.class;
        serde_json::json!({
            "class": c.name,
            "namespace": c.namespace,
            "tier": c.tier,
            "enforcement": enforcement(c),
            "fairness": c.fairness,
            "ttl_ms": c.ttl.as_millis() as u64,
            "sessions": self.sessions,
            "renewal_period_ms": self.period.as_millis() as u64,
            "keepalives_per_second": (self.keepalives * 1000.0).round() / 1000.0,
            "election_timeout_ms": self.election_timeout.as_millis() as u64,
            "liveness_bound_ms": self.bound.as_millis() as u64,
            "durable_writes_per_waiter": if self.durable { DURABLE_WRITES_PER_WAITER } else { 0 },
        })
    }
}

fn enforcement(c: &Class) -> &'static str {
    c.enforcement.mode()
}

/// An enum's word as the class file (and `--json`) writes it (`best-effort`, `coord`).
fn word(v: serde_json::Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_default()
}

/// Seconds with up to three decimals: `10s`, `3.333s`, `15.5s`.
fn secs(d: Duration) -> String {
    format!("{}s", trim(format!("{:.3}", d.as_secs_f64())))
}

/// A rate with up to two decimals: `300`, `428.57`, `0.2`.
fn rate(r: f64) -> String {
    trim(format!("{r:.2}"))
}

fn trim(s: String) -> String {
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_written() {
        assert_eq!(secs(Duration::from_secs(10)), "10s");
        assert_eq!(secs(Duration::from_nanos(3_333_333_333)), "3.333s");
        assert_eq!(secs(Duration::from_millis(15_500)), "15.5s");
        assert_eq!(rate(300.0), "300");
        assert_eq!(rate(428.571_428), "428.57");
        assert_eq!(rate(0.2), "0.2");
        assert_eq!(rate(100.0), "100");
        assert_eq!(word(serde_json::json!(Fairness::BestEffort)), "best-effort");
    }
}
