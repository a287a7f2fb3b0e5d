//! holdfast-bench: lock throughput, handoff and renewal cost (see
//! `holdfast-bench --help`).

use clap::Parser;
use holdfast_cli::{conn, exit};
use std::process::ExitCode;

/// Measure lock throughput, handoff and renewal cost through the arbiter
/// against etcd's own paths, in one run on the same etcd. A lab tool: never
/// packaged. Reads the arbiter's address and your mTLS credentials from
/// --endpoint, --ca, --cert and --key or HOLDFAST_ENDPOINT, HOLDFAST_CA,
/// HOLDFAST_CERT and HOLDFAST_KEY (`source DIR/env` after
/// `holdfastctl dev --detach`).
#[derive(Parser)]
#[command(name = "holdfast-bench", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    conn: conn::ConnArgs,
    #[command(flatten)]
    args: holdfast_bench::BenchArgs,
}

fn main() -> ExitCode {
    // `--replot SAVED --plot OUT.svg` draws a saved run and measures nothing,
    // so it needs none of the connection flags.
    if std::env::args().skip(1).any(|a| a == "--replot" || a.starts_with("--replot=")) {
        return ExitCode::from(holdfast_bench::replot(&holdfast_bench::Replot::parse()));
    }
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfast-bench: cannot start the async runtime: {e}");
            return ExitCode::from(exit::SOFTWARE);
        }
    };
    let code = runtime.block_on(holdfast_bench::run(&cli.conn, cli.args));
    runtime.shutdown_background();
    ExitCode::from(code)
}
