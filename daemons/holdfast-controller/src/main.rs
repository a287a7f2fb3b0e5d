//! holdfast-controller: reads arguments, loads the config, runs the loop.

use clap::{Parser, Subcommand};
use holdfast_config::controller::{ControllerConfig, DEFAULT_PATH};
use holdfast_daemon::startup::{Daemon, LogFormat, exit_code};
use std::path::PathBuf;
use std::process::ExitCode;

/// The holdfast controller: publishes the validated class and grant set.
///
/// One controller per cluster is active (etcd election); the others wait as
/// standbys. The active one validates policy_dir (classes.d/, grants.d/) on
/// start, every rescan_interval and on SIGHUP, and publishes the compiled
/// set to /sys/policy when it is valid and changed. An invalid set is never
/// published: the last good one stays in force, and the refusal is logged,
/// counted (holdfast_controller_refusals_total) and written to
/// /sys/policy-status.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Configuration file.
    #[arg(long, global = true, default_value = DEFAULT_PATH, env = "HOLDFAST_CONTROLLER_CONFIG")]
    config: PathBuf,
    /// Log output format: `plain` for terminals and journald, `json` for collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration file and the class set in its policy_dir,
    /// then exit: 0 valid, 65 the class set has problems (each printed as
    /// FILE:LINE: message), 78 the config is wrong or policy_dir unreadable.
    /// Reads the pause-test results from [etcd] unless --offline.
    Check {
        /// Do not contact etcd: the fenced-class rule is reported NOT checked.
        #[arg(long)]
        offline: bool,
    },
    /// Run the controller (the default).
    Run,
    /// Write the man pages and shell completions to DIR (packaging/build).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

const DAEMON: Daemon = Daemon::new("holdfast-controller");

fn main() -> ExitCode {
    exit_code(start(Args::parse()))
}

fn start(args: Args) -> Result<ExitCode, ExitCode> {
    if let Some(Command::GenerateDocs { out }) = &args.command {
        return Ok(ExitCode::from(holdfast_cli::docs::run_daemon(
            <Args as clap::CommandFactory>::command(),
            out,
            &[holdfast_cli::docs::ConfigPage { file: "holdfast-controller.toml", heading: "## controller.toml" }],
        )));
    }
    let runtime = DAEMON.runtime()?;
    if let Some(Command::Check { offline }) = args.command {
        return Ok(ExitCode::from(runtime.block_on(holdfast_controller::check::run(&args.config, offline))));
    }
    let config = DAEMON.config(ControllerConfig::load(&args.config))?;
    Ok(DAEMON.serve(&runtime, args.log_format, holdfast_controller::server::run(config)))
}
