use holdfast_cli::conn::{self, ConnArgs, EtcdArgs};
use holdfast_cli::exit;
use holdfast_store::epoch::{self, EpochError};
use holdfast_store::etcd::Etcd;

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
    Init(InitArgs),
    /// Show the epoch the arbiter serves, and whether it is sealed.
    Status {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct InitArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
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

async fn init(args: InitArgs) -> u8 {
    let cfg = args.etcd.config();
    let etcd = match Etcd::connect(&cfg).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfastctl: {e:#}");
            return exit::UNAVAILABLE;
        }
    };
    let quiet = args.json;
    match epoch::init(&etcd, |m| {
        if !quiet {
            eprintln!("holdfastctl: {m}")
        }
    })
    .await
    {
        Ok(r) => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"epoch": r.epoch, "cluster_id": format!("{:x}", r.cluster_id), "log_floor": r.log_floor})
                );
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
