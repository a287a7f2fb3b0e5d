//! holdfastctl: the operator and developer CLI.

mod approve;
mod audit;
mod class;
mod cost;
#[cfg(feature = "dev")]
mod dev;
mod epoch;
mod etcd;
mod etcdconn;
mod force;
mod health;
mod inspect;
mod lock;
mod risk;
mod shard;
mod status;
mod validate;

use holdfast_cli::{conn, exit};

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Operate and use holdfast, the lock service with fencing tokens.
///
/// Start a local appliance with `holdfastctl dev`, then take a lock with
/// `holdfastctl lock exec NS/KEY -- CMD`. Commands that talk to an arbiter
/// read its address and your mTLS credentials from --endpoint, --ca, --cert
/// and --key, or from HOLDFAST_ENDPOINT, HOLDFAST_CA, HOLDFAST_CERT and
/// HOLDFAST_KEY (`source DIR/env` after `holdfastctl dev --detach`).
#[derive(Parser)]
#[command(version, about, long_about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    conn: conn::ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole holdfast appliance on loopback for development
    /// (etcd, the arbiter, a throwaway CA).
    #[cfg(feature = "dev")]
    Dev(dev::DevArgs),
    /// Not in this build: the packaged holdfastctl leaves the dev appliance out.
    #[cfg(not(feature = "dev"))]
    #[command(hide = true, disable_help_flag = true)]
    Dev {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Take locks.
    Lock(lock::LockArgs),
    /// Show who holds a key (never the token).
    Inspect(inspect::InspectArgs),
    /// Whether the arbiter grants now (grpc.health.v1): SERVING or
    /// NOT_SERVING; --wait until it does, e.g. after a restart.
    #[command(after_long_help = health::HEALTH_HELP)]
    Health(health::HealthArgs),
    /// Check a token against the current hold of a key: prints valid or
    /// invalid (exit 0 or 1). The token comes from HOLDFAST_TOKEN or stdin,
    /// never from the command line.
    #[command(after_long_help = validate::VALIDATE_HELP)]
    ValidateToken(validate::ValidateArgs),
    /// The epoch: initialise a new cluster, show what the arbiter serves.
    Epoch(epoch::EpochArgs),
    /// etcd itself: the role and user of every holdfast tool.
    Etcd(etcd::EtcdCmdArgs),
    /// Sign a two-person request (an epoch advance, a force-release) with
    /// your SSH key.
    Approve(approve::ApproveArgs),
    /// End one hold with two signed approvals: request, then apply.
    ForceRelease(force::ForceArgs),
    /// The shard map: which entity cluster each key lives on; edit the
    /// desired layout (init, add, remove, assign, segments) and see moves.
    #[command(after_long_help = shard::SHARD_HELP)]
    Shard(shard::ShardArgs),
    /// Lock classes and grants: validate a policy directory offline, and
    /// what a class costs etcd.
    Class(class::ClassArgs),
    /// Advisory classes, their risk owners and waivers: expired, expiring
    /// or ok (exit 1 if any expired).
    #[command(after_long_help = risk::RISK_HELP)]
    RiskRegister(risk::RiskArgs),
    /// One screen for an operator, read from etcd: the published class set,
    /// the last refused change, the epoch and seal, the controller leader
    /// (exit 1 if something needs attention).
    #[command(after_long_help = status::STATUS_HELP)]
    Status(status::StatusArgs),
    /// The lock history the tailer recorded: who held a key when, and how
    /// each hold ended (release, expiry, close, force-release…).
    #[command(after_long_help = audit::AUDIT_HELP)]
    Audit(audit::AuditArgs),
    /// Write the man pages and shell completions to DIR (packaging/build).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::GenerateDocs { out } = &cli.command {
        return ExitCode::from(holdfast_cli::docs::run(<Cli as clap::CommandFactory>::command(), out));
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfastctl: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            #[cfg(feature = "dev")]
            Command::Dev(args) => dev::run(args).await,
            #[cfg(not(feature = "dev"))]
            Command::Dev { .. } => {
                eprintln!(
                    "holdfastctl: this holdfastctl was built without the dev appliance (the packaged one leaves it out); \
                     run it from a source checkout: scripts/dev"
                );
                exit::USAGE
            }
            Command::Lock(args) => lock::run(&cli.conn, args).await,
            Command::Inspect(args) => inspect::run(&cli.conn, args).await,
            Command::ValidateToken(args) => validate::run(&cli.conn, args).await,
            Command::Health(args) => health::run(&cli.conn, args).await,
            Command::Epoch(args) => epoch::run(&cli.conn, args).await,
            Command::Class(args) => class::run(args).await,
            Command::Etcd(args) => etcd::run(args).await,
            Command::Approve(args) => approve::run(args),
            Command::ForceRelease(args) => force::run(args).await,
            Command::RiskRegister(args) => risk::run(args).await,
            Command::Shard(args) => shard::run(args).await,
            Command::Status(args) => status::run(args).await,
            Command::Audit(args) => audit::run(args),
            Command::GenerateDocs { .. } => exit::OK,
        }
    });
    // Do not wait for background tasks (keepalive streams) at exit.
    runtime.shutdown_background();
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks over every subcommand (a clash of two
    /// flags' names otherwise shows only when that subcommand runs).
    #[test]
    fn the_command_line_is_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
