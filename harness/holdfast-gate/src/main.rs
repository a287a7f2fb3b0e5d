//! holdfast-gate: the correctness gate (see `holdfast-gate --help`).

use clap::Parser;
use std::process::ExitCode;

/// The correctness gate: faults on a 3-member etcd cluster and two arbiters
/// in network namespaces, every client call recorded, and the history
/// checked against etcd's log (C1), at the fence (C2) and for per-key
/// linearizability (C3). Needs root. A lab tool: never packaged.
#[derive(Parser)]
#[command(name = "holdfast-gate", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    args: holdfast_gate::GateArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfast-gate: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(holdfast_gate::run(cli.args));
    runtime.shutdown_background();
    ExitCode::from(code)
}
