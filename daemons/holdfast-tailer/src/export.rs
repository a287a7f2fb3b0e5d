//! `holdfast-tailer export` (and `holdfastctl audit export`, which runs
//! it): the grant history of the embedded store as one Parquet file for the
//! one-year archive. It runs where the store is, so the columnar libraries
//! ship with the tailer and not with the operator CLI.
//!
//! One row per **ended** hold: the grant paired with the event that ended
//! it. Live holds are left out, and no row carries a grant's revision (with
//! the epoch it is the token); the end's revision identifies the row.
//!
//! | column | type |
//! |---|---|
//! | `cluster_id`, `namespace`, `key`, `identity`, `session`, `ended_by` | UTF-8 |
//! | `class`, `tier` | UTF-8, nullable (no class published then) |
//! | `epoch` | UInt32, nullable |
//! | `granted`, `ended` | timestamp (ms, UTC) |
//! | `held_ms` | UInt64, nullable |
//! | `end_revision` | Int64 |

use anyhow::Context;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use holdfast_audit::{Event, Kind};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One ended hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRow {
    pub cluster_id: String,
    pub namespace: String,
    pub key: String,
    pub class: Option<String>,
    pub tier: Option<String>,
    pub identity: String,
    pub session: String,
    pub epoch: Option<u32>,
    pub granted_unix_ms: u64,
    pub ended_by: Kind,
    pub ended_unix_ms: u64,
    pub held_ms: Option<u64>,
    pub end_revision: i64,
}

/// Pairs each grant with the event that ended it, in store order. Grants
/// granted before `since_ms` or at or after `until_ms` are left out.
pub fn ended_holds(events: &[Event], since_ms: Option<u64>, until_ms: Option<u64>) -> Vec<HoldRow> {
    let mut open: HashMap<&str, &Event> = HashMap::new();
    let mut rows = Vec::new();
    for e in events {
        if e.kind == Kind::Grant {
            open.insert(e.etcd_key.as_str(), e);
        } else if e.kind.ends_hold()
            && let Some(g) = open.remove(e.etcd_key.as_str())
        {
            if since_ms.is_some_and(|t| g.time_unix_ms < t) || until_ms.is_some_and(|t| g.time_unix_ms >= t) {
                continue;
            }
            rows.push(HoldRow {
                cluster_id: g.cluster_id.clone(),
                namespace: g.namespace.clone().unwrap_or_default(),
                key: g.key.clone().unwrap_or_default(),
                class: g.class.clone(),
                tier: g.tier.clone(),
                identity: g.identity.clone().unwrap_or_default(),
                session: g.session.clone().unwrap_or_default(),
                epoch: g.epoch,
                granted_unix_ms: g.time_unix_ms,
                ended_by: e.kind,
                ended_unix_ms: e.time_unix_ms,
                held_ms: e.held_ms,
                end_revision: e.position().0,
            });
        }
    }
    rows
}

fn schema() -> Arc<Schema> {
    let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
    let time = |name: &str| Field::new(name, DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())), false);
    Arc::new(Schema::new(vec![
        text("cluster_id", false),
        text("namespace", false),
        text("key", false),
        text("class", true),
        text("tier", true),
        text("identity", false),
        text("session", false),
        Field::new("epoch", DataType::UInt32, true),
        time("granted"),
        text("ended_by", false),
        time("ended"),
        Field::new("held_ms", DataType::UInt64, true),
        Field::new("end_revision", DataType::Int64, false),
    ]))
}

/// Writes `rows` to `out` as Parquet (Snappy), via a temporary file renamed
/// into place, so a failed export leaves no half-written file.
pub fn write(rows: &[HoldRow], out: &Path) -> anyhow::Result<()> {
    let text = |f: fn(&HoldRow) -> &str| -> ArrayRef { Arc::new(StringArray::from_iter_values(rows.iter().map(f))) };
    let opt = |f: fn(&HoldRow) -> Option<&str>| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<StringArray>()) };
    let ms = |f: fn(&HoldRow) -> u64| -> ArrayRef {
        Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| f(r).min(i64::MAX as u64) as i64)).with_timezone("UTC"))
    };
    let columns: Vec<ArrayRef> = vec![
        text(|r| &r.cluster_id),
        text(|r| &r.namespace),
        text(|r| &r.key),
        opt(|r| r.class.as_deref()),
        opt(|r| r.tier.as_deref()),
        text(|r| &r.identity),
        text(|r| &r.session),
        Arc::new(rows.iter().map(|r| r.epoch).collect::<UInt32Array>()),
        ms(|r| r.granted_unix_ms),
        text(|r| r.ended_by.as_str()),
        ms(|r| r.ended_unix_ms),
        Arc::new(rows.iter().map(|r| r.held_ms).collect::<UInt64Array>()),
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.end_revision))),
    ];
    let schema = schema();
    let batch = RecordBatch::try_new(schema.clone(), columns).context("building the export's columns")?;
    let tmp = out.with_extension("parquet.tmp");
    let file = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let props = parquet::file::properties::WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, Some(props)).context("starting the Parquet file")?;
    writer.write(&batch).context("writing the Parquet file")?;
    writer.close().context("finishing the Parquet file")?;
    std::fs::rename(&tmp, out).with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn ev(revision: i64, kind: Kind, key: &str, time: u64) -> Event {
        let mut e = Event::new(1, revision, 0, kind, &format!("/l/{key}"), time);
        e.key = Some(key.into());
        e.namespace = Some("ns".into());
        e.identity = Some("spiffe://t/a".into());
        e.session = Some("0000000000000007".into());
        e.epoch = Some(2);
        e
    }

    #[test]
    fn ended_holds_pair_and_round_trip_through_parquet_without_live_holds() {
        let mut end = ev(11, Kind::Expiry, "ns/a", 9_000);
        end.held_ms = Some(4_000);
        let events = vec![ev(10, Kind::Grant, "ns/a", 5_000), end, ev(12, Kind::Grant, "ns/b", 9_500), ev(13, Kind::Grant, "ns/a", 9_600)];
        let rows = ended_holds(&events, None, None);
        assert_eq!(rows.len(), 1, "live holds are left out: {rows:?}");
        assert_eq!((rows[0].ended_by, rows[0].granted_unix_ms, rows[0].end_revision), (Kind::Expiry, 5_000, 11));
        assert!(ended_holds(&events, Some(6_000), None).is_empty());
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("grants.parquet");
        write(&rows, &out).unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&out).unwrap()).unwrap().build().unwrap();
        let batches: Vec<RecordBatch> = reader.map(Result::unwrap).collect();
        assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
        let b = &batches[0];
        let col = |name: &str| b.column_by_name(name).unwrap().clone();
        let ended_by = col("ended_by");
        assert_eq!(ended_by.as_any().downcast_ref::<StringArray>().unwrap().value(0), "expiry");
        let held = col("held_ms");
        assert_eq!(held.as_any().downcast_ref::<UInt64Array>().unwrap().value(0), 4_000);
        assert!(b.schema().field_with_name("revision").is_err(), "no grant revision column");
        assert!(!dir.path().join("grants.parquet.tmp").exists());
    }
}
