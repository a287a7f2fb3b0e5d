//! holdfast-pausetest: the pause-test kit.

mod holder;
mod record;
mod run;

use clap::{Parser, Subcommand};
use holdfast_cli::conn::{ConnArgs, CoordArgs, EtcdArgs};
use holdfast_cli::exit;
use std::process::ExitCode;

/// Prove that a resource is fenced: freeze a lock holder past its TTL and
/// check that the resource rejects its writes once the lock has moved on.
///
/// A lock cannot stop a holder that was paused (GC, SIGSTOP, a VM
/// migration) past its lease from writing afterwards; only the resource can,
/// by rejecting writes whose fencing token is not newer than one it already
/// accepted, in the same atomic step as the write. This kit runs holdfast's
/// reference fence (crates/holdfast-fence: PostgreSQL `UPDATE … WHERE fence
/// < $token`, S3 `PUT` with `If-Match`) against your real resource, with a
/// real lock from your arbiter, and records what happened in etcd under
/// /sys/pausetest/<class>/<resource>. A class may be declared fenced only
/// while a passing result for it and its resource is recorded.
///
/// `run` does, with records named pausetest-<run id>-first and -pending:
///
///   1. A holder process acquires --lock with a session of --ttl and writes
///      record "first" with its token: must be accepted.
///   2. It starts writing record "pending". At the decisive point — before
///      the one conditional statement of a correct fence; between the check
///      and the write of a two-statement one — the kit freezes it with
///      SIGSTOP.
///   3. The lease lapses. A second holder (this process) acquires --lock,
///      which proves the first hold expired, and writes "pending" with its
///      newer token: must be accepted.
///   4. The first holder is resumed with SIGCONT and finishes its write:
///      must be REJECTED (catches check-then-write in two statements).
///   5. The first holder re-presents its expired token to "first", which
///      nobody has written since: must be REJECTED (catches `fence <=
///      $token`: the resource has seen that token, and the lock has moved
///      on).
///
/// The record's log of accepted tokens must end with the second holder's.
///
/// Exit status of `run`: 0 passed, 1 failed (both recorded); 64 bad input;
/// 69 the arbiter, etcd or the resource is unreachable, or the lock did not
/// pass to the second holder (nothing recorded); 70 the holder process
/// failed; 77 credentials refused. `status` exits 0 only if a passing,
/// unexpired result for the resource's current schema version is recorded,
/// else 1.
///
/// Connection: --endpoint --ca --cert --key (or HOLDFAST_ENDPOINT,
/// HOLDFAST_CA, HOLDFAST_CERT, HOLDFAST_KEY) for the arbiter, as for
/// holdfastctl; --etcd-endpoint (HOLDFAST_ETCD_ENDPOINT) and --etcd-ca/-cert/
/// -key for recording, or, with a separate coord cluster (where the
/// controller reads the results), --coord-endpoint (HOLDFAST_COORD_ENDPOINT)
/// and --coord-ca/-cert/-key (default: the --etcd-* ones). Tokens are never
/// printed.
#[derive(Parser)]
#[command(version, about, long_about, propagate_version = true, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the pause test against a resource and record the result.
    #[command(after_long_help = "\
Examples:
  holdfast-pausetest run --class payments-ledger --lock payments/pausetest \\
      --resource postgres://ledger@db-staging:5432/ledger --pg-password-file /run/credentials/pg
  AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... holdfast-pausetest run --class media-index \\
      --lock media/pausetest --resource s3://staging-bucket/holdfast --s3-endpoint https://s3.staging:9000")]
    Run(run::RunArgs),
    /// Show the recorded result for a class and resource, and whether it
    /// still counts (unexpired, same resource schema version).
    Status(record::StatusArgs),
    /// The frozen holder (internal: started by `run`).
    #[command(hide = true)]
    Holder(holder::HolderArgs),
    /// Write the man pages and shell completions to DIR (packaging/build).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
}

/// Arguments shared by `run` and `status`.
#[derive(clap::Args)]
pub struct Target {
    /// The lock class the result is for (as in `[class.<name>]`).
    #[arg(long)]
    pub class: String,
    #[command(flatten)]
    pub resource: holdfast_pausetest::ResourceArgs,
    #[command(flatten)]
    pub etcd: EtcdArgs,
    #[command(flatten)]
    pub coord: CoordArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::GenerateDocs { out } = &cli.command {
        return ExitCode::from(holdfast_cli::docs::run(<Cli as clap::CommandFactory>::command(), out));
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfast-pausetest: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(&cli.conn, args).await,
            Command::Status(args) => record::status(args).await,
            Command::Holder(args) => holder::run(&cli.conn, args).await,
            Command::GenerateDocs { .. } => exit::OK,
        }
    });
    runtime.shutdown_background();
    ExitCode::from(code)
}
