//! What the holdfast daemons (arbiter, controller, tailer) share: the
//! Prometheus text endpoint each serves on `metrics_listen`, systemd
//! readiness and watchdog ([`Notifier`]), the stop signals ([`Stop`]), the
//! process's name in elections and records ([`identity`]), and the etcd
//! election of the single-active daemons ([`election`]).

pub mod election;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Response, StatusCode};
use sd_notify::NotifyState;
use std::net::SocketAddr;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// This process's name in elections and in the documents it writes:
/// `HOST pid PID`.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    let host = if host.is_empty() { "unknown-host".to_string() } else { host };
    format!("{host} pid {}", std::process::id())
}

/// Logs to stderr, level from `HOLDFAST_LOG` (default info): plain text
/// for terminals and journald, or one JSON object per line for collectors.
/// (The arbiter adds its span exporter and sets up its own.)
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOLDFAST_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
}

fn notify(state: &[NotifyState]) {
    // Outside systemd NOTIFY_SOCKET is unset and this does nothing.
    if let Err(e) = sd_notify::notify(state) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Sends READY=1 once, then WATCHDOG=1 on every completed round (only when
/// systemd asked for it: `WatchdogSec=`), and STATUS= when it changes. Each
/// message is a blocking datagram send, so nothing is sent that nobody
/// asked for.
pub struct Notifier {
    ready: bool,
    watchdog: bool,
    status: String,
}

impl Default for Notifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Notifier {
    pub fn new() -> Self {
        Notifier { ready: false, watchdog: sd_notify::watchdog_enabled().is_some(), status: String::new() }
    }

    /// One completed round, described by `status` (systemd's STATUS=).
    pub fn round(&mut self, status: &str) {
        if !self.ready {
            self.ready = true;
            self.status = status.to_string();
            notify(&[NotifyState::Ready, NotifyState::Status(status)]);
            tracing::info!("ready: {status}");
            return;
        }
        let changed = self.status != status;
        if changed {
            self.status = status.to_string();
        }
        match (self.watchdog, changed) {
            (true, true) => notify(&[NotifyState::Watchdog, NotifyState::Status(status)]),
            (true, false) => notify(&[NotifyState::Watchdog]),
            (false, true) => notify(&[NotifyState::Status(status)]),
            (false, false) => {}
        }
    }

    /// Tells systemd the daemon is stopping.
    pub fn stopping(&self) {
        notify(&[NotifyState::Stopping]);
    }
}

/// SIGTERM and SIGINT: a graceful stop.
pub struct Stop {
    term: Signal,
    int: Signal,
}

impl Stop {
    pub fn new() -> std::io::Result<Self> {
        Ok(Stop { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Resolves on SIGTERM or SIGINT. Cancel-safe.
    pub async fn stop(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Serves `GET /metrics` (anything else: 404) over plain HTTP/1.1 on
/// `addr`, answering with `encode()` (Prometheus text format). Returns the
/// bound address (port 0 picks one).
pub async fn serve_metrics(addr: SocketAddr, encode: fn() -> String) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("binding metrics_listen {addr}: {e}; change metrics_listen or stop what uses the port"))?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                    if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                            .body(Full::new(Bytes::from(encode())))
                    } else {
                        Response::builder().status(StatusCode::NOT_FOUND).body(Full::new(Bytes::from_static(b"see /metrics\n")))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    Ok(local)
}
