//! What the holdfast daemons (arbiter, controller, tailer) share: their
//! start-up in `main` ([`startup`]: `--log-format`, config load, runtime,
//! exit statuses), their metrics' plumbing ([`metrics`]) and the Prometheus
//! text endpoint each serves on `metrics_listen` ([`serve_metrics`]),
//! systemd readiness and watchdog ([`Notifier`]), the stop signals
//! ([`Stop`]), the process's name in elections and records ([`identity`]),
//! and the etcd election of the single-active daemons ([`election`]).

pub mod election;
pub mod metrics;
pub mod route;
pub mod startup;

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

/// Logs at the level from `HOLDFAST_LOG` (default info). Under systemd, when
/// stderr is the journal (`JOURNAL_STREAM` names it), each event goes to
/// journald natively: its fields become journal fields (`HOLDFAST_*`,
/// e.g. `journalctl HOLDFAST_NAMESPACE=payments`) and its level the
/// priority. Elsewhere: plain text for terminals, or one JSON object per
/// line for collectors. (The arbiter adds its span exporter and sets up its
/// own subscriber with [`log_layer`].)
pub fn init_logging(json: bool) {
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry().with(log_layer(json)).init();
}

/// Where log lines go: journald when stderr is connected to it, else stderr
/// as plain text or JSON; filtered by `HOLDFAST_LOG`.
pub fn log_layer<S>(json: bool) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOLDFAST_LOG").unwrap_or_else(|_| "info".into());
    if libsystemd::logging::connected_to_journal() {
        match tracing_journald::layer() {
            Ok(journal) => return journal.with_field_prefix(Some("HOLDFAST".into())).with_filter(filter).boxed(),
            // The stream still reaches the journal as plain lines.
            Err(e) => eprintln!("journald socket unavailable ({e}); logging plain text to stderr"),
        }
    }
    if json {
        tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr).with_filter(filter).boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
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
