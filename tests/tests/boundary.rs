//! Bad input is refused at the boundary, with a typed reason naming the
//! field, and writes nothing to etcd.

use holdfast_proto::v1::{AcquireRequest, CloseSessionRequest, OpenSessionRequest};
use holdfast_proto::{ErrorReason, reason_of};
use holdfast_tests::*;
use std::time::Duration;

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_and_writes_nothing() {
    let app = Appliance::start("bad-input", 1).await;
    let client = app.client("team/a").await;
    let session = client.open_session_for("orders", None).await.unwrap();
    let mut rpc = client.rpc();
    let long_key = "k".repeat(holdfast_model::key::MAX_KEY_LEN + 1);
    let cases: Vec<(&str, &str, &str)> = vec![
        ("orders", "", "key"),
        ("orders", &long_key, "key"),
        ("orders", "../billing/ledger", "key"),
        ("orders", "/billing/ledger", "key"),
        ("orders", "a/../../billing", "key"),
        ("orders/../billing", "ledger", "namespace"),
        ("", "ledger", "namespace"),
    ];
    for (ns, key, field) in cases {
        let before = app.etcd.revision().await;
        let req = AcquireRequest { session_id: session.id(), namespace: ns.into(), key: key.into(), wait_millis: 0 };
        let status = rpc.acquire(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{ns:?}/{key:?}");
        assert_eq!(reason_of(&status), Some((ErrorReason::InvalidArgument, field.to_string())), "{ns:?}/{key:?}");
        assert!(status.message().starts_with(field), "message names the field: {}", status.message());
        assert_eq!(app.etcd.revision().await, before, "{ns:?}/{key:?} wrote to etcd");
    }
    for ttl_millis in [4_000u64, 301_000, 5_500] {
        let before = app.etcd.revision().await;
        let status = rpc.open_session(OpenSessionRequest { ttl_millis, ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(reason_of(&status), Some((ErrorReason::InvalidArgument, "ttl_millis".into())));
        assert_eq!(app.etcd.revision().await, before, "ttl {ttl_millis}ms wrote to etcd");
    }
    // A session for a namespace: the namespace must be a valid one.
    for ns in ["orders/../billing", "/orders", "orders/ledger", ".."] {
        let before = app.etcd.revision().await;
        let req = OpenSessionRequest { ttl_millis: 0, namespace: ns.into() };
        let status = rpc.open_session(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{ns:?}");
        assert_eq!(reason_of(&status), Some((ErrorReason::InvalidArgument, "namespace".into())), "{ns:?}");
        assert!(status.message().starts_with("namespace"), "message names the field: {}", status.message());
        assert_eq!(app.etcd.revision().await, before, "namespace {ns:?} wrote to etcd");
    }
    // Its TTL, if given, must be the class's (orders: 30 s), even one that
    // is a valid session TTL on its own.
    for ttl_millis in [10_000u64, 29_000, 31_000, 4_000, 301_000] {
        let before = app.etcd.revision().await;
        let req = OpenSessionRequest { ttl_millis, namespace: "orders".into() };
        let status = rpc.open_session(req).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{ttl_millis}ms");
        assert_eq!(reason_of(&status), Some((ErrorReason::InvalidArgument, "ttl_millis".into())), "{ttl_millis}ms");
        let message = status.message();
        assert!(message.starts_with("ttl_millis"), "message names the field: {message}");
        assert!(message.contains("class orders") && message.contains("30s"), "message names the class and its TTL: {message}");
        assert_eq!(app.etcd.revision().await, before, "ttl {ttl_millis}ms for orders wrote to etcd");
    }
    // Without a TTL (or with the class's), the session's TTL is the class's,
    // not the 15 s default.
    for (ns, ttl_millis, class_ttl) in [("orders", 0u64, 30_000u64), ("teams", 0, 5_000), ("orders", 30_000, 30_000)] {
        let req = OpenSessionRequest { ttl_millis, namespace: ns.into() };
        let opened = rpc.open_session(req).await.unwrap().into_inner();
        assert_eq!(opened.ttl_millis, class_ttl, "{ns} with ttl {ttl_millis}ms");
        let req = CloseSessionRequest { session_id: opened.session_id };
        rpc.close_session(req).await.unwrap();
    }
    // A session ID that is not this identity's is reported as not found.
    let other = app.client("team/b").await;
    let before = app.etcd.revision().await;
    let req = AcquireRequest { session_id: session.id(), namespace: "orders".into(), key: "k".into(), wait_millis: 0 };
    let status = other.rpc().acquire(req).await.unwrap_err();
    assert_eq!(reason_of(&status).map(|r| r.0), Some(ErrorReason::SessionNotFound));
    assert_eq!(app.etcd.revision().await, before);
}

#[tokio::test]
async fn a_certificate_without_a_spiffe_id_is_unauthenticated() {
    let app = Appliance::start("no-spiffe", 1).await;
    let cert = app.pki.no_spiffe("plain");
    let client = app.arbiter.client(&app.pki, &cert).await;
    let before = app.etcd.revision().await;
    let status = client.rpc().open_session(OpenSessionRequest { ttl_millis: 0, ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(reason_of(&status).map(|r| r.0), Some(ErrorReason::Unauthenticated));
    assert!(status.message().contains("URI SAN"), "message names the certificate field: {}", status.message());
    assert_eq!(app.etcd.revision().await, before);
}

#[tokio::test]
async fn a_client_without_a_certificate_cannot_connect() {
    let app = Appliance::start("no-cert", 1).await;
    // A TLS client that trusts the server but presents no certificate.
    let _ = rustls_provider();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(app.pki.ca.ca_path()).unwrap()))
        .domain_name("127.0.0.1");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", app.arbiter.endpoint()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(3))
        .connect()
        .await;
    // The TLS handshake is refused: either connecting fails, or the first
    // call on the (lazily failed) connection does. Nothing reaches etcd.
    let before = app.etcd.revision().await;
    if let Ok(channel) = channel {
        let status = holdfast_proto::LockClient::new(channel)
            .open_session(OpenSessionRequest { ttl_millis: 0, ..Default::default() })
            .await
            .unwrap_err();
        assert_ne!(status.code(), tonic::Code::Ok);
    }
    assert_eq!(app.etcd.revision().await, before);
}

fn rustls_provider() -> Result<(), std::sync::Arc<rustls::crypto::CryptoProvider>> {
    rustls::crypto::ring::default_provider().install_default()
}
