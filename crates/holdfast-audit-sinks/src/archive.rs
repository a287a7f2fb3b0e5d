//! Force-release records into an S3-compatible bucket, each kept under
//! object lock in compliance mode for seven years.
//!
//! A two-person force-release writes `/sys/force/<nonce>` on a 24 h lease;
//! this archive is where the record outlives the lease.
//!
//! # What is stored
//!
//! One JSON object per record, never rewritten:
//!
//! - [`Sink::append`] archives every [`Kind::ForceRelease`] event (the hold
//!   that was deleted, requester, approver, reason, fenced) as the
//!   [`Event`]'s JSON, at
//!   `<prefix>force-release/<cluster_id>/<revision, 20 digits>-<index>.json`.
//! - [`Archive::archive_record`] archives the raw [`ForceRecord`] the tailer
//!   read from the put of `/sys/force/<nonce>` (an event of kind `Record`
//!   does not carry the value, so the tailer hands it over), as an
//!   [`ArchivedRecord`] at
//!   `<prefix>force-record/<cluster_id>/<revision, 20 digits>-<nonce>.json`.
//!
//! Keys sort by revision; [`Archive::event_key`] and [`Archive::record_key`]
//! name them, [`Archive::list`] and [`Archive::get`] read them back.
//!
//! # Object lock
//!
//! [`Archive::connect`] checks that the bucket exists and reads its object
//! lock configuration (`GetObjectLockConfiguration`). On a bucket with
//! object lock, every `PutObject` carries `x-amz-object-lock-mode:
//! COMPLIANCE` and `x-amz-object-lock-retain-until-date` = now +
//! [`ArchiveConfig::retention`] (default 2557 days, seven years): until
//! then no user, root included, can delete the version or shorten its
//! retention. The first object each `Archive` writes is read back with
//! `GetObjectRetention`; a store that took the headers but keeps no
//! retention is reported like a bucket without lock.
//!
//! A bucket without object lock (or a store without it) still receives the
//! records, without retention: `connect` logs one warning and
//! [`Archive::object_lock`] answers `false`, so nothing claims a retention
//! that is not there. [`ArchiveConfig::require_object_lock`] makes it a
//! refusal to start instead. Object lock can only be turned on when a bucket
//! is created (`aws s3api create-bucket --object-lock-enabled-for-bucket`,
//! which also enables versioning) or, on a versioned bucket, with
//! `PutObjectLockConfiguration`.
//!
//! # Idempotence
//!
//! The tailer replays a batch after a crash. Under object lock a second
//! `PUT` of the same key is harmful either way: a versioned bucket keeps it
//! as a second version (also locked for seven years), an unversioned locked
//! object refuses it. So each object is written once: `HEAD` first and skip
//! it if present, otherwise `PUT` with `If-None-Match: *`, so a concurrent
//! or lost-and-retried write between the two answers 412 (also "present")
//! instead of adding a version. The copy that stays is the first one; a
//! replayed event whose observed time differs does not replace it.
//!
//! # Durability
//!
//! S3 answers a `PutObject` only once the object is stored; `append`
//! returns after every object of the batch was accepted (or found), and
//! stops at the first failure, which the tailer retries. Each `PUT` also
//! carries `x-amz-checksum-sha256`, so the store refuses a body damaged in
//! transit (and AWS requires a checksum on puts with a retention).
//!
//! # Credentials
//!
//! Static keys, read once by `connect`: from
//! [`ArchiveConfig::access_key_id_file`] and
//! [`ArchiveConfig::secret_access_key_file`] when set (one line each; the
//! secret's file must not be world-readable; systemd's `LoadCredential=`
//! puts them under `/run/credentials/<unit>/`), otherwise from the
//! environment variables `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`
//! (`EnvironmentFile=`). Never inline in `tailer.toml`. Temporary
//! credentials (`AWS_SESSION_TOKEN`) are not supported: they would expire
//! under a long-running tailer.
//!
//! # The client
//!
//! [`ureq`], synchronous with no runtime of its own, so it is safe on a
//! tokio worker inside `block_in_place` (how the tailer calls sinks), as in
//! the ClickHouse sink. Requests are signed with SigV4 by `object_store`'s
//! [`AwsAuthorizer`] (the Apache Arrow S3 client already in the tree for the
//! S3 fence), which signs every header — the object-lock ones included —
//! and the payload's SHA-256. `object_store`'s own `put_opts` cannot set
//! object-lock headers, and its client is async. Addressing is path-style
//! (`<endpoint>/<bucket>/<key>`), which versitygw, MinIO and AWS accept.
//! The few XML answers read here (`ListObjectsV2`, the lock configuration,
//! a retention, errors) are flat documents read by element name.

use holdfast_audit::Event;
use holdfast_audit::event::Kind;
use holdfast_audit::sink::{Sink, SinkError};
use holdfast_model::layout::{self, ForceRecord};
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::HttpRequestBody;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use ureq::http::{self, HeaderMap, Method, StatusCode};

/// The sink's name in logs, metrics and errors.
pub const NAME: &str = "archive";

/// The `[archive]` table of `tailer.toml` and its default retention
/// (defined in `holdfast-config`, so the config can be checked without this
/// crate).
pub use holdfast_config::sinks::{ArchiveConfig, DEFAULT_RETENTION};

/// The object-lock mode every object is written with.
pub const LOCK_MODE: &str = "COMPLIANCE";

/// Where the access key id comes from when `access_key_id_file` is unset.
pub const ENV_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
/// Where the secret comes from when `secret_access_key_file` is unset.
pub const ENV_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";

/// The largest object [`Archive::get`] reads.
const MAX_OBJECT: u64 = 64 << 20;
/// What an error body is cut to.
const MAX_ERROR_BODY: usize = 1000;
/// How often a put that met a concurrent one (409) looks again.
const CONFLICT_ATTEMPTS: u32 = 5;

/// The signing credentials, from the key files or the environment.
fn credential(config: &ArchiveConfig) -> Result<AwsCredential, String> {
    let key_id = read_key(config.access_key_id_file.as_deref(), ENV_ACCESS_KEY_ID, "access_key_id", false)?;
    let secret_key = read_key(config.secret_access_key_file.as_deref(), ENV_SECRET_ACCESS_KEY, "secret_access_key", true)?;
    Ok(AwsCredential { key_id, secret_key, token: None })
}

/// One key: the first line of `file`, else the environment variable `env`.
fn read_key(file: Option<&Path>, env: &str, key: &str, secret: bool) -> Result<String, String> {
    let value = match file {
        Some(path) => {
            if secret && let Some(problem) = holdfast_config::sinks::secret_file_problem(path) {
                return Err(format!("archive.{key}_file = {:?}: {problem}", path.display().to_string()));
            }
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("archive.{key}_file = {:?}: cannot read it: {e}", path.display().to_string()))?;
            text.lines().next().unwrap_or_default().trim().to_string()
        }
        None => std::env::var(env).unwrap_or_default().trim().to_string(),
    };
    if value.is_empty() {
        return Err(match file {
            Some(path) => format!("archive.{key}_file = {:?} is empty: put the key on its first line", path.display().to_string()),
            None => format!(
                "no credentials: archive.{key}_file is unset and {env} is not in the environment; set one \
                 (systemd: LoadCredential= with archive.{key}_file under /run/credentials/, or EnvironmentFile=)"
            ),
        });
    }
    Ok(value)
}

/// The body of a `force-record/` object: the raw record and where it was
/// read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchivedRecord {
    /// The etcd cluster ID, 16 hex digits.
    pub cluster_id: String,
    /// The revision of the put of `etcd_key`.
    pub revision: i64,
    /// `/sys/force/<nonce>`.
    pub etcd_key: String,
    pub record: ForceRecord,
}

/// An object's retention, as the store reports it (`GetObjectRetention`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// `COMPLIANCE` or `GOVERNANCE`.
    pub mode: String,
    pub retain_until: SystemTime,
}

/// A connected archive; see the module docs.
pub struct Archive {
    agent: ureq::Agent,
    /// `scheme://host[:port]`, without a trailing `/`.
    endpoint: String,
    bucket: String,
    region: String,
    prefix: String,
    retention: Duration,
    timeout: Duration,
    credential: AwsCredential,
    /// Objects are written with a retention, and the store keeps it.
    object_lock: bool,
    /// The first object written under lock was read back with its retention.
    retention_checked: bool,
}

impl fmt::Debug for Archive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Archive")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("object_lock", &self.object_lock)
            .finish_non_exhaustive()
    }
}

/// A store's answer.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    /// The `<Code>` of an S3 error body, or "".
    fn code(&self) -> String {
        xml_text(&String::from_utf8_lossy(&self.body), "Code").unwrap_or_default()
    }
}

impl Archive {
    /// Checks the config, reads the credentials, checks that the bucket
    /// exists and reads whether it has object lock.
    pub fn connect(config: &ArchiveConfig) -> Result<Archive, SinkError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(SinkError::new(NAME, format!("invalid [archive] config: {}", problems.join("; "))));
        }
        let credential = credential(config).map_err(|e| SinkError::new(NAME, e))?;
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(config.timeout))
            .max_redirects(0)
            .tls_config(tls)
            .user_agent(concat!("holdfast-audit-sinks/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        let mut archive = Archive {
            agent,
            endpoint: config.endpoint.trim().trim_end_matches('/').to_string(),
            bucket: config.bucket.clone(),
            region: config.region.clone(),
            prefix: config.prefix.clone(),
            retention: config.retention,
            timeout: config.timeout,
            credential,
            object_lock: false,
            retention_checked: false,
        };
        archive.check_bucket()?;
        archive.object_lock = archive.read_object_lock()?;
        if !archive.object_lock {
            if config.require_object_lock {
                return Err(archive.error(
                    "connecting",
                    format!(
                        "bucket {} has no object lock and archive.require_object_lock is set: archive to a bucket created \
                         with object lock (`aws s3api create-bucket --bucket … --object-lock-enabled-for-bucket`), or unset \
                         require_object_lock to archive without retention",
                        archive.bucket
                    ),
                ));
            }
            tracing::warn!(
                bucket = %archive.bucket,
                endpoint = %archive.endpoint,
                "the archive bucket has no object lock: force-release records are stored WITHOUT retention and can be \
                 deleted; create the bucket with object lock enabled (or set archive.require_object_lock to refuse this)"
            );
        }
        Ok(archive)
    }

    /// Whether objects are written with a compliance-mode retention the
    /// store keeps. `false` on a bucket without object lock.
    pub fn object_lock(&self) -> bool {
        self.object_lock
    }

    /// The retention each object gets from when it is written.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Archives the raw force record read at `revision` from
    /// `/sys/force/<nonce>`, once (see the module docs).
    pub fn archive_record(&mut self, cluster_id: &str, revision: i64, nonce: &str, record: &ForceRecord) -> Result<(), SinkError> {
        let key = self.record_key(cluster_id, revision, nonce)?;
        let archived =
            ArchivedRecord { cluster_id: cluster_id.to_string(), revision, etcd_key: layout::force_key(nonce), record: record.clone() };
        let mut body =
            serde_json::to_vec(&archived).map_err(|e| SinkError::new(NAME, format!("encoding the force record {nonce} as JSON: {e}")))?;
        body.push(b'\n');
        self.put_once(&key, &body, &format!("archiving the force record {nonce} (revision {revision})"))
    }

    /// The object key of a force-release event.
    pub fn event_key(&self, event: &Event) -> Result<String, SinkError> {
        let Some(revision) = event.revision else {
            return Err(SinkError::new(
                NAME,
                format!("event {} of {} has no revision; refusing to archive it", event.index, event.etcd_key),
            ));
        };
        check_cluster_id(&event.cluster_id)?;
        check_revision(revision)?;
        Ok(format!("{}force-release/{}/{revision:020}-{}.json", self.prefix, event.cluster_id, event.index))
    }

    /// The object key of a raw force record.
    pub fn record_key(&self, cluster_id: &str, revision: i64, nonce: &str) -> Result<String, SinkError> {
        check_cluster_id(cluster_id)?;
        check_revision(revision)?;
        if nonce.is_empty() || nonce.len() > 128 || !nonce.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-') {
            return Err(SinkError::new(NAME, format!("nonce {nonce:?}: expected letters, digits, '_' and '-' (at most 128)")));
        }
        Ok(format!("{}force-record/{cluster_id}/{revision:020}-{nonce}.json", self.prefix))
    }

    /// Every key under the archive's prefix, in key order.
    pub fn list(&self) -> Result<Vec<String>, SinkError> {
        let what = "listing the archive";
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = format!("?list-type=2&prefix={}", encode(&self.prefix, false));
            if let Some(t) = &token {
                query.push_str(&format!("&continuation-token={}", encode(t, false)));
            }
            let answer = self.call(Method::GET, &format!("/{}", self.bucket), &query, &[], None, what)?;
            if answer.status != StatusCode::OK {
                return Err(self.failure(what, &answer));
            }
            let xml = String::from_utf8_lossy(&answer.body);
            keys.extend(xml_texts(&xml, "Key"));
            token = match xml_text(&xml, "IsTruncated").as_deref() {
                Some("true") => match xml_text(&xml, "NextContinuationToken") {
                    Some(t) if !t.is_empty() => Some(t),
                    _ => return Err(self.error(what, "the listing is truncated but has no NextContinuationToken".into())),
                },
                _ => break,
            };
        }
        Ok(keys)
    }

    /// One object's bytes (the current version).
    pub fn get(&self, key: &str) -> Result<Vec<u8>, SinkError> {
        let what = format!("reading {key}");
        let answer = self.call(Method::GET, &self.object_path(key), "", &[], None, &what)?;
        match answer.status {
            StatusCode::OK => Ok(answer.body),
            StatusCode::NOT_FOUND if answer.code() != "NoSuchBucket" => {
                Err(self.error(&what, format!("no object {key} in bucket {}", self.bucket)))
            }
            _ => Err(self.failure(&what, &answer)),
        }
    }

    /// An object's retention (`GetObjectRetention`); `None` when it has
    /// none.
    pub fn object_retention(&self, key: &str) -> Result<Option<Retention>, SinkError> {
        let what = format!("reading the retention of {key}");
        let answer = self.call(Method::GET, &self.object_path(key), "?retention", &[], None, &what)?;
        let code = answer.code();
        match answer.status {
            StatusCode::OK => {
                let xml = String::from_utf8_lossy(&answer.body);
                let (Some(mode), Some(until)) = (xml_text(&xml, "Mode"), xml_text(&xml, "RetainUntilDate")) else {
                    return Err(self.error(&what, format!("the answer has no Mode or RetainUntilDate: {}", cut(&xml))));
                };
                let retain_until =
                    humantime::parse_rfc3339_weak(&until).map_err(|e| self.error(&what, format!("RetainUntilDate {until:?}: {e}")))?;
                Ok(Some(Retention { mode, retain_until }))
            }
            // An object without retention (404 on AWS, 400 on versitygw);
            // AWS answers 400 InvalidRequest on a bucket without object lock.
            _ if code == "NoSuchObjectLockConfiguration" => Ok(None),
            StatusCode::BAD_REQUEST if code == "InvalidRequest" && !self.object_lock => Ok(None),
            _ => Err(self.failure(&what, &answer)),
        }
    }

    /// `HEAD /<bucket>`.
    fn check_bucket(&self) -> Result<(), SinkError> {
        let what = "connecting";
        let answer = self.call(Method::HEAD, &format!("/{}", self.bucket), "", &[], None, what)?;
        match answer.status {
            StatusCode::OK => Ok(()),
            StatusCode::NOT_FOUND => Err(self.error(
                what,
                format!(
                    "bucket {b} does not exist at {e}: create it with object lock enabled \
                     (`aws s3api create-bucket --bucket {b} --object-lock-enabled-for-bucket`, which also enables versioning), \
                     or correct archive.bucket",
                    b = self.bucket,
                    e = self.endpoint
                ),
            )),
            _ => Err(self.failure(what, &answer)),
        }
    }

    /// `GetObjectLockConfiguration`: whether the bucket has object lock.
    fn read_object_lock(&self) -> Result<bool, SinkError> {
        let what = "reading the bucket's object lock configuration";
        let answer = self.call(Method::GET, &format!("/{}", self.bucket), "?object-lock", &[], None, what)?;
        let code = answer.code();
        match answer.status {
            StatusCode::OK => Ok(xml_text(&String::from_utf8_lossy(&answer.body), "ObjectLockEnabled").as_deref() == Some("Enabled")),
            StatusCode::NOT_FOUND if code == "ObjectLockConfigurationNotFoundError" => Ok(false),
            // A store without the API at all.
            StatusCode::NOT_IMPLEMENTED => Ok(false),
            _ if code == "NotImplemented" => Ok(false),
            _ => Err(self.failure(what, &answer)),
        }
    }

    /// Writes `key` unless it is there; see the module docs.
    fn put_once(&mut self, key: &str, body: &[u8], what: &str) -> Result<(), SinkError> {
        for _ in 0..CONFLICT_ATTEMPTS {
            if self.exists(key, what)? {
                tracing::debug!(key, "already archived");
                return Ok(());
            }
            let checksum = base64(&Sha256::digest(body));
            let mut headers = vec![
                ("content-type", "application/json".to_string()),
                ("if-none-match", "*".to_string()),
                ("x-amz-sdk-checksum-algorithm", "SHA256".to_string()),
                ("x-amz-checksum-sha256", checksum),
            ];
            let until = SystemTime::now() + self.retention;
            if self.object_lock {
                headers.push(("x-amz-object-lock-mode", LOCK_MODE.to_string()));
                headers.push(("x-amz-object-lock-retain-until-date", humantime::format_rfc3339_seconds(until).to_string()));
            }
            let answer = self.call(Method::PUT, &self.object_path(key), "", &headers, Some(body), what)?;
            match answer.status {
                StatusCode::OK => {
                    tracing::debug!(key, object_lock = self.object_lock, "archived");
                    return self.check_retention_once(key, until);
                }
                // Written since the HEAD: by an earlier attempt whose answer
                // was lost, or by another tailer.
                StatusCode::PRECONDITION_FAILED => return Ok(()),
                // A concurrent conditional write of the same key: look again.
                StatusCode::CONFLICT => continue,
                _ => return Err(self.failure(what, &answer)),
            }
        }
        Err(self.error(what, format!("{key} was being written concurrently {CONFLICT_ATTEMPTS} times in a row; the tailer will retry")))
    }

    /// Whether `key` exists (`HEAD`).
    fn exists(&self, key: &str, what: &str) -> Result<bool, SinkError> {
        let answer = self.call(Method::HEAD, &self.object_path(key), "", &[], None, what)?;
        match answer.status {
            StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            StatusCode::FORBIDDEN => Err(self.error(
                what,
                format!(
                    "HEAD {key} was refused (403): the key needs s3:GetObject and s3:ListBucket on bucket {} \
                     (without ListBucket a missing object answers 403, not 404), and s3:PutObject and s3:PutObjectRetention",
                    self.bucket
                ),
            )),
            _ => Err(self.failure(what, &answer)),
        }
    }

    /// After the first write under lock, reads its retention back: a store
    /// that ignores the headers must not be reported as retaining.
    fn check_retention_once(&mut self, key: &str, until: SystemTime) -> Result<(), SinkError> {
        if !self.object_lock || self.retention_checked {
            return Ok(());
        }
        let kept = self.object_retention(key)?;
        let sent = until.checked_sub(Duration::from_secs(1)).unwrap_or(until);
        match kept {
            Some(r) if r.mode == LOCK_MODE && r.retain_until >= sent => {
                self.retention_checked = true;
                Ok(())
            }
            other => {
                self.object_lock = false;
                tracing::error!(
                    key,
                    bucket = %self.bucket,
                    kept = ?other,
                    "the store took the object-lock headers but does not keep the retention: force-release records are \
                     stored WITHOUT retention; archive to a store that implements object lock"
                );
                Ok(())
            }
        }
    }

    /// `/<bucket>/<key>`, the key percent-encoded.
    fn object_path(&self, key: &str) -> String {
        format!("/{}/{}", self.bucket, encode(key, true))
    }

    /// One signed request; any status is an answer.
    fn call(
        &self,
        method: Method,
        path: &str,
        query: &str,
        headers: &[(&'static str, String)],
        body: Option<&[u8]>,
        what: &str,
    ) -> Result<Answer, SinkError> {
        let uri = format!("{}{path}{query}", self.endpoint);
        let mut builder = http::Request::builder().method(method.clone()).uri(&uri);
        for (name, value) in headers {
            builder = builder.header(*name, value);
        }
        let mut request = builder
            .body(HttpRequestBody::from(body.map(<[u8]>::to_vec).unwrap_or_default()))
            .map_err(|e| self.error(what, format!("building the request for {uri}: {e}")))?;
        AwsAuthorizer::new(&self.credential, "s3", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|e| self.error(what, format!("signing the request: {e}")))?;
        let (parts, _) = request.into_parts();
        let sent = match body {
            Some(bytes) => self.agent.run(http::Request::from_parts(parts, bytes)),
            None => self.agent.run(http::Request::from_parts(parts, ())),
        };
        let mut response = sent.map_err(|e| self.error(what, self.transport_error(&e)))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = if method == Method::HEAD {
            Vec::new()
        } else {
            response
                .body_mut()
                .with_config()
                .limit(MAX_OBJECT)
                .read_to_vec()
                .map_err(|e| self.error(what, format!("reading the answer from {}: {e}", self.endpoint)))?
        };
        Ok(Answer { status, headers, body })
    }

    fn error(&self, what: &str, message: String) -> SinkError {
        SinkError::new(NAME, format!("{what}: {message}"))
    }

    /// An unexpected answer, with S3's error code and message and a hint.
    fn failure(&self, what: &str, answer: &Answer) -> SinkError {
        let text = String::from_utf8_lossy(&answer.body);
        let code = xml_text(&text, "Code").unwrap_or_default();
        let message = xml_text(&text, "Message").unwrap_or_else(|| cut(text.trim()));
        let message = message.trim_end_matches('.');
        let hint = match (answer.status.as_u16(), code.as_str()) {
            (301, _) | (_, "PermanentRedirect" | "AuthorizationHeaderMalformed") => {
                match answer.headers.get("x-amz-bucket-region").and_then(|v| v.to_str().ok()) {
                    Some(region) => format!(" The bucket is in {region}: set archive.region = \"{region}\" and that region's endpoint."),
                    None => " Check archive.region and archive.endpoint: they must name the bucket's region.".into(),
                }
            }
            (_, "SignatureDoesNotMatch" | "InvalidAccessKeyId") => {
                " Check the credentials (archive.*_file or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY).".into()
            }
            (403, _) => " Check the credentials and that they may use this bucket (s3:ListBucket, s3:GetBucketObjectLockConfiguration, \
                         s3:GetObject, s3:PutObject, s3:PutObjectRetention, s3:GetObjectRetention)."
                .into(),
            (404, "NoSuchBucket") => format!(" Bucket {} is gone: create it again with object lock enabled.", self.bucket),
            _ => String::new(),
        };
        let code = if code.is_empty() { String::new() } else { format!(" {code}") };
        self.error(what, format!("{} answered {}{code}: {message}.{hint}", self.endpoint, answer.status.as_u16()))
    }

    fn transport_error(&self, e: &ureq::Error) -> String {
        match e {
            ureq::Error::Timeout(_) => {
                format!("no answer from {} within {:?}: check that the store is up, or raise archive.timeout", self.endpoint, self.timeout)
            }
            ureq::Error::Io(_) | ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
                format!("cannot reach {} ({e}): check that the store is running and archive.endpoint", self.endpoint)
            }
            _ => format!("request to {} failed: {e}", self.endpoint),
        }
    }
}

impl Sink for Archive {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Archives each [`Kind::ForceRelease`] event of the batch, in order;
    /// other kinds are not archived. Nothing is sent if any of them lacks a
    /// revision or a valid cluster ID.
    fn append(&mut self, events: &[Event]) -> Result<(), SinkError> {
        let mut objects = Vec::new();
        for e in events.iter().filter(|e| e.kind == Kind::ForceRelease) {
            let key = self.event_key(e)?;
            let mut body =
                serde_json::to_vec(e).map_err(|err| SinkError::new(NAME, format!("encoding event {:?} as JSON: {err}", e.position())))?;
            body.push(b'\n');
            objects.push((key, body, e.position()));
        }
        for (key, body, (revision, index)) in objects {
            self.put_once(&key, &body, &format!("archiving the force-release at revision {revision} index {index}"))?;
        }
        Ok(())
    }

    /// [`Archive::archive_record`].
    fn force_record(&mut self, cluster_id: &str, revision: i64, nonce: &str, record: &ForceRecord) -> Result<(), SinkError> {
        self.archive_record(cluster_id, revision, nonce, record)
    }
}

fn check_cluster_id(cluster_id: &str) -> Result<(), SinkError> {
    if cluster_id.is_empty() || cluster_id.len() > 64 || !cluster_id.bytes().all(|c| c.is_ascii_alphanumeric()) {
        return Err(SinkError::new(NAME, format!("cluster ID {cluster_id:?}: expected hex digits")));
    }
    Ok(())
}

fn check_revision(revision: i64) -> Result<(), SinkError> {
    if revision < 1 {
        return Err(SinkError::new(NAME, format!("revision {revision}: etcd revisions start at 1")));
    }
    Ok(())
}

/// RFC 3986 percent-encoding of everything but the unreserved characters
/// (and `/` when `slash`): what SigV4's canonical request expects.
fn encode(s: &str, slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk.first().copied().unwrap_or(0), chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The text of every `<tag>…</tag>` element, unescaped. S3's answers are
/// generated documents: these elements have no attributes, no CDATA and no
/// children.
fn xml_texts(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at + open.len()..];
        let Some(end) = after.find(&close) else { break };
        out.push(xml_unescape(&after[..end]));
        rest = &after[end + close.len()..];
    }
    out
}

fn xml_text(xml: &str, tag: &str) -> Option<String> {
    xml_texts(xml, tag).into_iter().next()
}

fn xml_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let Some(end) = tail.find(';') else {
            out.push_str(tail);
            return out;
        };
        let entity = &tail[1..end];
        let decoded = match entity {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|hex| u32::from_str_radix(hex, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse::<u32>))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(c) => out.push(c),
            None => out.push_str(&tail[..=end]),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_ERROR_BODY) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (input, expected) in
            [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foob", "Zm9vYg=="), ("fooba", "Zm9vYmE="), ("foobar", "Zm9vYmFy")]
        {
            assert_eq!(base64(input.as_bytes()), expected, "{input:?}");
        }
        // The SHA-256 of "" as S3 checksums spell it.
        assert_eq!(base64(&Sha256::digest(b"")), "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=");
    }

    #[test]
    fn xml_elements_are_read_and_unescaped() {
        let xml = "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a&amp;b&#47;c&#x41;</Key></Contents>\
                   <Contents><Key>d&lt;e</Key></Contents></ListBucketResult>";
        assert_eq!(xml_texts(xml, "Key"), ["a&b/cA", "d<e"]);
        assert_eq!(xml_text(xml, "IsTruncated").as_deref(), Some("false"));
        assert_eq!(xml_text(xml, "Missing"), None);
        assert_eq!(xml_unescape("x &bogus; & y"), "x &bogus; & y");
    }

    #[test]
    fn keys_are_percent_encoded_for_sigv4() {
        assert_eq!(encode("holdfast/force-release/00ab/0001-2.json", true), "holdfast/force-release/00ab/0001-2.json");
        assert_eq!(encode("a b+c/d", true), "a%20b%2Bc/d");
        assert_eq!(encode("a/b=", false), "a%2Fb%3D");
    }
}
