//! holdfast-tailer: reads arguments, loads the config, runs the loop.

use clap::{Parser, Subcommand};
use holdfast_config::tailer::{DEFAULT_PATH, TailerConfig};
use holdfast_daemon::startup::{Daemon, LogFormat};
use std::path::PathBuf;
use std::process::ExitCode;

/// The holdfast audit tailer: records every grant, release, expiry,
/// session close and force-release, from etcd's revision stream.
///
/// One tailer per cluster is active (etcd election); the others wait as
/// standbys and, when elected, catch up from their own checkpoint. The
/// active one resumes after its store's checkpoint, so a restart loses
/// nothing and stores nothing twice; if etcd compacted past the checkpoint
/// it records a gap event and raises holdfast_tailer_gap_alarm. Query the
/// store with `holdfastctl audit --store DIR`.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Configuration file.
    #[arg(long, global = true, default_value = DEFAULT_PATH, env = "HOLDFAST_TAILER_CONFIG")]
    config: PathBuf,
    /// Log output format: `plain` for terminals and journald, `json` for collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration file and the store directory, then exit:
    /// 0 valid, 78 the config is wrong or the store unusable.
    Check,
    /// Run the tailer (the default).
    Run,
    /// Write the grant history of a store (every ended hold; never a
    /// token) to one Parquet file: 0 written, 64 bad flags, 78 the store
    /// cannot be read, 70 the file cannot be written.
    Export {
        /// The store (default: store_dir of --config).
        #[arg(long, value_name = "DIR")]
        store: Option<PathBuf>,
        /// The Parquet file to write (replaced atomically).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Holds granted from this time: RFC 3339 or a duration ago (365d).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Holds granted before this time.
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
    },
    /// Write the man pages and shell completions to DIR (packaging/build).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

const DAEMON: Daemon = Daemon::new("holdfast-tailer");

fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        Some(Command::Check) => return ExitCode::from(holdfast_tailer::check::run(&args.config)),
        Some(Command::Export { store, out, since, until }) => {
            return ExitCode::from(export(&args.config, store, &out, since.as_deref(), until.as_deref()));
        }
        Some(Command::GenerateDocs { out }) => {
            return ExitCode::from(holdfast_cli::docs::run_daemon(
                <Args as clap::CommandFactory>::command(),
                &out,
                &[holdfast_cli::docs::ConfigPage { file: "holdfast-tailer.toml", heading: "## tailer.toml" }],
            ));
        }
        Some(Command::Run) | None => {}
    }
    match DAEMON.config(TailerConfig::load(&args.config)) {
        Ok(config) => DAEMON.start(args.log_format, holdfast_tailer::server::run(config)),
        Err(code) => code,
    }
}

fn export(config: &std::path::Path, store: Option<PathBuf>, out: &std::path::Path, since: Option<&str>, until: Option<&str>) -> u8 {
    use holdfast_audit::query::parse_time;
    let (since, until) = match (since.map(|t| parse_time("--since", t)).transpose(), until.map(|t| parse_time("--until", t)).transpose()) {
        (Ok(s), Ok(u)) => (s, u),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("holdfast-tailer export: {e}");
            return 64;
        }
    };
    let store = match store {
        Some(s) => s,
        None => match TailerConfig::load(config) {
            Ok(c) => c.store_dir,
            Err(e) => {
                eprintln!("holdfast-tailer export: {e} (or pass --store DIR)");
                return holdfast_tailer::check::CONFIG;
            }
        },
    };
    let events = match holdfast_audit::store::read_events(&store) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfast-tailer export: {e}");
            return holdfast_tailer::check::CONFIG;
        }
    };
    let rows = holdfast_tailer::export::ended_holds(&events, since, until);
    match holdfast_tailer::export::write(&rows, out) {
        Ok(()) => {
            println!("wrote {} ended hold(s) to {}", rows.len(), out.display());
            0
        }
        Err(e) => {
            eprintln!("holdfast-tailer export: {e:#}");
            70
        }
    }
}
