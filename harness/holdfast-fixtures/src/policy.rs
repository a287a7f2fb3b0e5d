//! A class set for the lab (the end-to-end tests, the gate, the bench),
//! published the way production publishes one: a policy directory read,
//! validated and published by the real `holdfast-controller`.
//!
//! Each [`FixtureClass`] becomes one class of its own namespace. A class
//! with a TTL under 30 s must be fenced (advisory classes need 30 s or
//! more), and a fenced class needs a passing pause-test result: for those
//! this module records one under `/sys/pausetest/<class>/` naming the
//! resource `fixture:holdfast-lab`. That record is a fixture, not evidence:
//! the lab's resources are the gate's model resource and the reference
//! fences, whose rejection of stale tokens the gate and
//! `tests/tests/pausetest.rs` prove. Longer TTLs become advisory classes
//! with a far waiver, so no fixture record is needed for them.
//!
//! One grant gives every identity under `identity_prefix` lock, inspect and
//! force-release on every namespace; `extra_grants` (TOML `[grant.NAME]`
//! tables) can narrow some identities (a more specific identity wins).

use anyhow::Context;
use holdfast_config::{ControllerConfig, EtcdConfig};
use holdfast_devkit::controller::{ControllerLaunch, ControllerProcess};
use holdfast_model::layout::{self, PauseTestOutcome, PauseTestRecord};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The resource fixture classes name and fixture pause-test records are for.
pub const FIXTURE_RESOURCE: &str = "fixture:holdfast-lab";
/// The schema version fixture classes declare and fixture records carry.
pub const FIXTURE_SCHEMA_VERSION: u32 = 1;

/// One class: its namespace (also its name) and its TTL.
#[derive(Debug, Clone)]
pub struct FixtureClass {
    pub namespace: String,
    pub ttl: Duration,
    /// The class's `tier`: "entity" (the default) or "coord".
    pub tier: &'static str,
    /// The class's `fairness`: "best-effort" (the default) or "durable".
    pub fairness: &'static str,
    /// The class's `on_quorum_loss`: "closed" (the default) or "open".
    pub on_quorum_loss: &'static str,
    /// The class's `home_region`: none (the default: served everywhere).
    pub home_region: Option<&'static str>,
}

impl FixtureClass {
    pub fn new(namespace: &str, ttl: Duration) -> Self {
        FixtureClass {
            namespace: namespace.to_string(),
            ttl,
            tier: "entity",
            fairness: "best-effort",
            on_quorum_loss: "closed",
            home_region: None,
        }
    }

    /// The same class failing open on quorum loss (it must be unfenced:
    /// a TTL of 30 s or more here).
    pub fn open(mut self) -> Self {
        self.on_quorum_loss = "open";
        self
    }

    /// The same class with durable fairness (waiters recorded under `/q/`).
    pub fn durable(mut self) -> Self {
        self.fairness = "durable";
        self
    }

    /// The same class homed to `region`: an arbiter of another region
    /// refuses it (WRONG_REGION).
    pub fn homed(mut self, region: &'static str) -> Self {
        self.home_region = Some(region);
        self
    }

    /// The same class on the coord tier.
    pub fn on_coord(mut self) -> Self {
        self.tier = "coord";
        self
    }

    fn fenced(&self) -> bool {
        self.ttl < Duration::from_secs(30)
    }
}

/// The policy directory's files for `classes` and a grant to every identity
/// under `identity_prefix` (plus `extra_grants`).
pub fn write_dir(dir: &Path, identity_prefix: &str, classes: &[FixtureClass], extra_grants: &str) -> anyhow::Result<()> {
    write_files(dir, "lab", identity_prefix, classes, extra_grants)
}

/// Like [`write_dir`], into `classes.d/NAME.toml` and `grants.d/NAME.toml`
/// (beside the files already there: a drop-in for an existing policy
/// directory, such as `holdfastctl dev`'s), the grant named `NAME`.
pub fn write_files(dir: &Path, name: &str, identity_prefix: &str, classes: &[FixtureClass], extra_grants: &str) -> anyhow::Result<()> {
    let mut text = String::from("# Written by holdfast-fixtures (policy.rs): the lab's class set.\n");
    for c in classes {
        let ns = &c.namespace;
        let ttl = c.ttl.as_secs();
        let rule = if c.fenced() {
            format!(
                "purpose = \"correctness\"\nenforcement = \"fenced\"\nresource = \"{FIXTURE_RESOURCE}\"\nresource_schema_version = \
                 {FIXTURE_SCHEMA_VERSION}"
            )
        } else {
            "purpose = \"efficiency\"\nenforcement = \"advisory\"\nrisk_owner = \"holdfast-lab\"\nwaiver_expires = 2099-12-31".to_string()
        };
        text.push_str(&format!(
            "\n[class.{ns}]\nnamespace = \"{ns}\"\n{rule}\nttl = \"{ttl}s\"\ntier = \"{}\"\nfairness = \"{}\"\non_quorum_loss = \"{}\"\n",
            c.tier, c.fairness, c.on_quorum_loss
        ));
        if let Some(region) = c.home_region {
            text.push_str(&format!("home_region = \"{region}\"\n"));
        }
    }
    let prefixes: Vec<String> = classes.iter().map(|c| format!("\"{}/\"", c.namespace)).collect();
    let all = prefixes.join(", ");
    let grants = format!(
        "# Written by holdfast-fixtures (policy.rs).\n\n[grant.{name}]\nidentity = \"{identity_prefix}\"\nlock = [{all}]\ninspect = [{all}]\nforce_release = [{all}]\n\n{extra_grants}"
    );
    for (sub, body) in [("classes.d", text), ("grants.d", grants)] {
        std::fs::create_dir_all(dir.join(sub))?;
        let file = dir.join(sub).join(format!("{name}.toml"));
        std::fs::write(&file, body).with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}

/// Records a passing fixture pause-test result for every fenced class (see
/// the module documentation), on a one-year lease like the kit's, with the
/// credentials of `etcd` (the pause-test kit's role on a cluster with
/// authentication on).
pub async fn record_pause_tests(etcd: &EtcdConfig, classes: &[FixtureClass]) -> anyhow::Result<()> {
    let mut client = holdfast_store::Etcd::connect(etcd).await.context("connecting to etcd")?.client;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    let year = 365 * 24 * 3600;
    for c in classes.iter().filter(|c| c.fenced()) {
        let record = PauseTestRecord {
            class: c.namespace.clone(),
            resource: FIXTURE_RESOURCE.into(),
            schema_version: FIXTURE_SCHEMA_VERSION,
            time_unix_ms: now,
            expires_unix_ms: now + year * 1000,
            etcd_version: "fixture".into(),
            outcome: PauseTestOutcome::Pass,
            reason: "a lab fixture (holdfast-fixtures policy.rs), not a pause test".into(),
            fence_mode: "correct".into(),
        };
        let lease = client.lease_grant(year as i64, None).await?.id();
        let key = layout::pausetest_key(&c.namespace, FIXTURE_RESOURCE);
        client.put(key, layout::encode(&record), Some(etcd_client::PutOptions::new().with_lease(lease))).await?;
    }
    Ok(())
}

/// Writes `DIR/policy`, records the fixture pause tests (as `pausetest`)
/// and starts a real controller (the binary `bin`; see
/// `holdfast_devkit::controller::locate`) on it with `etcd`; returns once
/// the controller is READY, which it sends after its first round (the set
/// is published by then).
pub async fn publish(
    bin: PathBuf,
    dir: &Path,
    etcd: EtcdConfig,
    pausetest: &EtcdConfig,
    identity_prefix: &str,
    classes: &[FixtureClass],
    extra_grants: &str,
) -> anyhow::Result<(ControllerProcess, PathBuf)> {
    let policy = dir.join("policy");
    write_dir(&policy, identity_prefix, classes, extra_grants)?;
    record_pause_tests(pausetest, classes).await?;
    let mut config = ControllerConfig::new(etcd);
    config.policy_dir = policy.clone();
    config.metrics_listen = ([127, 0, 0, 1], holdfast_devkit::ports::free_port()).into();
    config.cluster_name = "lab".into();
    config.rescan_interval = Duration::from_millis(500);
    let launch = ControllerLaunch::new(bin, config, dir, "controller");
    let mut process = ControllerProcess::spawn(&launch)?;
    process.wait_ready(Duration::from_secs(60))?;
    Ok((process, policy))
}
