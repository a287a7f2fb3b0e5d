//! The sinks an operator turned on in `tailer.toml`, beside the embedded
//! store (which is always written first): `[clickhouse]`, then `[archive]`.

use anyhow::Context;
use holdfast_audit::sink::Sink;
use holdfast_audit_sinks::archive::Archive;
use holdfast_audit_sinks::clickhouse::ClickHouse;
use holdfast_config::TailerConfig;

/// Connects every configured sink, in order: ClickHouse, then the archive.
/// A sink that cannot be reached fails the round: the tailer retries from
/// its checkpoint rather than record a history with a hole in one
/// destination.
pub fn open(config: &TailerConfig) -> anyhow::Result<Vec<Box<dyn Sink>>> {
    let mut sinks: Vec<Box<dyn Sink>> = Vec::new();
    if let Some(c) = &config.clickhouse {
        let sink = tokio::task::block_in_place(|| ClickHouse::connect(c))
            .with_context(|| format!("connecting the [clickhouse] sink at {}", c.url.trim()))?;
        tracing::info!(url = %c.url.trim(), database = %c.database, table = %c.table, "sink: clickhouse");
        sinks.push(Box::new(sink));
    }
    if let Some(a) = &config.archive {
        let sink = tokio::task::block_in_place(|| Archive::connect(a))
            .with_context(|| format!("connecting the [archive] sink ({})", a.describe()))?;
        tracing::info!(archive = %a.describe(), object_lock = sink.object_lock(), retention = ?a.retention, "sink: archive");
        sinks.push(Box::new(sink));
    }
    Ok(sinks)
}
