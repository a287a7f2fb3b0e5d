//! The force-release archive against a real versitygw (posix backend, with
//! versioning) on 127.0.0.1. These tests fail, never skip, when versitygw
//! is not installed: run `scripts/install-deps`.
//!
//! Locked buckets are created through the S3 API with
//! `x-amz-bucket-object-lock-enabled: true` (which makes them versioned, as
//! on AWS); a directory made before the server starts is a bucket without
//! object lock. What the archive claims is checked with requests of the
//! test's own (ListObjectVersions, GetObjectRetention, DELETE of a version),
//! not only through the archive's API.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_audit::Event;
use holdfast_audit::event::{Kind, TimeSource, cluster_hex};
use holdfast_audit::sink::Sink;
use holdfast_audit_sinks::archive::{Archive, ArchiveConfig, ArchivedRecord, DEFAULT_RETENTION, NAME};
use holdfast_fixtures::s3::S3Server;
use holdfast_model::layout::{self, ForceRecord};
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::HttpRequestBody;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use ureq::http::{self, Method};

const LOCKED: &str = "force-archive";
const PLAIN: &str = "plain";

struct Fixture {
    server: S3Server,
    dir: tempfile::TempDir,
    key_id_file: PathBuf,
    secret_file: PathBuf,
}

impl Fixture {
    /// A versioned versitygw with the bucket `plain` (no object lock) and
    /// the bucket `force-archive`, created with object lock.
    fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-archive-").tempdir().unwrap();
        let log = dir.path().join("versitygw.log");
        let server = match S3Server::start_versioned(&dir.path().join("root"), &dir.path().join("versions"), &log, &[PLAIN]) {
            Ok(s) => s,
            Err(e) => {
                print_log(&log);
                panic!("{e:#}");
            }
        };
        let key_id_file = dir.path().join("access-key-id");
        let secret_file = dir.path().join("secret-access-key");
        write_private(&key_id_file, &format!("{}\n", server.access_key_id));
        write_private(&secret_file, &format!("{}\n", server.secret_access_key));
        let fixture = Fixture { server, dir, key_id_file, secret_file };
        let (status, body) = fixture.raw(Method::PUT, &format!("/{LOCKED}"), &[("x-amz-bucket-object-lock-enabled", "true")], b"");
        assert_eq!(status, 200, "CreateBucket with object lock: {body}");
        fixture
    }

    fn config(&self, bucket: &str) -> ArchiveConfig {
        let mut c = ArchiveConfig::new(self.server.endpoint(), bucket);
        c.allow_http = true;
        c.access_key_id_file = Some(self.key_id_file.clone());
        c.secret_access_key_file = Some(self.secret_file.clone());
        c.timeout = Duration::from_secs(5);
        c
    }

    fn connect(&self, bucket: &str) -> Archive {
        Archive::connect(&self.config(bucket)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// One request signed with the server's root key, sent by the test
    /// itself: the status and the body.
    fn raw(&self, method: Method, path_and_query: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
        let credential =
            AwsCredential { key_id: self.server.access_key_id.clone(), secret_key: self.server.secret_access_key.clone(), token: None };
        let mut builder = http::Request::builder().method(method).uri(format!("{}{path_and_query}", self.server.endpoint()));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(HttpRequestBody::from(body.to_vec())).unwrap();
        AwsAuthorizer::new(&credential, "s3", "us-east-1").try_authorize(&mut request, None).unwrap();
        let (parts, _) = request.into_parts();
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let mut response = if body.is_empty() {
            agent.run(http::Request::from_parts(parts, ())).unwrap()
        } else {
            agent.run(http::Request::from_parts(parts, body)).unwrap()
        };
        (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default())
    }

    /// The version IDs of `key` (not its delete markers), from
    /// ListObjectVersions.
    fn versions(&self, bucket: &str, key: &str) -> Vec<String> {
        let (status, xml) = self.raw(Method::GET, &format!("/{bucket}?versions&prefix={key}"), &[], b"");
        assert_eq!(status, 200, "ListObjectVersions: {xml}");
        elements(&xml, "Version")
            .iter()
            .filter(|v| elements(v, "Key").first().map(String::as_str) == Some(key))
            .map(|v| elements(v, "VersionId").into_iter().next().expect("a version has an ID"))
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log(&self.server.log);
            eprintln!("(test directory {})", self.dir.path().display());
        }
    }
}

fn print_log(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!("--- last lines of {} ---", path.display());
    for l in &lines[lines.len().saturating_sub(40)..] {
        eprintln!("{l}");
    }
}

fn write_private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The contents of every `<tag>…</tag>` (no nesting of the same tag in
/// S3's answers).
fn elements(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(&open).skip(1).filter_map(|part| part.split_once(&close).map(|(inside, _)| inside.to_string())).collect()
}

/// `x-amz-checksum-sha256` of `body` (S3 requires a checksum on
/// PutObjectRetention).
fn sha256_base64(body: &[u8]) -> String {
    use sha2::Digest;
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let digest = sha2::Sha256::digest(body);
    let mut bits: Vec<bool> = digest.iter().flat_map(|b| (0..8).rev().map(move |i| b >> i & 1 == 1)).collect();
    bits.resize(bits.len().div_ceil(6) * 6, false);
    let mut out: String = bits.chunks(6).map(|c| char::from(ALPHABET[c.iter().fold(0, |n, &b| n << 1 | usize::from(b))])).collect();
    while !out.len().is_multiple_of(4) {
        out.push('=');
    }
    out
}

fn cluster() -> String {
    cluster_hex(0x00c0_ffee_1234_5678)
}

fn sample_record() -> ForceRecord {
    ForceRecord {
        namespace: "payments".into(),
        key: "ledger-writer".into(),
        holder: "spiffe://example.org/ledger/7".into(),
        session: 0x1234_5678,
        granted_unix_ms: 1_790_000_000_000,
        class: "critical".into(),
        fenced: true,
        requester: "alice".into(),
        approver: "bob".into(),
        reason: "holder's host is gone (INC-4711)".into(),
        revoked_session: true,
        at_unix: 1_790_000_100,
    }
}

fn force_release_event(revision: i64, index: u32) -> Event {
    let mut e = Event::new(0x00c0_ffee_1234_5678, revision, index, Kind::ForceRelease, "/l/payments/ledger-writer", 1_790_000_100_000);
    e.time_source = TimeSource::Record;
    e.identity = Some("spiffe://example.org/ledger/7".into());
    e.namespace = Some("payments".into());
    e.key = Some("payments/ledger-writer".into());
    e.requester = Some("alice".into());
    e.approver = Some("bob".into());
    e.reason = Some("holder's host is gone (INC-4711)".into());
    e.fenced = Some(true);
    e
}

#[test]
fn a_record_archived_twice_is_stored_once_and_reads_back_equal() {
    let f = Fixture::start();
    let mut archive = f.connect(LOCKED);
    assert!(archive.object_lock(), "{LOCKED} was created with object lock");
    let nonce = "9f86d081884c7d659a2feaa0c55ad015";
    let record = sample_record();
    let key = archive.record_key(&cluster(), 42, nonce).unwrap();
    assert_eq!(key, format!("holdfast/force-record/{}/00000000000000000042-{nonce}.json", cluster()));

    archive.archive_record(&cluster(), 42, nonce, &record).unwrap();
    archive.archive_record(&cluster(), 42, nonce, &record).unwrap();
    // A restarted tailer replays the same record.
    f.connect(LOCKED).archive_record(&cluster(), 42, nonce, &record).unwrap();

    assert_eq!(archive.list().unwrap(), std::slice::from_ref(&key));
    assert_eq!(f.versions(LOCKED, &key).len(), 1, "one version, not one per attempt");
    let stored: ArchivedRecord = serde_json::from_slice(&archive.get(&key).unwrap()).unwrap();
    assert_eq!(stored, ArchivedRecord { cluster_id: cluster(), revision: 42, etcd_key: layout::force_key(nonce), record });

    // The events: only force-releases are archived, each once; a replay
    // whose observed time differs keeps the first copy.
    let release = force_release_event(43, 1);
    let grant = Event::new(0x00c0_ffee_1234_5678, 43, 0, Kind::Grant, "/l/payments/ledger-writer", 1_790_000_100_000);
    archive.append(&[grant.clone(), release.clone()]).unwrap();
    let mut replayed = release.clone();
    replayed.time_unix_ms += 5;
    archive.append(&[grant, replayed]).unwrap();
    let event_key = archive.event_key(&release).unwrap();
    assert_eq!(event_key, format!("holdfast/force-release/{}/00000000000000000043-1.json", cluster()));
    assert_eq!(archive.list().unwrap(), [key.clone(), event_key.clone()], "force-record/ sorts before force-release/");
    assert_eq!(f.versions(LOCKED, &event_key).len(), 1);
    let stored: Event = serde_json::from_slice(&archive.get(&event_key).unwrap()).unwrap();
    assert_eq!(stored, release);

    // The version count above can fail: a put that does not look first
    // makes a second version of a locked object.
    let (status, body) = f.raw(Method::PUT, &format!("/{LOCKED}/{key}"), &[("content-type", "application/json")], b"{}\n");
    assert_eq!(status, 200, "{body}");
    assert_eq!(f.versions(LOCKED, &key).len(), 2);
}

#[test]
fn a_locked_bucket_keeps_each_object_in_compliance_mode_for_seven_years() {
    let f = Fixture::start();
    let mut archive = f.connect(LOCKED);
    assert!(archive.object_lock());
    assert_eq!(archive.retention(), Duration::from_secs(2557 * 86400));
    let nonce = "0123456789abcdef0123456789abcdef";
    let before = SystemTime::now();
    archive.archive_record(&cluster(), 7, nonce, &sample_record()).unwrap();
    let after = SystemTime::now();
    let key = archive.record_key(&cluster(), 7, nonce).unwrap();
    let bytes = archive.get(&key).unwrap();

    // GetObjectRetention, read by the test itself.
    let (status, xml) = f.raw(Method::GET, &format!("/{LOCKED}/{key}?retention"), &[], b"");
    assert_eq!(status, 200, "GetObjectRetention: {xml}");
    assert_eq!(elements(&xml, "Mode"), ["COMPLIANCE"], "{xml}");
    let until = humantime::parse_rfc3339_weak(&elements(&xml, "RetainUntilDate")[0]).unwrap();
    // Sent with whole seconds.
    assert!(until + Duration::from_secs(1) >= before + DEFAULT_RETENTION, "{xml}");
    assert!(until <= after + DEFAULT_RETENTION, "{xml}");
    let years = until.duration_since(before).unwrap().as_secs_f64() / (365.25 * 86400.0);
    assert!((years - 7.0).abs() < 0.01, "{years} years");
    // And through the archive's own reader.
    let retention = archive.object_retention(&key).unwrap().expect("a retention");
    assert_eq!((retention.mode.as_str(), retention.retain_until), ("COMPLIANCE", until));

    // Deleting the version is refused, even with the governance bypass;
    // shortening the retention too.
    let versions = f.versions(LOCKED, &key);
    assert_eq!(versions.len(), 1);
    let delete = format!("/{LOCKED}/{key}?versionId={}", versions[0]);
    let (status, body) = f.raw(Method::DELETE, &delete, &[], b"");
    assert_eq!(status, 403, "DELETE of a locked version: {body}");
    assert_eq!(elements(&body, "Code"), ["AccessDenied"], "{body}");
    let (status, body) = f.raw(Method::DELETE, &delete, &[("x-amz-bypass-governance-retention", "true")], b"");
    assert_eq!(status, 403, "compliance mode has no bypass: {body}");
    let shorter = "<Retention><Mode>GOVERNANCE</Mode><RetainUntilDate>2030-01-01T00:00:00Z</RetainUntilDate></Retention>";
    let checksum = sha256_base64(shorter.as_bytes());
    let (status, body) =
        f.raw(Method::PUT, &format!("/{LOCKED}/{key}?retention"), &[("x-amz-checksum-sha256", &checksum)], shorter.as_bytes());
    assert_eq!(status, 403, "PutObjectRetention shortening it: {body}");
    assert_eq!(f.versions(LOCKED, &key), versions);
    assert_eq!(archive.get(&key).unwrap(), bytes);

    // The check above can fail: an object written without the archive's
    // headers has no retention and its version can be deleted.
    let (status, body) = f.raw(Method::PUT, &format!("/{LOCKED}/unlocked.json"), &[], b"{}\n");
    assert_eq!(status, 200, "{body}");
    assert_eq!(archive.object_retention("unlocked.json").unwrap(), None);
    let version = f.versions(LOCKED, "unlocked.json").remove(0);
    let (status, body) = f.raw(Method::DELETE, &format!("/{LOCKED}/unlocked.json?versionId={version}"), &[], b"");
    assert_eq!(status, 204, "{body}");
}

#[test]
fn a_bucket_without_object_lock_is_reported_and_archived_without_retention() {
    let f = Fixture::start();
    let mut archive = f.connect(PLAIN);
    assert!(!archive.object_lock(), "{PLAIN} is a directory made before start: no object lock");
    let nonce = "fedcba9876543210fedcba9876543210";
    archive.archive_record(&cluster(), 9, nonce, &sample_record()).unwrap();
    archive.archive_record(&cluster(), 9, nonce, &sample_record()).unwrap();
    let key = archive.record_key(&cluster(), 9, nonce).unwrap();
    assert_eq!(archive.list().unwrap(), std::slice::from_ref(&key));
    assert_eq!(archive.object_retention(&key).unwrap(), None, "no retention is claimed");
    let stored: ArchivedRecord = serde_json::from_slice(&archive.get(&key).unwrap()).unwrap();
    assert_eq!(stored.record, sample_record());

    let mut strict = f.config(PLAIN);
    strict.require_object_lock = true;
    let e = Archive::connect(&strict).unwrap_err().to_string();
    assert!(e.starts_with(NAME), "{e}");
    assert!(e.contains("no object lock") && e.contains("--object-lock-enabled-for-bucket"), "{e}");
    strict.bucket = LOCKED.into();
    assert!(Archive::connect(&strict).unwrap().object_lock());
}

#[test]
fn a_missing_bucket_is_an_error_that_says_what_to_do() {
    let f = Fixture::start();
    let e = Archive::connect(&f.config("no-such-bucket")).unwrap_err().to_string();
    assert!(e.contains("bucket no-such-bucket does not exist"), "{e}");
    assert!(e.contains("create it with object lock enabled") && e.contains("--object-lock-enabled-for-bucket"), "{e}");
    assert!(e.contains("archive.bucket"), "{e}");

    // Wrong credentials are told apart from a missing bucket.
    let wrong = f.dir.path().join("wrong-secret");
    write_private(&wrong, "not-the-secret\n");
    let mut c = f.config(LOCKED);
    c.secret_access_key_file = Some(wrong);
    let e = Archive::connect(&c).unwrap_err().to_string();
    assert!(e.contains("403") && e.contains("Check the credentials"), "{e}");
    assert!(!e.contains(&f.server.secret_access_key), "{e}");
}

#[test]
fn the_archive_table_parses_with_its_defaults_and_names_its_problems() {
    let c: ArchiveConfig = toml::from_str("endpoint = \"https://s3.eu-west-1.amazonaws.com\"\nbucket = \"holdfast-force\"").unwrap();
    assert_eq!(c, ArchiveConfig::new("https://s3.eu-west-1.amazonaws.com", "holdfast-force"));
    assert_eq!((c.region.as_str(), c.prefix.as_str(), c.retention), ("us-east-1", "holdfast/", DEFAULT_RETENTION));
    assert!(!c.allow_http && !c.require_object_lock && c.access_key_id_file.is_none());
    assert!(c.problems().is_empty(), "{:?}", c.problems());
    let text = toml::to_string(&c).unwrap();
    assert_eq!(toml::from_str::<ArchiveConfig>(&text).unwrap(), c, "{text}");
    let c: ArchiveConfig = toml::from_str("endpoint = \"https://s3\"\nbucket = \"b-1\"\nretention = \"3650d\"").unwrap();
    assert_eq!(c.retention, Duration::from_secs(3650 * 86400));

    let e = toml::from_str::<ArchiveConfig>("endpoint = \"https://s3\"\nbucket = \"b-1\"\nretention_days = 7").unwrap_err().to_string();
    assert!(e.contains("retention_days"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("secret");
    std::fs::write(&open, "s\n").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = ArchiveConfig::new("http://127.0.0.1:9", "Bad_Bucket");
    c.prefix = "/holdfast".into();
    c.retention = Duration::from_secs(3600);
    c.secret_access_key_file = Some(open.clone());
    let p = c.problems().join("\n");
    for needle in ["archive.endpoint", "allow_http", "archive.bucket", "archive.prefix", "archive.retention", "world-readable"] {
        assert!(p.contains(needle), "{needle} not in {p}");
    }
    let e = Archive::connect(&c).unwrap_err().to_string();
    assert!(e.contains("invalid [archive] config"), "{e}");

    // An empty key file is refused before anything is sent.
    let empty = dir.path().join("empty");
    write_private(&empty, "");
    let mut c = ArchiveConfig::new("http://127.0.0.1:9", "b-1");
    c.allow_http = true;
    c.access_key_id_file = Some(empty.clone());
    c.secret_access_key_file = Some(empty);
    let e = Archive::connect(&c).unwrap_err().to_string();
    assert!(e.contains("archive.access_key_id_file") && e.contains("is empty"), "{e}");
}
