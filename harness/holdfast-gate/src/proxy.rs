//! A small userspace TCP proxy between an arbiter and an etcd member, for the
//! delay and stall faults (this kernel has no `tc netem`). Every chunk read
//! from either side waits for the current delay, and while the proxy is
//! stalled, for the stall to end.

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
    pub fn clear(&self) {
        self.set_delay(Duration::ZERO);
        self.set_stalled(false);
        self.set_replies_stalled(false);
    }
    async fn gate(&self, reply: bool) {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        let held = |c: &Self| c.stalled.load(Ordering::SeqCst) || (reply && c.replies_stalled.load(Ordering::SeqCst));
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

async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, controls: Arc<Controls>, reply: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        controls.gate(reply).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
