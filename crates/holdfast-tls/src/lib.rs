//! mTLS material read from PEM files and reloaded when they change.
//!
//! A [`Reloading`] holds a rustls config built from three files — a
//! certificate chain, its private key and a CA bundle — and rebuilds it when
//! any of them changes ([`Reloading::check`]: the arbiter runs it every
//! [`WATCH_INTERVAL`] and on SIGHUP, the client library before each new
//! connection). A new config is used
//! for new connections; connections already made keep theirs. Files that do
//! not build a config (unreadable, no certificate, a key that does not match
//! the certificate, no CA) are refused: the last good config stays, the
//! error is logged once per distinct content, and the next change is tried
//! again. So a rotation that writes the certificate and then the key is
//! picked up once both are in place. Files whose owner or mode would let
//! another user rewrite them, or a key that others may read, are refused
//! the same way, at start and at every reload ([`trust`]).
//!
//! [`server_config`] requires a client certificate from the CA bundle
//! (webpki: trusted chain, validity period, an end-entity certificate, not a
//! CA); [`client_config`] presents the workload's SVID and trusts the
//! arbiter's CA. Both speak HTTP/2 only (ALPN `h2`), as gRPC does.

pub mod trust;

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;

/// The three files of one TLS identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
    /// PEM CA bundle: the peer's certificate must chain to one of these.
    pub ca: PathBuf,
}

/// Why a set of files does not make a TLS config.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the {what} {path}: {source}")]
    Read { what: &'static str, path: String, source: std::io::Error },
    #[error("the {what} {path} holds no usable PEM {kind}: {reason}")]
    Pem { what: &'static str, path: String, kind: &'static str, reason: String },
    #[error("the certificate {cert} and the key {key} do not make a TLS identity ({source}); is the key the certificate's?")]
    Identity { cert: String, key: String, source: rustls::Error },
    #[error("the CA bundle {path} cannot verify peers: {reason}")]
    Ca { path: String, reason: String },
    #[error("the {what} {path} {why}")]
    Insecure { what: &'static str, path: String, why: String },
}

/// The PEM bytes of [`Files`], as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pem {
    pub files: Files,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Vec<u8>,
}

fn read(what: &'static str, path: &Path, kind: trust::Kind) -> Result<Vec<u8>, TlsError> {
    trust::read(path, kind).map_err(|e| match e {
        trust::Refused::Io(source) => TlsError::Read { what, path: path.display().to_string(), source },
        trust::Refused::Insecure(why) => TlsError::Insecure { what, path: path.display().to_string(), why },
    })
}

impl Pem {
    /// Reads the three files, each checked for owner and mode
    /// ([`trust`]): an insecure one is [`TlsError::Insecure`].
    pub fn read(files: &Files) -> Result<Pem, TlsError> {
        Ok(Pem {
            cert: read("certificate", &files.cert, trust::Kind::Public)?,
            key: read("private key", &files.key, trust::Kind::Secret)?,
            ca: read("CA bundle", &files.ca, trust::Kind::Public)?,
            files: files.clone(),
        })
    }

    fn chain(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        certificates("certificate", &self.files.cert, &self.cert)
    }

    fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.key).map_err(|e| TlsError::Pem {
            what: "private key",
            path: self.files.key.display().to_string(),
            kind: "private key",
            reason: e.to_string(),
        })
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let path = self.files.ca.display().to_string();
        let mut roots = RootCertStore::empty();
        for cert in certificates("CA bundle", &self.files.ca, &self.ca)? {
            roots.add(cert).map_err(|e| TlsError::Ca { path: path.clone(), reason: e.to_string() })?;
        }
        Ok(roots)
    }

    fn identity_error(&self, source: rustls::Error) -> TlsError {
        TlsError::Identity { cert: self.files.cert.display().to_string(), key: self.files.key.display().to_string(), source }
    }
}

fn certificates(what: &'static str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let err = |reason: String| TlsError::Pem { what, path: path.display().to_string(), kind: "certificate", reason };
    let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>().map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The arbiter's server config: presents `cert`, requires every client to
/// present a certificate that chains to `ca`.
pub fn server_config(pem: &Pem) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(pem.roots()?), provider.clone())
        .build()
        .map_err(|e| TlsError::Ca { path: pem.files.ca.display().to_string(), reason: e.to_string() })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| pem.identity_error(e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(pem.chain()?, pem.private_key()?)
        .map_err(|e| pem.identity_error(e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A client config: presents `cert` (the workload's SVID), trusts servers
/// whose certificate chains to `ca`.
pub fn client_config(pem: &Pem) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| pem.identity_error(e))?
        .with_root_certificates(pem.roots()?)
        .with_client_auth_cert(pem.chain()?, pem.private_key()?)
        .map_err(|e| pem.identity_error(e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// What one [`Reloading::check`] found.
#[derive(Debug)]
pub enum Reload {
    /// The files are as last loaded (or as last refused).
    Unchanged,
    /// The files changed and the new config is in use for new connections.
    Reloaded,
    /// The files changed but do not build a config; the last good one stays.
    Refused(TlsError),
    /// The files could not be read; the last good config stays.
    Unreadable(TlsError),
}

struct State<C> {
    current: Arc<C>,
    loaded: Pem,
    refused: Option<Pem>,
    /// The last insecure-file refusal, reported once until it changes.
    insecure: Option<String>,
}

/// A TLS config built from [`Files`] and rebuilt when they change.
pub struct Reloading<C> {
    files: Files,
    build: fn(&Pem) -> Result<C, TlsError>,
    state: Mutex<State<C>>,
}

impl<C> Reloading<C> {
    /// Reads the files and builds the first config: an error here is an
    /// error at start.
    pub fn load(files: Files, build: fn(&Pem) -> Result<C, TlsError>) -> Result<Self, TlsError> {
        let loaded = Pem::read(&files)?;
        let current = Arc::new(build(&loaded)?);
        Ok(Reloading { files, build, state: Mutex::new(State { current, loaded, refused: None, insecure: None }) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<C>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The config for the next connection.
    pub fn current(&self) -> Arc<C> {
        self.state().current.clone()
    }

    /// The PEM bytes of the config in use.
    pub fn loaded(&self) -> Pem {
        self.state().loaded.clone()
    }

    pub fn files(&self) -> &Files {
        &self.files
    }

    /// Re-reads the files and, if they changed, builds a new config.
    pub fn check(&self) -> Reload {
        let pem = match Pem::read(&self.files) {
            Ok(p) => p,
            Err(e @ TlsError::Insecure { .. }) => {
                // Refused, whatever the content; said once per distinct reason.
                let why = e.to_string();
                let mut state = self.state();
                if state.insecure.as_ref() == Some(&why) {
                    return Reload::Unchanged;
                }
                state.insecure = Some(why);
                return Reload::Refused(e);
            }
            Err(e) => return Reload::Unreadable(e),
        };
        let mut state = self.state();
        state.insecure = None;
        if pem == state.loaded || state.refused.as_ref() == Some(&pem) {
            return Reload::Unchanged;
        }
        match (self.build)(&pem) {
            Ok(config) => {
                state.current = Arc::new(config);
                state.loaded = pem;
                state.refused = None;
                Reload::Reloaded
            }
            Err(e) => {
                state.refused = Some(pem);
                Reload::Refused(e)
            }
        }
    }

    /// [`Reloading::check`] with the outcome logged: `what` names the
    /// identity ("arbiter certificate", "client SVID"). True if a new config
    /// was loaded.
    pub fn check_and_log(&self, what: &str) -> bool {
        match self.check() {
            Reload::Unchanged => false,
            Reload::Reloaded => {
                tracing::info!(cert = %self.files.cert.display(), "{what}: the files changed and were loaded; new connections use them");
                true
            }
            Reload::Refused(e) => {
                tracing::error!(error = %e, "{what}: the files changed but do not load; the last good ones stay in use until they are fixed");
                false
            }
            // A rename in progress, or a file briefly gone: look again next time.
            Reload::Unreadable(e) => {
                tracing::debug!(error = %e, "{what}: files unreadable for now; the last good ones stay");
                false
            }
        }
    }
}

/// How often a daemon looks at its TLS files (the client library looks at
/// its own on every new connection).
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Dials a TLS server: TCP, then TLS with the files on disk now (each call
/// first runs [`Reloading::check_and_log`], so a rotated certificate is
/// what every new connection presents). A tonic connector
/// (`Endpoint::connect_with_connector`): tonic then speaks plain HTTP/2 over
/// the TLS stream, so give it an `http://` URI.
#[derive(Clone)]
pub struct Dialer {
    tls: Arc<Reloading<ClientConfig>>,
    /// The name the server's certificate must carry; `None`: the host of
    /// each URI dialled.
    server_name: Option<ServerName<'static>>,
    /// What the files are, for the log ("client SVID", "etcd client certificate").
    what: &'static str,
}

impl Dialer {
    pub fn new(tls: Arc<Reloading<ClientConfig>>, server_name: Option<ServerName<'static>>, what: &'static str) -> Self {
        Dialer { tls, server_name, what }
    }
}

impl tower_service::Service<http::Uri> for Dialer {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        self.tls.check_and_log(self.what);
        let connector = connector(&self.tls);
        let name = self.server_name.clone();
        Box::pin(async move {
            let host = uri.host().unwrap_or_default().trim_matches(['[', ']']).to_string();
            let port = uri.port_u16().unwrap_or(443);
            let name = match name {
                Some(n) => n,
                None => ServerName::try_from(host.clone()).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
            };
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            Ok(TokioIo::new(connector.connect(name, tcp).await?))
        })
    }
}

/// The server side of a reloading TLS identity: a TLS acceptor with the
/// config in force now.
pub fn acceptor(tls: &Reloading<ServerConfig>) -> tokio_rustls::TlsAcceptor {
    tokio_rustls::TlsAcceptor::from(tls.current())
}

/// The client side: a TLS connector with the config in force now.
pub fn connector(tls: &Reloading<ClientConfig>) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(tls.current())
}
