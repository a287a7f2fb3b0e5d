//! The S3 fences against a real S3-compatible server process (versitygw,
//! posix backend) on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

mod common;

use holdfast_fence::{Fence, FenceMode, S3Config, S3Fence, SharedFence};
use holdfast_fixtures::s3::S3Server;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::sync::Arc;

struct Fixture {
    s3: S3Server,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-fence-s3-").tempdir().unwrap();
        let s3 =
            S3Server::start(&dir.path().join("s3"), &dir.path().join("versitygw.log"), &["fences"]).unwrap_or_else(|e| panic!("{e:#}"));
        Fixture { s3, _dir: dir }
    }

    fn config(&self, prefix: &str) -> S3Config {
        S3Config {
            endpoint: Some(self.s3.endpoint()),
            region: "us-east-1".into(),
            bucket: "fences".into(),
            prefix: prefix.into(),
            access_key_id: self.s3.access_key_id.clone(),
            secret_access_key: self.s3.secret_access_key.clone(),
        }
    }

    async fn fence(&self, mode: FenceMode) -> SharedFence {
        let f = S3Fence::connect(&self.config("t"), mode).unwrap_or_else(|e| panic!("{e}"));
        f.setup().await.unwrap_or_else(|e| panic!("{e}"));
        Arc::new(f)
    }

    fn expected(&self) -> (&'static str, String) {
        ("s3", format!("s3://fences/t?endpoint={}", self.s3.endpoint()))
    }
}

/// The property the S3 fence rests on, checked on the server itself: a PUT
/// with `If-Match` on a stale ETag gets 412 and changes nothing;
/// `If-None-Match: *` on an existing object likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_refuses_a_put_whose_if_match_etag_is_stale() {
    let fx = Fixture::start();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = AmazonS3Builder::new()
        .with_endpoint(fx.s3.endpoint())
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name("fences")
        .with_access_key_id(&fx.s3.access_key_id)
        .with_secret_access_key(&fx.s3.secret_access_key)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .build()
        .unwrap();
    let path = Path::from("probe/object");
    let put = |body: &'static str, mode: PutMode| {
        let store = &store;
        let path = &path;
        async move { store.put_opts(path, PutPayload::from_static(body.as_bytes()), PutOptions { mode, ..Default::default() }).await }
    };
    let first = put("one", PutMode::Create).await.expect("create");
    let v1 = UpdateVersion { e_tag: first.e_tag.clone(), version: None };
    assert!(
        matches!(put("again", PutMode::Create).await, Err(object_store::Error::AlreadyExists { .. })),
        "If-None-Match: * on an existing object"
    );
    let second = put("two", PutMode::Update(v1.clone())).await.expect("If-Match with the current ETag");
    assert_ne!(second.e_tag, first.e_tag);
    let stale = put("three", PutMode::Update(v1)).await;
    assert!(matches!(stale, Err(object_store::Error::Precondition { .. })), "If-Match with a stale ETag must get 412, got {stale:?}");
    let wrong = UpdateVersion { e_tag: Some("\"00000000000000000000000000000000\"".into()), version: None };
    assert!(matches!(put("four", PutMode::Update(wrong)).await, Err(object_store::Error::Precondition { .. })));
    let got = store.get_opts(&path, GetOptions::default()).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"two", "refused puts changed nothing");
}

common::scenarios!();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_is_idempotent_and_a_missing_bucket_is_named() {
    let fx = Fixture::start();
    let fresh = S3Fence::connect(&fx.config("fresh"), FenceMode::Correct).unwrap();
    let err = fresh.schema_version().await.unwrap_err().to_string();
    assert!(err.contains("not set up"), "{err}");
    let fences: Vec<SharedFence> =
        (0..4).map(|_| Arc::new(S3Fence::connect(&fx.config("fresh"), FenceMode::Correct).unwrap()) as SharedFence).collect();
    common::setup_is_idempotent(fences).await;
    let nobucket = S3Fence::connect(&S3Config { bucket: "missing".into(), ..fx.config("x") }, FenceMode::Correct).unwrap();
    let err = nobucket.setup().await.unwrap_err().to_string();
    assert!(err.contains("bucket does not exist"), "{err}");
}
