//! The embedded audit store: a directory of append-only JSON-lines segment
//! files and a checkpoint.
//!
//! ```text
//! <store_dir>/lock                      flock'd by the one writer
//! <store_dir>/checkpoint.json           {cluster_id, revision, written_unix_ms}
//! <store_dir>/segments/<rev>.jsonl      events from revision <rev> on, one JSON object per line
//! ```
//!
//! - **Durable**: every batch is written and fsync'd before the sink
//!   returns; the checkpoint is written to a temporary file, fsync'd and
//!   renamed over the old one.
//! - **No duplicates**: events are appended in `(revision, index)` order and
//!   an event at or before the last stored position is skipped, so a replay
//!   from an older checkpoint stores nothing twice.
//! - **Crash-safe**: a torn last line (a crash mid-write) is cut when the
//!   writer opens the store; the stream resumes from the checkpoint, which
//!   is never ahead of what was fsync'd.
//! - **One writer**: [`Store::open`] takes an exclusive `flock` on `lock`;
//!   readers ([`read_events`]) take no lock and ignore a torn last line.

use crate::event::Event;
use crate::sink::{Sink, SinkError};
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A new segment is started once the current one reaches this size.
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{0} is being written by another holdfast-tailer (its lock file is held); stop it or give this one another store_dir")]
    Locked(PathBuf),
    #[error("{dir} holds the audit trail of etcd cluster {stored}, not of cluster {connected}; give this cluster its own store_dir")]
    OtherCluster { dir: PathBuf, stored: String, connected: String },
    #[error("{path}:{line}: not an audit event ({error}); the store was not written by holdfast-tailer")]
    Corrupt { path: PathBuf, line: usize, error: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |error| StoreError::Io { path: path.to_path_buf(), error }
}

/// How far the store is known complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub cluster_id: String,
    /// Every revision up to and including this one is stored.
    pub revision: i64,
    pub written_unix_ms: u64,
}

/// The store, opened by its one writer.
pub struct Store {
    dir: PathBuf,
    _lock: Flock<File>,
    segment: Option<(PathBuf, File, u64)>,
    last: Option<(i64, u32)>,
    checkpoint: Option<Checkpoint>,
}

impl Store {
    /// Opens (creating if needed) the store in `dir` for writing: takes the
    /// lock, cuts a torn tail, finds the last stored event.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let segments = dir.join("segments");
        fs::DirBuilder::new().recursive(true).mode(0o750).create(&segments).map_err(io(&segments))?;
        let lock_path = dir.join("lock");
        let lock_file = OpenOptions::new().create(true).truncate(false).write(true).mode(0o640).open(&lock_path).map_err(io(&lock_path))?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| StoreError::Locked(dir.to_path_buf()))?;
        let checkpoint = read_checkpoint(dir)?;
        let mut store = Store { dir: dir.to_path_buf(), _lock: lock, segment: None, last: None, checkpoint };
        if let Some(path) = segment_paths(dir)?.pop() {
            let (good_len, last) = scan(&path)?;
            let file = OpenOptions::new().append(true).open(&path).map_err(io(&path))?;
            if file.metadata().map_err(io(&path))?.len() > good_len {
                file.set_len(good_len).map_err(io(&path))?;
                file.sync_all().map_err(io(&path))?;
            }
            store.last = last;
            if store.last.is_none() {
                store.last = segment_paths(dir)?.iter().rev().skip(1).find_map(|p| scan(p).ok().and_then(|(_, l)| l));
            }
            store.segment = Some((path, file, good_len));
        }
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// The last stored `(revision, index)`.
    pub fn last_position(&self) -> Option<(i64, u32)> {
        self.last
    }

    /// Refuses a store that holds another cluster's trail.
    pub fn check_cluster(&self, cluster_id: &str) -> Result<(), StoreError> {
        match &self.checkpoint {
            Some(c) if c.cluster_id != cluster_id => {
                Err(StoreError::OtherCluster { dir: self.dir.clone(), stored: c.cluster_id.clone(), connected: cluster_id.to_string() })
            }
            _ => Ok(()),
        }
    }

    /// Records that every revision up to `revision` is stored (atomically:
    /// temporary file, fsync, rename, fsync of the directory).
    pub fn write_checkpoint(&mut self, cluster_id: &str, revision: i64, now_unix_ms: u64) -> Result<(), StoreError> {
        let c = Checkpoint { cluster_id: cluster_id.to_string(), revision, written_unix_ms: now_unix_ms };
        let path = self.dir.join("checkpoint.json");
        let tmp = self.dir.join("checkpoint.json.tmp");
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o640).open(&tmp).map_err(io(&tmp))?;
        f.write_all(&serde_json::to_vec(&c).unwrap_or_default()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io(&self.dir))?;
        self.checkpoint = Some(c);
        Ok(())
    }

    /// Appends the events after the last stored position, then fsyncs.
    /// Returns how many were new.
    pub fn append_events(&mut self, events: &[Event]) -> Result<usize, StoreError> {
        let new: Vec<&Event> = events.iter().filter(|e| self.last.is_none_or(|l| e.position() > l)).collect();
        let Some(first) = new.first() else { return Ok(0) };
        let roll = self.segment.as_ref().is_none_or(|(_, _, len)| *len >= SEGMENT_BYTES);
        if roll {
            let path = self.dir.join("segments").join(format!("{:020}.jsonl", first.position().0.max(0)));
            let file = OpenOptions::new().create(true).append(true).mode(0o640).open(&path).map_err(io(&path))?;
            File::open(self.dir.join("segments")).and_then(|d| d.sync_all()).map_err(io(&path))?;
            let len = file.metadata().map_err(io(&path))?.len();
            self.segment = Some((path, file, len));
        }
        let mut text = Vec::with_capacity(new.len() * 256);
        for e in &new {
            serde_json::to_writer(&mut text, e).map_err(|e| StoreError::Io { path: self.dir.clone(), error: e.into() })?;
            text.push(b'\n');
        }
        if let Some((path, file, len)) = self.segment.as_mut() {
            file.write_all(&text).map_err(io(path))?;
            file.sync_data().map_err(io(path))?;
            *len += text.len() as u64;
        }
        self.last = new.last().map(|e| e.position());
        Ok(new.len())
    }
}

impl Sink for Store {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn append(&mut self, events: &[Event]) -> Result<(), SinkError> {
        self.append_events(events).map(|_| ()).map_err(|e| SinkError::new("embedded", e.to_string()))
    }
}

fn segment_paths(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let segments = dir.join("segments");
    let mut paths = Vec::new();
    match fs::read_dir(&segments) {
        Ok(entries) => {
            for entry in entries {
                let path = entry.map_err(io(&segments))?.path();
                if path.extension().is_some_and(|x| x == "jsonl") {
                    paths.push(path);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::Io { path: segments, error: e }),
    }
    paths.sort();
    Ok(paths)
}

/// The length of the segment's complete, parseable lines and the last
/// event's position. A line that does not parse ends the good part only if
/// nothing follows it (a torn tail); one in the middle is corruption.
fn scan(path: &Path) -> Result<(u64, Option<(i64, u32)>), StoreError> {
    let mut reader = BufReader::new(File::open(path).map_err(io(path))?);
    let (mut good, mut last, mut line_no) = (0u64, None, 0usize);
    let mut line = Vec::new();
    let mut bad: Option<(usize, String)> = None;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io(path))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if let Some((at, error)) = bad.take() {
            return Err(StoreError::Corrupt { path: path.to_path_buf(), line: at, error });
        }
        if line.last() != Some(&b'\n') {
            break;
        }
        match serde_json::from_slice::<Event>(&line) {
            Ok(e) => {
                good += n as u64;
                last = Some(e.position());
            }
            Err(e) => bad = Some((line_no, e.to_string())),
        }
    }
    let _ = reader.seek(SeekFrom::Start(good));
    Ok((good, last))
}

/// The checkpoint of the store in `dir`, if one was written.
pub fn read_checkpoint(dir: &Path) -> Result<Option<Checkpoint>, StoreError> {
    let path = dir.join("checkpoint.json");
    match fs::read(&path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|e| StoreError::Corrupt { path: path.clone(), line: 1, error: e.to_string() })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::Io { path, error: e }),
    }
}

/// Every stored event, in `(revision, index)` order, each once. Needs no
/// lock: a torn last line (being written now) is left out.
pub fn read_events(dir: &Path) -> Result<Vec<Event>, StoreError> {
    if !dir.join("segments").is_dir() {
        return Err(StoreError::Io {
            path: dir.to_path_buf(),
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no audit store here (no segments/ directory); is holdfast-tailer running with this store_dir?",
            ),
        });
    }
    let mut events = Vec::new();
    for path in segment_paths(dir)? {
        let mut reader = BufReader::new(File::open(&path).map_err(io(&path))?);
        let mut line = Vec::new();
        let mut line_no = 0;
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).map_err(io(&path))?;
            if n == 0 || line.last() != Some(&b'\n') {
                break;
            }
            line_no += 1;
            match serde_json::from_slice::<Event>(&line) {
                Ok(e) => events.push(e),
                Err(e) => return Err(StoreError::Corrupt { path: path.clone(), line: line_no, error: e.to_string() }),
            }
        }
    }
    events.sort_by_key(Event::position);
    events.dedup_by_key(|e| e.position());
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Kind;

    fn ev(revision: i64, index: u32) -> Event {
        Event::new(1, revision, index, Kind::Record, "/sys/x", 0)
    }

    #[test]
    fn a_replay_stores_nothing_twice_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.append_events(&[ev(5, 0), ev(5, 1), ev(6, 0)]).unwrap(), 3);
        s.write_checkpoint("0000000000000001", 5, 1).unwrap();
        assert_eq!(s.append_events(&[ev(6, 0), ev(7, 0)]).unwrap(), 1);
        assert!(matches!(Store::open(dir.path()), Err(StoreError::Locked(_))));
        drop(s);
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.checkpoint().map(|c| c.revision), Some(5));
        assert_eq!(s.last_position(), Some((7, 0)));
        // The stream resumes after the checkpoint: 6 and 7 come again.
        assert_eq!(s.append_events(&[ev(6, 0), ev(7, 0), ev(8, 0)]).unwrap(), 1);
        let positions: Vec<_> = read_events(dir.path()).unwrap().iter().map(Event::position).collect();
        assert_eq!(positions, [(5, 0), (5, 1), (6, 0), (7, 0), (8, 0)]);
        assert!(s.check_cluster("0000000000000001").is_ok());
        assert!(matches!(s.check_cluster("0000000000000002"), Err(StoreError::OtherCluster { .. })));
    }

    #[test]
    fn a_torn_tail_is_cut_and_a_corrupt_middle_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.append_events(&[ev(5, 0), ev(6, 0)]).unwrap();
        drop(s);
        let seg = segment_paths(dir.path()).unwrap().pop().unwrap();
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        f.write_all(b"{\"cluster_id\":\"00").unwrap();
        assert_eq!(read_events(dir.path()).unwrap().len(), 2);
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.last_position(), Some((6, 0)));
        s.append_events(&[ev(7, 0)]).unwrap();
        assert_eq!(read_events(dir.path()).unwrap().len(), 3);
        drop(s);
        let text = fs::read_to_string(&seg).unwrap();
        fs::write(&seg, text.replacen("{\"cluster_id\"", "garbage\n{\"cluster_id\"", 1)).unwrap();
        assert!(matches!(Store::open(dir.path()), Err(StoreError::Corrupt { line: 1, .. })), "a bad line in the middle is refused");
    }
}
