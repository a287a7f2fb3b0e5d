//! The S3-compatible reference fence: a conditional `PUT` with `If-Match`.
//!
//! Each record is one JSON object, `<prefix>/records/<record>.json`:
//!
//! ```json
//! {"value": 41, "fence": 281474976711680, "accepted": [ … ]}
//! ```
//!
//! `fence` is the highest token the object accepted; `accepted` lists every
//! accepted token in the order the store applied them (for the gate). Object
//! stores have no "compare a field and write" statement, so the fence is
//! compare-and-swap on the object's version: read the object and its ETag,
//! compare the fence in the body, write with `If-Match: <ETag>`. The store
//! applies the `PUT` only if the object is still exactly the version whose
//! fence was compared — the same guarantee PostgreSQL's row lock gives the
//! one-statement `UPDATE`.
//!
//! The store must honour `If-Match` on `PutObject` (Amazon S3 since
//! November 2024; versitygw, which the tests run, does it under a per-key
//! lock). A store that ignores the header accepts stale writes: run the
//! pause-test kit against yours. ETags here are content hashes, so every
//! write must change the body — it does, because the fence changes.
//!
//! The whole fence is [`S3Fence::increment_correct`].

use crate::{Fence, FenceError, FenceMode, SCHEMA_VERSION, Token, Written};
use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig, UpdateVersion};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How often a conditional write is retried after the object changed under
/// it before [`FenceError::Contended`].
pub const MAX_ATTEMPTS: u32 = 64;

/// Where the bucket is and how to sign requests.
#[derive(Clone)]
pub struct S3Config {
    /// `http(s)://host:port` of an S3-compatible store; `None` for AWS.
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    /// Key prefix under which the fence keeps its objects ("" for none).
    pub prefix: String,
    pub access_key_id: String,
    /// Never printed: `Debug` redacts it.
    pub secret_access_key: String,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

impl S3Config {
    /// `s3://bucket/prefix?endpoint=…`: no credentials.
    pub fn describe(&self) -> String {
        let mut d = format!("s3://{}/{}", self.bucket, self.prefix);
        if let Some(e) = &self.endpoint {
            d.push_str(&format!("?endpoint={e}"));
        }
        d
    }
}

/// The object body of one record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordObject {
    value: u64,
    fence: u64,
    accepted: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SchemaObject {
    schema_version: u32,
}

/// A fenced set of counters in an S3 bucket. Cheap to clone.
#[derive(Clone)]
pub struct S3Fence {
    inner: Arc<Inner>,
}

struct Inner {
    store: AmazonS3,
    prefix: String,
    describe: String,
    mode: FenceMode,
}

impl S3Fence {
    /// Builds the client; sends nothing. Requests are never retried by the
    /// client: a retried conditional `PUT` whose first attempt landed would
    /// come back 412 and turn an accepted write into a reported rejection.
    pub fn connect(config: &S3Config, mode: FenceMode) -> Result<Self, FenceError> {
        // reqwest's rustls uses the process-wide provider: the workspace's ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let bad = |m: String| FenceError::Config(format!("S3 resource {}: {m}", config.describe()));
        if config.bucket.is_empty() {
            return Err(bad("the bucket name is empty".into()));
        }
        if config.prefix.starts_with('/') || config.prefix.ends_with('/') || config.prefix.contains("//") {
            return Err(bad("the prefix may not start or end with '/' or contain \"//\"".into()));
        }
        if config.access_key_id.is_empty() || config.secret_access_key.is_empty() {
            return Err(bad("credentials are missing (access key id and secret access key)".into()));
        }
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            // Send If-Match / If-None-Match on conditional puts.
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(RetryConfig { max_retries: 0, retry_timeout: Duration::from_secs(30), ..Default::default() });
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
        }
        let store = builder.build().map_err(|e| bad(holdfast_model::error_chain(&e)))?;
        Ok(S3Fence { inner: Arc::new(Inner { store, prefix: config.prefix.clone(), describe: config.describe(), mode }) })
    }

    fn path(&self, name: &str) -> Path {
        if self.inner.prefix.is_empty() { Path::from(name) } else { Path::from(format!("{}/{name}", self.inner.prefix)) }
    }

    fn record_path(&self, record: &str) -> Path {
        self.path(&format!("records/{record}.json"))
    }

    fn err(&self, what: &str, e: object_store::Error) -> FenceError {
        FenceError::Resource { resource: self.inner.describe.clone(), message: format!("{what}: {}", holdfast_model::error_chain(&e)) }
    }

    /// The record and the version (ETag) it was read at; `None` if absent.
    async fn get(&self, record: &str) -> Result<(RecordObject, Option<UpdateVersion>), FenceError> {
        match self.inner.store.get_opts(&self.record_path(record), GetOptions::default()).await {
            Ok(got) => {
                let version = UpdateVersion { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
                if version.e_tag.is_none() {
                    return Err(FenceError::Resource {
                        resource: self.inner.describe.clone(),
                        message: "the store returned no ETag; it cannot fence with If-Match".into(),
                    });
                }
                let bytes = got.bytes().await.map_err(|e| self.err("reading", e))?;
                let object = serde_json::from_slice(&bytes).map_err(|e| FenceError::Malformed {
                    resource: self.inner.describe.clone(),
                    record: record.to_string(),
                    message: e.to_string(),
                })?;
                Ok((object, Some(version)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok((RecordObject::default(), None)),
            Err(e) => Err(self.err("reading", e)),
        }
    }

    /// Writes `next`: with `If-Match` on `version` (`If-None-Match: *` if the
    /// object did not exist) when `conditional`, else unconditionally.
    /// `Ok(false)`: the object changed since it was read; nothing was written.
    async fn put(&self, record: &str, next: &RecordObject, version: Option<UpdateVersion>, conditional: bool) -> Result<bool, FenceError> {
        let body = serde_json::to_vec(next).map_err(|e| FenceError::Config(e.to_string()))?;
        let mode = match (conditional, version) {
            (false, _) => PutMode::Overwrite,
            (true, Some(v)) => PutMode::Update(v),
            (true, None) => PutMode::Create,
        };
        let opts = PutOptions { mode, ..Default::default() };
        match self.inner.store.put_opts(&self.record_path(record), PutPayload::from(body), opts).await {
            Ok(_) => Ok(true),
            // 412 (If-Match or If-None-Match failed) or 409 (a concurrent
            // conditional write): the object is no longer the version read.
            Err(object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(self.err("writing", e)),
        }
    }

    /// **The reference fence.** Copy this.
    ///
    /// 1. `GET` the object: its fence and its ETag (the version).
    /// 2. If the stored fence is `>=` our token, a token at least as new has
    ///    written: **rejected**. (`<` only, as in SQL: a token the object has
    ///    already accepted is refused, so an expired holder cannot keep
    ///    writing until its successor's first write.)
    /// 3. `PUT` the new body, which carries `fence = token`, with
    ///    `If-Match: <ETag from 1>` (`If-None-Match: *` if there was no
    ///    object). The store applies it only if nothing was written since 1,
    ///    so the fence compared in 2 is the fence being replaced.
    /// 4. 412 (or 409): somebody wrote between 1 and 3 and our `PUT` did not
    ///    apply. That is not yet a rejection — the other writer may hold an
    ///    older token — so go back to 1 and decide again on the new version.
    ///    If the new fence is `>=` our token we are stale and step 2 rejects.
    ///
    /// Every accepted write therefore replaced exactly the version whose
    /// fence was lower than its token. `between` runs once, before the first
    /// conditional `PUT`.
    pub async fn increment_correct(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError> {
        let token = token.expose();
        let mut between = Some(between);
        for _ in 0..MAX_ATTEMPTS {
            let (current, version) = self.get(record).await?;
            if current.fence >= token {
                return Ok(Written::Rejected);
            }
            if let Some(f) = between.take() {
                f();
            }
            let next = successor(current, token);
            if self.put(record, &next, version, true).await? {
                return Ok(Written::Accepted { value: next.value });
            }
        }
        Err(FenceError::Contended { resource: self.inner.describe.clone(), record: record.to_string(), attempts: MAX_ATTEMPTS })
    }

    /// Deliberately wrong variants. `LessOrEqual` keeps the conditional
    /// `PUT` but compares with `<=`; `TwoStatements` compares and then writes
    /// without `If-Match`; `Unfenced` neither compares nor conditions.
    async fn increment_wrong(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError> {
        let token = token.expose();
        let mode = self.inner.mode;
        let conditional = mode == FenceMode::LessOrEqual;
        let mut between = Some(between);
        for _ in 0..MAX_ATTEMPTS {
            let (current, version) = self.get(record).await?;
            let stale = match mode {
                FenceMode::LessOrEqual => current.fence > token,
                FenceMode::TwoStatements => current.fence >= token,
                _ => false,
            };
            if stale {
                return Ok(Written::Rejected);
            }
            if let Some(f) = between.take() {
                f();
            }
            let next = successor(current, token);
            if self.put(record, &next, version, conditional).await? {
                return Ok(Written::Accepted { value: next.value });
            }
        }
        Err(FenceError::Contended { resource: self.inner.describe.clone(), record: record.to_string(), attempts: MAX_ATTEMPTS })
    }
}

/// The body after one accepted increment.
fn successor(mut current: RecordObject, token: u64) -> RecordObject {
    current.value += 1;
    current.fence = token;
    current.accepted.push(token);
    current
}

#[async_trait::async_trait]
impl Fence for S3Fence {
    async fn setup(&self) -> Result<(), FenceError> {
        let body = serde_json::to_vec(&SchemaObject { schema_version: SCHEMA_VERSION }).map_err(|e| FenceError::Config(e.to_string()))?;
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.inner.store.put_opts(&self.path("holdfast-fence-schema.json"), PutPayload::from(body), opts).await {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Err(FenceError::Resource {
                resource: self.inner.describe.clone(),
                message: "the bucket does not exist; create it first".into(),
            }),
            Err(e) => Err(self.err("setting up", e)),
        }
    }

    async fn read(&self, record: &str) -> Result<u64, FenceError> {
        crate::validate_record(record)?;
        Ok(self.get(record).await?.0.value)
    }

    async fn increment(&self, record: &str, token: Token, between: &mut (dyn FnMut() + Send)) -> Result<Written, FenceError> {
        crate::validate_record(record)?;
        match self.inner.mode {
            FenceMode::Correct => self.increment_correct(record, token, between).await,
            _ => self.increment_wrong(record, token, between).await,
        }
    }

    async fn accepted_log(&self, record: &str) -> Result<Vec<u64>, FenceError> {
        crate::validate_record(record)?;
        Ok(self.get(record).await?.0.accepted)
    }

    async fn schema_version(&self) -> Result<u32, FenceError> {
        let path = self.path("holdfast-fence-schema.json");
        let got = match self.inner.store.get_opts(&path, GetOptions::default()).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Err(FenceError::NotSetUp { resource: self.inner.describe.clone() }),
            Err(e) => return Err(self.err("reading the schema version", e)),
        };
        let bytes = got.bytes().await.map_err(|e| self.err("reading the schema version", e))?;
        let schema: SchemaObject = serde_json::from_slice(&bytes).map_err(|e| FenceError::Malformed {
            resource: self.inner.describe.clone(),
            record: "holdfast-fence-schema.json".into(),
            message: e.to_string(),
        })?;
        Ok(schema.schema_version)
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn kind(&self) -> &'static str {
        "s3"
    }

    fn mode(&self) -> FenceMode {
        self.inner.mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> S3Config {
        S3Config {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: "us-east-1".into(),
            bucket: "b".into(),
            prefix: "p/q".into(),
            access_key_id: "AK".into(),
            secret_access_key: "very-secret".into(),
        }
    }

    #[test]
    fn secrets_stay_out_of_descriptions_and_debug() {
        let c = config();
        assert_eq!(c.describe(), "s3://b/p/q?endpoint=http://127.0.0.1:9");
        assert!(!format!("{c:?}").contains("very-secret"));
    }

    #[test]
    fn bad_prefixes_and_missing_credentials_are_refused() {
        for prefix in ["/p", "p/", "a//b"] {
            let e = S3Fence::connect(&S3Config { prefix: prefix.into(), ..config() }, FenceMode::Correct).err().unwrap();
            assert!(e.to_string().contains("prefix"), "{e}");
        }
        let e = S3Fence::connect(&S3Config { secret_access_key: String::new(), ..config() }, FenceMode::Correct).err().unwrap();
        assert!(e.to_string().contains("credentials"), "{e}");
        assert!(S3Fence::connect(&config(), FenceMode::Correct).is_ok());
    }
}
