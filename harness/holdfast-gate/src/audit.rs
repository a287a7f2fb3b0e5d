//! `--audit`: a real holdfast-tailer records the run (host namespace,
//! outside every fault, with its own read-only etcd role), and at the end
//! the audit checker (`holdfast_checkers::audit`) compares its store with
//! etcd's log: the same set of changes, each once, and every hold's end
//! classified as the gate's own recorder classifies it.

use crate::cluster::Cluster;
use anyhow::Context;
use holdfast_audit::{Event, Kind};
use holdfast_checkers::audit::{AuditReport, Recorded, StoredEnd, compare};
use holdfast_checkers::history::EtcdEventKind;
use holdfast_config::TailerConfig;
use holdfast_devkit::tailer::{TailerLaunch, TailerProcess};
use holdfast_store::roles;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub struct Audit {
    _tailer: TailerProcess,
    store: PathBuf,
}

impl Audit {
    pub fn start(cluster: &Cluster, dir: &Path) -> anyhow::Result<Audit> {
        let store = dir.join("audit");
        let mut config = TailerConfig::new(cluster.etcd_config(roles::TAILER.name)?);
        config.store_dir = store.clone();
        config.metrics_listen = ([127, 0, 0, 1], holdfast_devkit::ports::free_port()).into();
        config.cluster_name = "gate".into();
        config.checkpoint_interval = Duration::from_millis(500);
        config.election.ttl = Duration::from_secs(2);
        let launch = TailerLaunch::new(holdfast_devkit::tailer::locate()?, config, dir, "tailer");
        let tailer = TailerProcess::start(&launch, Duration::from_secs(60)).context("starting the audit tailer; see tailer.log")?;
        Ok(Audit { _tailer: tailer, store })
    }

    /// Takes a hold and keeps it live while it waits for the store to
    /// reach etcd's revision now, then compares: the hold's revision must
    /// be withheld, not stored. Releases it after.
    pub async fn check(&self, cluster: &Cluster) -> anyhow::Result<AuditReport> {
        let arbiter = holdfast_client::Client::connect(&holdfast_client::ClientConfig {
            endpoint: cluster.arbiter_endpoints()[0].clone(),
            ca: cluster.ca.ca_path(),
            cert: cluster.client_cert.cert.clone(),
            key: cluster.client_cert.key.clone(),
        })
        .await?;
        let session = arbiter.open_session_for(crate::cluster::GATE_NAMESPACE, Some(crate::CLIENT_TTL)).await?;
        let key = holdfast_model::LockKey::parse(&format!("{}/audit-live", crate::cluster::GATE_NAMESPACE))?;
        let hold = session.acquire(&key, Duration::from_secs(30)).await.context("taking a hold to keep live during the audit check")?;
        let report = self.compare(cluster).await;
        hold.release().await?;
        session.close().await?;
        let report = report?;
        anyhow::ensure!(report.withheld > 0, "the hold live during the audit check was not withheld by the tailer: {report:?}");
        Ok(report)
    }

    async fn compare(&self, cluster: &Cluster) -> anyhow::Result<AuditReport> {
        let mut client = cluster.etcd().await?;
        let target = client.get("/sys/epoch", None).await?.header().map_or(0, |h| h.revision());
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let at = holdfast_audit::store::read_checkpoint(&self.store)?.map_or(0, |c| c.revision);
            if at >= target {
                break;
            }
            anyhow::ensure!(Instant::now() < end, "the audit tailer's checkpoint is at {at}, etcd at {target}, after 60 s; see tailer.log");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Withheld before stored (a release in between is then in both),
        // live holds after (a hold live now was live when the store was read).
        let withheld: BTreeSet<(i64, u32)> = holdfast_audit::store::read_withheld(&self.store)?
            .values()
            .flat_map(|w| w.events.iter().filter(|e| e.kind != Kind::Gap).map(Event::position))
            .collect();
        let events = holdfast_audit::store::read_events(&self.store)?;
        let stored: BTreeSet<(i64, u32)> = events.iter().filter(|e| e.kind != Kind::Gap).map(Event::position).collect();
        let holds = client.get("/l/", Some(etcd_client::GetOptions::new().with_prefix())).await?;
        let live: BTreeSet<i64> = holds.kvs().iter().map(|kv| kv.create_revision()).collect();
        let ends: Vec<StoredEnd> = events
            .iter()
            .filter(|e| e.kind.ends_hold())
            .map(|e| StoredEnd {
                revision: e.position().0 as u64,
                key: e.etcd_key.clone(),
                with_session: matches!(e.kind, Kind::Expiry | Kind::Close | Kind::Advance),
                kind: e.kind.to_string(),
            })
            .collect();
        let etcd = positions(&client, target).await?;
        let log = holdfast_fixtures::etcdlog::read_log(&client, "", 1, 1).await?;
        let recorded: BTreeMap<(u64, String), Option<bool>> =
            log.events.iter().filter(|e| e.kind == EtcdEventKind::Delete).map(|e| ((e.revision, e.key.clone()), e.expired)).collect();
        let gaps = events.iter().filter(|e| e.kind == Kind::Gap).count();
        anyhow::ensure!(gaps == 0, "the audit store has {gaps} gap event(s): etcd compacted history the tailer had not read");
        let mut report = compare(&Recorded { stored, withheld, live }, &etcd, &ends, &recorded);
        // Shipped fail-open records: each one an unprotected event (their
        // positions are compared above like any other).
        for e in events.iter().filter(|e| e.etcd_key.starts_with(holdfast_model::layout::UNPROTECTED_PREFIX)) {
            report.unprotected += 1;
            let kind_ok = matches!(e.kind, Kind::UnprotectedGrant | Kind::UnprotectedRelease | Kind::UnprotectedEnd);
            if (e.unprotected != Some(true) || !kind_ok) && report.misclassified.len() < 20 {
                report.misclassified.push(format!("{} at {:?}: {} without unprotected = true", e.etcd_key, e.position(), e.kind));
            }
        }
        Ok(report)
    }
}

/// Every `(revision, index)` in etcd's log from revision 1 to `through`.
async fn positions(client: &etcd_client::Client, through: i64) -> anyhow::Result<BTreeSet<(i64, u32)>> {
    let opts = etcd_client::WatchOptions::new().with_range(vec![0]).with_start_revision(1);
    let mut stream = client.clone().watch(vec![0], Some(opts)).await?;
    let mut out = BTreeSet::new();
    let (mut revision, mut index) = (0, 0);
    while revision < through {
        let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .context("etcd's log did not arrive within 10 s")??
            .context("etcd ended the watch")?;
        anyhow::ensure!(resp.compact_revision() == 0, "etcd compacted its log before the audit check");
        for ev in resp.events() {
            let r = ev.kv().map_or(0, |kv| kv.mod_revision());
            index = if r == revision { index + 1 } else { 0 };
            revision = r;
            if r <= through {
                out.insert((r, index));
            }
        }
    }
    Ok(out)
}
