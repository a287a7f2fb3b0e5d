//! holdfast-tailer: reads arguments, loads the config, runs the loop.

use clap::{Parser, Subcommand, ValueEnum};
use holdfast_config::tailer::{DEFAULT_PATH, TailerConfig};
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
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Check) = args.command {
        return ExitCode::from(holdfast_tailer::check::run(&args.config));
    }
    let config = match TailerConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-tailer: {e}");
            return ExitCode::from(holdfast_tailer::check::CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfast-tailer: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    holdfast_daemon::init_logging(matches!(args.log_format, LogFormat::Json));
    match runtime.block_on(holdfast_tailer::server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("holdfast-tailer: {e:#}");
            ExitCode::FAILURE
        }
    }
}
