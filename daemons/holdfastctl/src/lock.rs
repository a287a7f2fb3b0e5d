//! `holdfastctl lock exec`: run a command while holding a lock, like
//! `flock`, `etcdctl lock` and `consul lock`.

use holdfast_cli::conn::{self, ConnArgs};
use holdfast_cli::exit;
use holdfast_client::{AcquireOptions, ErrorReason, Health};
use holdfast_model::LockKey;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::time::Duration;

#[derive(clap::Args)]
pub struct LockArgs {
    #[command(subcommand)]
    action: LockAction,
}

#[derive(clap::Subcommand)]
enum LockAction {
    /// Acquire NS/KEY, run CMD holding it, release when CMD exits.
    ///
    /// CMD gets the fencing token in HOLDFAST_TOKEN (decimal) and the key in
    /// HOLDFAST_LOCK_KEY. Pass the token to the resource with every write; a
    /// fenced resource rejects writes carrying a token lower than one it has
    /// seen. An unprotected grant (etcd out of reach, a class with
    /// on_quorum_loss = "open") runs CMD with HOLDFAST_UNPROTECTED=1 and
    /// HOLDFAST_TOKEN=0, and says so on stderr: another arbiter may grant
    /// the key at the same time. If the session is lost while CMD runs, CMD gets SIGTERM, then
    /// SIGKILL after --kill-after.
    ///
    /// Exit status: CMD's own status (128+N if killed by signal N); 75 if the
    /// lock was not acquired within --wait; 76 if this identity holds the key
    /// through another session (a leaked hold); 79 if the lock was lost while
    /// CMD ran; 69 if the arbiter is unreachable or sealed; 64 for bad input.
    #[command(after_long_help = "\
Examples:
  holdfastctl lock exec billing/nightly-close -- ./close-books.sh
  holdfastctl lock exec billing/nightly-close --wait 0 -- ./close-books.sh   # try once
  holdfastctl lock exec db/migrate --ttl 60s --wait 10m -- sh -c 'migrate --fence \"$HOLDFAST_TOKEN\"'")]
    Exec {
        /// The key, as NAMESPACE/KEY.
        key: String,
        /// How long to wait for the lock while another session holds it
        /// (e.g. 30s, 5m; 0 tries once). Default: wait indefinitely.
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<Duration>,
        /// Session TTL: how long after this process stops renewing the lock
        /// is released by the server. Default: the TTL of the key's class,
        /// the only one the arbiter accepts; a different value is refused
        /// naming the class.
        #[arg(long, value_parser = humantime::parse_duration)]
        ttl: Option<Duration>,
        /// After SIGTERM on lock loss, how long CMD has before SIGKILL.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
        kill_after: Duration,
        /// The command and its arguments.
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
}

pub async fn run(conn: &ConnArgs, args: LockArgs) -> u8 {
    match args.action {
        LockAction::Exec { key, wait, ttl, kill_after, command } => exec(conn, &key, wait, ttl, kill_after, &command).await,
    }
}

/// One Acquire call may wait at most this long; longer waits loop.
const SLICE: Duration = Duration::from_secs(3000);

async fn exec(conn: &ConnArgs, key: &str, wait: Option<Duration>, ttl: Option<Duration>, kill_after: Duration, command: &[String]) -> u8 {
    let key = match LockKey::parse(key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            return exit::USAGE;
        }
    };
    if let Some(Err(m)) = ttl.map(holdfast_model::ttl::session_ttl) {
        eprintln!("holdfastctl: --ttl: {m}");
        return exit::USAGE;
    }
    let (fence_tx, mut fenced) = tokio::sync::mpsc::unbounded_channel();
    let locker = match conn.locker(move |f| {
        let _ = fence_tx.send(f);
    }) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let started = tokio::time::Instant::now();
    let hold = loop {
        let left = wait.map(|w| w.saturating_sub(started.elapsed()));
        let slice = left.unwrap_or(SLICE).min(SLICE);
        let opts = AcquireOptions { ttl, wait: slice };
        let attempt = tokio::select! {
            r = locker.acquire(&key, opts) => r,
            _ = tokio::signal::ctrl_c() => {
                let _ = tokio::time::timeout(Duration::from_secs(5), locker.close()).await;
                eprintln!("holdfastctl: interrupted while waiting for {key}");
                return 130;
            }
        };
        match attempt {
            Ok(h) => break h,
            Err(e) if e.reason() == Some(ErrorReason::Contention) && left.is_none_or(|l| l > slice) => continue,
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), locker.close()).await;
                if e.reason() == Some(ErrorReason::Contention) {
                    eprintln!(
                        "holdfastctl: {key} is held by another session; gave up after {}",
                        humantime::format_duration(wait.unwrap_or_default())
                    );
                    return exit::CONTENTION;
                }
                return conn::report(&e);
            }
        }
    };

    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env("HOLDFAST_TOKEN", hold.token().expose().to_string()).env("HOLDFAST_LOCK_KEY", key.to_string());
    if hold.unprotected() {
        eprintln!(
            "holdfastctl: {key} was granted WITHOUT etcd (unprotected, token 0): etcd is out of the arbiter's reach and the class fails open; \
             another arbiter may grant it at the same time. Running {:?} with HOLDFAST_UNPROTECTED=1",
            command[0]
        );
        cmd.env("HOLDFAST_UNPROTECTED", "1");
    } else {
        cmd.env_remove("HOLDFAST_UNPROTECTED");
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfastctl: cannot run {:?}: {e}", command[0]);
            let _ = hold.release().await;
            let _ = tokio::time::timeout(Duration::from_secs(5), locker.close()).await;
            return 127;
        }
    };
    let pid = child.id().map(|p| Pid::from_raw(p as i32));
    let mut health = hold.health();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut lost = false;
    let mut health_open = true;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s,
            changed = health.changed(), if health_open && !lost => {
                if changed.is_err() {
                    health_open = false;
                    continue;
                }
                match *health.borrow() {
                    Health::Degraded => eprintln!(
                        "holdfastctl: warning: a keepalive for the lock on {key} failed; the lock may be lost in {:.1}s",
                        hold.remaining_ttl().as_secs_f64()
                    ),
                    Health::Healthy => eprintln!("holdfastctl: keepalives for {key} recovered"),
                    // on_fence delivers the loss below.
                    Health::Lost => {}
                }
            }
            Some(_) = fenced.recv(), if !lost => {
                lost = true;
                eprintln!("holdfastctl: lost the lock on {key}: sending SIGTERM to the command, SIGKILL in {}", humantime::format_duration(kill_after));
                if let Some(pid) = pid {
                    let _ = kill(pid, Signal::SIGTERM);
                }
                match tokio::time::timeout(kill_after, child.wait()).await {
                    Ok(s) => break s,
                    Err(_) => {
                        let _ = child.start_kill();
                        break child.wait().await;
                    }
                }
            }
            _ = tokio::signal::ctrl_c() => { if let Some(pid) = pid { let _ = kill(pid, Signal::SIGINT); } }
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {
                if let Some(pid) = pid { let _ = kill(pid, Signal::SIGTERM); }
            }
        }
    };
    if lost {
        let _ = tokio::time::timeout(Duration::from_secs(2), locker.close()).await;
        eprintln!("holdfastctl: the command was terminated because the lock on {key} was lost");
        return exit::LOCK_LOST;
    }
    let released = hold.release().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), locker.close()).await;
    match released {
        Ok(true) => {}
        Ok(false) => eprintln!("holdfastctl: warning: the hold on {key} was already gone at release"),
        Err(e) => eprintln!("holdfastctl: warning: release failed ({e}); the lock ends when the session expires"),
    }
    match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            match (s.code(), s.signal()) {
                (Some(c), _) => c as u8,
                (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
                _ => exit::SOFTWARE,
            }
        }
        Err(e) => {
            eprintln!("holdfastctl: waiting for the command failed: {e}");
            exit::SOFTWARE
        }
    }
}
