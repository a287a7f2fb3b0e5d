//! The PostgreSQL fences against a real PostgreSQL cluster from Debian's
//! packages, started per test on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

mod common;

use holdfast_fence::{Fence, FenceMode, PgFence, SharedFence};
use holdfast_fixtures::postgres::PgCluster;
use std::sync::Arc;

struct Fixture {
    pg: PgCluster,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-fence-pg-").tempdir().unwrap();
        let pg = PgCluster::start(&dir.path().join("postgres.log")).unwrap_or_else(|e| panic!("{e:#}"));
        Fixture { pg, _dir: dir }
    }

    /// A fence on its own connection (another "process"), set up.
    async fn fence(&self, mode: FenceMode) -> SharedFence {
        let cfg: tokio_postgres::Config = self.pg.url().parse().unwrap();
        let f = PgFence::connect(&cfg, "holdfast_fence", mode).await.unwrap_or_else(|e| panic!("{e}"));
        f.setup().await.unwrap_or_else(|e| panic!("{e}"));
        Arc::new(f)
    }

    fn expected(&self) -> (&'static str, String) {
        ("postgresql", format!("postgresql://127.0.0.1:{}/holdfast?table=holdfast_fence", self.pg.port))
    }
}

common::scenarios!();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_is_idempotent_and_records_the_schema_version() {
    let fx = Fixture::start();
    let cfg: tokio_postgres::Config = fx.pg.url().parse().unwrap();
    let fresh = PgFence::connect(&cfg, "fresh_table", FenceMode::Correct).await.unwrap();
    let err = fresh.schema_version().await.unwrap_err().to_string();
    assert!(err.contains("not set up"), "{err}");
    let mut fences: Vec<SharedFence> = Vec::new();
    for _ in 0..4 {
        fences.push(Arc::new(PgFence::connect(&cfg, "fresh_table", FenceMode::Correct).await.unwrap()));
    }
    common::setup_is_idempotent(fences).await;
    let bad = PgFence::connect(&cfg, "Robert'); DROP TABLE students;--", FenceMode::Correct).await.err().unwrap();
    assert!(bad.to_string().contains("not a plain identifier"), "{bad}");
}
