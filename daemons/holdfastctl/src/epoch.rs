use crate::conn::{self, ConnArgs};
use crate::exit;
use holdfast_arbiter::config::EtcdConfig;
use holdfast_arbiter::epoch::{self, EpochError};
use holdfast_arbiter::etcd::Etcd;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct EpochArgs {
    #[command(subcommand)]
    action: EpochAction,
}

#[derive(clap::Subcommand)]
enum EpochAction {
    /// Initialise epoch 1 on a new etcd cluster (talks to etcd directly).
    ///
    /// Run once per cluster, before the first arbiter serves. Refuses if the
    /// epoch already exists. Moves a fresh cluster's revision to 1024 first,
    /// so that a later restore from any snapshot is detectable.
    Init(EtcdArgs),
    /// Show the epoch the arbiter serves, and whether it is sealed.
    Status {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct EtcdArgs {
    /// etcd client URLs, comma-separated: list every member.
    #[arg(long, env = "HOLDFAST_ETCD_ENDPOINT", value_delimiter = ',', required = true)]
    etcd_endpoint: Vec<String>,
    /// CA of the etcd server certificates (https endpoints).
    #[arg(long, env = "HOLDFAST_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd.
    #[arg(long, env = "HOLDFAST_ETCD_CERT")]
    etcd_cert: Option<PathBuf>,
    /// Key of --etcd-cert.
    #[arg(long, env = "HOLDFAST_ETCD_KEY")]
    etcd_key: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn run(conn: &ConnArgs, args: EpochArgs) -> u8 {
    match args.action {
        EpochAction::Init(e) => init(e).await,
        EpochAction::Status { json } => status(conn, json).await,
    }
}

async fn init(args: EtcdArgs) -> u8 {
    let cfg = EtcdConfig {
        endpoints: args.etcd_endpoint.clone(),
        request_timeout: Duration::from_secs(5),
        ca_file: args.etcd_ca,
        cert_file: args.etcd_cert,
        key_file: args.etcd_key,
    };
    let etcd = match Etcd::connect(&cfg).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfastctl: {e:#}");
            return exit::UNAVAILABLE;
        }
    };
    let quiet = args.json;
    match epoch::init(&etcd, |m| if !quiet { eprintln!("holdfastctl: {m}") }).await {
        Ok(r) => {
            if args.json {
                println!("{}", serde_json::json!({"epoch": r.epoch, "cluster_id": format!("{:x}", r.cluster_id), "log_floor": r.log_floor}));
            } else {
                println!("initialised epoch {} for etcd cluster {:x}", r.epoch, r.cluster_id);
            }
            exit::OK
        }
        Err(EpochError::AlreadyInitialised(n)) => {
            eprintln!("holdfastctl: the epoch is already initialised (epoch {n}); nothing was changed");
            exit::USAGE
        }
        Err(e) => {
            eprintln!("holdfastctl: epoch init failed: {e}");
            exit::UNAVAILABLE
        }
    }
}

async fn status(conn: &ConnArgs, json: bool) -> u8 {
    let client = match conn.connect().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let s = match client.server_status().await {
        Ok(s) => s,
        Err(e) => return conn::report(&e),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "epoch": s.epoch, "cluster_id": s.cluster_id, "sealed": s.sealed, "serving": s.serving,
                "sealed_reason": s.sealed_reason, "etcd_version": s.etcd_version,
            })
        );
    } else if s.sealed {
        println!("state        SEALED: granting nothing");
        println!("reason       {}", s.sealed_reason);
        println!("etcd         {}", s.etcd_version);
    } else if !s.serving {
        println!("state        not serving yet");
        println!("reason       {}", s.sealed_reason);
    } else {
        println!("state        serving");
        println!("epoch        {}", s.epoch);
        println!("cluster id   {}", s.cluster_id);
        println!("etcd         {}", s.etcd_version);
    }
    exit::OK
}
