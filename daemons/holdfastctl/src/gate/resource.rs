//! The fenced resource the gate's clients write to: each lock key has a
//! record (a counter) at the resource; a holder increments it presenting its
//! token, and a correct fence rejects tokens older than one it accepted.

use std::sync::Arc;
use std::time::Duration;

#[async_trait::async_trait]
pub trait Resource: Send + Sync {
    /// Reads `record`, waits `think`, writes the value read plus one under
    /// `token`. Ok(true): accepted; Ok(false): rejected as stale.
    async fn increment(&self, record: &str, token: u64, think: Duration) -> anyhow::Result<bool>;
    /// Tokens of the accepted writes to `record`, in the resource's order.
    async fn accepted_log(&self, record: &str) -> anyhow::Result<Vec<u64>>;
    /// The record's counter.
    async fn counter(&self, record: &str) -> anyhow::Result<u64>;
}

/// Opens a resource from its URL and fence mode.
pub async fn open(url: &str, fence: &str) -> anyhow::Result<Arc<dyn Resource>> {
    anyhow::bail!("unsupported resource {url:?} (fence {fence})")
}
