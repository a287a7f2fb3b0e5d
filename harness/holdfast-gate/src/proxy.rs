//! A small userspace TCP proxy, for the delay and stall faults (this kernel
//! has no `tc netem`): between arbiter 1 and each etcd member, and between
//! client 0 and each arbiter. Every chunk read from either side waits for
//! the current delay, and while the proxy is stalled, for the stall to end.
//! Answers can also be given a latency (each arrives that long after it was
//! read, in order, without slowing the ones behind it) and requests can be
//! held on their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
pub struct Controls {
    delay_ms: AtomicU64,
    stalled: AtomicBool,
    /// Hold only etcd's answers: requests arrive and are applied, their
    /// answers wait (a transaction in flight when the arbiter dies).
    replies_stalled: AtomicBool,
    /// Hold only the requests: answers already on their way still arrive.
    requests_stalled: AtomicBool,
    /// Every answer arrives this long after it was read (pipelined).
    reply_latency_ms: AtomicU64,
    /// Chunks that were delayed or held by a stall: proof the fault bit.
    pub affected: AtomicU64,
}

impl Controls {
    pub fn set_delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
    pub fn set_stalled(&self, on: bool) {
        self.stalled.store(on, Ordering::SeqCst);
    }
    pub fn set_replies_stalled(&self, on: bool) {
        self.replies_stalled.store(on, Ordering::SeqCst);
    }
    pub fn set_requests_stalled(&self, on: bool) {
        self.requests_stalled.store(on, Ordering::SeqCst);
    }
    pub fn set_reply_latency(&self, d: Duration) {
        self.reply_latency_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }
    pub fn clear(&self) {
        self.set_delay(Duration::ZERO);
        self.set_stalled(false);
        self.set_replies_stalled(false);
        self.set_requests_stalled(false);
        self.set_reply_latency(Duration::ZERO);
    }
    /// When a chunk read now may be passed on, as far as the latency goes.
    fn due(&self, reply: bool) -> tokio::time::Instant {
        let latency = if reply { self.reply_latency_ms.load(Ordering::SeqCst) } else { 0 };
        if latency > 0 {
            self.affected.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::Instant::now() + Duration::from_millis(latency)
    }
    async fn gate(&self, reply: bool) {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        let held = |c: &Self| {
            c.stalled.load(Ordering::SeqCst)
                || (reply && c.replies_stalled.load(Ordering::SeqCst))
                || (!reply && c.requests_stalled.load(Ordering::SeqCst))
        };
        let stalled = held(self);
        if delay > 0 || stalled {
            self.affected.fetch_add(1, Ordering::Relaxed);
        }
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        while held(self) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Listens on `listen` and forwards every connection to `target`.
pub async fn start(listen: &str, target: String, controls: Arc<Controls>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let (target, controls) = (target.clone(), controls.clone());
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(&target).await else { return };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::join!(pipe(ri, wo, controls.clone(), false), pipe(ro, wi, controls, true));
            });
        }
    });
    Ok(())
}

/// One direction. The reader stamps each chunk with when the latency lets
/// it through and hands it on; the writer waits for that, then for the
/// delay and stalls, then writes: chunks keep their order, and a latency
/// delays each by itself, not by the sum of the ones before it.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, controls: Arc<Controls>, reply: bool) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader_controls = controls.clone();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if tx.send((reader_controls.due(reply), buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            controls.gate(reply).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
