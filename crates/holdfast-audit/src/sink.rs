//! Where events go. The tailer writes every batch to each configured sink,
//! in order, and checkpoints only after all of them accepted it; each sink
//! must be idempotent on `(cluster_id, revision, index)` so a batch replayed
//! after a crash changes nothing.

use crate::event::Event;
use holdfast_model::layout::ForceRecord;

/// One destination of events.
pub trait Sink: Send {
    /// A short name for logs and metrics (`embedded`, `clickhouse`, …).
    fn name(&self) -> &'static str;

    /// Stores `events` (one or more whole revisions, in order) durably
    /// before returning. Events stored before are skipped or overwritten
    /// with the same content.
    fn append(&mut self, events: &[Event]) -> Result<(), SinkError>;

    /// Stores the raw force-release record the tailer read from the put of
    /// `/sys/force/<nonce>` at `revision` (an event carries only what the
    /// classifier took from it). Called for every such put in a batch,
    /// after [`Sink::append`] of the batch's events and before the batch
    /// counts as done; like `append`, a record stored before must change
    /// nothing. Most sinks keep no raw records: the default does nothing.
    fn force_record(&mut self, cluster_id: &str, revision: i64, nonce: &str, record: &ForceRecord) -> Result<(), SinkError> {
        let _ = (cluster_id, revision, nonce, record);
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{sink}: {message}")]
pub struct SinkError {
    pub sink: &'static str,
    pub message: String,
}

impl SinkError {
    pub fn new(sink: &'static str, message: impl Into<String>) -> SinkError {
        SinkError { sink, message: message.into() }
    }
}
