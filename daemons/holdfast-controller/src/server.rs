//! The controller's loop: campaign as a standby, lead, step down on losing
//! the lease, resign on SIGTERM; systemd readiness, watchdog and status.
//!
//! READY=1 is sent after the first completed round: as leader, once the
//! directory's set was published, found current or refused; as standby, once
//! etcd answered who leads. WATCHDOG=1 is sent after every completed round
//! (each one talks to etcd), never from an idle timer.

use crate::metrics::METRICS;
use crate::publish::{Outcome, Publisher};
use holdfast_config::ControllerConfig;
use holdfast_daemon::election::{self, Lease, Won};
use holdfast_daemon::{Notifier, Stop};
use holdfast_store::Etcd;
use std::time::Duration;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::{Instant, MissedTickBehavior};

struct Signals {
    stop: Stop,
    hup: Signal,
}

pub async fn run(config: ControllerConfig) -> anyhow::Result<()> {
    crate::metrics::init(&config.cluster_name);
    let metrics_addr = crate::metrics::serve(config.metrics_listen).await?;
    tracing::info!(metrics = %metrics_addr, "metrics at http://{metrics_addr}/metrics");
    let mut signals = Signals { stop: Stop::new()?, hup: signal(SignalKind::hangup())? };
    let etcd = Etcd::connect(&config.etcd).await?;
    holdfast_daemon::route::spawn(&etcd);
    let waiting = holdfast_store::etcd::connect_for_waiting_calls(&config.etcd).await?;
    let identity = holdfast_daemon::identity();
    tracing::info!(
        identity = %identity,
        policy_dir = %config.policy_dir.display(),
        election = %config.election.name,
        etcd = %config.etcd.endpoints.join(","),
        "starting"
    );
    let mut notifier = Notifier::new();
    let mut publisher = Publisher::new(config.policy_dir.clone(), identity.clone());
    loop {
        let lease = tokio::select! {
            r = Lease::grant(&etcd, config.election.ttl) => r,
            _ = signals.stop.stop() => return Ok(()),
        };
        let mut lease = match lease {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot get an etcd lease to campaign with; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(config.rescan_interval) => continue,
                    _ = signals.stop.stop() => return Ok(()),
                }
            }
        };
        let won = match standby(&config, &etcd, &waiting, &identity, &mut lease, &mut signals, &mut notifier).await {
            Standby::Elected(won) => won,
            Standby::Retry => {
                lease.revoke(&etcd).await;
                continue;
            }
            Standby::Stop => {
                lease.revoke(&etcd).await;
                tracing::info!("stopped (standby)");
                return Ok(());
            }
        };
        match lead(&config, &etcd, &won, &mut lease, &mut signals, &mut notifier, &mut publisher).await {
            Led::Stopped => {
                election::resign(&etcd, &won).await;
                lease.revoke(&etcd).await;
                METRICS.set_leader(false);
                tracing::info!("stopped");
                return Ok(());
            }
            Led::Lost(why) => {
                METRICS.set_leader(false);
                publisher.reset();
                tracing::warn!("lost the leadership ({why}); stopped publishing, campaigning again");
                lease.revoke(&etcd).await;
            }
        }
    }
}

enum Standby {
    Elected(Won),
    /// The campaign failed or the lease was lost: campaign again.
    Retry,
    /// SIGTERM or SIGINT.
    Stop,
}

/// Waits as a standby until elected, checking on the leader every
/// `rescan_interval`.
async fn standby(
    config: &ControllerConfig,
    etcd: &Etcd,
    waiting: &etcd_client::Client,
    identity: &str,
    lease: &mut Lease,
    signals: &mut Signals,
    notifier: &mut Notifier,
) -> Standby {
    let campaign = election::campaign(waiting, &config.election.name, identity, lease.id);
    tokio::pin!(campaign);
    // The first standby round waits a little: an uncontested campaign wins
    // at once, and READY should then report the leader's first round.
    let mut tick = tokio::time::interval_at(Instant::now() + config.rescan_interval.min(Duration::from_secs(1)), config.rescan_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_leader: Option<Option<String>> = None;
    loop {
        tokio::select! {
            biased;
            r = &mut campaign => match r {
                Ok(won) => return Standby::Elected(won),
                Err(e) => {
                    tracing::warn!(error = %e, "campaign failed; campaigning again");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    return Standby::Retry;
                }
            },
            why = lease.lost() => {
                tracing::warn!("the candidate lease was lost ({why}); campaigning again");
                return Standby::Retry;
            }
            _ = signals.stop.stop() => return Standby::Stop,
            _ = signals.hup.recv() => tracing::info!("SIGHUP: standby, nothing to rescan (the leader publishes)"),
            _ = tick.tick() => {
                let leader = election::current_leader(etcd, &config.election.name).await;
                let published = holdfast_store::policy::read_published(etcd).await;
                match (leader, published) {
                    (Ok(leader), Ok(published)) => {
                        let version = published.doc().map(|p| p.version).unwrap_or(0);
                        METRICS.set_published_version(version);
                        let name = leader.clone().unwrap_or_else(|| "none".into());
                        if last_leader.as_ref() != Some(&leader) {
                            tracing::info!(leader = %name, version, "standby: waiting while another controller leads");
                            last_leader = Some(leader);
                        }
                        notifier.round(&format!("standby; leader: {name}; policy version {version}"));
                    }
                    (Err(e), _) | (_, Err(e)) => tracing::warn!(error = %e, "standby: etcd did not answer; no watchdog ping this round"),
                }
            }
        }
    }
}

enum Led {
    /// SIGTERM or SIGINT: resign.
    Stopped,
    /// The lease or the leader key is gone.
    Lost(String),
}

/// Leads until the leadership is lost or a stop signal arrives: a round at
/// once, then every `rescan_interval` and on SIGHUP.
async fn lead(
    config: &ControllerConfig,
    etcd: &Etcd,
    won: &Won,
    lease: &mut Lease,
    signals: &mut Signals,
    notifier: &mut Notifier,
    publisher: &mut Publisher,
) -> Led {
    METRICS.set_leader(true);
    tracing::info!(key = %String::from_utf8_lossy(&won.leadership.key), "leader: elected; this controller publishes the policy");
    let mut tick = tokio::time::interval_at(Instant::now() + config.rescan_interval, config.rescan_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut forced = false;
    loop {
        let round = tokio::select! {
            r = publisher.round(etcd, &won.leadership, forced) => r,
            why = lease.lost() => return Led::Lost(why),
        };
        forced = false;
        let status = match round {
            Ok(Outcome::NotLeader) => return Led::Lost("the leader key is gone from etcd".into()),
            Ok(Outcome::Raced) => {
                tracing::info!("/sys/policy changed while this round ran; reading it again");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Ok(Outcome::Published { version, hash }) => Some(format!("leader; published policy version {version} ({hash})")),
            Ok(Outcome::Current { version, hash }) => Some(format!("leader; policy version {version} ({hash}) is current")),
            Ok(Outcome::Refused { version, problems }) => Some(format!(
                "leader; REFUSING {} ({problems} problem(s)); policy version {version} stays in force",
                config.policy_dir.display()
            )),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "leader: the round failed (etcd); retrying next round, no watchdog ping");
                None
            }
        };
        if let Some(status) = status {
            notifier.round(&status);
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = signals.hup.recv() => {
                tracing::info!("SIGHUP: rescanning {}", config.policy_dir.display());
                forced = true;
            }
            why = lease.lost() => return Led::Lost(why),
            _ = signals.stop.stop() => return Led::Stopped,
        }
    }
}
