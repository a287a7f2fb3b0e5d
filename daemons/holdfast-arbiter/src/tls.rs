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
//!
//! Before any handshake, [`Admission`] bounds what an unauthenticated peer
//! can take: open connections in total and per source address, and
//! handshakes started per second in total and per source address
//! (`[limits]`). A connection past a bound is closed at once, before TLS:
//! no gRPC status can be sent earlier, and sending one would cost the
//! handshake being limited (the client sees UNAVAILABLE). Connections
//! already open are untouched.

use crate::metrics::{self, Metrics};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use holdfast_config::arbiter::{LimitsConfig, TlsConfig};
use holdfast_tls::{Files, Reloading};
use rustls::ServerConfig;
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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

/// The bounds on connections and handshakes (see the module docs).
pub struct Admission {
    open: Mutex<Open>,
    handshakes: DefaultDirectRateLimiter,
    handshakes_per_address: DefaultKeyedRateLimiter<IpAddr>,
    config: LimitsConfig,
}

#[derive(Default)]
struct Open {
    total: u32,
    by_address: HashMap<IpAddr, u32>,
}

/// Why a connection was closed before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turned {
    Connections,
    ConnectionsFromAddress,
    Handshakes,
    HandshakesFromAddress,
}

impl Admission {
    pub fn new(config: &LimitsConfig) -> Self {
        let per_second = |v: u32| {
            let v = NonZeroU32::new(v).unwrap_or(NonZeroU32::MIN);
            Quota::per_second(v).allow_burst(v)
        };
        Admission {
            open: Mutex::default(),
            handshakes: RateLimiter::direct(per_second(config.handshakes_per_second)),
            handshakes_per_address: RateLimiter::keyed(per_second(config.handshakes_per_second_per_address)),
            config: config.clone(),
        }
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for one more connection from `peer`, held until the
    /// connection closes; or why not.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, Turned> {
        let mut open = self.open();
        if open.total >= self.config.max_connections {
            return Err(Turned::Connections);
        }
        if open.by_address.get(&peer).copied().unwrap_or(0) >= self.config.max_connections_per_address {
            return Err(Turned::ConnectionsFromAddress);
        }
        // The address's bucket first: one address's flood spends its own
        // bucket, not everyone's.
        if self.handshakes_per_address.check_key(&peer).is_err() {
            return Err(Turned::HandshakesFromAddress);
        }
        if self.handshakes.check().is_err() {
            return Err(Turned::Handshakes);
        }
        open.total += 1;
        *open.by_address.entry(peer).or_default() += 1;
        Ok(Slot { admission: self.clone(), peer })
    }

    /// Connections open now (for the metric).
    pub fn open_connections(&self) -> u32 {
        self.open().total
    }

    /// Forgets per-address handshake buckets that are full again.
    pub fn forget_idle(&self) {
        self.handshakes_per_address.retain_recent();
    }

    /// The warning for a connection turned away, naming the limit.
    pub fn describe(&self, turned: Turned, peer: IpAddr) -> String {
        let c = &self.config;
        match turned {
            Turned::Connections => {
                format!("{} connections are open, limits.max_connections = {}", self.open_connections(), c.max_connections)
            }
            Turned::ConnectionsFromAddress => {
                format!("{peer} has limits.max_connections_per_address = {} connections open", c.max_connections_per_address)
            }
            Turned::Handshakes => format!("past limits.handshakes_per_second = {}", c.handshakes_per_second),
            Turned::HandshakesFromAddress => {
                format!("{peer} is past limits.handshakes_per_second_per_address = {}", c.handshakes_per_second_per_address)
            }
        }
    }
}

/// One admitted connection's place; freed when dropped.
pub struct Slot {
    admission: Arc<Admission>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.admission.open();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_address.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_address.remove(&self.peer);
            }
        }
    }
}

/// An accepted TLS connection holding its [`Slot`] for as long as it is open.
pub struct Conn {
    tls: TlsStream<TcpStream>,
    _slot: Slot,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = <TlsStream<TcpStream> as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tls.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_shutdown(cx)
    }
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
    admission: Arc<Admission>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let warned = RateLimiter::direct(Quota::per_second(NonZeroU32::MIN));
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
            let slot = match admission.admit(peer.ip()) {
                Ok(slot) => slot,
                Err(turned) => {
                    metrics::inc(|m: &Metrics| &m.connections_turned_away);
                    // At most one line a second: a flood must not become a log flood.
                    if warned.check().is_ok() {
                        tracing::warn!(%peer, "connection closed before its TLS handshake: {}", admission.describe(turned, peer.ip()));
                    }
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = holdfast_tls::acceptor(&tls);
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(Conn { tls, _slot: slot })).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(total: u32, per_address: u32, rate: u32, rate_per_address: u32) -> Arc<Admission> {
        let config = LimitsConfig {
            max_connections: total,
            max_connections_per_address: per_address,
            handshakes_per_second: rate,
            handshakes_per_second_per_address: rate_per_address,
            ..LimitsConfig::default()
        };
        Arc::new(Admission::new(&config))
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    #[test]
    fn connections_are_bounded_per_address_and_in_total_and_a_close_frees_a_place() {
        let adm = admission(3, 2, 100, 100);
        let a1 = adm.admit(A).unwrap();
        let _a2 = adm.admit(A).unwrap();
        assert_eq!(adm.admit(A).err(), Some(Turned::ConnectionsFromAddress));
        let _b1 = adm.admit(B).unwrap();
        assert_eq!(adm.admit(B).err(), Some(Turned::Connections), "three open in total");
        assert_eq!(adm.open_connections(), 3);
        drop(a1);
        assert_eq!(adm.open_connections(), 2);
        assert!(adm.admit(A).is_ok(), "a closed connection frees its place");
        assert!(adm.describe(Turned::Connections, A).contains("limits.max_connections = 3"));
    }

    #[test]
    fn handshakes_are_rate_limited_per_address_before_the_total() {
        let adm = admission(100, 100, 5, 3);
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(adm.admit(A).unwrap());
        }
        assert_eq!(adm.admit(A).err(), Some(Turned::HandshakesFromAddress));
        // A's flood spent A's bucket, not the total one.
        open.push(adm.admit(B).unwrap());
        open.push(adm.admit(B).unwrap());
        assert_eq!(adm.admit(B).err(), Some(Turned::Handshakes), "five handshakes this second in total");
        assert!(adm.describe(Turned::HandshakesFromAddress, A).contains("limits.handshakes_per_second_per_address = 3"));
        // A refused handshake takes no place.
        assert_eq!(adm.open_connections(), 5);
    }
}
