//! The pause-test kit's logic: which resource to fence, and what the observed
//! writes say about the fence. `main.rs` and its modules drive processes,
//! the arbiter and etcd around it.

use holdfast_fence::{FenceError, FenceMode, PgFence, S3Config, S3Fence, SharedFence, Written};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the fenced resource is. Credentials never go on the command line:
/// PostgreSQL's password comes from `--pg-password-file` or `PGPASSWORD`,
/// S3 keys from `AWS_ACCESS_KEY_ID` and `--s3-secret-key-file` or
/// `AWS_SECRET_ACCESS_KEY`.
#[derive(clap::Args, Clone, Debug)]
pub struct ResourceArgs {
    /// The resource to test: `postgres://USER@HOST:PORT/DB` (the kit creates
    /// and uses table --table there) or `s3://BUCKET/PREFIX` (the kit writes
    /// objects under PREFIX; the bucket must exist).
    #[arg(long, value_name = "URL")]
    pub resource: String,
    /// PostgreSQL: the table the reference fence creates and writes.
    #[arg(long, default_value = "holdfast_fence", value_name = "NAME")]
    pub table: String,
    /// PostgreSQL: a file holding the password (not world-readable).
    #[arg(long, value_name = "FILE")]
    pub pg_password_file: Option<PathBuf>,
    /// S3: the endpoint of an S3-compatible store, e.g. https://s3.example:9000
    /// (omit for AWS).
    #[arg(long, env = "AWS_ENDPOINT_URL", value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3: the region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub s3_region: String,
    /// S3: the access key id.
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true, value_name = "ID")]
    pub s3_access_key_id: Option<String>,
    /// S3: a file holding the secret access key (not world-readable);
    /// default: AWS_SECRET_ACCESS_KEY.
    #[arg(long, value_name = "FILE")]
    pub s3_secret_key_file: Option<PathBuf>,
}

impl ResourceArgs {
    /// The same flags again, for the holder subprocess (secrets travel as
    /// file paths or in the inherited environment, never as values).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["--resource".into(), self.resource.clone().into(), "--table".into(), self.table.clone().into()];
        if let Some(f) = &self.pg_password_file {
            a.extend(["--pg-password-file".into(), f.clone().into()]);
        }
        if let Some(e) = &self.s3_endpoint {
            a.extend(["--s3-endpoint".into(), e.clone().into()]);
        }
        a.extend(["--s3-region".into(), self.s3_region.clone().into()]);
        if let Some(k) = &self.s3_access_key_id {
            a.extend(["--s3-access-key-id".into(), k.clone().into()]);
        }
        if let Some(f) = &self.s3_secret_key_file {
            a.extend(["--s3-secret-key-file".into(), f.clone().into()]);
        }
        a
    }

    /// Connects to the resource with the given fence implementation.
    pub async fn open(&self, mode: FenceMode) -> Result<SharedFence, FenceError> {
        let url = self.resource.as_str();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut config: tokio_postgres::Config =
                url.parse().map_err(|e| FenceError::Config(format!("--resource {url:?} is not a PostgreSQL URL: {e}")))?;
            if config.get_password().is_some() {
                return Err(FenceError::Config(
                    "--resource carries a password; put it in a file passed as --pg-password-file (mode 0600), or in PGPASSWORD".into(),
                ));
            }
            if let Some(file) = &self.pg_password_file {
                config.password(read_secret(file, "--pg-password-file")?);
            } else if let Ok(p) = std::env::var("PGPASSWORD") {
                config.password(p);
            }
            Ok(Arc::new(PgFence::connect(&config, &self.table, mode).await?))
        } else if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let secret = match &self.s3_secret_key_file {
                Some(file) => read_secret(file, "--s3-secret-key-file")?,
                None => std::env::var("AWS_SECRET_ACCESS_KEY").map_err(|_| {
                    FenceError::Config("S3: no secret key; pass --s3-secret-key-file FILE or set AWS_SECRET_ACCESS_KEY".into())
                })?,
            };
            let access_key_id = self
                .s3_access_key_id
                .clone()
                .ok_or_else(|| FenceError::Config("S3: no access key id; pass --s3-access-key-id or set AWS_ACCESS_KEY_ID".into()))?;
            let config = S3Config {
                endpoint: self.s3_endpoint.clone(),
                region: self.s3_region.clone(),
                bucket: bucket.to_string(),
                prefix: prefix.trim_end_matches('/').to_string(),
                access_key_id,
                secret_access_key: secret,
            };
            Ok(Arc::new(S3Fence::connect(&config, mode)?))
        } else {
            Err(FenceError::Config(format!("--resource {url:?}: use postgres://USER@HOST:PORT/DB or s3://BUCKET/PREFIX")))
        }
    }
}

/// Reads a secret file, refusing one that every user may read.
fn read_secret(path: &Path, flag: &str) -> Result<String, FenceError> {
    let meta = std::fs::metadata(path).map_err(|e| FenceError::Config(format!("{flag} {}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o004 != 0 {
        return Err(FenceError::Config(format!("{flag} {} is world-readable; refusing to use it (chmod 0600 it)", path.display())));
    }
    let text = std::fs::read_to_string(path).map_err(|e| FenceError::Config(format!("{flag} {}: {e}", path.display())))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

/// What the kit saw, step by step. `None`: the step was not reached.
#[derive(Debug, Default, Clone)]
pub struct Observed {
    /// 1. The holder's first write, with its freshly granted token.
    pub first: Option<Written>,
    /// 3. The second holder's write, after the frozen holder's lease lapsed.
    pub newer: Option<Written>,
    /// 4. The frozen holder's write, resumed after the second holder wrote.
    pub pending: Option<Written>,
    /// 5. The frozen holder's token re-presented to the record it already
    ///    wrote, after the lock passed on.
    pub repeat: Option<Written>,
    /// Whether the record written in 3 and 4 ends with the second holder's
    /// token in the resource's log of accepted tokens.
    pub newer_is_last: Option<bool>,
}

/// The kit's judgement: `Ok(reason)` passes, `Err(reason)` fails.
pub fn verdict(o: &Observed) -> Result<String, String> {
    let mut failures = Vec::new();
    if o.first == Some(Written::Rejected) {
        failures.push("the holder's first write, with a freshly granted token, was rejected: the fence refuses valid writes".to_string());
    }
    if o.newer == Some(Written::Rejected) {
        failures.push("the second holder's write, with the newer token granted after the first holder's lease lapsed, was rejected".into());
    }
    if o.pending.is_some_and(Written::is_accepted) {
        failures.push(
            "the first holder, frozen (SIGSTOP) at its decisive statement past its TTL and resumed after the second holder wrote, \
             had its write ACCEPTED: the check and the write are not one atomic step (a check then a write in two statements, or no check)"
                .into(),
        );
    }
    if o.repeat.is_some_and(Written::is_accepted) {
        failures.push(
            "the first holder's expired token, re-presented to the record it had already written after the lock passed on, was ACCEPTED: \
             the fence compares with <= instead of <"
                .into(),
        );
    }
    if o.newer_is_last == Some(false) {
        failures
            .push("the record's log of accepted tokens does not end with the second holder's token: a stale write landed after it".into());
    }
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    if [o.first, o.newer, o.pending, o.repeat].iter().any(Option::is_none) || o.newer_is_last.is_none() {
        return Err("the test did not complete every step".into());
    }
    Ok("the frozen holder's resumed write and its re-presented expired token were both rejected; \
        the second holder's write was accepted and is the last in the record's log"
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Option<Written> = Some(Written::Accepted { value: 1 });
    const R: Option<Written> = Some(Written::Rejected);

    fn complete(pending: Option<Written>, repeat: Option<Written>, last: bool) -> Observed {
        Observed { first: A, newer: A, pending, repeat, newer_is_last: Some(last) }
    }

    #[test]
    fn only_both_rejections_pass() {
        assert!(verdict(&complete(R, R, true)).is_ok());
        let lte = verdict(&complete(R, A, true)).unwrap_err();
        assert!(lte.contains("<= instead of <") && !lte.contains("atomic"), "{lte}");
        let two = verdict(&complete(A, R, false)).unwrap_err();
        assert!(two.contains("not one atomic step") && two.contains("stale write landed"), "{two}");
        assert!(verdict(&Observed { first: R, ..complete(R, R, true) }).unwrap_err().contains("refuses valid writes"));
        assert!(verdict(&Observed { newer: R, ..complete(R, R, true) }).unwrap_err().contains("second holder's write"));
        assert!(verdict(&Observed { repeat: None, ..complete(R, R, true) }).unwrap_err().contains("did not complete"));
    }

    #[tokio::test]
    async fn resources_are_parsed_with_precise_errors() {
        let args = |r: &str| ResourceArgs {
            resource: r.into(),
            table: "holdfast_fence".into(),
            pg_password_file: None,
            s3_endpoint: None,
            s3_region: "us-east-1".into(),
            s3_access_key_id: None,
            s3_secret_key_file: None,
        };
        let e = args("mysql://x").open(FenceMode::Correct).await.err().unwrap().to_string();
        assert!(e.contains("postgres://") && e.contains("s3://"), "{e}");
        let e = args("postgres://u:pw@127.0.0.1:1/db").open(FenceMode::Correct).await.err().unwrap().to_string();
        assert!(e.contains("--pg-password-file") && !e.contains("pw@"), "{e}");
        let e =
            ResourceArgs { table: "bad-name".into(), ..args("postgres://u@127.0.0.1:1/db") }.open(FenceMode::Correct).await.err().unwrap();
        assert!(e.to_string().contains("plain identifier"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let s3 =
            ResourceArgs { s3_secret_key_file: Some(secret.clone()), s3_access_key_id: Some("AK".into()), ..args("s3://bucket/prefix") };
        let e = s3.open(FenceMode::Correct).await.err().unwrap().to_string();
        assert!(e.contains("world-readable"), "{e}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = s3.open(FenceMode::Correct).await.unwrap();
        assert_eq!(f.describe(), "s3://bucket/prefix");
        assert!(s3.to_args().iter().all(|a| a.to_str() != Some("s3cret")));
    }
}
