//! Running the arbiter: TLS, the listener (its own, or the one systemd's
//! holdfast-arbiter.socket passes), systemd readiness and watchdog, the
//! gRPC health and reflection services, and a graceful drain on SIGTERM.
//!
//! READY=1 is sent only after the listener is bound and etcd has answered a
//! full check. WATCHDOG=1 is sent from the seal check loop, the loop that
//! proves the arbiter still talks to etcd, never from an idle timer.

use crate::config::ArbiterConfig;
use crate::etcd::Etcd;
use crate::seal::{self, Guard, Serve};
use crate::service::LockService;
use anyhow::Context;
use holdfast_config::EtcdConfig;
use holdfast_proto::LockServer;
use sd_notify::NotifyState;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tonic::transport::Server;

/// Installs the ring crypto provider for rustls, once per process.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn notify(state: &[NotifyState]) {
    // Outside systemd NOTIFY_SOCKET is unset and this does nothing.
    if let Err(e) = sd_notify::notify(state) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

pub async fn run(config: ArbiterConfig) -> anyhow::Result<()> {
    install_crypto_provider();
    let tls = crate::tls::load(&config.tls).context("[tls]")?;

    crate::metrics::init(&config.cluster_name);
    let _ = holdfast_store::etcd::ON_AUTH_RACE_RESEND.set(|| crate::metrics::inc(|m| &m.auth_race_resends));
    for name in apply_mutations(&config.mutation)? {
        tracing::warn!(mutation = name, "MUTATION on: this arbiter is deliberately broken (test builds only)");
    }
    let metrics_addr = crate::metrics::serve(config.metrics_listen).await?;
    tracing::info!(metrics = %metrics_addr, "metrics at http://{metrics_addr}/metrics");
    let served = crate::served::Served::open(&config.state_dir, &config.cluster_name).map_err(|e| anyhow::anyhow!("state_dir: {e}"))?;
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    // One etcd client (and seal check, sessions, waiters) per cluster: the
    // entity cluster ([etcd]) and the coord cluster ([coord], unless it
    // lists [etcd]'s endpoints or is left out: then one serves both tiers).
    let entity = Arc::new(open_cluster(&config, &config.etcd, served.sibling(&config.cluster_name), 0).await.context("[etcd]")?);
    let clusters = match config.separate_coord() {
        None => crate::cluster::Clusters { coord: entity.clone(), entity },
        Some(coord) => {
            let coord = Arc::new(open_cluster(&config, coord, served.sibling(config.coord_name()), 1).await.context("[coord]")?);
            crate::cluster::Clusters { entity, coord }
        }
    };
    for c in clusters.all() {
        if let Some(high) = c.guard.served.high() {
            tracing::info!(cluster = %c.name(), epoch = high.epoch, "the highest epoch this arbiter served");
        }
    }
    let (listener, activated) = listener(config.listen).await?;
    let local = listener.local_addr()?;
    let from = if activated { "socket from systemd" } else { "bound" };
    let coord_at = if clusters.shared() {
        "the same cluster".to_string()
    } else {
        clusters.coord.etcd.members.iter().map(|m| m.0.clone()).collect::<Vec<_>>().join(",")
    };
    tracing::info!(listen = %local, from, etcd = %config.etcd.endpoints.join(","), coord = %coord_at, "listening; checking etcd before serving");
    let (health, health_service) = crate::health::Health::start();

    let watchdog = sd_notify::watchdog_enabled().map(|d| d / 2);
    // READY once every cluster has been checked.
    let mut firsts = Vec::new();
    for (i, c) in clusters.all().into_iter().enumerate() {
        let (first_tx, first_rx) = tokio::sync::watch::channel(false);
        firsts.push(first_rx);
        let (etcd, guard, health) = (c.etcd.clone(), c.guard.clone(), health.clone());
        let check = config.seal.check_interval;
        let wm = config.seal.watermark_interval;
        // The entity cluster's loop reports health and pings the watchdog.
        let primary = i == 0;
        tokio::spawn(async move {
            seal::run(etcd, guard.clone(), check, wm, |state| {
                if guard.has_checked() {
                    let _ = first_tx.send(true);
                }
                if !primary {
                    return;
                }
                health.set(matches!(state, Serve::Serving(_)));
                let status = match state {
                    Serve::Serving(c) => format!("serving epoch {}", c.record.epoch),
                    Serve::Sealed { .. } => "SEALED: granting nothing; see `holdfastctl epoch status`".to_string(),
                    Serve::Unverified(_) => "waiting for etcd".to_string(),
                };
                // Every completed round proves the loop runs; a round lasts at
                // most a few request timeouts, well inside WatchdogSec=.
                if watchdog.is_some() {
                    notify(&[NotifyState::Watchdog, NotifyState::Status(&status)]);
                }
            })
            .await
        });
    }

    // The class set is published on the coord cluster.
    let policy = Arc::new(crate::policy::Policy::new(config.region.clone()));
    crate::policy::load(&clusters.coord.etcd, &policy).await;
    tokio::spawn(crate::policy::run(clusters.coord.etcd.clone(), policy.clone()));
    // Quotas count what etcd holds, on every cluster; listed before READY
    // when etcd answers.
    crate::metrics::set_limits(&config.limits);
    let limits = Arc::new(crate::limits::Limits::new(config.limits.clone(), clusters.all().len()));
    for c in clusters.all() {
        let from = limits.ledgers[c.ledger].load(&c.etcd).await.unwrap_or(0);
        tokio::spawn(crate::limits::run(c.etcd.clone(), limits.clone(), c.ledger, from));
    }
    tokio::spawn(crate::limits::export(limits.clone(), policy.clone()));

    let entity_guard = clusters.entity.guard.clone();
    let (spool, unshipped) =
        crate::spool::Spool::open(&config.state_dir, config.fail_open.spool_max_bytes).map_err(|e| anyhow::anyhow!("fail_open: {e}"))?;
    if !unshipped.is_empty() {
        tracing::warn!(records = unshipped.len(), spool = %spool.path().display(), "the fail-open spool holds unprotected grants not yet shipped");
    }
    let unprotected =
        Arc::new(crate::unprotected::Unprotected::new(config.fail_open.after, spool).map_err(|e| anyhow::anyhow!("fail_open: {e}"))?);
    {
        let (unprotected, clusters, policy) = (unprotected.clone(), clusters.clone(), policy.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::unprotected::SWEEP);
            loop {
                tick.tick().await;
                unprotected.sweep(&clusters, &policy.classes()).await;
            }
        });
    }
    let service = LockService { clusters, stopping, policy, limits, trust_domain: config.tls.trust_domain.as_str().into(), unprotected };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    crate::tls::watch(tls.clone()).context("SIGHUP handler")?;
    let admission = Arc::new(crate::tls::Admission::new(&config.limits));
    {
        let admission = admission.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            loop {
                tick.tick().await;
                admission.forget_idle();
                let m = &*crate::metrics::METRICS;
                m.connections_open.get_or_create(m.labels()).set(i64::from(admission.open_connections()));
            }
        });
    }
    let incoming = crate::tls::incoming(listener, tls, admission, stopping_tx.subscribe());
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(holdfast_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("gRPC reflection descriptors")?;
    // The older v1alpha protocol too: grpc_cli and older grpcurl ask for it.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(holdfast_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("gRPC reflection descriptors")?;
    let server = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        // A connection's certificate was checked once, at its handshake:
        // after this age the client reconnects and is checked again (its
        // calls get a minute to finish first).
        .max_connection_age(config.limits.max_connection_age)
        .max_connection_age_grace(Duration::from_secs(60))
        .add_service(LockServer::new(service))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    let mut server = tokio::spawn(server);

    // Ready once every cluster has answered a full check (serving, sealed or not).
    let checked = async {
        for first in &mut firsts {
            first.wait_for(|v| *v).await.context("check loop ended")?;
        }
        anyhow::Ok(())
    };
    tokio::select! {
        r = checked => r?,
        r = &mut server => { r??; anyhow::bail!("server stopped before it was ready"); }
    }
    notify(&[NotifyState::Ready, NotifyState::Status("ready")]);
    tracing::info!(listen = %local, state = %entity_guard.state().describe(), "ready");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        r = &mut server => { r??; anyhow::bail!("server stopped unexpectedly"); }
    }
    tracing::info!(drain = ?config.drain_timeout, "stopping: draining in-flight calls");
    notify(&[NotifyState::Stopping]);
    health.set(false);
    let _ = stopping_tx.send(true);
    let _ = stop_tx.send(());
    match tokio::time::timeout(config.drain_timeout, &mut server).await {
        Ok(r) => r??,
        Err(_) => tracing::warn!("drain timeout passed; exiting with calls still in flight"),
    }
    Ok(())
}

/// Connects to one cluster and sets up what the arbiter keeps for it.
async fn open_cluster(
    config: &ArbiterConfig,
    etcd: &EtcdConfig,
    served: crate::served::Served,
    ledger: usize,
) -> anyhow::Result<crate::cluster::Cluster> {
    let tiers = match (config.separate_coord(), ledger) {
        (None, _) => "coord,entity",
        (Some(_), 0) => "entity",
        (Some(_), _) => "coord",
    };
    let etcd = Etcd::connect(etcd).await?;
    let committer = crate::commit::Committer::new(etcd.clone(), config.grants.group_commit);
    let expiries = Arc::new(crate::expiry::Expiries::new(config.waiters.watch));
    tokio::spawn(crate::expiry::run(etcd.clone(), expiries.clone()));
    Ok(crate::cluster::Cluster {
        tiers,
        guard: Arc::new(Guard::new(served)),
        sessions: Default::default(),
        waiters: Arc::new(crate::waiting::Waiters::new(config.waiters.watch, committer)),
        confirmer: crate::confirm::Confirmer::start(etcd.clone()),
        deposed: crate::deposed::Deposed::start(etcd.clone()),
        renewer: Arc::new(crate::renewal::Renewer::new(etcd.clone())),
        expiries,
        ledger,
        etcd,
    })
}

/// The lock.v1 listener: the first socket systemd passed (LISTEN_FDS, from
/// holdfast-arbiter.socket), so the port stays open while the arbiter
/// restarts or is upgraded and connections queue in the kernel; otherwise
/// `listen`, bound here. Returns whether the socket came from systemd.
async fn listener(listen: std::net::SocketAddr) -> anyhow::Result<(TcpListener, bool)> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let passed = libsystemd::activation::receive_descriptors(true)
        .map_err(|e| anyhow::anyhow!("reading the sockets systemd passed (LISTEN_FDS): {e}"))?;
    let Some(fd) = passed.into_iter().next() else {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}; is another arbiter running, or is `listen` wrong?"))?;
        return Ok((listener, false));
    };
    // SAFETY: systemd passed this descriptor to this process to own (and
    // receive_descriptors unset LISTEN_FDS, so nothing else claims it).
    let std = unsafe { std::net::TcpListener::from_raw_fd(fd.into_raw_fd()) };
    std.set_nonblocking(true)?;
    let listener = TcpListener::from_std(std)
        .context("the socket systemd passed is not a TCP listener: check ListenStream= in holdfast-arbiter.socket")?;
    if let Ok(addr) = listener.local_addr()
        && addr.port() != listen.port()
    {
        tracing::warn!(socket = %addr, listen = %listen, "the socket from systemd differs from `listen` in arbiter.toml; serving on the socket");
    }
    Ok((listener, true))
}

/// Switches on the deliberate bugs `[mutation]` names, if this arbiter was
/// built with the `mutations` feature (the gate's test builds); any other
/// arbiter refuses a config that turns one on. Returns the names switched on.
pub fn apply_mutations(config: &holdfast_config::arbiter::MutationConfig) -> anyhow::Result<Vec<&'static str>> {
    let on = config.on();
    if on.is_empty() {
        return Ok(on);
    }
    #[cfg(feature = "mutations")]
    return Ok(holdfast_store::mutation::enable(config));
    #[cfg(not(feature = "mutations"))]
    anyhow::bail!(
        "[mutation] turns on {} but this arbiter was built without the `mutations` feature \
         (deliberate bugs exist only in the correctness gate's test builds); remove the [mutation] table",
        on.join(", ")
    )
}

#[cfg(test)]
mod mutation_tests {
    use super::apply_mutations;
    use holdfast_config::arbiter::MutationConfig;

    /// The suite runs it with the `mutations` feature; a plain `cargo test
    /// -p holdfast-arbiter` runs it without. The install test runs the
    /// packaged arbiter (built without it) on a `[mutation]` table.
    #[test]
    fn mutations_apply_only_in_a_build_with_the_feature() {
        assert_eq!(apply_mutations(&MutationConfig::default()).unwrap(), Vec::<&str>::new());
        let mut m = MutationConfig::default();
        m.set("token_from_counter").unwrap();
        let r = apply_mutations(&m);
        if cfg!(feature = "mutations") {
            assert_eq!(r.unwrap(), vec!["token_from_counter"]);
            // Leave the process-wide flag as it was.
            apply_mutations(&MutationConfig::default()).unwrap();
            #[cfg(feature = "mutations")]
            holdfast_store::mutation::enable(&MutationConfig::default());
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("without the `mutations` feature") && e.contains("token_from_counter"), "{e}");
        }
    }
}
