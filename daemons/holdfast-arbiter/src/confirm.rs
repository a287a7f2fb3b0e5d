//! Keepalives from a deposed leader are not trusted (etcd #15247: a stalled
//! leader that had been deposed kept acknowledging keepalives).
//!
//! A keepalive counts only if the Raft term in its response header equals
//! the term reported by a quorum (linearizable) read issued *after* the
//! keepalive was sent. A deposed leader answers with its old term; any read
//! that completes after it was deposed reports the new one. Confirmations are
//! batched: one read answers every keepalive sent before the read was issued,
//! so the cost is a few reads a second, not one per keepalive.

use crate::etcd::Etcd;
use holdfast_model::layout;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

struct Request {
    sent_at: Instant,
    reply: oneshot::Sender<Option<u64>>,
}

#[derive(Clone)]
pub struct Confirmer {
    tx: mpsc::Sender<Request>,
}

impl Confirmer {
    pub fn start(etcd: Etcd) -> Self {
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(run(etcd, rx));
        Confirmer { tx }
    }

    /// The Raft term a quorum read issued after `sent_at` saw; None if the
    /// read failed (the keepalive is then not confirmed).
    pub async fn term_after(&self, sent_at: Instant) -> Option<u64> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request { sent_at, reply }).await.ok()?;
        rx.await.ok().flatten()
    }
}

async fn run(etcd: Etcd, mut rx: mpsc::Receiver<Request>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let issued = Instant::now();
        // A default (linearizable) range read: served only after a quorum
        // confirmed the leader's read index.
        let read = tokio::time::timeout(etcd.timeout, etcd.get(layout::EPOCH_KEY, None)).await;
        let term = match read {
            Ok(Ok(resp)) => resp.header().map(|h| h.raft_term()),
            _ => None,
        };
        for r in batch {
            // Every request in the batch was sent before the read was issued.
            debug_assert!(r.sent_at <= issued);
            let _ = r.reply.send(term);
        }
    }
}
