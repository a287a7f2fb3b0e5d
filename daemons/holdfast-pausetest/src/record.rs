//! Pause-test results in etcd: `/sys/pausetest/<class>/<resource>`, one JSON
//! [`PauseTestRecord`] on a one-year lease, and the `status` reader.

use crate::Target;
use holdfast_cli::exit;
use holdfast_fence::FenceMode;
use holdfast_model::layout::{self, PAUSETEST_VALIDITY, PauseTestOutcome, PauseTestRecord};
use holdfast_store::etcd::Etcd;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Where results are recorded: the coord cluster when one is named (the
/// controller reads them there), else the --etcd-endpoint cluster.
pub async fn connect(target: &Target) -> Result<Etcd, String> {
    let config = target.coord.config(&target.etcd).unwrap_or_else(|| target.etcd.config());
    Etcd::connect(&config).await.map_err(|e| format!("{e:#}"))
}

/// The version of the first etcd member that answers.
pub async fn etcd_version(etcd: &Etcd) -> Result<String, String> {
    let mut last = String::from("no etcd member configured");
    for s in etcd.member_status().await {
        match s {
            Ok(s) => return Ok(s.version),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Writes the result on a fresh one-year lease and revokes the lease of the
/// result it replaces. Returns the key.
pub async fn put(etcd: &Etcd, record: &PauseTestRecord) -> Result<String, String> {
    let key = layout::pausetest_key(&record.class, &record.resource);
    let mut client = etcd.client.clone();
    let lease =
        client.lease_grant(PAUSETEST_VALIDITY.as_secs() as i64, None).await.map_err(|e| format!("granting the result's lease: {e}"))?;
    let opts = etcd_client::PutOptions::new().with_lease(lease.id()).with_prev_key();
    let resp = client.put(key.as_str(), layout::encode(record), Some(opts)).await.map_err(|e| format!("writing {key}: {e}"))?;
    if let Some(prev) = resp.prev_key().filter(|p| p.lease() != 0 && p.lease() != lease.id()) {
        let _ = client.lease_revoke(prev.lease()).await;
    }
    Ok(key)
}

pub async fn get(etcd: &Etcd, class: &str, resource: &str) -> Result<Option<PauseTestRecord>, String> {
    let key = layout::pausetest_key(class, resource);
    let resp = etcd.client.clone().get(key.as_str(), None).await.map_err(|e| format!("reading {key}: {e}"))?;
    match resp.kvs().first() {
        None => Ok(None),
        Some(kv) => layout::decode(&key, kv.value()).map(Some),
    }
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: Target,
}

/// `status`: 0 if a passing, unexpired result for the resource's current
/// schema version is recorded; 1 otherwise (absent, expired, schema
/// changed, or failed).
pub async fn status(args: StatusArgs) -> u8 {
    let t = &args.target;
    if let Err(e) = layout::validate_class(&t.class) {
        eprintln!("holdfast-pausetest: --{e}");
        return exit::USAGE;
    }
    let fence = match t.resource.open(FenceMode::Correct).await {
        Ok(f) => f,
        Err(e @ holdfast_fence::FenceError::Config(_)) => {
            eprintln!("holdfast-pausetest: {e}");
            return exit::USAGE;
        }
        Err(e) => {
            eprintln!("holdfast-pausetest: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let current = match fence.schema_version().await {
        Ok(v) => v,
        Err(e) => {
            eprintln!("holdfast-pausetest: reading the resource's schema version: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let etcd = match connect(t).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfast-pausetest: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let resource = fence.describe();
    let record = match get(&etcd, &t.class, &resource).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfast-pausetest: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let absent = match &record {
        None => Some("no result is recorded".to_string()),
        Some(r) => r.invalid_because(now_unix_ms(), current),
    };
    let passing = absent.is_none() && record.as_ref().is_some_and(|r| r.outcome == PauseTestOutcome::Pass);
    if t.json {
        let v = serde_json::json!({
            "class": t.class,
            "resource": resource,
            "key": layout::pausetest_key(&t.class, &resource),
            "current_schema_version": current,
            "present": absent.is_none(),
            "absent_because": absent,
            "fenced": passing,
            "record": record,
        });
        println!("{v}");
    } else {
        println!("class      {}", t.class);
        println!("resource   {resource} (schema version {current})");
        match (&record, &absent) {
            (_, Some(why)) => println!("result     absent: {why}"),
            (Some(r), None) => {
                let when = |ms: u64| humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_millis(ms));
                let outcome = if r.outcome == PauseTestOutcome::Pass { "PASS" } else { "FAIL" };
                println!("result     {outcome} ({} fence)", r.fence_mode);
                println!("reason     {}", r.reason);
                println!("recorded   {} on etcd {}", when(r.time_unix_ms), r.etcd_version);
                println!("expires    {}", when(r.expires_unix_ms));
            }
            (None, None) => {}
        }
    }
    if passing { exit::OK } else { 1 }
}
