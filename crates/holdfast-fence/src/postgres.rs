//! The PostgreSQL reference fence.
//!
//! The table [`PgFence::setup`] creates (name configurable):
//!
//! ```sql
//! CREATE TABLE holdfast_fence (
//!     id       text     PRIMARY KEY,
//!     value    bigint   NOT NULL DEFAULT 0,    -- the guarded data (here a counter)
//!     fence    bigint   NOT NULL DEFAULT 0,    -- the highest token this row accepted
//!     accepted bigint[] NOT NULL DEFAULT '{}'  -- every accepted token, in commit order (for the gate)
//! );
//! ```
//!
//! In your own table you need only the `fence` column, one per record you
//! guard (a fence per table lets a stale holder write any row that the new
//! holder has not touched yet). Tokens fit in `bigint`: their top bit is
//! always zero.
//!
//! The whole fence is [`PgFence::increment_correct`]; everything else in this
//! file is plumbing or a deliberately wrong variant.

use crate::{Fence, FenceError, FenceMode, SCHEMA_VERSION, Token, Written};
use std::sync::Arc;
use tokio_postgres::config::Host;
use tokio_postgres::{Client, NoTls};

/// A fenced table of counters in PostgreSQL. Cheap to clone; clones share one
/// connection, on which concurrent calls are pipelined.
#[derive(Clone)]
pub struct PgFence {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    table: String,
    describe: String,
    mode: FenceMode,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// Table names are interpolated into SQL, so only plain lower-case
/// identifiers are accepted.
fn validate_table(table: &str) -> Result<(), FenceError> {
    let ok = !table.is_empty()
        && table.len() <= 63
        && table.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && table.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(FenceError::Config(format!(
            "table name {table:?} is not a plain identifier; use 1..=63 of a-z, 0-9 and '_', not starting with a digit"
        )))
    }
}

/// `postgresql://host:port/db?table=t`: no user, no password.
fn describe(config: &tokio_postgres::Config, table: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config.get_dbname().or(config.get_user()).unwrap_or("postgres");
    format!("postgresql://{host}:{port}/{db}?table={table}")
}

impl PgFence {
    /// Connects (without TLS) and checks the table name. Does not create
    /// anything: call [`Fence::setup`].
    pub async fn connect(config: &tokio_postgres::Config, table: &str, mode: FenceMode) -> Result<Self, FenceError> {
        validate_table(table)?;
        let describe = describe(config, table);
        let (client, connection) = config.connect(NoTls).await.map_err(|e| FenceError::Resource {
            resource: describe.clone(),
            message: format!("cannot connect: {}", holdfast_model::error_chain(&e)),
        })?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(PgFence { inner: Arc::new(Inner { client, table: table.to_string(), describe, mode, connection }) })
    }

    fn err(&self, what: &str, e: tokio_postgres::Error) -> FenceError {
        FenceError::Resource { resource: self.inner.describe.clone(), message: format!("{what}: {}", holdfast_model::error_chain(&e)) }
    }

    /// Creates the row with counter 0 and fence 0 if it is missing, and
    /// never touches an existing row — so it decides nothing. Your own rows
    /// usually exist already.
    async fn ensure_row(&self, record: &str) -> Result<(), FenceError> {
        let sql = format!("INSERT INTO {} (id) VALUES ($1) ON CONFLICT (id) DO NOTHING", self.inner.table);
        self.inner.client.execute(&sql, &[&record]).await.map_err(|e| self.err("creating the record", e))?;
        Ok(())
    }

    /// **The reference fence.** Copy this.
    ///
    /// One `UPDATE` carries the guarded write *and* the comparison:
    ///
    /// - `WHERE id = $1 AND fence < $2` — PostgreSQL evaluates the condition
    ///   on the row version it is about to update, holding that row's lock;
    ///   a concurrent writer's `UPDATE` waits for the lock and then
    ///   re-evaluates the condition on the new version. No other write can
    ///   land between the check and the write, which is the whole point.
    /// - `<`, not `<=`: a token that this record has already accepted is
    ///   refused. Otherwise a holder whose lock expired could keep writing
    ///   with its old token after the lock passed on, until the new holder's
    ///   first write raised the fence.
    /// - `fence = $2` in the same `SET`: the next writer is compared with
    ///   this token.
    /// - `RETURNING`: no row means the condition failed, i.e. a token at
    ///   least as new already wrote this row: the write is stale.
    pub async fn increment_correct(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError> {
        let token = token_param(token);
        self.ensure_row(record).await?;
        between();
        let sql = format!(
            "UPDATE {} SET value = value + 1, fence = $2, accepted = array_append(accepted, $2) \
             WHERE id = $1 AND fence < $2 RETURNING value",
            self.inner.table
        );
        let row = self.inner.client.query_opt(&sql, &[&record, &token]).await.map_err(|e| self.err("writing", e))?;
        Ok(match row {
            Some(row) => Written::Accepted { value: counter(row.get(0)) },
            None => Written::Rejected,
        })
    }

    /// Deliberately wrong: the reference statement with `<=`.
    async fn increment_less_or_equal(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError> {
        let token = token_param(token);
        self.ensure_row(record).await?;
        between();
        let sql = format!(
            "UPDATE {} SET value = value + 1, fence = $2, accepted = array_append(accepted, $2) \
             WHERE id = $1 AND fence <= $2 RETURNING value",
            self.inner.table
        );
        let row = self.inner.client.query_opt(&sql, &[&record, &token]).await.map_err(|e| self.err("writing", e))?;
        Ok(match row {
            Some(row) => Written::Accepted { value: counter(row.get(0)) },
            None => Written::Rejected,
        })
    }

    /// Deliberately wrong: read, decide in the client, write unconditionally.
    /// With `check = false` there is no decision at all (unfenced).
    async fn increment_read_then_write(
        &self,
        record: &str,
        token: Token,
        check: bool,
        between: &mut (dyn FnMut() + Send),
    ) -> Result<Written, FenceError> {
        let token = token_param(token);
        self.ensure_row(record).await?;
        let sql = format!("SELECT value, fence FROM {} WHERE id = $1", self.inner.table);
        let row = self.inner.client.query_one(&sql, &[&record]).await.map_err(|e| self.err("reading", e))?;
        let (value, fence): (i64, i64) = (row.get(0), row.get(1));
        if check && fence >= token {
            return Ok(Written::Rejected);
        }
        between();
        let next = value + 1;
        let sql = format!("UPDATE {} SET value = $3, fence = $2, accepted = array_append(accepted, $2) WHERE id = $1", self.inner.table);
        self.inner.client.execute(&sql, &[&record, &token, &next]).await.map_err(|e| self.err("writing", e))?;
        Ok(Written::Accepted { value: counter(next) })
    }
}

/// Tokens have their top bit clear (epoch < 2^15), so they fit `bigint`.
fn token_param(token: Token) -> i64 {
    token.expose() as i64
}

fn counter(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[async_trait::async_trait]
impl Fence for PgFence {
    async fn setup(&self) -> Result<(), FenceError> {
        let t = &self.inner.table;
        // The advisory lock serialises concurrent setups: CREATE TABLE IF NOT
        // EXISTS alone can still fail on a race in the catalog.
        let sql = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('holdfast-fence-setup'));
             CREATE TABLE IF NOT EXISTS holdfast_fence_schema (
                 table_name text PRIMARY KEY,
                 version integer NOT NULL
             );
             CREATE TABLE IF NOT EXISTS {t} (
                 id text PRIMARY KEY,
                 value bigint NOT NULL DEFAULT 0,
                 fence bigint NOT NULL DEFAULT 0,
                 accepted bigint[] NOT NULL DEFAULT '{{}}'
             );
             INSERT INTO holdfast_fence_schema (table_name, version) VALUES ('{t}', {SCHEMA_VERSION})
                 ON CONFLICT (table_name) DO NOTHING;
             COMMIT;"
        );
        self.inner.client.batch_execute(&sql).await.map_err(|e| self.err("setting up", e))
    }

    async fn read(&self, record: &str) -> Result<u64, FenceError> {
        crate::validate_record(record)?;
        let sql = format!("SELECT value FROM {} WHERE id = $1", self.inner.table);
        let row = self.inner.client.query_opt(&sql, &[&record]).await.map_err(|e| self.err("reading", e))?;
        Ok(row.map(|r| counter(r.get(0))).unwrap_or(0))
    }

    async fn increment(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError> {
        crate::validate_record(record)?;
        match self.inner.mode {
            FenceMode::Correct => self.increment_correct(record, token, between).await,
            FenceMode::LessOrEqual => self.increment_less_or_equal(record, token, between).await,
            FenceMode::TwoStatements => self.increment_read_then_write(record, token, true, between).await,
            FenceMode::Unfenced => self.increment_read_then_write(record, token, false, between).await,
        }
    }

    async fn accepted_log(&self, record: &str) -> Result<Vec<u64>, FenceError> {
        crate::validate_record(record)?;
        let sql = format!("SELECT accepted FROM {} WHERE id = $1", self.inner.table);
        let row = self.inner.client.query_opt(&sql, &[&record]).await.map_err(|e| self.err("reading", e))?;
        let log: Vec<i64> = row.map(|r| r.get(0)).unwrap_or_default();
        Ok(log.into_iter().map(|t| t as u64).collect())
    }

    async fn schema_version(&self) -> Result<u32, FenceError> {
        let row =
            self.inner.client.query_opt("SELECT version FROM holdfast_fence_schema WHERE table_name = $1", &[&self.inner.table]).await;
        match row {
            Ok(Some(r)) => Ok(u32::try_from(r.get::<_, i32>(0)).unwrap_or(0)),
            Ok(None) => Err(FenceError::NotSetUp { resource: self.inner.describe.clone() }),
            // 42P01: the schema table does not exist.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
                Err(FenceError::NotSetUp { resource: self.inner.describe.clone() })
            }
            Err(e) => Err(self.err("reading the schema version", e)),
        }
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn kind(&self) -> &'static str {
        "postgresql"
    }

    fn mode(&self) -> FenceMode {
        self.inner.mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(validate_table("holdfast_fence").is_ok());
        assert!(validate_table("_t2").is_ok());
        for bad in ["", "2t", "T", "a-b", "a;drop table x", "a.b", &"x".repeat(64)] {
            assert!(validate_table(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn description_has_no_credentials() {
        let cfg: tokio_postgres::Config = "postgres://alice:secret@127.0.0.1:6543/ledger".parse().unwrap();
        let d = describe(&cfg, "t");
        assert_eq!(d, "postgresql://127.0.0.1:6543/ledger?table=t");
        assert!(!d.contains("secret") && !d.contains("alice"));
    }
}
