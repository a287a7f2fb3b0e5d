//! The fenced resource the gate's clients write to: each lock key has a
//! record (a counter) at the resource; a holder increments it presenting its
//! token. The fence is one of `holdfast_fence`'s (the reference PostgreSQL
//! fence, or a deliberately wrong one); C2 checks what it accepted.

use holdfast_fence::{FenceMode, PgFence, SharedFence};
use holdfast_model::Token;
use std::sync::Arc;
use std::time::Duration;

#[async_trait::async_trait]
pub trait Resource: Send + Sync {
    /// Increments `record` under `token`, pausing `think` inside the write
    /// (between read and write where the fence has two steps). Ok(true):
    /// accepted; Ok(false): rejected as stale.
    /// `state`, if given, reads `w` while the write is at its pause point
    /// (the gate's client-pause fault looks for it).
    async fn increment(&self, record: &str, token: u64, think: Duration, state: Option<&std::path::Path>) -> anyhow::Result<bool>;
    /// Tokens of the accepted writes to `record`, in the resource's order.
    async fn accepted_log(&self, record: &str) -> anyhow::Result<Vec<u64>>;
    /// The record's counter.
    async fn counter(&self, record: &str) -> anyhow::Result<u64>;
}

/// The record of a lock key: `ns/key` → `ns.key` (record names allow no `/`).
pub fn record_of(key: &str) -> String {
    key.replace('/', ".")
}

/// The table the gate's records live in.
const TABLE: &str = "holdfast_gate";

struct Fenced(SharedFence);

#[async_trait::async_trait]
impl Resource for Fenced {
    async fn increment(&self, record: &str, token: u64, think: Duration, state: Option<&std::path::Path>) -> anyhow::Result<bool> {
        let token = Token::from_wire(token).map_err(|e| anyhow::anyhow!("malformed token: {e}"))?;
        // A blocking pause: the fence calls it synchronously at its pause
        // point; the client's runtime has other workers for keepalives.
        let mut pause = move || {
            if let Some(s) = state {
                let _ = std::fs::write(s, "w");
            }
            std::thread::sleep(think);
        };
        let r = self.0.increment(record, token, &mut pause).await;
        if let Some(s) = state {
            let _ = std::fs::write(s, "-");
        }
        Ok(r?.is_accepted())
    }
    async fn accepted_log(&self, record: &str) -> anyhow::Result<Vec<u64>> {
        Ok(self.0.accepted_log(record).await?)
    }
    async fn counter(&self, record: &str) -> anyhow::Result<u64> {
        Ok(self.0.read(record).await?)
    }
}

/// Opens a resource (`postgres://…`) with a fence mode (correct,
/// less-or-equal, two-statements, unfenced); creates its table if needed.
pub async fn open(url: &str, fence: &str) -> anyhow::Result<Arc<dyn Resource>> {
    let mode: FenceMode = fence.parse().map_err(|e| anyhow::anyhow!("--fence {fence:?}: {e}"))?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        anyhow::bail!(
            "--resource {:?}: the gate writes to PostgreSQL (postgres://USER@HOST:PORT/DB, or postgres-local for a throwaway cluster)",
            super::redact_url(url)
        );
    }
    let config: tokio_postgres::Config = url.parse().map_err(|e| anyhow::anyhow!("--resource is not a PostgreSQL URL: {e}"))?;
    let fence = PgFence::connect(&config, TABLE, mode).await?;
    Ok(Arc::new(Fenced(Arc::new(fence))))
}

/// Creates the table once, before the clients start.
pub async fn setup(url: &str, fence: &str) -> anyhow::Result<()> {
    let mode: FenceMode = fence.parse().map_err(|e| anyhow::anyhow!("--fence {fence:?}: {e}"))?;
    let config: tokio_postgres::Config = url.parse().map_err(|e| anyhow::anyhow!("--resource is not a PostgreSQL URL: {e}"))?;
    use holdfast_fence::Fence;
    PgFence::connect(&config, TABLE, mode).await?.setup().await?;
    Ok(())
}
