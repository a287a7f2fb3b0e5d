//! holdfast-arbiter: reads arguments, loads the config, runs the server.

use clap::{Parser, Subcommand};
use holdfast_arbiter::config::{ArbiterConfig, DEFAULT_PATH};
use holdfast_arbiter::telemetry::Telemetry;
use holdfast_daemon::startup::{Daemon, LogFormat, exit_code};
use std::path::PathBuf;
use std::process::ExitCode;

/// The holdfast arbiter: grants locks with fencing tokens on etcd.
///
/// Serves lock.v1 gRPC over mTLS. It is the only component that writes grants
/// to etcd. It seals itself (grants nothing) when the etcd cluster was
/// restored or replaced, until the epoch is advanced.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Configuration file.
    #[arg(long, global = true, default_value = DEFAULT_PATH, env = "HOLDFAST_ARBITER_CONFIG")]
    config: PathBuf,
    /// Log output format off systemd: `plain` for terminals, `json` for
    /// collectors. Under systemd, logs go to journald natively either way.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration file and exit (0 = valid). Used by the
    /// unit's ExecStartPre= and by Ansible before deploying.
    Check,
    /// Run the arbiter (the default).
    Run,
    /// Write the man pages and shell completions to DIR (packaging/build).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

const DAEMON: Daemon = Daemon::new("holdfast-arbiter");

fn main() -> ExitCode {
    exit_code(start(Args::parse()))
}

fn start(args: Args) -> Result<ExitCode, ExitCode> {
    if let Some(Command::GenerateDocs { out }) = &args.command {
        return Ok(ExitCode::from(holdfast_cli::docs::run_daemon(
            <Args as clap::CommandFactory>::command(),
            out,
            &[holdfast_cli::docs::ConfigPage { file: "holdfast-arbiter.toml", heading: "## arbiter.toml" }],
        )));
    }
    let config = DAEMON.config(ArbiterConfig::load(&args.config))?;
    if let Some(Command::Check) = args.command {
        holdfast_arbiter::server::install_crypto_provider();
        let path = args.config.display();
        DAEMON.config(holdfast_arbiter::tls::load(&config.tls).map_err(|e| format!("{path}: [tls]: {e}")))?;
        // A [mutation] table passes only in the gate's test builds (the
        // deliberate bugs are compiled out of every other arbiter).
        DAEMON.config(holdfast_arbiter::server::apply_mutations(&config.mutation).map_err(|e| format!("{path}: {e}")))?;
        println!("{path}: ok");
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = DAEMON.runtime()?;
    // The exporter's connections live on the runtime: build it there.
    let telemetry = runtime
        .block_on(async { Telemetry::start(&config.tracing, &config.cluster_name) })
        .map_err(|e| DAEMON.config_error(format_args!("{e:#}")))?;
    init_logging(args.log_format, telemetry.as_ref());
    let outcome = runtime.block_on(holdfast_arbiter::server::run(config));
    // Flush queued spans while the runtime that sends them still runs.
    if let Some(t) = telemetry {
        t.shutdown();
    }
    Ok(DAEMON.outcome(outcome))
}

/// Logs through holdfast-daemon's layer (journald natively under systemd,
/// else stderr; level from `HOLDFAST_LOG`) and, when tracing export is on,
/// this crate's spans to the OTLP exporter (its own filter: the log level
/// does not decide what is exported).
fn init_logging(format: LogFormat, telemetry: Option<&Telemetry>) {
    use tracing_subscriber::prelude::*;
    let log = holdfast_daemon::log_layer(format.json());
    let spans = telemetry.map(|t| t.layer().boxed());
    tracing_subscriber::registry().with(log).with(spans).init();
}
