//! What this arbiter has served, kept on its own disk.
//!
//! Per cluster, the highest epoch record the arbiter has granted under,
//! written and fsync'd to `STATE_DIR/served-epochs.json` before the first
//! grant of that epoch. The arbiter refuses to serve a record at or below
//! it unless it is that very record (the same epoch, cluster ID, log floor
//! and mint): such a record can only come from a restore of an etcd
//! snapshot older than an advance, or from an advance that minted an
//! epoch again, and serving it could hand out tokens already issued.
//! Being on the arbiter's disk, this survives a restore of etcd (and of the
//! allocator with it, while one cluster serves both tiers) and a restart.
//! `ServerStatus` reports it, so an advance request can ask for an epoch
//! above every epoch any arbiter served.

use holdfast_model::layout::EpochRecord;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The file under the state directory.
pub const FILE: &str = "served-epochs.json";

#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Doc {
    /// Cluster name (`cluster_name` in arbiter.toml) → the highest record served.
    clusters: BTreeMap<String, EpochRecord>,
}

/// The arbiter's record of what it served, for one of its clusters. The
/// clusters' records share one file ([`Served::sibling`]).
pub struct Served {
    file: Arc<File>,
    cluster: String,
}

struct File {
    path: PathBuf,
    doc: Mutex<Doc>,
}

/// Whether a record may be served.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Above everything served, and now recorded; or the record served last.
    Serve,
    /// At or below a record served with another binding: seal, with this reason.
    Refuse(String),
    /// A new high that could not be recorded: do not serve yet.
    Unrecorded(String),
}

fn describe(r: &EpochRecord) -> String {
    let mint = if r.mint.is_empty() { "none".to_string() } else { r.mint[..r.mint.len().min(8)].to_string() };
    format!("epoch {} (cluster ID {:x}, log floor {}, mint {mint})", r.epoch, r.cluster_id, r.log_floor)
}

impl Served {
    /// Reads `STATE_DIR/served-epochs.json` (absent: nothing served yet),
    /// creating the directory (mode 0700) if needed. A file that does not
    /// parse is an error: the arbiter must not forget what it served.
    pub fn open(state_dir: &Path, cluster: &str) -> Result<Served, String> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|e| format!("creating the state directory {}: {e}", state_dir.display()))?;
        let path = state_dir.join(FILE);
        let doc = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "{} does not parse ({e}); it records the epochs this arbiter served and must not be lost: restore it from a backup, or, only if this host never served this cluster, remove it",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Doc::default(),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        };
        Ok(Served { file: Arc::new(File { path, doc: Mutex::new(doc) }), cluster: cluster.to_string() })
    }

    /// The record of another cluster of this arbiter, in the same file.
    pub fn sibling(&self, cluster: &str) -> Served {
        Served { file: self.file.clone(), cluster: cluster.to_string() }
    }

    /// The name of the cluster this arbiter serves.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The highest record served for this arbiter's cluster.
    pub fn high(&self) -> Option<EpochRecord> {
        self.file.doc.lock().unwrap_or_else(|e| e.into_inner()).clusters.get(&self.cluster).cloned()
    }

    /// Every cluster's highest record, by cluster name.
    pub fn all(&self) -> Vec<(String, EpochRecord)> {
        self.file.doc.lock().unwrap_or_else(|e| e.into_inner()).clusters.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// May `record` be served? A record above the high is written (fsync'd)
    /// before this returns [`Admission::Serve`].
    pub fn admit(&self, record: &EpochRecord) -> Admission {
        let mut doc = self.file.doc.lock().unwrap_or_else(|e| e.into_inner());
        match doc.clusters.get(&self.cluster) {
            Some(high) if high == record => return Admission::Serve,
            Some(high) if record.epoch <= high.epoch => {
                return Admission::Refuse(format!(
                    "etcd's epoch record is {}, but this arbiter already served {} ({}): a restore brought back an older record, \
                     or an advance minted an epoch again. Serving it could reissue tokens; advance to an epoch above {} \
                     (`holdfastctl epoch advance-request` asks every arbiter for its highest)",
                    describe(record),
                    describe(high),
                    self.file.path.display(),
                    high.epoch
                ));
            }
            _ => {}
        }
        let mut next = doc.clone();
        next.clusters.insert(self.cluster.clone(), record.clone());
        match write_synced(&self.file.path, &next) {
            Ok(()) => {
                *doc = next;
                Admission::Serve
            }
            Err(e) => Admission::Unrecorded(format!(
                "cannot record {} in {} ({e}); granting nothing until it is recorded",
                describe(record),
                self.file.path.display()
            )),
        }
    }
}

/// Writes `doc` to a temporary file, fsyncs it, renames it over `path` and
/// fsyncs the directory: after a crash the file is the old one or the new
/// one, never a torn one.
fn write_synced(path: &Path, doc: &Doc) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(doc).map_err(std::io::Error::other)?;
    let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
    {
        let mut f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn record(epoch: u32, floor: i64, mint: &str) -> EpochRecord {
        EpochRecord { epoch, cluster_id: 0xabc, log_floor: floor, mint: mint.into() }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("holdfast-served-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_higher_epoch_is_recorded_and_survives_a_restart() {
        let d = dir("restart");
        let served = Served::open(&d, "entity-1").unwrap();
        assert_eq!(served.high(), None);
        assert_eq!(served.admit(&record(1, 5, "a")), Admission::Serve);
        assert_eq!(served.admit(&record(2, 9, "b")), Admission::Serve);
        assert_eq!(served.admit(&record(2, 9, "b")), Admission::Serve, "the record served last, again");
        let again = Served::open(&d, "entity-1").unwrap();
        assert_eq!(again.high(), Some(record(2, 9, "b")));
        assert_eq!(Served::open(&d, "other").unwrap().high(), None, "kept per cluster");
        assert_eq!(again.all().len(), 1);
        // Another cluster of the same arbiter: the same file, both kept.
        let coord = again.sibling("coord");
        assert_eq!(coord.admit(&record(3, 1, "c")), Admission::Serve);
        assert_eq!(again.admit(&record(4, 9, "d")), Admission::Serve);
        let both = Served::open(&d, "entity-1").unwrap();
        assert_eq!(both.high(), Some(record(4, 9, "d")));
        assert_eq!(both.sibling("coord").high(), Some(record(3, 1, "c")));
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700, "the state directory is the arbiter's alone");
    }

    #[test]
    fn an_epoch_at_or_below_the_high_with_another_binding_is_refused() {
        let d = dir("refuse");
        let served = Served::open(&d, "c").unwrap();
        assert_eq!(served.admit(&record(2, 9, "b")), Admission::Serve);
        for other in [record(2, 9, "c"), record(2, 10, "b"), EpochRecord { cluster_id: 1, ..record(2, 9, "b") }, record(1, 9, "b")] {
            let Admission::Refuse(why) = served.admit(&other) else { panic!("{other:?} was not refused") };
            assert!(why.contains("already served epoch 2") && why.contains("advance to an epoch above 2"), "{why}");
        }
        // Refusals change nothing on disk.
        assert_eq!(Served::open(&d, "c").unwrap().high(), Some(record(2, 9, "b")));
    }

    #[test]
    fn a_file_that_does_not_parse_is_an_error_not_a_blank() {
        let d = dir("bad");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(FILE), b"{\"clusters\": 3}").unwrap();
        let e = Served::open(&d, "c").err().unwrap();
        assert!(e.contains("must not be lost"), "{e}");
    }

    #[test]
    fn a_high_that_cannot_be_written_is_not_served() {
        let d = dir("unwritable");
        let served = Served::open(&d, "c").unwrap();
        // The temporary file's name is taken.
        std::fs::create_dir_all(d.join(FILE).with_extension(format!("json.{}.tmp", std::process::id()))).unwrap();
        assert!(matches!(served.admit(&record(1, 0, "a")), Admission::Unrecorded(_)));
        assert_eq!(served.high(), None);
    }
}
