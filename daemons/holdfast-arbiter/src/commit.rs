//! Sending grant and release transactions to etcd, one by one or grouped.
//!
//! **Group commit** (`[grants] group_commit = true`): concurrent grant and
//! release transactions for *different* keys are folded into one etcd
//! transaction of nested sub-transactions. Each sub-transaction keeps its own compares and
//! its own success flag, so each grant is decided exactly as if it had been
//! sent alone. Grants in one batch commit at the same revision: tokens still
//! strictly increase per key and are never reused for a key, but two keys can
//! carry equal tokens (tokens are unique per key, not across keys). Two
//! transactions of one key (two grants, or a grant and a release) never
//! share a batch (etcd refuses a transaction that writes a key twice); the
//! second waits for the next batch. A release writes only its hold key; a
//! grant writes its hold key and, for a waiter, deletes the waiter's own
//! queue entry, which nothing else in a batch writes.
//!
//! Batching is opportunistic and pipelined: up to [`MAX_IN_FLIGHT`] batches
//! are in etcd at once, and a batch is whatever is queued when a slot frees,
//! so a lone grant pays no delay and a busy arbiter sends fewer, larger
//! transactions. Batches in flight together may hold grants of the same key:
//! each sub-transaction's compares decide, exactly as for grants sent one by
//! one.

use crate::etcd::Etcd;
use etcd_client::{ResponseHeader, Txn, TxnOp, TxnOpResponse};
use std::collections::{HashSet, VecDeque};
use tokio::sync::{mpsc, oneshot};

/// At most this many sub-transactions per batch (etcd's default
/// `--max-txn-ops` is 128).
pub const MAX_BATCH: usize = 64;

/// Batches in etcd at once.
pub const MAX_IN_FLIGHT: usize = 4;

/// The outcome of one (sub-)transaction.
pub struct Outcome {
    pub succeeded: bool,
    pub header: Option<ResponseHeader>,
    pub ops: Vec<TxnOpResponse>,
}

/// A grant or release queued for the group committer.
pub struct Job {
    key: String,
    txn: Txn,
    reply: oneshot::Sender<Result<Outcome, String>>,
}

#[derive(Clone)]
pub enum Committer {
    Direct(Box<Etcd>),
    Grouped(mpsc::Sender<Job>),
}

impl Committer {
    pub fn new(etcd: Etcd, group: bool) -> Self {
        if !group {
            return Committer::Direct(Box::new(etcd));
        }
        let (tx, rx) = mpsc::channel(4096);
        tokio::spawn(run(etcd, rx));
        Committer::Grouped(tx)
    }

    /// Commits `txn`, which writes `key` and nothing else that another
    /// concurrent job could write. Errors are etcd failures (text).
    pub async fn commit(&self, key: &str, txn: Txn) -> Result<Outcome, String> {
        match self {
            Committer::Direct(etcd) => send_one(etcd, txn).await,
            Committer::Grouped(tx) => {
                let (reply, rx) = oneshot::channel();
                tx.send(Job { key: key.to_string(), txn, reply }).await.map_err(|_| "the group committer stopped".to_string())?;
                rx.await.map_err(|_| "the group committer dropped the transaction".to_string())?
            }
        }
    }
}

async fn send_one(etcd: &Etcd, txn: Txn) -> Result<Outcome, String> {
    let resp = etcd.txn(txn).await.map_err(|e| e.to_string())?;
    Ok(Outcome { succeeded: resp.succeeded(), header: resp.header().cloned(), ops: resp.op_responses() })
}

async fn run(etcd: Etcd, mut rx: mpsc::Receiver<Job>) {
    let mut deferred: VecDeque<Job> = VecDeque::new();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let first = match deferred.pop_front() {
            Some(j) => j,
            None => match rx.recv().await {
                Some(j) => j,
                None => return,
            },
        };
        let mut keys = HashSet::from([first.key.clone()]);
        let mut batch = vec![first];
        // Jobs deferred earlier go first, then whatever is queued now.
        let mut still_deferred = VecDeque::new();
        while let Some(j) = deferred.pop_front() {
            if batch.len() < MAX_BATCH && keys.insert(j.key.clone()) {
                batch.push(j);
            } else {
                still_deferred.push_back(j);
            }
        }
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => {
                    if keys.insert(j.key.clone()) {
                        batch.push(j);
                    } else {
                        still_deferred.push_back(j);
                    }
                }
                Err(_) => break,
            }
        }
        deferred = still_deferred;
        let etcd = etcd.clone();
        tokio::spawn(async move {
            send_batch(&etcd, batch).await;
            drop(slot);
        });
    }
}

/// Sends one batch (a lone grant as itself) and answers every job in it.
async fn send_batch(etcd: &Etcd, mut batch: Vec<Job>) {
    if batch.len() == 1 {
        if let Some(job) = batch.pop() {
            let r = send_one(etcd, job.txn).await;
            let _ = job.reply.send(r);
        }
        return;
    }
    let (txns, replies): (Vec<Txn>, Vec<_>) = batch.into_iter().map(|j| (j.txn, j.reply)).unzip();
    let parent = Txn::new().and_then(txns.into_iter().map(TxnOp::txn).collect::<Vec<_>>());
    match etcd.txn(parent).await {
        Ok(resp) => {
            let header = resp.header().cloned();
            let subs = resp.op_responses();
            for (reply, op) in replies.into_iter().zip(subs.into_iter().map(Some).chain(std::iter::repeat_with(|| None))) {
                let outcome = match op {
                    Some(TxnOpResponse::Txn(sub)) => {
                        Ok(Outcome { succeeded: sub.succeeded(), header: header.clone(), ops: sub.op_responses() })
                    }
                    _ => Err("etcd answered a grouped transaction without the sub-transaction".to_string()),
                };
                let _ = reply.send(outcome);
            }
        }
        Err(e) => {
            let msg = e.to_string();
            for reply in replies {
                let _ = reply.send(Err(msg.clone()));
            }
        }
    }
}
