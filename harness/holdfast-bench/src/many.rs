//! `--only holds` and `--only queue` (each runs only when named): many
//! holds over many sessions, and a long queue of waiters on one key, through
//! a second arbiter the bench starts on a dev appliance's etcd with that
//! appliance's config, its hold quotas and request rate raised
//! ([`DevArbiter`]).
//!
//! - **holds**: `--holds` holds on distinct keys spread over
//!   `--holds-sessions` sessions: grants/s, the arbiter's resident memory
//!   per session and per hold, etcd's database bytes in use per hold, and
//!   sessions lost after one keepalive round (must be 0).
//! - **queue**: `--queue` waiters, each with its own session, wait on one
//!   key while one holder keeps it; once the arbiter's `waiters` gauge counts
//!   them all, the holder releases and each waiter releases as soon as it is
//!   granted. Handoffs/s, release→next-grant p50/p99, the arbiter's memory
//!   per waiter, and whether the grants came in the order the waits began.

use crate::scale::{DevArbiter, rss_kib};
use crate::{BENCH_NAMESPACE, cpu, percentile, rand_u64, round, scrape};
use anyhow::Context;
use futures::StreamExt;
use holdfast_client::{Client, Health, Hold, Session};
use holdfast_model::LockKey;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Sessions per connection to the arbiter: each has a keepalive stream and,
/// in the queue, a waiting acquire; HTTP/2 servers commonly allow 200
/// concurrent streams.
const PER_CONNECTION: usize = 64;

/// Opens, acquires and closes in flight at once.
const IN_FLIGHT: usize = 64;

/// The bench class's keepalive period (TTL 60 s / 3) and a second: every
/// session has renewed once after this.
const KEEPALIVE_ROUND: Duration = Duration::from_secs(21);

/// A second arbiter on the appliance's etcd that admits `sessions` sessions
/// and any number of holds and requests from the bench's one identity.
fn arbiter(dir: Option<&std::path::Path>, name: &str, sessions: usize) -> anyhow::Result<DevArbiter> {
    let dir = dir.with_context(|| format!("--only {name} starts a second arbiter from a dev appliance's arbiter.toml: give --dev-dir"))?;
    DevArbiter::start_tuned(dir, &format!("arbiter-{name}"), &|c| {
        c.limits.max_sessions_per_identity = c.limits.max_sessions_per_identity.max(sessions as u64 + 8);
        c.limits.max_holds_per_identity = u64::MAX / 2;
        c.limits.max_holds_per_namespace = u64::MAX / 2;
        c.limits.requests_per_second = u32::MAX / 4;
        c.limits.request_burst = u32::MAX / 4;
    })
}

/// `n` sessions of the bench class over connections of [`PER_CONNECTION`]
/// each, and the first failure.
async fn open_sessions(conn: &holdfast_cli::conn::ConnArgs, n: usize) -> (Vec<Session>, Option<String>) {
    let mut clients: Vec<Client> = Vec::new();
    for i in 0..n.div_ceil(PER_CONNECTION) {
        match conn.connect().await {
            Ok(c) => clients.push(c),
            Err(code) => return (Vec::new(), Some(format!("connection {} to the arbiter failed (exit {code})", i + 1))),
        }
    }
    let clients = Arc::new(clients);
    let opened: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let clients = clients.clone();
            async move { clients[i / PER_CONNECTION].open_session_for(BENCH_NAMESPACE, None).await.map_err(|e| e.to_string()) }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut first_error = None;
    let sessions = opened
        .into_iter()
        .filter_map(|r| r.map_err(|e| first_error.get_or_insert(format!("opening a session: {e}")).clone()).ok())
        .collect();
    (sessions, first_error)
}

async fn close_all(sessions: Vec<Session>) {
    futures::stream::iter(sessions)
        .map(|s| async move {
            let _ = s.close().await;
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// What `--only holds` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Holds {
    pub sessions: usize,
    pub holds: usize,
    pub granted: usize,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    pub grants_per_sec: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_kib_per_session: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_bytes_per_hold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_db_bytes_per_hold: Option<f64>,
    /// Sessions lost one keepalive round after the last grant.
    pub false_fences: u64,
}

/// `holds` holds over `sessions` sessions.
pub async fn holds(
    conn: &holdfast_cli::conn::ConnArgs,
    dir: Option<&std::path::Path>,
    etcd_metrics: &str,
    sessions: usize,
    holds: usize,
) -> anyhow::Result<Holds> {
    let sessions = sessions.clamp(1, holds.max(1));
    let arbiter = arbiter(dir, "holds", sessions)?;
    let mut conn = conn.clone();
    conn.endpoint = Some(arbiter.endpoint.clone());
    let db = || scrape(etcd_metrics, "etcd_mvcc_db_total_size_in_use_in_bytes", "");
    let rss0 = rss_kib(arbiter.pid());
    let (open, mut first_error) = open_sessions(&conn, sessions).await;
    let rss_sessions = rss_kib(arbiter.pid());
    let db0 = db().await.ok();
    let run = rand_u64();
    let started = Instant::now();
    let open = Arc::new(open);
    let results: Vec<Result<Hold, String>> = futures::stream::iter(0..if open.is_empty() { 0 } else { holds })
        .map(|i| {
            let open = open.clone();
            async move {
                let key = LockKey::new(BENCH_NAMESPACE, &format!("many-{run:x}-{i}")).map_err(|e| e.to_string())?;
                open[i % open.len()].acquire(&key, Duration::ZERO).await.map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let granting = started.elapsed();
    let mut held = Vec::new();
    let mut errors = 0u64;
    for r in results {
        match r {
            Ok(h) => held.push(h),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(format!("acquiring: {e}"));
            }
        }
    }
    eprintln!(
        "  holds: {} of {holds} granted over {} sessions in {granting:.1?}; one keepalive round before measuring",
        held.len(),
        open.len()
    );
    tokio::time::sleep(KEEPALIVE_ROUND).await;
    let rss1 = rss_kib(arbiter.pid());
    let db1 = db().await.ok();
    let lost = open.iter().filter(|s| *s.health().borrow() == Health::Lost).count() as u64;
    let granted = held.len();
    drop(held); // a dropped Hold stays held; the sessions' close releases them
    let open = Arc::try_unwrap(open).unwrap_or_default();
    let n_sessions = open.len();
    close_all(open).await;
    let per = |a: Option<f64>, b: Option<f64>, n: usize, scale: f64| match (a, b) {
        (Some(a), Some(b)) if n > 0 => Some(round((b - a) * scale / n as f64)),
        _ => None,
    };
    Ok(Holds {
        sessions: n_sessions,
        holds,
        granted,
        errors,
        first_error,
        grants_per_sec: round(granted as f64 / granting.as_secs_f64().max(1e-9)),
        arbiter_rss_mib: rss1.map(|r| round(r / 1024.0)),
        arbiter_rss_kib_per_session: per(rss0, rss_sessions, n_sessions, 1.0),
        arbiter_rss_bytes_per_hold: per(rss_sessions, rss1, granted, 1024.0),
        etcd_db_bytes_per_hold: per(db0, db1, granted, 1.0),
        false_fences: lost,
    })
}

/// What `--only queue` measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Queue {
    pub waiters: usize,
    /// Waiters the arbiter's gauge counted before the holder released.
    pub queued: u64,
    pub granted: usize,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    pub handoffs_per_sec: f64,
    pub handoff_p50_ms: f64,
    pub handoff_p99_ms: f64,
    /// Grants that came before a grant to a waiter that began waiting
    /// earlier (0: strictly in arrival order); absent when the arrival
    /// order could not be fixed (the gauge did not count a waiter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_order: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_mib: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_rss_bytes_per_waiter: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arbiter_cpu_us_per_handoff: Option<f64>,
}

/// `waiters` waiters on one key.
pub async fn queue(conn: &holdfast_cli::conn::ConnArgs, dir: Option<&std::path::Path>, waiters: usize) -> anyhow::Result<Queue> {
    let arbiter = arbiter(dir, "queue", waiters + 1)?;
    let mut conn = conn.clone();
    conn.endpoint = Some(arbiter.endpoint.clone());
    let waiting_gauge = || scrape(&arbiter.metrics_url, "holdfast_arbiter_waiters", "");
    let (mut open, mut first_error) = open_sessions(&conn, waiters + 1).await;
    let holder = open.pop().with_context(|| format!("no session opened: {}", first_error.clone().unwrap_or_default()))?;
    let key = LockKey::new(BENCH_NAMESPACE, &format!("queue-{:x}", rand_u64()))?;
    let held = holder.acquire(&key, Duration::ZERO).await.context("the holder's acquire")?;
    let rss0 = rss_kib(arbiter.pid());
    // Waits begin one at a time, each after the previous one is counted
    // waiting, so arrival order is known.
    let grants: Arc<Mutex<Vec<(Instant, usize)>>> = Arc::default();
    let releases: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let mut tasks = Vec::new();
    let mut queued = 0u64;
    let mut ordered = true;
    let before = waiting_gauge().await.unwrap_or(0.0);
    for (i, session) in open.into_iter().enumerate() {
        let (grants, releases, key) = (grants.clone(), releases.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let granted = session.acquire(&key, Duration::from_secs(600)).await;
            let result = match granted {
                Ok(h) => {
                    grants.lock().unwrap_or_else(|e| e.into_inner()).push((Instant::now(), i));
                    let released = h.release().await;
                    releases.lock().unwrap_or_else(|e| e.into_inner()).push(Instant::now());
                    released.map(|_| ()).map_err(|e| format!("releasing: {e}"))
                }
                Err(e) => Err(format!("waiting: {e}")),
            };
            let _ = session.close().await;
            result
        }));
        // The next wait begins once this one is counted waiting. If the
        // gauge does not count it within 2 s, the rest begin at once and
        // the order is not judged.
        let end = Instant::now() + Duration::from_secs(2);
        while ordered {
            if let Ok(g) = waiting_gauge().await
                && g - before >= (i + 1) as f64
            {
                break;
            }
            if Instant::now() > end {
                eprintln!("  queue: waiter {} not counted waiting within 2 s; the rest begin at once, order not judged", i + 1);
                ordered = false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    if let Ok(g) = waiting_gauge().await {
        queued = (g - before).max(0.0) as u64;
    }
    let rss1 = rss_kib(arbiter.pid());
    let pids = cpu::Pids { arbiter: arbiter.pid(), etcd: None };
    let c0 = pids.sample();
    let released_at = Instant::now();
    held.release().await.context("the holder's release")?;
    releases.lock().unwrap_or_else(|e| e.into_inner()).push(released_at);
    let mut errors = 0u64;
    for t in tasks {
        if let Err(e) = t.await.map_err(|e| e.to_string()).and_then(|r| r) {
            errors += 1;
            first_error.get_or_insert(e);
        }
    }
    let c1 = pids.sample();
    let _ = holder.close().await;
    let mut grants = std::mem::take(&mut *grants.lock().unwrap_or_else(|e| e.into_inner()));
    let mut releases = std::mem::take(&mut *releases.lock().unwrap_or_else(|e| e.into_inner()));
    grants.sort();
    releases.sort();
    // Each grant's gap from the latest release before it.
    let mut gaps: Vec<Duration> =
        grants.iter().filter_map(|(t, _)| releases.iter().rev().find(|r| *r <= t).map(|r| t.saturating_duration_since(*r))).collect();
    gaps.sort();
    let out_of_order = ordered.then(|| grants.windows(2).filter(|w| w[1].1 < w[0].1).count());
    let span = grants.last().map_or(Duration::ZERO, |(t, _)| t.saturating_duration_since(released_at));
    let granted = grants.len();
    Ok(Queue {
        waiters,
        queued,
        granted,
        errors,
        first_error,
        handoffs_per_sec: round(granted as f64 / span.as_secs_f64().max(1e-9)),
        handoff_p50_ms: round(percentile(&gaps, 0.5)),
        handoff_p99_ms: round(percentile(&gaps, 0.99)),
        out_of_order,
        arbiter_rss_mib: rss1.map(|r| round(r / 1024.0)),
        arbiter_rss_bytes_per_waiter: match (rss0, rss1) {
            (Some(a), Some(b)) if queued > 0 => Some(round((b - a) * 1024.0 / queued as f64)),
            _ => None,
        },
        arbiter_cpu_us_per_handoff: match (c0.arbiter, c1.arbiter) {
            (Some(a), Some(b)) if granted > 0 => Some(round((b - a) * 1e6 / granted as f64)),
            _ => None,
        },
    })
}
