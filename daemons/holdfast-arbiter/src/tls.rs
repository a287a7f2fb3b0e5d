//! The arbiter's mTLS listener.
//!
//! The arbiter accepts TLS itself (tokio-rustls) instead of handing tonic a
//! fixed certificate, so `tls.cert_file`, `tls.key_file` and
//! `tls.client_ca_file` can change under a running arbiter: they are
//! re-read every second and on SIGHUP ([`holdfast_tls::Reloading`]), each
//! new connection is accepted with the config in force when it arrived,
//! and established connections (their sessions' keepalive streams) carry
//! on untouched. Handshakes run concurrently, each bounded by
//! [`HANDSHAKE_TIMEOUT`], so a slow or silent client holds up nobody.
//!
//! rustls (webpki) refuses at the handshake: no client certificate, an
//! untrusted CA, an expired or not yet valid certificate, a CA certificate
//! used as a leaf, a key that does not match the certificate. The SPIFFE
//! checks (one URI SAN, `spiffe://`, the trust domain) come after, on every
//! call ([`crate::identity`]), so the refusal can say what to issue instead.

use crate::metrics::{self, Metrics};
use holdfast_config::arbiter::TlsConfig;
use holdfast_tls::{Files, Reloading};
use rustls::ServerConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub type Tls = Arc<Reloading<ServerConfig>>;

pub fn files(tls: &TlsConfig) -> Files {
    Files { cert: tls.cert_file.clone(), key: tls.key_file.clone(), ca: tls.client_ca_file.clone() }
}

/// Reads the files and builds the first server config (the `check`
/// subcommand does this too).
pub fn load(tls: &TlsConfig) -> Result<Tls, holdfast_tls::TlsError> {
    Ok(Arc::new(Reloading::load(files(tls), holdfast_tls::server_config)?))
}

/// One look at the files, logged and counted; the watch loop and SIGHUP
/// both call it.
pub fn reload(tls: &Tls) {
    if tls.check_and_log("arbiter TLS (tls.cert_file, key_file, client_ca_file)") {
        metrics::inc(|m: &Metrics| &m.tls_reloads);
    }
}

/// Re-reads the files every second and on SIGHUP, for as long as the
/// arbiter runs.
pub fn watch(tls: Tls) -> std::io::Result<()> {
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(holdfast_tls::WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = hup.recv() => tracing::info!("SIGHUP: re-reading the TLS files"),
            }
            reload(&tls);
        }
    });
    Ok(())
}

/// The accepted connections, each through its TLS handshake, as tonic's
/// incoming stream. TCP_NODELAY is set on every connection (tonic ignores
/// its own setting for an incoming stream; with Nagle on, a small response
/// written while an earlier one awaits its delayed ACK waits up to 40 ms).
///
/// Accepting stops when `stopping` turns true (SIGTERM): connections that
/// arrive while in-flight calls drain stay in the kernel's backlog, where
/// the next arbiter on the same socket (holdfast-arbiter.socket keeps it
/// open across a restart) takes them, instead of being accepted here and
/// dropped at exit.
pub fn incoming(
    listener: TcpListener,
    tls: Tls,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stopping.wait_for(|s| *s) => return,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    // EMFILE and the like: say so, and do not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = tcp.set_nodelay(true);
            let acceptor = holdfast_tls::acceptor(&tls);
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => {
                        metrics::inc(|m: &Metrics| &m.tls_handshake_failures);
                        tracing::debug!(%peer, error = %e, "TLS handshake refused");
                    }
                    Err(_) => {
                        metrics::inc(|m: &Metrics| &m.tls_handshake_failures);
                        tracing::debug!(%peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
