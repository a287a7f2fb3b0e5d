//! The holder under test, run by `run` as a subprocess so that it can be
//! frozen with SIGSTOP. It reports each step as one line on stdout
//! (`acquired`, `first accepted|rejected`, `paused`, `pending …`,
//! `repeat …`, or `error <message>`) and never prints its token.

use holdfast_cli::conn::ConnArgs;
use holdfast_cli::exit;
use holdfast_fence::{FenceMode, Written};
use holdfast_model::LockKey;
use std::io::{BufRead, Write};
use std::time::Duration;

#[derive(clap::Args)]
pub struct HolderArgs {
    #[arg(long)]
    lock: String,
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// The record written first, and re-presented to at the end.
    #[arg(long)]
    first: String,
    /// The record whose write is frozen at its decisive point.
    #[arg(long)]
    pending: String,
    #[arg(long)]
    fence_mode: FenceMode,
    #[command(flatten)]
    resource: holdfast_pausetest::ResourceArgs,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn word(w: Written) -> &'static str {
    if w.is_accepted() { "accepted" } else { "rejected" }
}

pub async fn run(conn: &ConnArgs, args: HolderArgs) -> u8 {
    match steps(conn, args).await {
        Ok(()) => exit::OK,
        Err(message) => {
            say(&format!("error {message}"));
            exit::SOFTWARE
        }
    }
}

async fn steps(conn: &ConnArgs, args: HolderArgs) -> Result<(), String> {
    let key = LockKey::parse(&args.lock).map_err(|e| e.to_string())?;
    let fence = args.resource.open(args.fence_mode).await.map_err(|e| e.to_string())?;
    let client = conn.connect().await.map_err(|code| format!("cannot connect to the arbiter (status {code})"))?;
    let session = client.open_session_for(key.namespace(), Some(args.ttl)).await.map_err(|e| format!("opening a session: {e}"))?;
    let hold = session.acquire(&key, Duration::from_secs(30)).await.map_err(|e| format!("acquiring {key}: {e}"))?;
    let token = hold.token();
    say("acquired");

    let first = fence.increment(&args.first, token, &mut || {}).await.map_err(|e| e.to_string())?;
    say(&format!("first {}", word(first)));

    // The pause point: announce it, then wait for the parent's go-ahead. The
    // parent freezes this process before answering, so nothing after this
    // line runs until it is resumed.
    let mut between = || {
        say("paused");
        let mut line = String::new();
        let _ = tokio::task::block_in_place(|| std::io::stdin().lock().read_line(&mut line));
    };
    let pending = fence.increment(&args.pending, token, &mut between).await.map_err(|e| e.to_string())?;
    say(&format!("pending {}", word(pending)));

    // Deliberately ignores that the session is lost: a stale holder that does
    // not check is exactly what the fence must stop.
    let repeat = fence.increment(&args.first, token, &mut || {}).await.map_err(|e| e.to_string())?;
    say(&format!("repeat {}", word(repeat)));
    Ok(())
}
