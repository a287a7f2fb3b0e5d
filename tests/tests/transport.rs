//! Transport security at the arbiter: every kind of bad client certificate
//! is refused and writes nothing, and certificates rotate under a running
//! arbiter and running clients without losing a hold.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_devkit::pki::{DevCa, Issued, params};
use holdfast_devkit::rcgen;
use holdfast_model::LockKey;
use holdfast_proto::LockClient;
use holdfast_proto::v1::OpenSessionRequest;
use holdfast_tests::*;
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::transport::{Endpoint, Uri};

fn chain(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path).unwrap().collect::<Result<_, _>>().unwrap()
}

fn roots(ca: &Path) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    for c in chain(ca) {
        roots.add(c).unwrap();
    }
    roots
}

/// Presents a certificate with whatever key it is given: rustls's own
/// builder refuses a key that does not match, and the arbiter must refuse
/// it too when a client presents one anyway.
#[derive(Debug)]
struct Present(Arc<CertifiedKey>);

impl ResolvesClientCert for Present {
    fn resolve(&self, _: &[&[u8]], _: &[rustls::SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
    fn has_certs(&self) -> bool {
        true
    }
}

/// A rustls client trusting `ca`, presenting `cert` (with its key file,
/// matching or not), or nothing.
fn client_tls(ca: &Path, cert: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots(ca));
    let mut config = match cert {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let provider = rustls::crypto::ring::default_provider();
            let key = provider.key_provider.load_private_key(PrivateKeyDer::from_pem_file(&c.key).unwrap()).unwrap();
            builder.with_client_cert_resolver(Arc::new(Present(Arc::new(CertifiedKey::new(chain(&c.cert), key)))))
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// Dials the arbiter with a fixed rustls config (the test's own, not the
/// client library's).
#[derive(Clone)]
struct RawDialer(Arc<rustls::ClientConfig>);

impl tower_service::Service<Uri> for RawDialer {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.0.clone());
        Box::pin(async move {
            let tcp = TcpStream::connect((uri.host().unwrap(), uri.port_u16().unwrap())).await?;
            let name = ServerName::try_from("127.0.0.1").unwrap();
            Ok(TokioIo::new(connector.connect(name, tcp).await?))
        })
    }
}

/// OpenSession (which writes the session record) through a connection made
/// with `tls`.
async fn open_session(endpoint: &str, tls: Arc<rustls::ClientConfig>) -> Result<u64, tonic::Status> {
    let channel = Endpoint::from_shared(format!("http://{endpoint}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(RawDialer(tls))
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    let req = OpenSessionRequest { ttl_millis: 0, namespace: "demo".into() };
    LockClient::new(channel).open_session(req).await.map(|r| r.into_inner().session_id)
}

/// The certificate the arbiter presents to a new connection.
async fn presented(endpoint: &str, tls: Arc<rustls::ClientConfig>) -> Result<CertificateDer<'static>, std::io::Error> {
    let tcp = TcpStream::connect(endpoint).await?;
    let stream = tokio_rustls::TlsConnector::from(tls).connect(ServerName::try_from("127.0.0.1").unwrap(), tcp).await?;
    Ok(stream.get_ref().1.peer_certificates().unwrap()[0].clone())
}

async fn handshake_failures(arbiter: &Arbiter) -> f64 {
    sample(&scrape(arbiter.metrics_port).await, "holdfast_arbiter_tls_handshake_failures_total{cluster=\"test\"}")
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_client_certificate_is_refused_and_etcd_does_not_move() {
    let app = Appliance::start("tls-matrix", 1).await;
    let (ca, ca_file, endpoint) = (&app.pki.ca, app.pki.ca.ca_path(), app.arbiter.endpoint());
    let svid = |path: &str| format!("spiffe://holdfast.dev/matrix/{path}");
    let leaf = |name: &str| params(name, &[], &[&svid(name)]).unwrap();

    let other_ca = DevCa::open_or_create(&app.dir.path.join("other-ca")).unwrap();
    let mut expired = leaf("expired");
    (expired.not_before, expired.not_after) = (rcgen::date_time_ymd(2020, 1, 1), rcgen::date_time_ymd(2021, 1, 1));
    let mut not_yet = leaf("not-yet-valid");
    (not_yet.not_before, not_yet.not_after) = (rcgen::date_time_ymd(2090, 1, 1), rcgen::date_time_ymd(2091, 1, 1));
    let mut ca_leaf = leaf("ca-leaf");
    ca_leaf.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let good = ca.workload("good", "matrix/good").unwrap();
    let mismatched = Issued { cert: good.cert.clone(), key: ca.workload("another", "matrix/another").unwrap().key };

    // Refused in the TLS handshake (counted by the arbiter).
    let at_handshake: Vec<(&str, Option<Issued>)> = vec![
        ("an untrusted CA", Some(other_ca.workload("untrusted", "matrix/untrusted").unwrap())),
        ("an expired certificate", Some(ca.issue_with("expired", expired).unwrap())),
        ("a certificate not yet valid", Some(ca.issue_with("not-yet-valid", not_yet).unwrap())),
        ("no client certificate", None),
        ("a CA:TRUE leaf", Some(ca.issue_with("ca-leaf", ca_leaf).unwrap())),
        ("a key that does not match its certificate", Some(mismatched)),
    ];
    // Past the handshake, refused on the call with what to issue instead.
    let at_call: Vec<(&str, Issued, &str)> = vec![
        (
            "the wrong trust domain",
            ca.issue("wrong-domain", &[], &["spiffe://other.example/matrix/x"]).unwrap(),
            "is in trust domain \"other.example\", but this arbiter serves \"holdfast.dev\"",
        ),
        (
            "two URI SANs",
            ca.issue("two-sans", &[], &[&svid("a"), &svid("b")]).unwrap(),
            "an SVID carries exactly one URI SAN; this certificate has several",
        ),
        ("a non-spiffe URI", ca.issue("https-uri", &[], &["https://matrix.example/x"]).unwrap(), "no spiffe:// ID"),
    ];

    let revision = app.etcd.revision().await;
    for (what, cert) in &at_handshake {
        let before = handshake_failures(&app.arbiter).await;
        let r = open_session(&endpoint, client_tls(&ca_file, cert.as_ref())).await;
        let status = r.expect_err(&format!("{what}: a session was opened"));
        assert_ne!(status.code(), tonic::Code::Unauthenticated, "{what}: got past the handshake: {status:?}");
        let end = Instant::now() + Duration::from_secs(5);
        while handshake_failures(&app.arbiter).await < before + 1.0 {
            assert!(Instant::now() < end, "{what}: the arbiter did not count a refused handshake ({status:?})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for (what, cert, message) in &at_call {
        let status = open_session(&endpoint, client_tls(&ca_file, Some(cert))).await.expect_err(what);
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{what}: {status:?}");
        assert!(status.message().contains(message), "{what}: {:?}", status.message());
    }
    assert_eq!(app.etcd.revision().await, revision, "a refused client wrote to etcd");

    // The control: the good SVID opens a session (and that does write).
    open_session(&endpoint, client_tls(&ca_file, Some(&good))).await.expect("the good SVID");
    assert!(app.etcd.revision().await > revision);
}

/// Writes `from`'s certificate and key over `to`'s files, each by an
/// atomic rename (the certificate first: for a moment the two do not match,
/// as in a real rotation).
fn replace(from: &Issued, to: &Issued) {
    for (src, dst) in [(&from.cert, &to.cert), (&from.key, &to.key)] {
        let tmp = dst.with_extension("new");
        std::fs::copy(src, &tmp).unwrap();
        std::fs::rename(&tmp, dst).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn write_atomically(path: &Path, contents: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn certificates_rotate_under_eight_holders_without_a_restart_and_no_hold_is_lost() {
    let mut app = Appliance::start("tls-rotation", 1).await;
    let dir = app.dir.path.clone();
    let first_ca = std::fs::read(app.pki.ca.ca_path()).unwrap();

    // Eight workloads each hold a key of the 30 s "demo" class and renew.
    let fenced = Arc::new(AtomicUsize::new(0));
    let mut holders = Vec::new();
    for i in 0..8 {
        let path = format!("rotate/w{i}");
        let cert = app.pki.workload(&path.replace('/', "-"), &path);
        let f = fenced.clone();
        let locker = app.locker(&path, &[&app.arbiter], move |_| {
            f.fetch_add(1, Ordering::SeqCst);
        });
        let key = LockKey::parse(&format!("demo/rotate-{i}")).unwrap();
        let guard = locker.acquire(&key, Default::default()).await.unwrap();
        holders.push((locker, guard, cert, key));
    }
    let holds_before = holds(&app.etcd).await;
    assert_eq!(holds_before.len(), 8);

    // A second CA: the bundle trusts both while certificates move over.
    let second = DevCa::open_or_create(&dir.join("second-ca")).unwrap();
    let both = [first_ca.clone(), std::fs::read(second.ca_path()).unwrap()].concat();
    write_atomically(&app.pki.ca.ca_path(), &both);
    replace(&second.server("arbiter").unwrap(), &app.pki.server);
    for (_, _, cert, _) in &holders {
        let name = cert.cert.file_stem().unwrap().to_str().unwrap().to_string();
        let path = name.replacen('-', "/", 1);
        replace(&second.workload(&name, &path).unwrap(), cert);
    }

    // New connections get the new server certificate, without a restart.
    let new_server = chain(&app.pki.server.cert)[0].clone();
    let probe = second.workload("probe", "rotate/probe").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let got = presented(&app.arbiter.endpoint(), client_tls(&app.pki.ca.ca_path(), Some(&probe))).await.unwrap();
        if got == new_server {
            break;
        }
        assert!(Instant::now() < end, "the arbiter still presents its first certificate");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = scrape(app.arbiter.metrics_port).await;
    assert!(sample(&metrics, "holdfast_arbiter_tls_reloads_total{cluster=\"test\"}") >= 1.0, "{metrics}");

    // Then the first CA is withdrawn: a certificate from it no longer
    // connects, while the eight existing connections carry on renewing.
    write_atomically(&app.pki.ca.ca_path(), &std::fs::read(second.ca_path()).unwrap());
    let old = DevCa::open_or_create(&dir.join("tls")).unwrap().workload("old", "rotate/old").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while open_session(&app.arbiter.endpoint(), client_tls(&app.pki.ca.ca_path(), Some(&old))).await.is_ok() {
        assert!(Instant::now() < end, "the arbiter still trusts the withdrawn CA");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(12)).await; // more than one renewal period of the 30 s class

    // The clients' new connections present their rotated SVIDs: after an
    // arbiter restart (same port) only those are trusted, and every
    // session reconnects and renews on.
    let port = app.arbiter.port;
    app.arbiter.stop();
    let endpoints = app.etcd.endpoints();
    app.arbiter = Arbiter::start_with(&dir, "arbiter-after", &endpoints, &app.pki, &|c| c.listen = ([127, 0, 0, 1], port).into());
    tokio::time::sleep(Duration::from_secs(15)).await; // a renewal period and more, on the new connections
    for (_, guard, _, key) in &holders {
        assert!(guard.can_start(), "{key}: the holder may no longer act");
        assert!(guard.remaining_ttl() > Duration::from_secs(10), "{key}: renewals stopped ({:?} left)", guard.remaining_ttl());
    }
    assert_eq!(fenced.load(Ordering::SeqCst), 0, "a client was fenced");
    assert_eq!(holds(&app.etcd).await, holds_before, "a hold was lost or granted again");
    for (_, guard, _, _) in holders {
        assert!(guard.release().await.unwrap());
    }
}

/// Every hold in etcd: (key, create revision, lease).
async fn holds(etcd: &Etcd) -> Vec<(String, i64, i64)> {
    let opts = etcd_client::GetOptions::new().with_prefix();
    let resp = etcd.client().await.get(holdfast_model::layout::HOLD_PREFIX, Some(opts)).await.unwrap();
    resp.kvs().iter().map(|kv| (kv.key_str().unwrap().to_string(), kv.create_revision(), kv.lease())).collect()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Trust files are checked for owner and mode at every reload and at
/// start (`holdfast_tls::trust`): a CA bundle that others could write is
/// refused, said once in the log with what to change, and the last good
/// bundle stays in force; once its mode is fixed it loads. An arbiter whose
/// CA bundle is group-writable does not start.
#[tokio::test(flavor = "multi_thread")]
async fn a_trust_file_others_could_write_is_refused_at_reload_and_at_start() {
    let mut app = Appliance::start("tls-modes", 1).await;
    let dir = app.dir.path.clone();
    let ca_path = app.pki.ca.ca_path();
    let second = DevCa::open_or_create(&dir.join("second-ca")).unwrap();
    let probe = second.workload("probe", "modes/probe").unwrap();
    let known = app.pki.workload("known", "modes/known");

    // The bundle now trusts a second CA, but is group-writable: refused.
    let both = [std::fs::read(&ca_path).unwrap(), std::fs::read(second.ca_path()).unwrap()].concat();
    write_atomically(&ca_path, &both);
    chmod(&ca_path, 0o664);
    let said = format!("the CA bundle {} is writable by its group or by others (mode 0664); `chmod go-w", ca_path.display());
    let end = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&app.arbiter.log).unwrap().contains(&said) {
        assert!(Instant::now() < end, "the arbiter did not say why it refused the bundle");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // three more looks at the files
    let log = std::fs::read_to_string(&app.arbiter.log).unwrap();
    assert_eq!(log.matches(&said).count(), 1, "said once, not at every look:\n{log}");
    assert!(
        open_session(&app.arbiter.endpoint(), client_tls(&ca_path, Some(&probe))).await.is_err(),
        "a certificate of the CA in the insecure bundle was admitted"
    );
    open_session(&app.arbiter.endpoint(), client_tls(&ca_path, Some(&known))).await.expect("the last good bundle stays in force");

    // Its mode fixed, the same bundle loads.
    chmod(&ca_path, 0o644);
    let end = Instant::now() + Duration::from_secs(10);
    while open_session(&app.arbiter.endpoint(), client_tls(&ca_path, Some(&probe))).await.is_err() {
        assert!(Instant::now() < end, "the bundle was not loaded once its mode was fixed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // At start: refused, saying what to change.
    app.arbiter.stop();
    chmod(&ca_path, 0o664);
    let endpoints = app.etcd.endpoints();
    let mut refused = Arbiter::spawn(&dir, "arbiter-insecure", &endpoints, &app.pki);
    let e = refused.wait_ready(Duration::from_secs(15)).unwrap_err();
    assert!(format!("{e:#}").contains(&said), "{e:#}");
    chmod(&ca_path, 0o644);
}

/// A TLS connection to the arbiter, kept open by the caller.
async fn connect_tls(endpoint: &str, tls: Arc<rustls::ClientConfig>) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(endpoint).await?;
    let handshake = tokio_rustls::TlsConnector::from(tls).connect(ServerName::try_from("127.0.0.1").unwrap(), tcp);
    tokio::time::timeout(Duration::from_secs(5), handshake).await.map_err(|_| std::io::Error::other("handshake timed out"))?
}

async fn turned_away(arbiter: &Arbiter) -> f64 {
    sample(&scrape(arbiter.metrics_port).await, "holdfast_arbiter_connections_turned_away_total{cluster=\"test\"}")
}

/// `limits.max_connections_per_address`: a connection past it is closed
/// before its handshake (counted and logged), while the connections
/// already open, another identity's among them, carry on; a close frees
/// its place. (The handshake rate buckets and the total are unit-tested in
/// the arbiter's tls.rs.)
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_past_the_per_address_limit_is_closed_before_its_handshake_and_open_ones_carry_on() {
    let limits = |c: &mut holdfast_config::ArbiterConfig| c.limits.max_connections_per_address = 4;
    let app = Appliance::start_with("tls-connections", 1, &limits).await;
    let endpoint = app.arbiter.endpoint();
    let b = app.client("svc/b").await;
    let sb = b.open_session(Duration::from_secs(10)).await.unwrap();
    let tls = client_tls(&app.pki.ca.ca_path(), Some(&app.pki.workload("flood", "svc/flood")));
    let mut held = Vec::new();
    for i in 0..3 {
        held.push(connect_tls(&endpoint, tls.clone()).await.unwrap_or_else(|e| panic!("connection {} of 4 refused: {e}", i + 2)));
    }
    let before = turned_away(&app.arbiter).await;
    assert!(connect_tls(&endpoint, tls.clone()).await.is_err(), "a fifth connection from 127.0.0.1 was accepted");
    assert_eq!(turned_away(&app.arbiter).await, before + 1.0);
    let end = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&app.arbiter.log).unwrap_or_default().contains("limits.max_connections_per_address = 4") {
        assert!(Instant::now() < end, "no warning naming limits.max_connections_per_address in the arbiter's log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // B's connection, open before the flood, carries on.
    for i in 0..5 {
        let hold = sb.acquire(&LockKey::parse(&format!("svc/conn-{i}")).unwrap(), Duration::ZERO).await.expect("B is granted");
        hold.release().await.unwrap();
    }
    // A connection closed frees its place (once the arbiter sees the close).
    drop(held.pop());
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match connect_tls(&endpoint, tls.clone()).await {
            Ok(c) => break held.push(c),
            Err(e) => assert!(Instant::now() < end, "still refused 5 s after a connection closed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// rustls checks a certificate's validity at the handshake only. A
/// certificate that expires while its connection stays open is refused on
/// its next call, and its open keepalive stream ends at the expiry even
/// with no renewal sent (a 300 s class renews only every 100 s).
#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_that_expires_on_an_open_connection_is_refused_on_its_next_call_and_renewal() {
    let app = Appliance::start("tls-expiry", 1).await;
    let mut short = params("short", &[], &["spiffe://holdfast.dev/matrix/short"]).unwrap();
    let valid = Duration::from_secs(6);
    short.not_before = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    short.not_after = time::OffsetDateTime::now_utc() + time::Duration::seconds(valid.as_secs() as i64);
    let expires = Instant::now() + valid;
    let issued = app.pki.ca.issue_with("short", short).unwrap();
    let client = app.arbiter.client(&app.pki, &issued).await;
    let session = client.open_session(Duration::from_secs(10)).await.unwrap();
    let k = LockKey::parse("svc/expiry").unwrap();
    assert!(!client.inspect(&k).await.unwrap().held);

    // One keepalive stream: one renewal, then silence.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client.rpc().keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(holdfast_proto::v1::KeepAliveRequest { session_id: session.id() }).await.unwrap();
    let renewed = replies.message().await.unwrap().expect("a renewal");
    assert!(renewed.ttl_millis > 0, "the session was renewed");
    let ended = tokio::time::timeout(valid + Duration::from_secs(60), replies.message()).await;
    let refused = match ended {
        Ok(Err(status)) => status,
        Ok(Ok(r)) => panic!("the stream answered {r:?} with nothing sent, or ended without a status"),
        Err(_) => panic!("the stream was still open a minute after the certificate expired"),
    };
    let late = Instant::now().saturating_duration_since(expires);
    eprintln!("the stream was refused {late:?} after the certificate expired");
    assert!(Instant::now() + Duration::from_millis(1500) >= expires, "refused before the certificate expired: {refused:?}");
    assert!(late < Duration::from_secs(5), "refused {late:?} after the expiry");
    drop(tx);
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("client certificate expired at"), "{refused:?}");
    // A call on the same connection is refused the same way.
    let e = client.inspect(&k).await.expect_err("a call with an expired certificate");
    assert_eq!(e.code(), Some(tonic::Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("renew it"), "{e}");
}

/// `limits.max_connection_age`: a connection made under a CA that is then
/// withdrawn from `tls.client_ca_file` keeps working only until its age
/// runs out; its client's reconnection is refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_outlives_its_cas_withdrawal_by_at_most_the_maximum_connection_age() {
    let age = Duration::from_secs(60);
    let app = Appliance::start_with("tls-age", 1, &|c| c.limits.max_connection_age = age).await;
    let k = LockKey::parse("svc/age").unwrap();
    // The clients verify the server with their own copy of the first CA
    // (which issued the server's certificate): the arbiter's bundle is
    // about to change, theirs is not.
    let first = app.dir.path.join("first-ca.pem");
    std::fs::copy(app.pki.ca.ca_path(), &first).unwrap();
    let aged = app.pki.workload("aged", "svc/aged");
    let config = holdfast_client::ClientConfig { ca: first.clone(), ..app.pki.client_config(&app.arbiter.endpoint(), &aged) };
    let client = holdfast_client::Client::connect(&config).await.unwrap();
    let connected = Instant::now();
    assert!(!client.inspect(&k).await.unwrap().held);

    // The bundle now trusts only another CA: new connections from the first are refused.
    let other = DevCa::open_or_create(&app.dir.path.join("other-ca")).unwrap();
    write_atomically(&app.pki.ca.ca_path(), &std::fs::read(other.ca_path()).unwrap());
    let fresh = app.pki.workload("fresh", "svc/fresh");
    let end = Instant::now() + Duration::from_secs(10);
    while open_session(&app.arbiter.endpoint(), client_tls(&first, Some(&fresh))).await.is_ok() {
        assert!(Instant::now() < end, "the arbiter still trusts the withdrawn CA for new connections");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(client.inspect(&k).await.is_ok(), "the open connection carries on for now");

    // Until its age runs out (plus at most the minute's grace for calls in
    // flight): then its client reconnects and the arbiter refuses it.
    let refused = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Err(e) = client.inspect(&k).await {
            break e;
        }
        assert!(connected.elapsed() < age * 2 + Duration::from_secs(10), "still served {:?} after connecting", connected.elapsed());
    };
    eprintln!("the connection ended {:?} after it was made: {refused}", connected.elapsed());
    assert!(connected.elapsed() >= age - Duration::from_secs(1), "ended before its age: {refused}");
    // The client still trusts the server: the refusal is the arbiter's.
    assert!(!refused.to_string().contains("invalid peer certificate: BadSignature"), "the client refused the server: {refused}");
    let trusted = holdfast_client::Client::connect(&holdfast_client::ClientConfig { ca: first, ..config.clone() }).await;
    let e = match trusted {
        Ok(c) => c.inspect(&k).await.expect_err("a new connection from the withdrawn CA"),
        Err(e) => e,
    };
    eprintln!("a new connection from the withdrawn CA: {e}");
}
