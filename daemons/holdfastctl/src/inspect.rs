use holdfast_cli::conn::{self, ConnArgs};
use holdfast_cli::exit;
use holdfast_model::LockKey;

#[derive(clap::Args)]
pub struct InspectArgs {
    /// The key, as NAMESPACE/KEY.
    key: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(conn: &ConnArgs, args: InspectArgs) -> u8 {
    let key = match LockKey::parse(&args.key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::USAGE;
        }
    };
    let client = match conn.connect().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let r = match client.inspect(&key).await {
        Ok(r) => r,
        Err(e) => return conn::report(&e),
    };
    if args.json {
        let v = serde_json::json!({
            "key": key.to_string(),
            "held": r.held,
            "holder_identity": r.held.then_some(&r.holder_identity),
            "session_id": r.held.then(|| format!("{:x}", r.session_id)),
            "since_unix_ms": r.held.then_some(r.since_unix_ms),
            "epoch": r.epoch,
            "waiters": r.waiters,
        });
        println!("{v}");
    } else if r.held {
        println!("key      {key}");
        println!("held     yes");
        println!("holder   {}", r.holder_identity);
        println!("session  {:x}", r.session_id);
        println!("epoch    {}", r.epoch);
        if r.since_unix_ms > 0 {
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.since_unix_ms);
            let held_for = std::time::SystemTime::now().duration_since(at).unwrap_or_default();
            println!(
                "granted  {} ({} ago)",
                humantime::format_rfc3339_seconds(at),
                humantime::format_duration(std::time::Duration::from_secs(held_for.as_secs()))
            );
        }
        println!("waiters  {}", r.waiters);
    } else {
        println!("key      {key}");
        println!("held     no");
        println!("waiters  {}", r.waiters);
    }
    exit::OK
}
