//! Audit events into a ClickHouse table over its HTTP interface.
//!
//! # The table
//!
//! [`ClickHouse::connect`] creates the database and the table when they are
//! missing, then checks that an existing table has what the sink needs:
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS `holdfast`.`audit_events` (
//!     `cluster_id` String, `revision` Int64, `index` UInt32,
//!     `kind` String, `time_unix_ms` UInt64, `time_source` String,
//!     `identity` Nullable(String), …, `epoch` Nullable(UInt32),
//!     `etcd_key` String, `held_ms` Nullable(UInt64), …,
//!     `fenced` Nullable(UInt8), `gap_from` Nullable(Int64), `gap_to` Nullable(Int64)
//! ) ENGINE = ReplacingMergeTree ORDER BY (`cluster_id`, `revision`, `index`)
//! ```
//!
//! One column per [`Event`] field, named like the field (see [`COLUMNS`]);
//! an `Option` field is `Nullable`, `kind` and `time_source` are their
//! kebab-case names (`force-release`, `observed`), `fenced` is 0 or 1.
//!
//! # Idempotence
//!
//! The tailer sends a batch again after a crash, so the same
//! `(cluster_id, revision, index)` can arrive more than once (an observed
//! time may differ between the copies). `ReplacingMergeTree` keeps one row
//! per sorting key — the last inserted — but only when it merges parts, in
//! the background, at a time of its choosing. Until then both copies are on
//! disk: **queries must read with `FINAL`** (as [`ClickHouse::positions`],
//! [`ClickHouse::count`] and [`ClickHouse::events`] do), or group by the
//! key; `OPTIMIZE TABLE … FINAL` forces the merge. The table has no
//! `PARTITION BY`: rows are only ever replaced within a partition, and a
//! partition by time would keep two copies whose observed times fall in
//! different months forever.
//!
//! `revision` is the sorting key, so it cannot be `Nullable` (ClickHouse
//! refuses nullable sorting-key columns). A stored event always has one;
//! [`Sink::append`] refuses an event without a revision rather than
//! storing it at revision 0, where it would replace an unrelated event.
//!
//! # Durability
//!
//! Each [`Sink::append`] is one `INSERT … FORMAT JSONEachRow` request;
//! ClickHouse answers only after the rows are written as a part, so an
//! accepted batch survives a restart of ClickHouse. ClickHouse 18.16 does
//! not fsync parts (newer servers have the `fsync_after_insert` table
//! setting) and a single server is a single copy: for more, use a
//! `ReplicatedReplacingMergeTree` table with `insert_quorum`, created by
//! hand with the same columns and sorting key. The embedded store remains
//! the record; this table is the copy for queries.
//!
//! # ClickHouse 18.16 (Debian 12)
//!
//! The oldest server this is tested against. It has no `Bool` (so `fenced`
//! is `UInt8`), no `X-ClickHouse-Exception-Code` header (errors are read
//! from the body) and no nullable sorting keys. Every identifier is quoted
//! with backticks: 18.16 accepts a bare `index` column, newer servers can
//! read `index` in a column list as a skipping-index declaration. Inserts
//! keep `input_format_skip_unknown_fields` at its default (off), so a table
//! that lacks a column fails loudly instead of dropping that field;
//! `connect` reports the missing columns first. 64-bit integers are read
//! back with `output_format_json_quote_64bit_integers=0`.
//!
//! # The HTTP client
//!
//! [`ureq`]: synchronous, no runtime of its own, so it is safe on a tokio
//! worker inside `block_in_place` (the tailer's way of calling sinks).
//! `https://` URLs use rustls with ring, verified against the system's
//! trust store. Credentials go in `X-ClickHouse-User`/`X-ClickHouse-Key`,
//! never in the URL. An idle connection is kept for 2 s, below the
//! `keep_alive_timeout` of 3 s that ClickHouse ships with.

use holdfast_audit::Event;
use holdfast_audit::event::{Kind, TimeSource};
use holdfast_audit::sink::{Sink, SinkError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The `[clickhouse]` table of `tailer.toml` (defined in `holdfast-config`,
/// so the config can be checked without this crate).
pub use holdfast_config::ClickHouseConfig;

/// The sink's name in logs, metrics and errors.
pub const NAME: &str = "clickhouse";

/// The table's columns, in order, with their ClickHouse types: one per
/// [`Event`] field.
pub const COLUMNS: [(&str, &str); 22] = [
    ("cluster_id", "String"),
    ("revision", "Int64"),
    ("index", "UInt32"),
    ("kind", "String"),
    ("time_unix_ms", "UInt64"),
    ("time_source", "String"),
    ("identity", "Nullable(String)"),
    ("namespace", "Nullable(String)"),
    ("key", "Nullable(String)"),
    ("class", "Nullable(String)"),
    ("tier", "Nullable(String)"),
    ("session", "Nullable(String)"),
    ("epoch", "Nullable(UInt32)"),
    ("etcd_key", "String"),
    ("held_ms", "Nullable(UInt64)"),
    ("requester", "Nullable(String)"),
    ("approver", "Nullable(String)"),
    ("reason", "Nullable(String)"),
    ("fenced", "Nullable(UInt8)"),
    ("gap_from", "Nullable(Int64)"),
    ("gap_to", "Nullable(Int64)"),
    ("unprotected", "Nullable(UInt8)"),
];

/// Columns added after the first release: a table that lacks one gets it
/// (`ALTER TABLE … ADD COLUMN`, every existing row NULL) when the sink
/// connects, instead of being refused.
const ADDED_COLUMNS: [&str; 1] = ["unprotected"];

/// The sorting key, which is also the identity of an event.
const SORTING_KEY: [&str; 3] = ["cluster_id", "revision", "index"];

/// One row as ClickHouse's JSONEachRow reads it: every column present, in
/// [`COLUMNS`] order, `null` for an absent value.
#[derive(Serialize)]
struct Row<'a> {
    cluster_id: &'a str,
    revision: i64,
    index: u32,
    kind: &'static str,
    time_unix_ms: u64,
    time_source: &'static str,
    identity: Option<&'a str>,
    namespace: Option<&'a str>,
    key: Option<&'a str>,
    class: Option<&'a str>,
    tier: Option<&'a str>,
    session: Option<&'a str>,
    epoch: Option<u32>,
    etcd_key: &'a str,
    held_ms: Option<u64>,
    requester: Option<&'a str>,
    approver: Option<&'a str>,
    reason: Option<&'a str>,
    fenced: Option<u8>,
    gap_from: Option<i64>,
    gap_to: Option<i64>,
    unprotected: Option<u8>,
}

fn time_source_str(t: TimeSource) -> &'static str {
    match t {
        TimeSource::Record => "record",
        TimeSource::Observed => "observed",
    }
}

fn parse_time_source(s: &str) -> Option<TimeSource> {
    [TimeSource::Record, TimeSource::Observed].into_iter().find(|t| time_source_str(*t) == s)
}

impl<'a> Row<'a> {
    fn of(e: &'a Event) -> Result<Row<'a>, SinkError> {
        let Some(revision) = e.revision else {
            return Err(SinkError::new(
                NAME,
                format!(
                    "refusing event {} of cluster {} (etcd key {:?}): it has no revision, and stored events always carry one; \
                     storing it at revision 0 would replace another event. This is a bug in the caller: report it",
                    e.index, e.cluster_id, e.etcd_key
                ),
            ));
        };
        Ok(Row {
            cluster_id: &e.cluster_id,
            revision,
            index: e.index,
            kind: e.kind.as_str(),
            time_unix_ms: e.time_unix_ms,
            time_source: time_source_str(e.time_source),
            identity: e.identity.as_deref(),
            namespace: e.namespace.as_deref(),
            key: e.key.as_deref(),
            class: e.class.as_deref(),
            tier: e.tier.as_deref(),
            session: e.session.as_deref(),
            epoch: e.epoch,
            etcd_key: &e.etcd_key,
            held_ms: e.held_ms,
            requester: e.requester.as_deref(),
            approver: e.approver.as_deref(),
            reason: e.reason.as_deref(),
            fenced: e.fenced.map(u8::from),
            gap_from: e.gap_from,
            gap_to: e.gap_to,
            unprotected: e.unprotected.map(u8::from),
        })
    }
}

/// A row read back from the table.
#[derive(Deserialize)]
struct StoredRow {
    cluster_id: String,
    revision: i64,
    index: u32,
    kind: String,
    time_unix_ms: u64,
    time_source: String,
    identity: Option<String>,
    namespace: Option<String>,
    key: Option<String>,
    class: Option<String>,
    tier: Option<String>,
    session: Option<String>,
    epoch: Option<u32>,
    etcd_key: String,
    held_ms: Option<u64>,
    requester: Option<String>,
    approver: Option<String>,
    reason: Option<String>,
    fenced: Option<u8>,
    gap_from: Option<i64>,
    gap_to: Option<i64>,
    #[serde(default)]
    unprotected: Option<u8>,
}

impl StoredRow {
    fn into_event(self) -> Result<Event, String> {
        let kind = Kind::parse(&self.kind).ok_or_else(|| format!("unknown kind {:?}", self.kind))?;
        let time_source = parse_time_source(&self.time_source).ok_or_else(|| format!("unknown time_source {:?}", self.time_source))?;
        Ok(Event {
            cluster_id: self.cluster_id,
            revision: Some(self.revision),
            index: self.index,
            kind,
            time_unix_ms: self.time_unix_ms,
            time_source,
            identity: self.identity,
            namespace: self.namespace,
            key: self.key,
            class: self.class,
            tier: self.tier,
            session: self.session,
            epoch: self.epoch,
            etcd_key: self.etcd_key,
            held_ms: self.held_ms,
            requester: self.requester,
            approver: self.approver,
            reason: self.reason,
            fenced: self.fenced.map(|f| f != 0),
            gap_from: self.gap_from,
            gap_to: self.gap_to,
            unprotected: self.unprotected.map(|u| u != 0),
        })
    }
}

/// What an error body is cut to.
const MAX_ERROR_BODY: usize = 2000;

/// A connected ClickHouse sink; see the module docs.
pub struct ClickHouse {
    agent: ureq::Agent,
    /// The URL requests go to (the configured one, ending in `/`).
    endpoint: String,
    /// The configured URL, for messages.
    url: String,
    user: Option<String>,
    password: Option<String>,
    timeout: Duration,
    database: String,
    table: String,
}

impl fmt::Debug for ClickHouse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClickHouse").field("url", &self.url).field("table", &self.qualified()).finish_non_exhaustive()
    }
}

/// Whether a request's text goes in the body (DDL, SELECT) or in the URL
/// with the body carrying data (INSERT).
enum Request<'a> {
    Query(&'a str),
    Insert { query: &'a str, data: &'a [u8] },
}

impl ClickHouse {
    /// Checks the config, creates the database and the table when missing,
    /// and checks that the table has the columns and the engine the sink
    /// needs.
    pub fn connect(config: &ClickHouseConfig) -> Result<ClickHouse, SinkError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(SinkError::new(NAME, format!("invalid [clickhouse] config: {}", problems.join("; "))));
        }
        let password = config.password().map_err(|e| SinkError::new(NAME, e))?;
        let url = config.url.trim().to_string();
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            .max_redirects(0)
            // Below ClickHouse's shipped keep_alive_timeout (3 s), so a
            // request never goes out on a connection the server is closing.
            .max_idle_age(Duration::from_secs(2))
            .tls_config(tls)
            .user_agent(concat!("holdfast-audit-sinks/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        let sink = ClickHouse {
            agent,
            endpoint: format!("{}/", url.trim_end_matches('/')),
            url,
            user: config.user.clone(),
            password,
            timeout: config.timeout,
            database: config.database.clone(),
            table: config.table.clone(),
        };
        sink.setup()?;
        Ok(sink)
    }

    /// `` `database`.`table` ``
    fn qualified(&self) -> String {
        format!("`{}`.`{}`", self.database, self.table)
    }

    fn setup(&self) -> Result<(), SinkError> {
        let what = "connecting";
        self.call(Request::Query(&format!("CREATE DATABASE IF NOT EXISTS `{}`", self.database)), what)?;
        let columns: Vec<String> = COLUMNS.iter().map(|(name, ty)| format!("`{name}` {ty}")).collect();
        let key: Vec<String> = SORTING_KEY.iter().map(|c| format!("`{c}`")).collect();
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE = ReplacingMergeTree ORDER BY ({})",
            self.qualified(),
            columns.join(", "),
            key.join(", ")
        );
        self.call(Request::Query(&create), what)?;
        self.add_new_columns()?;
        self.check_table()?;
        // The reconciliation list: every record of a grant made without
        // etcd, and of its end, deduplicated.
        let view = format!(
            "CREATE VIEW IF NOT EXISTS {} AS SELECT * FROM {} FINAL WHERE `unprotected` = 1",
            self.unprotected_view(),
            self.qualified()
        );
        self.call(Request::Query(&view), "creating the view of unprotected grants")?;
        Ok(())
    }

    /// `` `database`.`<table>_unprotected` ``: the view of events with
    /// `unprotected = 1` (grants made without etcd, and their ends).
    pub fn unprotected_view(&self) -> String {
        format!("`{}`.`{}_unprotected`", self.database, self.table)
    }

    /// Adds each of [`ADDED_COLUMNS`] an existing table lacks.
    fn add_new_columns(&self) -> Result<(), SinkError> {
        #[derive(Deserialize)]
        struct Column {
            name: String,
        }
        let (db, t) = (&self.database, &self.table);
        let what = "adding new columns";
        let found: Vec<Column> =
            self.select(&format!("SELECT name FROM system.columns WHERE database = '{db}' AND table = '{t}' FORMAT JSONEachRow"), what)?;
        for (name, ty) in COLUMNS.iter().filter(|(n, _)| ADDED_COLUMNS.contains(n)) {
            if !found.iter().any(|c| c.name == *name) {
                self.call(Request::Query(&format!("ALTER TABLE {} ADD COLUMN `{name}` {ty}", self.qualified())), what)?;
            }
        }
        Ok(())
    }

    /// An existing table may predate this version or be made by hand:
    /// refuse one that would lose fields or keep duplicates.
    fn check_table(&self) -> Result<(), SinkError> {
        #[derive(Deserialize)]
        struct Column {
            name: String,
            #[serde(rename = "type")]
            ty: String,
        }
        #[derive(Deserialize)]
        struct Table {
            engine: String,
            sorting_key: String,
        }
        let what = "checking the table";
        let (db, t) = (&self.database, &self.table);
        let found: Vec<Column> = self
            .select(&format!("SELECT name, type FROM system.columns WHERE database = '{db}' AND table = '{t}' FORMAT JSONEachRow"), what)?;
        let mut problems = Vec::new();
        for (name, ty) in COLUMNS {
            match found.iter().find(|c| c.name == name) {
                None => problems.push(format!("column `{name}` is missing (ALTER TABLE {} ADD COLUMN `{name}` {ty})", self.qualified())),
                Some(c) if c.ty != ty => problems.push(format!("column `{name}` is {} where the sink writes {ty}", c.ty)),
                Some(_) => {}
            }
        }
        let tables: Vec<Table> = self.select(
            &format!("SELECT engine, sorting_key FROM system.tables WHERE database = '{db}' AND name = '{t}' FORMAT JSONEachRow"),
            what,
        )?;
        match tables.first() {
            None => problems.push("the table does not exist after CREATE TABLE IF NOT EXISTS".into()),
            Some(table) => {
                if !table.engine.ends_with("ReplacingMergeTree") {
                    problems.push(format!(
                        "its engine is {}, which keeps every copy of a replayed batch; it must be a ReplacingMergeTree",
                        table.engine
                    ));
                }
                let key: Vec<String> = table.sorting_key.split(',').map(|c| c.trim().trim_matches('`').to_string()).collect();
                if key != SORTING_KEY {
                    problems.push(format!(
                        "its sorting key is ({}); it must be (cluster_id, revision, index), the identity of an event",
                        table.sorting_key
                    ));
                }
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(SinkError::new(
            NAME,
            format!(
                "table {} at {} cannot hold audit events: {}. Fix the table, or point [clickhouse] table at a new one and the sink creates it",
                self.qualified(),
                self.url,
                problems.join("; ")
            ),
        ))
    }

    /// Every stored `(cluster_id, revision, index)` once, in order (read
    /// with `FINAL`).
    pub fn positions(&self) -> Result<Vec<(String, i64, u32)>, SinkError> {
        #[derive(Deserialize)]
        struct Position {
            cluster_id: String,
            revision: i64,
            index: u32,
        }
        let rows: Vec<Position> = self.select(
            &format!(
                "SELECT `cluster_id`, `revision`, `index` FROM {} FINAL ORDER BY `cluster_id`, `revision`, `index` FORMAT JSONEachRow",
                self.qualified()
            ),
            "reading positions",
        )?;
        Ok(rows.into_iter().map(|p| (p.cluster_id, p.revision, p.index)).collect())
    }

    /// How many distinct events are stored (read with `FINAL`).
    pub fn count(&self) -> Result<u64, SinkError> {
        let what = "counting events";
        let text = self.call(Request::Query(&format!("SELECT count() FROM {} FINAL", self.qualified())), what)?;
        text.trim()
            .parse()
            .map_err(|e| SinkError::new(NAME, format!("{what}: ClickHouse at {} answered {:?}, not a count ({e})", self.url, text.trim())))
    }

    /// The events of [`Self::unprotected_view`], in order: the
    /// reconciliation list of grants made without etcd.
    pub fn unprotected_events(&self) -> Result<Vec<Event>, SinkError> {
        self.events_from(&self.unprotected_view())
    }

    /// Every stored event once, in `(cluster_id, revision, index)` order
    /// (read with `FINAL`).
    pub fn events(&self) -> Result<Vec<Event>, SinkError> {
        self.events_from(&format!("{} FINAL", self.qualified()))
    }

    fn events_from(&self, from: &str) -> Result<Vec<Event>, SinkError> {
        let names: Vec<String> = COLUMNS.iter().map(|(name, _)| format!("`{name}`")).collect();
        let what = "reading events";
        let rows: Vec<StoredRow> = self.select(
            &format!("SELECT {} FROM {from} ORDER BY `cluster_id`, `revision`, `index` FORMAT JSONEachRow", names.join(", "),),
            what,
        )?;
        rows.into_iter()
            .map(|r| r.into_event().map_err(|e| SinkError::new(NAME, format!("{what} from {}: {e}", self.qualified()))))
            .collect()
    }

    /// Runs a `FORMAT JSONEachRow` query and parses each line.
    fn select<T: serde::de::DeserializeOwned>(&self, query: &str, what: &str) -> Result<Vec<T>, SinkError> {
        let text = self.call(Request::Query(query), what)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                serde_json::from_str(line).map_err(|e| {
                    SinkError::new(NAME, format!("{what}: cannot parse ClickHouse's answer from {} ({e}): {}", self.url, cut(line)))
                })
            })
            .collect()
    }

    /// One request; the answer's body when ClickHouse accepted it.
    fn call(&self, request: Request<'_>, what: &str) -> Result<String, SinkError> {
        let mut builder = self
            .agent
            .post(&self.endpoint)
            // An error after the first bytes of an answer would otherwise
            // come with status 200, inside the body.
            .query("wait_end_of_query", "1")
            .query("output_format_json_quote_64bit_integers", "0");
        if let Some(user) = &self.user {
            builder = builder.header("X-ClickHouse-User", user);
        }
        if let Some(password) = &self.password {
            builder = builder.header("X-ClickHouse-Key", password);
        }
        let sent = match request {
            Request::Query(query) => builder.send(query),
            Request::Insert { query, data } => builder.query("query", query).send(data),
        };
        let mut response = sent.map_err(|e| SinkError::new(NAME, format!("{what}: {}", self.transport_error(&e))))?;
        let status = response.status();
        let body = response.body_mut().with_config().limit(u64::MAX).lossy_utf8(true).read_to_string();
        if status.is_success() {
            return body.map_err(|e| SinkError::new(NAME, format!("{what}: reading ClickHouse's answer from {}: {e}", self.url)));
        }
        let message = body.as_deref().map(clean_error).unwrap_or_default();
        let hint = match status.as_u16() {
            401 | 403 | 516 => " Check [clickhouse] user and password_file, and that the user may connect from this host.",
            404 if message.contains("doesn't exist") || message.contains("does not exist") => {
                " The database or table is gone (dropped after the sink connected?): restart the tailer to create it again, \
                 or correct [clickhouse] database and table."
            }
            _ => "",
        };
        Err(SinkError::new(NAME, format!("{what}: ClickHouse at {} answered {status}: {message}.{hint}", self.url)))
    }

    fn transport_error(&self, e: &ureq::Error) -> String {
        match e {
            ureq::Error::Timeout(_) => format!(
                "no answer from ClickHouse at {} within {:?}: check that it is up and not overloaded, or raise [clickhouse] timeout",
                self.url, self.timeout
            ),
            ureq::Error::Io(_) | ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => format!(
                "cannot reach ClickHouse at {} ({e}): check that it is running and that [clickhouse] url names its HTTP interface",
                self.url
            ),
            _ => format!("request to ClickHouse at {} failed: {e}", self.url),
        }
    }
}

/// ClickHouse's error text without 18.16's C++ decoration
/// (`, e.displayText() = DB::Exception:`, `, e.what() = DB::Exception`) or a
/// final full stop, cut to a readable length.
fn clean_error(body: &str) -> String {
    let body = body.trim();
    let body = body.strip_suffix(", e.what() = DB::Exception").unwrap_or(body).trim();
    let body = body.replacen(", e.displayText() = DB::Exception:", ":", 1);
    cut(body.trim_end_matches('.'))
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_ERROR_BODY) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

impl Sink for ClickHouse {
    fn name(&self) -> &'static str {
        NAME
    }

    /// One `INSERT` for the whole batch; nothing is sent if any event lacks
    /// a revision.
    fn append(&mut self, events: &[Event]) -> Result<(), SinkError> {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Ok(());
        };
        let mut data = Vec::with_capacity(events.len() * 256);
        for e in events {
            serde_json::to_writer(&mut data, &Row::of(e)?)
                .map_err(|err| SinkError::new(NAME, format!("encoding event {:?} as JSON: {err}", e.position())))?;
            data.push(b'\n');
        }
        let what = format!(
            "inserting {} events (revisions {}..={}) into {}",
            events.len(),
            first.position().0,
            last.position().0,
            self.qualified()
        );
        let query = format!("INSERT INTO {} FORMAT JSONEachRow", self.qualified());
        self.call(Request::Insert { query: &query, data: &data }, &what)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_has_every_column() {
        let mut e = Event::new(7, 42, 3, Kind::ForceRelease, "/l/ns/k", 1000);
        e.fenced = Some(true);
        let json = serde_json::to_value(Row::of(&e).unwrap()).unwrap();
        let serde_json::Value::Object(map) = &json else { panic!("{json}") };
        let keys: Vec<&str> = map.keys().map(String::as_str).collect();
        let mut columns: Vec<&str> = COLUMNS.iter().map(|(n, _)| *n).collect();
        columns.sort_unstable();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, columns);
        assert_eq!(json["kind"], "force-release");
        assert_eq!(json["time_source"], "observed");
        assert_eq!(json["fenced"], 1);
        assert_eq!(json["held_ms"], serde_json::Value::Null);
    }

    #[test]
    fn an_event_without_a_revision_is_refused() {
        let mut e = Event::new(7, 42, 3, Kind::Grant, "/l/ns/k", 1000);
        e.revision = None;
        let err = Row::of(&e).err().unwrap();
        assert_eq!(err.sink, NAME);
        assert!(err.message.contains("no revision"), "{err}");
    }

    #[test]
    fn error_bodies_lose_the_exception_suffix() {
        assert_eq!(
            clean_error("Code: 60, e.displayText() = DB::Exception: Table x.y doesn't exist., e.what() = DB::Exception\n"),
            "Code: 60: Table x.y doesn't exist"
        );
        assert_eq!(
            clean_error("Code: 60. DB::Exception: Table x.y does not exist. (UNKNOWN_TABLE)"),
            "Code: 60. DB::Exception: Table x.y does not exist. (UNKNOWN_TABLE)"
        );
        assert_eq!(cut(&"é".repeat(MAX_ERROR_BODY + 5)).chars().count(), MAX_ERROR_BODY + 1);
    }
}
