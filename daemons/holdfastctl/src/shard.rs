//! `holdfastctl shard`: the shard map on the coord cluster
//! (`holdfast_model::shardmap`, `holdfast_store::shardmap`). `init` creates
//! it; `add`, `remove`, `assign` and `segments` edit its desired layout
//! (they move nothing); `list`, `status` and `where` read it.

use crate::etcdconn;
use holdfast_cli::conn::{CoordArgs, EtcdArgs};
use holdfast_cli::exit;
use holdfast_model::LockKey;
use holdfast_model::layout::SHARDMAP_KEY;
use holdfast_model::shardmap::{Layout, Route, ShardCluster};
use holdfast_store::etcd::Etcd;
use holdfast_store::shardmap::{self, ShardMapError, Stored};
use serde_json::{Value, json};

pub const SHARD_HELP: &str = "\
The shard map (/sys/shardmap on the coord cluster) says which entity etcd
cluster each lock key lives on. A key's homing unit is its namespace and the
first N segments of its path (N per namespace, default 1: payments/eu/acct-7
is homed as payments/eu); the unit goes to the cluster whose name scores
highest for it (rendezvous hashing), unless its namespace is assigned to a
cluster. Adding a cluster moves only the units it now scores highest (about
1/N of them); removing one moves only its own.

The map holds the layout arbiters serve and the layout operators desire.
`add`, `remove`, `assign` and `segments` edit the desired layout and move
nothing: a rebalancer turns a desired layout into moves (drain, wait for the
holds, advance the destination's epoch, flip). `status` shows what is
pending and the moves in flight.

Reads and edits go to the coord cluster: --coord-endpoint (or
HOLDFAST_COORD_ENDPOINT), or the --etcd-endpoint cluster when the tiers share
one. Reading needs the holdfast-observer user (what `holdfastctl dev`'s env
gives); init and the edits need holdfast-shard (CN=holdfast-shard).

Examples:
  holdfastctl shard init entity-a --client-urls https://10.0.1.11:2379,https://10.0.2.11:2379
  holdfastctl shard add entity-b --client-urls https://10.0.1.21:2379
  holdfastctl shard assign big-tenant entity-b
  holdfastctl shard segments orders 2
  holdfastctl shard list
  holdfastctl shard where orders/shop-7/cart-1

Exit status:
  0   done (or, for reads, the map as it is: none is not an error)
  65  the edit makes no sense against the map (the message says why);
      nothing was written
  69  etcd unreachable, or the map changed under the edit five times
  77  etcd refused the write: use the holdfast-shard user's certificate
  78  bad etcd credentials or configuration, or a malformed map";

#[derive(clap::Args)]
pub struct ShardArgs {
    #[command(subcommand)]
    action: Action,
}

/// Where the map is: the coord cluster, or the --etcd-endpoint cluster when
/// the tiers share one.
#[derive(clap::Args)]
struct Conn {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(flatten)]
    coord: CoordArgs,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Create the map: one entity cluster, NAME, serving every key (the
    /// cluster the arbiters use today).
    Init {
        #[command(flatten)]
        conn: Conn,
        /// The cluster's name (a-z, 0-9, '-'): the rendezvous input, so keep it.
        name: String,
        /// Its members' client URLs, comma-separated.
        #[arg(long, value_name = "URLS", value_delimiter = ',', required = true)]
        client_urls: Vec<String>,
    },
    /// Add an entity cluster to the desired layout.
    Add {
        #[command(flatten)]
        conn: Conn,
        name: String,
        /// Its members' client URLs, comma-separated.
        #[arg(long, value_name = "URLS", value_delimiter = ',', required = true)]
        client_urls: Vec<String>,
    },
    /// Remove an entity cluster from the desired layout (its keys move to
    /// the others).
    Remove {
        #[command(flatten)]
        conn: Conn,
        name: String,
    },
    /// Assign every key of NAMESPACE to CLUSTER, or with --rendezvous home
    /// its units by hashing again.
    Assign {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        #[arg(required_unless_present = "rendezvous")]
        cluster: Option<String>,
        /// Drop the namespace's assignment.
        #[arg(long, conflicts_with = "cluster")]
        rendezvous: bool,
    },
    /// Set how many path segments make NAMESPACE's homing unit (1 to 16).
    Segments {
        #[command(flatten)]
        conn: Conn,
        namespace: String,
        segments: u32,
    },
    /// The layouts: serving, and desired when an edit is pending.
    List {
        #[command(flatten)]
        conn: Conn,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// What is pending and the moves in flight: each range, its step, the
    /// holds it waits for and the time left.
    Status {
        #[command(flatten)]
        conn: Conn,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Which cluster serves KEY (NS/KEY) now, and its homing unit.
    Where {
        #[command(flatten)]
        conn: Conn,
        key: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn failure(e: ShardMapError, writing: bool) -> u8 {
    match e {
        ShardMapError::Etcd(e) => {
            let access = if writing {
                etcdconn::Access::Write { what: SHARDMAP_KEY, user: holdfast_store::roles::SHARD.name }
            } else {
                etcdconn::Access::Read(SHARDMAP_KEY)
            };
            etcdconn::failure(access, &e)
        }
        ShardMapError::Malformed(m) => {
            eprintln!("holdfastctl: {m}");
            exit::CONFIG
        }
        e @ (ShardMapError::Missing | ShardMapError::Exists(_) | ShardMapError::Refused(_)) => {
            eprintln!("holdfastctl: {e}");
            exit::INVALID
        }
        e @ ShardMapError::Conflict(_) => {
            eprintln!("holdfastctl: {e}");
            exit::UNAVAILABLE
        }
    }
}

pub async fn run(args: ShardArgs) -> u8 {
    let conn = match &args.action {
        Action::Init { conn, .. }
        | Action::Add { conn, .. }
        | Action::Remove { conn, .. }
        | Action::Assign { conn, .. }
        | Action::Segments { conn, .. }
        | Action::List { conn, .. }
        | Action::Status { conn, .. }
        | Action::Where { conn, .. } => conn,
    };
    let config = conn.coord.config(&conn.etcd).unwrap_or_else(|| conn.etcd.config());
    if let Err(code) = etcdconn::check_files(&config) {
        return code;
    }
    let etcd = match Etcd::connect(&config).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfastctl: cannot connect to the coord cluster ({}): {e:#}", config.endpoints.join(","));
            return exit::UNAVAILABLE;
        }
    };
    let cluster = |name: String, endpoint: Vec<String>| ShardCluster {
        name,
        endpoints: endpoint.into_iter().map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect(),
    };
    let edited = match args.action {
        Action::List { json, .. } => return read_then(&etcd, |s| list(s, json)).await,
        Action::Status { json, .. } => return read_then(&etcd, |s| status(s, json)).await,
        Action::Where { key, json, .. } => {
            let key = match LockKey::parse(&key) {
                Ok(k) => k,
                Err(e) => {
                    eprintln!("holdfastctl: {e}");
                    return exit::USAGE;
                }
            };
            return read_then(&etcd, |s| locate(s, &key, json)).await;
        }
        Action::Init { name, client_urls, .. } => shardmap::init(&etcd, cluster(name, client_urls)).await,
        Action::Add { name, client_urls, .. } => {
            let c = cluster(name, client_urls);
            shardmap::edit(&etcd, |m| m.add(c.clone())).await
        }
        Action::Remove { name, .. } => shardmap::edit(&etcd, |m| m.remove(&name)).await,
        Action::Assign { namespace, cluster, .. } => shardmap::edit(&etcd, |m| m.assign(&namespace, cluster.as_deref())).await,
        Action::Segments { namespace, segments, .. } => shardmap::edit(&etcd, |m| m.set_segments(&namespace, segments)).await,
    };
    match edited {
        Ok(map) => {
            let pending = if map.pending() {
                "; the desired layout differs from the serving one: a rebalancer moves the keys (holdfastctl shard status)"
            } else {
                ""
            };
            println!("shard map version {}: {}{pending}", map.version, describe(&map.desired));
            exit::OK
        }
        Err(e) => failure(e, true),
    }
}

async fn read_then(etcd: &Etcd, show: impl FnOnce(Option<&Stored>) -> u8) -> u8 {
    match shardmap::read(etcd).await {
        Ok(s) => show(s.as_ref()),
        Err(e) => failure(e, false),
    }
}

const NO_MAP: &str = "no shard map: one entity cluster (the arbiters' [etcd]) serves every key; `holdfastctl shard init NAME --client-urls URLS` creates one";

/// `entity-a, entity-b (2 clusters); orders assigned to entity-b; orders: 2 segments`.
fn describe(l: &Layout) -> String {
    let names: Vec<&str> = l.clusters.iter().map(|c| c.name.as_str()).collect();
    let mut out = format!("{} ({} cluster{})", names.join(", "), names.len(), if names.len() == 1 { "" } else { "s" });
    for (ns, c) in &l.assigned {
        out.push_str(&format!("; {ns} assigned to {c}"));
    }
    for (ns, n) in &l.segments {
        out.push_str(&format!("; {ns}: {n} segments"));
    }
    out
}

fn layout_json(l: &Layout) -> Value {
    json!({
        "clusters": l.clusters.iter().map(|c| json!({"name": c.name, "endpoints": c.endpoints})).collect::<Vec<_>>(),
        "assigned": l.assigned,
        "segments": l.segments,
    })
}

fn print_layout(title: &str, l: &Layout) {
    println!("{title}:");
    for c in &l.clusters {
        println!("  {:<20} {}", c.name, c.endpoints.join(","));
    }
    for (ns, c) in &l.assigned {
        println!("  namespace {ns} assigned to {c}");
    }
    for (ns, n) in &l.segments {
        println!("  namespace {ns}: homing unit of {n} path segments");
    }
}

fn list(stored: Option<&Stored>, as_json: bool) -> u8 {
    let Some(Stored { map, .. }) = stored else {
        if as_json {
            println!("{}", json!({"map": null}));
        } else {
            println!("{NO_MAP}");
        }
        return exit::OK;
    };
    if as_json {
        let v = json!({
            "version": map.version,
            "serving": layout_json(&map.serving),
            "desired": layout_json(&map.desired),
            "pending": map.pending(),
            "target": map.target.as_ref().map(layout_json),
        });
        println!("{v}");
        return exit::OK;
    }
    println!("shard map version {}", map.version);
    print_layout("serving", &map.serving);
    if map.desired != map.serving {
        print_layout("desired (not serving yet)", &map.desired);
    }
    exit::OK
}

fn status(stored: Option<&Stored>, as_json: bool) -> u8 {
    let Some(Stored { map, .. }) = stored else {
        if as_json {
            println!("{}", json!({"map": null, "moves": []}));
        } else {
            println!("{NO_MAP}");
        }
        return exit::OK;
    };
    let now = now_ms();
    let moves: Vec<Value> = map
        .moves
        .iter()
        .map(|m| {
            json!({
                "from": m.from,
                "to": m.to,
                "step": m.step.to_string(),
                "since_unix_ms": m.since_unix_ms,
                "holds_left": m.holds_left,
                "time_left_ms": m.wait_until_unix_ms.saturating_sub(now),
                "destination_epoch": m.destination_epoch,
            })
        })
        .collect();
    if as_json {
        println!("{}", json!({"version": map.version, "pending": map.pending(), "moves": moves}));
        return exit::OK;
    }
    println!("shard map version {}: serving {}", map.version, describe(&map.serving));
    if map.pending() {
        println!("pending: the desired layout ({}) differs; no move has started toward it yet", describe(&map.desired));
    }
    if map.moves.is_empty() {
        println!("no move in flight");
    } else {
        println!("moves in flight (toward {}):", map.target.as_ref().map(describe).unwrap_or_default());
        println!("  {:<30} {:<10} {:>10} {:>10}", "range", "step", "holds left", "time left");
        for m in &map.moves {
            let left = m.wait_until_unix_ms.saturating_sub(now);
            println!(
                "  {:<30} {:<10} {:>10} {:>9.1}s",
                format!("{} → {}", m.from, m.to),
                m.step.to_string(),
                m.holds_left,
                left as f64 / 1000.0
            );
        }
    }
    exit::OK
}

fn locate(stored: Option<&Stored>, key: &LockKey, as_json: bool) -> u8 {
    let Some(Stored { map, .. }) = stored else {
        if as_json {
            println!("{}", json!({"key": key.to_string(), "map": null}));
        } else {
            println!("{key}: {NO_MAP}");
        }
        return exit::OK;
    };
    let unit = map.serving.unit(key);
    let route = map.route(key);
    if as_json {
        let (cluster, moving) = match &route {
            Route::Serve(c) => (Some(c.name.as_str()), None),
            Route::Moving { from, to, step } => (None, Some(json!({"from": from, "to": to, "step": step.to_string()}))),
        };
        println!("{}", json!({"key": key.to_string(), "unit": unit, "cluster": cluster, "moving": moving, "version": map.version}));
        return exit::OK;
    }
    match route {
        Route::Serve(c) => println!("{key}: on {} (homing unit {unit}; map version {})", c.name, map.version),
        Route::Moving { from, to, step } => {
            println!("{key}: moving from {from} to {to} ({step}): new grants are refused until it flips (homing unit {unit})")
        }
    }
    exit::OK
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
