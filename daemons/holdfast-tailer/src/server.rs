//! The tailer's loop: campaign as a standby, tail as the active one, step
//! down on losing the lease, checkpoint and resign on SIGTERM; systemd
//! readiness, watchdog and status.
//!
//! READY=1 is sent once the first round completed: as the active tailer,
//! once it resumed (caught up or watching); as a standby, once etcd
//! answered who leads. WATCHDOG=1 follows every completed round (each one
//! talks to etcd or the store), once a second.

use crate::metrics::METRICS;
use crate::tail::{Handled, Tailer};
use holdfast_config::TailerConfig;
use holdfast_daemon::election::{self, Lease, Won};
use holdfast_daemon::{Notifier, Stop};
use holdfast_store::Etcd;
use std::time::Duration;
use tokio::time::MissedTickBehavior;

const ROUND: Duration = Duration::from_secs(1);

pub async fn run(config: TailerConfig) -> anyhow::Result<()> {
    crate::metrics::init(&config.cluster_name);
    let metrics_addr = crate::metrics::serve(config.metrics_listen).await?;
    tracing::info!(metrics = %metrics_addr, "metrics at http://{metrics_addr}/metrics");
    let mut stop = Stop::new()?;
    let etcd = Etcd::connect(&config.etcd).await?;
    holdfast_daemon::route::spawn(&etcd);
    let waiting = holdfast_store::etcd::connect_for_waiting_calls(&config.etcd).await?;
    // The election: on the coord cluster when one is named, else on the
    // recorded cluster.
    let (elect, elect_waiting) = match &config.coord {
        Some(coord) => {
            let elect = Etcd::connect(coord).await?;
            holdfast_daemon::route::spawn(&elect);
            (elect, holdfast_store::etcd::connect_for_waiting_calls(coord).await?)
        }
        None => (etcd.clone(), waiting.clone()),
    };
    let identity = holdfast_daemon::identity();
    tracing::info!(
        identity = %identity,
        store = %config.store_dir.display(),
        election = %config.election.name,
        etcd = %config.etcd.endpoints.join(","),
        election_etcd = %config.coord.as_ref().unwrap_or(&config.etcd).endpoints.join(","),
        "starting"
    );
    let mut notifier = Notifier::new();
    loop {
        let lease = tokio::select! {
            r = Lease::grant(&elect, config.election.ttl) => r,
            _ = stop.stop() => return Ok(()),
        };
        let mut lease = match lease {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot get an etcd lease to campaign with; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(ROUND) => continue,
                    _ = stop.stop() => return Ok(()),
                }
            }
        };
        let campaign = election::campaign(&elect_waiting, &config.election.name, &identity, lease.id);
        let won = tokio::select! {
            biased;
            r = campaign => match r {
                Ok(won) => Some(won),
                Err(e) => {
                    tracing::warn!(error = %e, "campaign failed; campaigning again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    None
                }
            },
            why = lease.lost() => {
                tracing::warn!("the candidate lease was lost ({why}); campaigning again");
                None
            }
            _ = stop.stop() => {
                lease.revoke(&elect).await;
                tracing::info!("stopped (standby)");
                return Ok(());
            }
            () = standby(&config, &elect, &mut notifier) => None,
        };
        let Some(won) = won else {
            lease.revoke(&elect).await;
            continue;
        };
        METRICS.set_leader(true);
        tracing::info!(key = %String::from_utf8_lossy(&won.leadership.key), "active: elected; this tailer records the cluster's history");
        let outcome = lead(&config, &etcd, &mut lease, &mut stop, &mut notifier).await;
        METRICS.set_leader(false);
        match outcome {
            Led::Stopped => {
                resign(&elect, &won, lease).await;
                notifier.stopping();
                tracing::info!("stopped");
                return Ok(());
            }
            Led::Lost(why) => {
                tracing::warn!("lost the leadership ({why}); stopped recording, campaigning again");
                lease.revoke(&elect).await;
            }
            Led::Failed(e) => {
                tracing::warn!(error = format!("{e:#}"), "recording failed; resigning and trying again from the checkpoint");
                resign(&elect, &won, lease).await;
                tokio::select! {
                    _ = tokio::time::sleep(ROUND * 2) => {}
                    _ = stop.stop() => return Ok(()),
                }
            }
        }
    }
}

async fn resign(etcd: &Etcd, won: &Won, lease: Lease) {
    election::resign(etcd, won).await;
    lease.revoke(etcd).await;
}

/// Reports the leader once a round while waiting as a standby (asking the
/// cluster the election runs on); never returns.
async fn standby(config: &TailerConfig, etcd: &Etcd, notifier: &mut Notifier) {
    // An uncontested campaign wins at once: READY should then report the
    // active tailer's first round, so the first standby round waits.
    tokio::time::sleep(ROUND).await;
    let mut last: Option<Option<String>> = None;
    loop {
        match election::current_leader(etcd, &config.election.name).await {
            Ok(leader) => {
                let name = leader.clone().unwrap_or_else(|| "none".into());
                if last.as_ref() != Some(&leader) {
                    tracing::info!(leader = %name, "standby: waiting while another tailer records");
                    last = Some(leader);
                }
                let age = holdfast_audit::store::read_checkpoint(&config.store_dir)
                    .ok()
                    .flatten()
                    .map(|c| holdfast_daemon::now_unix_ms().saturating_sub(c.written_unix_ms) / 1000);
                METRICS.set_lag(0, age.unwrap_or(0) as i64, false);
                notifier.round(&format!("standby; active tailer: {name}"));
            }
            Err(e) => tracing::warn!(error = %e, "standby: etcd did not answer; no watchdog ping this round"),
        }
        tokio::time::sleep(ROUND).await;
    }
}

enum Led {
    /// SIGTERM or SIGINT: checkpointed; resign.
    Stopped,
    /// The lease is gone.
    Lost(String),
    /// etcd or a sink failed.
    Failed(anyhow::Error),
}

/// Records until the leadership is lost, a sink fails or a stop signal
/// arrives.
async fn lead(config: &TailerConfig, etcd: &Etcd, lease: &mut Lease, stop: &mut Stop, notifier: &mut Notifier) -> Led {
    let sinks = match crate::sinks::open(config) {
        Ok(s) => s,
        Err(e) => return Led::Failed(e),
    };
    let mut tailer = match Tailer::open(config, etcd, sinks).await {
        Ok(t) => t,
        Err(e) => return Led::Failed(e),
    };
    let mut tick = tokio::time::interval(ROUND);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    'resume: loop {
        let start = match tailer.resume(etcd).await {
            Ok(s) => s,
            Err(e) => return Led::Failed(e),
        };
        // On the client that requires a leader: a member cut off from the
        // quorum cancels the watch instead of holding it silent.
        let mut stream = match tailer.watch(&etcd.watch, start).await {
            Ok(s) => s,
            Err(e) => return Led::Failed(e),
        };
        // How far behind, never a revision: etcd's revision now may be a
        // live hold's, which with the epoch is its token.
        tracing::info!(behind_revisions = (tailer.etcd_revision() - start + 1).max(0), "recording from the checkpoint");
        loop {
            tokio::select! {
                biased;
                _ = stop.stop() => {
                    return match tailer.checkpoint().await {
                        Ok(()) => Led::Stopped,
                        Err(e) => {
                            tracing::warn!(error = format!("{e:#}"), "the last checkpoint failed; the next start replays from the one before");
                            Led::Stopped
                        }
                    };
                }
                why = lease.lost() => {
                    let _ = tailer.checkpoint().await;
                    return Led::Lost(why);
                }
                // Before the stream: under a steady stream of changes the
                // stream is always ready, and the checkpoint and watchdog
                // must still run once a second.
                _ = tick.tick() => match tailer.tick(etcd).await {
                    Ok(status) => notifier.round(&status),
                    Err(e) => return Led::Failed(e),
                },
                msg = stream.message() => match msg {
                    Ok(Some(resp)) => match tailer.handle(resp).await {
                        Ok(Handled::Stored(_)) => {}
                        Ok(Handled::Compacted) => {
                            tracing::warn!("etcd compacted past the watch's start; reading the key space again");
                            continue 'resume;
                        }
                        Err(e) => return Led::Failed(e),
                    },
                    Ok(None) => return Led::Failed(anyhow::anyhow!("etcd ended the watch")),
                    Err(e) => return Led::Failed(anyhow::anyhow!("the watch failed: {e}")),
                },
            }
        }
    }
}
