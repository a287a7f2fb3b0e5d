//! `holdfastctl health`: the arbiter's standard gRPC health check, for
//! scripts, probes and rolling restarts ("wait until it grants again").

use holdfast_cli::conn::{self, ConnArgs};
use holdfast_cli::exit;
use holdfast_client::Client;
use holdfast_client::ErrorReason;
use std::time::{Duration, Instant};

pub const HEALTH_HELP: &str = "\
Asks the arbiter's grpc.health.v1 service (what grpc_health_probe and load
balancers ask) whether it grants now. SERVING: it serves an epoch.
NOT_SERVING: it is sealed, has not verified etcd, or is draining.

With --wait, asks again every 200 ms until SERVING or the time is up:
    systemctl restart holdfast-arbiter && holdfastctl health --wait 60s

Exit status:
  0   SERVING
  69  NOT_SERVING, or the arbiter is unreachable (after --wait: still so)
  64  bad flags; 77 the credentials were refused";

#[derive(clap::Args)]
pub struct HealthArgs {
    /// The service asked about: "" (the whole server) or lock.v1.Lock.
    #[arg(long, default_value = "lock.v1.Lock")]
    service: String,
    /// Keep asking until SERVING, for at most this long (e.g. 30s, 2m).
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
}

pub async fn run(conn: &ConnArgs, args: HealthArgs) -> u8 {
    let mut cfg = match conn.config() {
        Ok(c) => c,
        Err(code) => return code,
    };
    cfg.endpoint = cfg.endpoint.split(',').next().unwrap_or_default().trim().to_string();
    // Lazy: an arbiter that is down now may be up within --wait.
    let client = match Client::connect_lazy(&cfg) {
        Ok(c) => c,
        Err(e) => return conn::report(&e),
    };
    let end = Instant::now() + args.wait.unwrap_or_default();
    loop {
        let answer = client.health(&args.service).await;
        let last_try = Instant::now() >= end;
        match answer {
            Ok(true) => {
                println!("SERVING");
                return exit::OK;
            }
            Ok(false) if last_try => {
                println!("NOT_SERVING");
                return exit::UNAVAILABLE;
            }
            Err(e) if last_try || matches!(e.reason(), Some(ErrorReason::Unauthenticated | ErrorReason::Denied)) => {
                return conn::report(&e);
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
