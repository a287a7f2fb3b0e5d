//! The election: a lease kept alive by this process, a campaign on it, and
//! resigning.
//!
//! etcd's election service does not keep a campaigner's lease alive (it
//! orphans its session), so this process does, for the whole candidacy. The
//! lease counts as lost as soon as no keepalive has been confirmed for a
//! whole TTL, measured from when the last confirmed request was *sent*: by
//! then etcd may have expired it and a standby may lead. Losing leadership
//! never depends on this timing for safety: every write compares the leader
//! key's create revision (`holdfast_store::policy`).

use etcd_client::{LeaderKey, ResignOptions};
use holdfast_store::Etcd;
use holdfast_store::policy::Leadership;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// An etcd lease and the task keeping it alive.
pub struct Lease {
    pub id: i64,
    ttl: Duration,
    lost: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Lease {
    /// Grants a lease of `ttl` (whole seconds) and starts keeping it alive.
    pub async fn grant(etcd: &Etcd, ttl: Duration) -> Result<Lease, etcd_client::Error> {
        let resp = etcd.client.clone().lease_grant(ttl.as_secs().max(1) as i64, None).await?;
        let id = resp.id();
        let (tx, lost) = watch::channel(None);
        let task = tokio::spawn(keep_alive(etcd.clone(), id, ttl, tx));
        Ok(Lease { id, ttl, lost, task })
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Resolves when the lease is (or may be) gone, with why. Cancel-safe.
    pub async fn lost(&mut self) -> String {
        loop {
            if let Some(why) = self.lost.borrow().clone() {
                return why;
            }
            if self.lost.changed().await.is_err() {
                return "the keepalive task ended".into();
            }
        }
    }

    /// Stops the keepalive and revokes the lease (deleting every key on it:
    /// the candidate's or leader's election key). Best effort: a lease that
    /// cannot be revoked expires after its TTL.
    pub async fn revoke(self, etcd: &Etcd) {
        self.task.abort();
        let mut c = etcd.client.clone();
        match tokio::time::timeout(etcd.timeout, c.lease_revoke(self.id)).await {
            Ok(Ok(_)) => tracing::debug!(lease = format!("{:x}", self.id), "lease revoked"),
            Ok(Err(e)) => tracing::debug!(error = %e, "revoking the lease failed; it expires on its own"),
            Err(_) => tracing::debug!("revoking the lease timed out; it expires on its own"),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn keep_alive(etcd: Etcd, id: i64, ttl: Duration, lost: watch::Sender<Option<String>>) {
    let period = (ttl / 3).max(Duration::from_millis(300));
    // The lease was granted just before this task started.
    let mut confirmed_at = Instant::now();
    let mut last_error = String::new();
    loop {
        if confirmed_at.elapsed() >= ttl {
            let _ = lost.send(Some(format!("no keepalive of lease {id:x} was confirmed for {ttl:?} ({last_error})")));
            return;
        }
        let mut client = etcd.client.clone();
        let (mut keeper, mut stream) = match tokio::time::timeout(period, client.lease_keep_alive(id)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                last_error = e.to_string();
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(_) => {
                last_error = "opening the keepalive stream timed out".into();
                continue;
            }
        };
        loop {
            let sent_at = Instant::now();
            if let Err(e) = keeper.keep_alive().await {
                last_error = e.to_string();
                break;
            }
            match tokio::time::timeout(period, stream.message()).await {
                Ok(Ok(Some(r))) if r.ttl() > 0 => confirmed_at = sent_at,
                Ok(Ok(Some(_))) => {
                    let _ = lost.send(Some(format!("lease {id:x} expired (etcd answered the keepalive with TTL 0)")));
                    return;
                }
                Ok(Ok(None)) => {
                    last_error = "the keepalive stream ended".into();
                    break;
                }
                Ok(Err(e)) => {
                    last_error = e.to_string();
                    break;
                }
                Err(_) => {
                    last_error = format!("no keepalive answer within {period:?}");
                    break;
                }
            }
            if confirmed_at.elapsed() >= ttl {
                break;
            }
            tokio::time::sleep(period.saturating_sub(sent_at.elapsed())).await;
        }
    }
}

/// Leadership won: the key to compare in writes, and etcd's handle to resign.
#[derive(Debug, Clone)]
pub struct Won {
    pub leadership: Leadership,
    pub key: LeaderKey,
}

/// Campaigns on `name` with `value` on `lease` until elected (etcd answers
/// when every older candidate's key is gone). `client` must have no request
/// deadline (`holdfast_store::etcd::connect_for_waiting_calls`): a standby's
/// campaign waits as long as the leader lives.
pub async fn campaign(client: &etcd_client::Client, name: &str, value: &str, lease: i64) -> anyhow::Result<Won> {
    let resp = client.election_client().campaign(name, value, lease).await?;
    let key = resp.leader().cloned().ok_or_else(|| anyhow::anyhow!("etcd answered the campaign without a leader key"))?;
    Ok(Won { leadership: Leadership { key: key.key().to_vec(), create_revision: key.rev() }, key })
}

/// Gives up leadership (deletes the leader key) so a standby takes over at
/// once instead of after the TTL.
pub async fn resign(etcd: &Etcd, won: &Won) {
    let mut c = etcd.client.election_client();
    match tokio::time::timeout(etcd.timeout, c.resign(Some(ResignOptions::new().with_leader(won.key.clone())))).await {
        Ok(Ok(_)) => tracing::info!("resigned the leadership"),
        Ok(Err(e)) => tracing::warn!(error = %e, "resigning failed; a standby takes over when the lease expires"),
        Err(_) => tracing::warn!("resigning timed out; a standby takes over when the lease expires"),
    }
}

/// The current leader's value (`HOST pid PID`), if there is a leader.
pub async fn current_leader(etcd: &Etcd, name: &str) -> Result<Option<String>, etcd_client::Error> {
    match etcd.client.election_client().leader(name).await {
        Ok(r) => Ok(r.kv().map(|kv| String::from_utf8_lossy(kv.value()).into_owned())),
        Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("no leader") => Ok(None),
        Err(e) => Err(e),
    }
}
