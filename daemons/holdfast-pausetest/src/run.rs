//! `run`: drive the holder process through the five steps (see `--help`),
//! judge, record.

use crate::{Target, record};
use holdfast_cli::conn::{self, ConnArgs};
use holdfast_cli::exit;
use holdfast_client::{Client, ClientConfig};
use holdfast_fence::{FenceError, FenceMode, SharedFence, Written};
use holdfast_model::layout::{self, PAUSETEST_VALIDITY, PauseTestOutcome, PauseTestRecord};
use holdfast_model::{LockKey, ttl};
use holdfast_pausetest::{Observed, verdict};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::ChildStdout;
use tokio::time::Instant;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    target: Target,
    /// The lock key to take, NAMESPACE/KEY. Use one nothing else takes: the
    /// test holds it for about two TTLs.
    #[arg(long, value_name = "NS/KEY")]
    lock: String,
    /// The frozen holder's session TTL: how long the test waits for its
    /// lease to lapse. Default: the TTL of the --lock key's class, the only
    /// one the arbiter accepts for it.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// FOR DEMONSTRATING WRONG FENCES ONLY. Runs a deliberately broken
    /// variant of the reference fence instead of the correct one, to watch
    /// the kit catch it: less-or-equal (`fence <= $token`), two-statements
    /// (check, then an unconditional write), unfenced. The failure is
    /// recorded like any other result, replacing a previous pass.
    #[arg(long, default_value = "correct", value_name = "MODE")]
    fence_mode: FenceMode,
}

fn progress(json: bool, m: &str) {
    if !json {
        eprintln!("holdfast-pausetest: {m}");
    }
}

pub async fn run(conn: &ConnArgs, args: RunArgs) -> u8 {
    let t = &args.target;
    if let Err(e) = layout::validate_class(&t.class) {
        eprintln!("holdfast-pausetest: --{e}");
        return exit::USAGE;
    }
    let key = match LockKey::parse(&args.lock) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("holdfast-pausetest: --lock: {e}");
            return exit::USAGE;
        }
    };
    if let Some(Err(m)) =
        args.ttl.map(|ttl| ttl::session_ttl(ttl).and_then(|t| if t == ttl { Ok(t) } else { Err("ttl must not be 0".into()) }))
    {
        eprintln!("holdfast-pausetest: --ttl: {m}");
        return exit::USAGE;
    }
    let client_config = match conn.config() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let fence = match t.resource.open(args.fence_mode).await {
        Ok(f) => f,
        Err(e) => return resource_error(&e),
    };
    if let Err(e) = fence.setup().await {
        return resource_error(&e);
    }
    let schema_version = match fence.schema_version().await {
        Ok(v) => v,
        Err(e) => return resource_error(&e),
    };
    let etcd = match record::connect(t).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfast-pausetest: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let etcd_version = match record::etcd_version(&etcd).await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("holdfast-pausetest: no etcd member answered Status: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let client = match conn.connect().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let resource = fence.describe();
    progress(t.json, &format!("testing {resource} (schema version {schema_version}, {} fence) with lock {key}", args.fence_mode));

    let observed = match drive(&args, &client_config, &client, &fence, &key).await {
        Ok(o) => o,
        Err((code, m)) => {
            eprintln!("holdfast-pausetest: {m}; nothing was recorded");
            return code;
        }
    };
    let (outcome, reason) = match verdict(&observed) {
        Ok(r) => (PauseTestOutcome::Pass, r),
        Err(r) => (PauseTestOutcome::Fail, r),
    };
    let now = record::now_unix_ms();
    let result = PauseTestRecord {
        class: t.class.clone(),
        resource,
        schema_version,
        time_unix_ms: now,
        expires_unix_ms: now + PAUSETEST_VALIDITY.as_millis() as u64,
        etcd_version,
        outcome,
        reason,
        fence_mode: args.fence_mode.name().into(),
    };
    let recorded = record::put(&etcd, &result).await;
    if t.json {
        println!("{}", serde_json::json!({ "key": recorded.as_ref().ok(), "result": result }));
    } else {
        let word = if outcome == PauseTestOutcome::Pass { "PASS" } else { "FAIL" };
        println!("{word}: {}", result.reason);
        if let Ok(k) = &recorded {
            println!("recorded at {k} (valid for a year, or until the resource's schema version changes)");
        }
    }
    if let Err(e) = recorded {
        eprintln!("holdfast-pausetest: the result could not be recorded: {e}");
        return exit::UNAVAILABLE;
    }
    if outcome == PauseTestOutcome::Pass { exit::OK } else { 1 }
}

fn resource_error(e: &FenceError) -> u8 {
    eprintln!("holdfast-pausetest: {e}");
    match e {
        FenceError::Config(_) => exit::USAGE,
        _ => exit::UNAVAILABLE,
    }
}

type Failure = (u8, String);

/// Runs the steps and reports what each write got. Errors are failures of
/// the test's machinery (unreachable services, a crashed holder), not of
/// the fence.
async fn drive(args: &RunArgs, cfg: &ClientConfig, client: &Client, fence: &SharedFence, key: &LockKey) -> Result<Observed, Failure> {
    let json = args.target.json;
    let run_id = format!("{}-{}", record::now_unix_ms(), std::process::id());
    let first = format!("pausetest-{run_id}-first");
    let pending = format!("pausetest-{run_id}-pending");
    // The second holder's session, opened first: it says the class's TTL,
    // which the frozen holder's session then uses too.
    let session = client
        .open_session_for(key.namespace(), args.ttl)
        .await
        .map_err(|e| (conn::report(&e), "the second holder could not open a session".to_string()))?;
    let ttl = session.ttl();
    let exe = std::env::current_exe().map_err(|e| (exit::SOFTWARE, format!("cannot find this executable to start the holder: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .arg("holder")
        .args(["--lock", &args.lock, "--ttl", &format!("{}s", ttl.as_secs()), "--first", &first, "--pending", &pending])
        .args(["--fence-mode", args.fence_mode.name()])
        .args(args.target.resource.to_args())
        .env("HOLDFAST_ENDPOINT", &cfg.endpoint)
        .env("HOLDFAST_CA", &cfg.ca)
        .env("HOLDFAST_CERT", &cfg.cert)
        .env("HOLDFAST_KEY", &cfg.key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| (exit::SOFTWARE, format!("cannot start the holder process: {e}")))?;
    let pid = Pid::from_raw(child.id().map(|p| p as i32).ok_or((exit::SOFTWARE, "the holder exited at once".to_string()))?);
    let (Some(stdout), Some(mut stdin)) = (child.stdout.take(), child.stdin.take()) else {
        return Err((exit::SOFTWARE, "the holder's pipes are missing".into()));
    };
    let mut lines = BufReader::new(stdout).lines();
    let mut o = Observed::default();

    // 1. Acquire and write.
    expect(&mut lines, "acquired", Duration::from_secs(60)).await?;
    o.first = Some(expect_written(&mut lines, "first", Duration::from_secs(30)).await?);
    progress(json, &format!("1. the holder acquired {key}; its first write was {}", word(o.first, true)));
    if o.first == Some(Written::Rejected) {
        return Ok(o);
    }

    // 2. Freeze it at the decisive point of its next write.
    expect(&mut lines, "paused", Duration::from_secs(30)).await?;
    kill(pid, Signal::SIGSTOP).map_err(|e| (exit::SOFTWARE, format!("SIGSTOP to the holder failed: {e}")))?;
    wait_stopped(pid).await?;
    // Buffered in the pipe; the holder reads it only once resumed.
    stdin.write_all(b"go\n").await.map_err(|e| (exit::SOFTWARE, format!("writing to the holder: {e}")))?;
    let frozen_at = Instant::now();
    progress(json, &format!("2. froze the holder (SIGSTOP) at its decisive statement; waiting for its {}s lease to lapse", ttl.as_secs()));

    // 3. A second holder acquires (so the first hold has expired) and writes.
    let wait = ttl * 3 + Duration::from_secs(10);
    let hold = session.acquire(key, wait).await.map_err(|e| {
        (exit::UNAVAILABLE, format!("the lock did not pass to a second holder within {}s of freezing the first: {e}", wait.as_secs()))
    })?;
    let newer = fence
        .increment(&pending, hold.token(), &mut || {})
        .await
        .map_err(|e| (exit::UNAVAILABLE, format!("the second holder's write failed: {e}")))?;
    o.newer = Some(newer);
    progress(
        json,
        &format!(
            "3. a second holder acquired {key} {:.1}s after the freeze; its write was {}",
            frozen_at.elapsed().as_secs_f64(),
            word(o.newer, true)
        ),
    );

    // 4. Resume the first holder: its pending write must be rejected.
    kill(pid, Signal::SIGCONT).map_err(|e| (exit::SOFTWARE, format!("SIGCONT to the holder failed: {e}")))?;
    o.pending = Some(expect_written(&mut lines, "pending", Duration::from_secs(60)).await?);
    progress(json, &format!("4. resumed the first holder (SIGCONT): its pending write was {}", word(o.pending, false)));

    // 5. Its expired token, re-presented: must be rejected.
    o.repeat = Some(expect_written(&mut lines, "repeat", Duration::from_secs(60)).await?);
    progress(json, &format!("5. the first holder re-presented its expired token: {}", word(o.repeat, false)));
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;

    let log = fence.accepted_log(&pending).await.map_err(|e| (exit::UNAVAILABLE, format!("reading the record's log: {e}")))?;
    o.newer_is_last = Some(log.last() == Some(&hold.token().expose()));
    let _ = hold.release().await;
    let _ = session.close().await;
    Ok(o)
}

/// The outcome of a step, in capitals when it is not the one a fence must
/// give.
fn word(w: Option<Written>, should_accept: bool) -> &'static str {
    match (w, should_accept) {
        (Some(Written::Accepted { .. }), true) => "accepted",
        (Some(Written::Accepted { .. }), false) => "ACCEPTED",
        (Some(Written::Rejected), false) => "rejected",
        (Some(Written::Rejected), true) => "REJECTED",
        (None, _) => "not made",
    }
}

/// Waits until the kernel reports the process stopped (state `T`).
async fn wait_stopped(pid: Pid) -> Result<(), Failure> {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) == Some("T") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err((exit::SOFTWARE, "the holder did not stop after SIGSTOP".into()))
}

/// The holder's next line, which must be `want` (or `want <rest>`; the rest
/// is returned).
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, want: &str, timeout: Duration) -> Result<String, Failure> {
    let line = tokio::time::timeout(timeout, lines.next_line())
        .await
        .map_err(|_| (exit::SOFTWARE, format!("the holder did not report {want:?} within {}s", timeout.as_secs())))?
        .map_err(|e| (exit::SOFTWARE, format!("reading from the holder: {e}")))?
        .ok_or_else(|| (exit::SOFTWARE, format!("the holder exited before reporting {want:?}")))?;
    if let Some(m) = line.strip_prefix("error ") {
        return Err((exit::SOFTWARE, format!("the holder failed: {m}")));
    }
    match line.strip_prefix(want) {
        Some(rest) => Ok(rest.trim().to_string()),
        None => Err((exit::SOFTWARE, format!("the holder reported {line:?}, expected {want:?}"))),
    }
}

async fn expect(lines: &mut Lines<BufReader<ChildStdout>>, want: &str, timeout: Duration) -> Result<(), Failure> {
    next_line(lines, want, timeout).await.map(|_| ())
}

async fn expect_written(lines: &mut Lines<BufReader<ChildStdout>>, want: &str, timeout: Duration) -> Result<Written, Failure> {
    match next_line(lines, want, timeout).await?.as_str() {
        "accepted" => Ok(Written::Accepted { value: 0 }),
        "rejected" => Ok(Written::Rejected),
        other => Err((exit::SOFTWARE, format!("the holder reported {want} {other:?}"))),
    }
}
