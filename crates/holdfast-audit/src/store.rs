//! The embedded audit store: a directory of append-only JSON-lines segment
//! files and a checkpoint.
//!
//! ```text
//! <store_dir>/lock                      flock'd by the one writer
//! <store_dir>/checkpoint.json           {cluster_id, revision, written_unix_ms}   (0600)
//! <store_dir>/withheld.jsonl            revisions withheld while a hold they granted lives (0600)
//! <store_dir>/segments/<rev>.jsonl      events from revision <rev> on, one JSON object per line
//! ```
//!
//! - **No live token**: every event of a revision that granted a hold is
//!   *withheld* ([`Store::withhold`]: written to `withheld.jsonl`, readable
//!   by the tailer's user alone) until every hold granted in that revision
//!   has ended; then [`Store::store_released`] appends them to the segment
//!   (after later revisions: readers sort by position) and marks the
//!   revision released. The checkpoint counts a withheld revision as done
//!   (it is durable), so it too may name a live hold's revision: it is
//!   readable by the tailer's user alone. Segments (0640, group
//!   `holdfast-audit`) never hold a live hold's revision.
//!
//! - **Durable**: every batch is written and fsync'd before the sink
//!   returns; the checkpoint is written to a temporary file, fsync'd and
//!   renamed over the old one.
//! - **No duplicates**: events are appended in `(revision, index)` order and
//!   an event at or before the last stored position is skipped, so a replay
//!   from an older checkpoint stores nothing twice. A withheld revision is
//!   stored once: its release is marked in `withheld.jsonl` after the
//!   segment's fsync, and a release cut off between the two by a crash is
//!   found in the last segment when the store opens.
//! - **Crash-safe**: a torn last line (a crash mid-write) is cut when the
//!   writer opens the store; the stream resumes from the checkpoint, which
//!   is never ahead of what was fsync'd.
//! - **One writer**: [`Store::open`] takes an exclusive `flock` on `lock`;
//!   readers ([`read_events`]) take no lock and ignore a torn last line.

use crate::event::Event;
use crate::sink::{Sink, SinkError};
use holdfast_model::layout::ForceRecord;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
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

/// The raw force-release record of a withheld revision (see
/// [`crate::sink::Sink::force_record`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithheldForce {
    pub nonce: String,
    pub record: ForceRecord,
}

/// The events of one revision that granted a hold still live, kept out of
/// the segments (and every sink) until the hold ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Withheld {
    /// The revision whose holds must end first (the events' own, or for a
    /// gap event, the end of the gap that is a live hold's revision).
    pub revision: i64,
    pub events: Vec<Event>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forced: Vec<WithheldForce>,
}

/// One line of `withheld.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum WithheldLine {
    Withheld(Withheld),
    Released(i64),
}

const WITHHELD: &str = "withheld.jsonl";

/// The store, opened by its one writer.
pub struct Store {
    dir: PathBuf,
    _lock: Flock<File>,
    segment: Option<(PathBuf, File, u64)>,
    last: Option<(i64, u32)>,
    checkpoint: Option<Checkpoint>,
    /// Withheld revisions not yet released.
    withheld: BTreeMap<i64, Withheld>,
    /// Revisions after the checkpoint whose withheld events were stored
    /// (a replay from the checkpoint must not store them again).
    released: BTreeSet<i64>,
    /// `withheld.jsonl`, open for appending, and its line count.
    withheld_file: Option<File>,
    withheld_lines: usize,
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
        let (withheld, released, withheld_lines) = load_withheld(dir)?;
        let mut store = Store {
            dir: dir.to_path_buf(),
            _lock: lock,
            segment: None,
            last: None,
            checkpoint,
            withheld,
            released,
            withheld_file: None,
            withheld_lines,
        };
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
            store.segment = Some((path.clone(), file, good_len));
            // A release the crash cut off after its events reached the
            // segment but before it was marked: they are in the last
            // segment (nothing is appended between the two), all or, if the
            // write was torn, the first of them; the rest are appended now.
            if !store.withheld.is_empty() {
                // A torn last line of withheld.jsonl goes before anything
                // is appended to it.
                store.compact_withheld()?;
                let pending: BTreeMap<(i64, u32), i64> =
                    store.withheld.values().flat_map(|w| w.events.iter().map(|e| (e.position(), w.revision))).collect();
                let present: BTreeSet<(i64, u32)> =
                    read_segment(&path)?.iter().map(Event::position).filter(|p| pending.contains_key(p)).collect();
                let begun: BTreeSet<i64> = present.iter().filter_map(|p| pending.get(p).copied()).collect();
                let missing: Vec<Event> = begun
                    .iter()
                    .filter_map(|r| store.withheld.get(r))
                    .flat_map(|w| w.events.iter().filter(|e| !present.contains(&e.position())).cloned())
                    .collect();
                if !missing.is_empty() {
                    store.write_lines(&missing.iter().collect::<Vec<_>>())?;
                }
                store.mark_released(&begun.into_iter().collect::<Vec<_>>())?;
            }
        }
        let through = store.checkpoint.as_ref().map_or(0, |c| c.revision);
        store.released.retain(|r| *r > through);
        store.compact_withheld()?;
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

    /// Records that every revision up to `revision` is stored or withheld
    /// (atomically: temporary file, fsync, rename, fsync of the directory).
    /// The file is the tailer user's alone: `revision` may be a live hold's.
    pub fn write_checkpoint(&mut self, cluster_id: &str, revision: i64, now_unix_ms: u64) -> Result<(), StoreError> {
        let c = Checkpoint { cluster_id: cluster_id.to_string(), revision, written_unix_ms: now_unix_ms };
        replace_file(&self.dir, "checkpoint.json", &serde_json::to_vec(&c).unwrap_or_default())?;
        self.checkpoint = Some(c);
        // A replay starts after the checkpoint: releases at or before it
        // can no longer come again.
        self.released.retain(|r| *r > revision);
        if self.withheld_lines > 2 * (self.withheld.len() + self.released.len()) + 1024 {
            self.compact_withheld()?;
        }
        Ok(())
    }

    /// The withheld revisions not yet released.
    pub fn withheld(&self) -> &BTreeMap<i64, Withheld> {
        &self.withheld
    }

    /// Whether `revision` was withheld and then stored since the
    /// checkpoint: a replay must neither withhold nor store it again.
    pub fn is_released(&self, revision: i64) -> bool {
        self.released.contains(&revision)
    }

    /// Keeps each entry's events out of the segments until
    /// [`Store::store_released`] (durably: `withheld.jsonl` is fsync'd once
    /// for them all before this returns). A revision already withheld, or
    /// released since the checkpoint, is left as it is.
    pub fn withhold(&mut self, entries: Vec<Withheld>) -> Result<(), StoreError> {
        let new: Vec<Withheld> =
            entries.into_iter().filter(|w| !self.withheld.contains_key(&w.revision) && !self.released.contains(&w.revision)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let lines: Vec<WithheldLine> = new.iter().cloned().map(WithheldLine::Withheld).collect();
        self.append_withheld(&lines)?;
        for w in new {
            self.withheld.insert(w.revision, w);
        }
        Ok(())
    }

    /// Appends the events withheld under each of `revisions` to the segment
    /// (one fsync), then marks them released (one more). Returns how many
    /// events were stored (none for a revision withheld under nothing).
    pub fn store_released(&mut self, revisions: &[i64]) -> Result<usize, StoreError> {
        let pending: Vec<i64> = revisions.iter().copied().filter(|r| self.withheld.contains_key(r)).collect();
        let events: Vec<Event> = pending.iter().filter_map(|r| self.withheld.get(r)).flat_map(|w| w.events.iter().cloned()).collect();
        if !events.is_empty() {
            self.write_lines(&events.iter().collect::<Vec<_>>())?;
            let top = events.iter().map(Event::position).max();
            self.last = self.last.max(top);
        }
        self.mark_released(&pending)?;
        Ok(events.len())
    }

    fn mark_released(&mut self, revisions: &[i64]) -> Result<(), StoreError> {
        if revisions.is_empty() {
            return Ok(());
        }
        self.append_withheld(&revisions.iter().map(|r| WithheldLine::Released(*r)).collect::<Vec<_>>())?;
        for r in revisions {
            self.withheld.remove(r);
            self.released.insert(*r);
        }
        Ok(())
    }

    fn append_withheld(&mut self, lines: &[WithheldLine]) -> Result<(), StoreError> {
        let path = self.dir.join(WITHHELD);
        if self.withheld_file.is_none() {
            let f = OpenOptions::new().create(true).append(true).mode(0o600).open(&path).map_err(io(&path))?;
            self.withheld_file = Some(f);
        }
        let mut text = Vec::new();
        for line in lines {
            serde_json::to_writer(&mut text, line).map_err(|e| StoreError::Io { path: path.clone(), error: e.into() })?;
            text.push(b'\n');
        }
        if let Some(f) = self.withheld_file.as_mut() {
            f.write_all(&text).map_err(io(&path))?;
            f.sync_data().map_err(io(&path))?;
        }
        self.withheld_lines += lines.len();
        Ok(())
    }

    /// Rewrites `withheld.jsonl` with only what is still needed: the
    /// withheld revisions and the releases after the checkpoint.
    fn compact_withheld(&mut self) -> Result<(), StoreError> {
        let path = self.dir.join(WITHHELD);
        if self.withheld.is_empty() && self.released.is_empty() {
            self.withheld_file = None;
            self.withheld_lines = 0;
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StoreError::Io { path, error: e }),
                _ => File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io(&self.dir)),
            };
        }
        let mut text = Vec::new();
        let lines = self
            .withheld
            .values()
            .map(|w| WithheldLine::Withheld(w.clone()))
            .chain(self.released.iter().map(|r| WithheldLine::Released(*r)));
        let mut n = 0;
        for line in lines {
            serde_json::to_writer(&mut text, &line).map_err(|e| StoreError::Io { path: path.clone(), error: e.into() })?;
            text.push(b'\n');
            n += 1;
        }
        self.withheld_file = None;
        replace_file(&self.dir, WITHHELD, &text)?;
        self.withheld_lines = n;
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
        self.write_lines(&new)?;
        self.last = self.last.max(new.last().map(|e| e.position()));
        Ok(new.len())
    }

    /// Appends `events` to the current segment (creating the first one if
    /// there is none), then fsyncs.
    fn write_lines(&mut self, events: &[&Event]) -> Result<(), StoreError> {
        if self.segment.is_none() {
            let first = events.first().map_or(0, |e| e.position().0.max(0));
            let path = self.dir.join("segments").join(format!("{first:020}.jsonl"));
            let file = OpenOptions::new().create(true).append(true).mode(0o640).open(&path).map_err(io(&path))?;
            File::open(self.dir.join("segments")).and_then(|d| d.sync_all()).map_err(io(&path))?;
            let len = file.metadata().map_err(io(&path))?.len();
            self.segment = Some((path, file, len));
        }
        let mut text = Vec::with_capacity(events.len() * 256);
        for e in events {
            serde_json::to_writer(&mut text, e).map_err(|e| StoreError::Io { path: self.dir.clone(), error: e.into() })?;
            text.push(b'\n');
        }
        if let Some((path, file, len)) = self.segment.as_mut() {
            file.write_all(&text).map_err(io(path))?;
            file.sync_data().map_err(io(path))?;
            *len += text.len() as u64;
        }
        Ok(())
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

/// The length of the segment's complete, parseable lines and the highest
/// event position in them (a released revision is appended after later
/// ones, so the last line's may be lower). A line that does not parse ends the good part only if
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
                last = last.max(Some(e.position()));
            }
            Err(e) => bad = Some((line_no, e.to_string())),
        }
    }
    let _ = reader.seek(SeekFrom::Start(good));
    Ok((good, last))
}

/// Writes `name` in `dir` atomically, readable by its owner alone:
/// temporary file, fsync, rename, fsync of the directory.
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new().create_new(true).write(true).mode(0o600).open(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// `withheld.jsonl` read back: the withheld revisions, the releases, the line count.
type Loaded = (BTreeMap<i64, Withheld>, BTreeSet<i64>, usize);

/// The withheld revisions of the store in `dir` not yet released, the
/// releases recorded, and the file's line count. A torn last line (a crash
/// mid-write) is ignored: it was never fsync'd, so nothing counted on it.
fn load_withheld(dir: &Path) -> Result<Loaded, StoreError> {
    let path = dir.join(WITHHELD);
    let text = match fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(StoreError::Io { path, error: e }),
    };
    let (mut withheld, mut released, mut lines) = (BTreeMap::new(), BTreeSet::new(), 0);
    let complete = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for (n, line) in text[..complete].split(|b| *b == b'\n').filter(|l| !l.is_empty()).enumerate() {
        match serde_json::from_slice::<WithheldLine>(line) {
            Ok(WithheldLine::Withheld(w)) => {
                released.remove(&w.revision);
                withheld.insert(w.revision, w);
            }
            Ok(WithheldLine::Released(r)) => {
                withheld.remove(&r);
                released.insert(r);
            }
            Err(e) => return Err(StoreError::Corrupt { path: path.clone(), line: n + 1, error: e.to_string() }),
        }
        lines += 1;
    }
    Ok((withheld, released, lines))
}

/// The withheld revisions of the store in `dir` not yet released (for the
/// checkers and tests, which run as root or the tailer's user; readers in
/// group `holdfast-audit` cannot read the file).
pub fn read_withheld(dir: &Path) -> Result<BTreeMap<i64, Withheld>, StoreError> {
    load_withheld(dir).map(|(w, _, _)| w)
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
    let mut events = Vec::new();
    for path in segments_of(dir)? {
        events.extend(read_segment(&path)?);
    }
    events.sort_by_key(Event::position);
    events.dedup_by_key(|e| e.position());
    Ok(events)
}

/// The segment files of the store in `dir`, oldest first.
fn segments_of(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    if !dir.join("segments").is_dir() {
        return Err(StoreError::Io {
            path: dir.to_path_buf(),
            error: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no audit store here (no segments/ directory); is holdfast-tailer running with this store_dir?",
            ),
        });
    }
    segment_paths(dir)
}

/// The complete lines of one segment, in file order (a torn last line is
/// left out).
fn read_segment(path: &Path) -> Result<Vec<Event>, StoreError> {
    let mut events = Vec::new();
    let mut reader = BufReader::new(File::open(path).map_err(io(path))?);
    let mut line = Vec::new();
    let mut line_no = 0;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io(path))?;
        if n == 0 || line.last() != Some(&b'\n') {
            break;
        }
        line_no += 1;
        match serde_json::from_slice::<Event>(&line) {
            Ok(e) => events.push(e),
            Err(e) => return Err(StoreError::Corrupt { path: path.to_path_buf(), line: line_no, error: e.to_string() }),
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Kind;
    use std::os::unix::fs::PermissionsExt;

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

    fn segment_text(dir: &Path) -> String {
        segment_paths(dir).unwrap().iter().map(|p| fs::read_to_string(p).unwrap()).collect()
    }

    fn withheld(revision: i64, events: Vec<Event>) -> Withheld {
        Withheld { revision, events, forced: Vec::new() }
    }

    #[test]
    fn a_withheld_revision_reaches_the_segments_only_when_released_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.append_events(&[ev(5, 0)]).unwrap();
        s.withhold(vec![withheld(6, vec![ev(6, 0), ev(6, 1)])]).unwrap();
        s.append_events(&[ev(7, 0)]).unwrap();
        s.write_checkpoint("0000000000000001", 7, 1).unwrap();
        let positions = |d: &Path| read_events(d).unwrap().iter().map(Event::position).collect::<Vec<_>>();
        assert_eq!(positions(dir.path()), [(5, 0), (7, 0)]);
        assert!(!segment_text(dir.path()).contains("\"revision\":6"), "a withheld revision is in no segment");
        for name in ["checkpoint.json", WITHHELD] {
            let mode = fs::metadata(dir.path().join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name} is the tailer's alone");
        }
        // A restart keeps it withheld.
        drop(s);
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.withheld().keys().copied().collect::<Vec<_>>(), [6]);
        assert_eq!(s.store_released(&[6]).unwrap(), 2);
        assert_eq!(s.store_released(&[6]).unwrap(), 0, "released once");
        s.append_events(&[ev(8, 0)]).unwrap();
        assert_eq!(positions(dir.path()), [(5, 0), (6, 0), (6, 1), (7, 0), (8, 0)]);
        assert_eq!(s.last_position(), Some((8, 0)));
        // A replay from the checkpoint (7) cannot bring 6 again; one from
        // before it is told 6 was stored.
        assert!(s.withheld().is_empty());
        drop(s);
        let mut s = Store::open(dir.path()).unwrap();
        assert!(s.withheld().is_empty());
        assert!(!s.is_released(6), "at or before the checkpoint: forgotten");
        s.withhold(vec![withheld(9, vec![ev(9, 0)])]).unwrap();
        s.store_released(&[9]).unwrap();
        drop(s);
        let mut s = Store::open(dir.path()).unwrap();
        assert!(s.is_released(9), "after the checkpoint: a replay must not store it again");
        s.withhold(vec![withheld(9, vec![ev(9, 0)])]).unwrap();
        assert!(s.withheld().is_empty(), "a released revision is not withheld again");
        s.write_checkpoint("0000000000000001", 9, 2).unwrap();
        assert!(!s.is_released(9));
        let text = segment_text(dir.path());
        assert_eq!(text.lines().count(), 6, "each event once:\n{text}");
    }

    #[test]
    fn a_release_cut_off_by_a_crash_is_found_in_the_segment_and_a_torn_withheld_line_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.append_events(&[ev(5, 0)]).unwrap();
        s.withhold(vec![withheld(6, vec![ev(6, 0)]), withheld(7, vec![ev(7, 0)])]).unwrap();
        s.append_events(&[ev(8, 0)]).unwrap();
        // The crash: 6's events reached the segment, its mark did not.
        s.write_lines(&[&ev(6, 0)]).unwrap();
        drop(s);
        {
            // The last line is 6, but 8 was stored: a replay of 8 is skipped.
            let mut s = Store::open(dir.path()).unwrap();
            assert_eq!(s.last_position(), Some((8, 0)));
            assert_eq!(s.append_events(&[ev(8, 0)]).unwrap(), 0);
        }
        let mut f = OpenOptions::new().append(true).open(dir.path().join(WITHHELD)).unwrap();
        f.write_all(b"{\"released\":").unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        assert_eq!(s.withheld().keys().copied().collect::<Vec<_>>(), [7], "6 was stored; 7 still withheld");
        assert!(s.is_released(6));
        assert_eq!(s.store_released(&[6]).unwrap(), 0);
        s.store_released(&[7]).unwrap();
        let positions: Vec<_> = read_events(dir.path()).unwrap().iter().map(Event::position).collect();
        assert_eq!(positions, [(5, 0), (6, 0), (7, 0), (8, 0)]);
        assert_eq!(segment_text(dir.path()).lines().count(), 4, "nothing twice");
        assert!(read_withheld(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn a_release_torn_by_a_crash_is_completed_when_the_store_opens() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(dir.path()).unwrap();
        s.append_events(&[ev(5, 0)]).unwrap();
        s.withhold(vec![withheld(6, vec![ev(6, 0), ev(6, 1), ev(6, 2)])]).unwrap();
        s.append_events(&[ev(7, 0)]).unwrap();
        // The crash: the first of 6's events reached the segment whole, the
        // rest did not (a torn write), and no mark.
        s.write_lines(&[&ev(6, 0)]).unwrap();
        drop(s);
        let seg = segment_paths(dir.path()).unwrap().pop().unwrap();
        OpenOptions::new().append(true).open(&seg).unwrap().write_all(b"{\"cluster_id\":\"00").unwrap();
        let s = Store::open(dir.path()).unwrap();
        assert!(s.withheld().is_empty() && s.is_released(6));
        let positions: Vec<_> = read_events(dir.path()).unwrap().iter().map(Event::position).collect();
        assert_eq!(positions, [(5, 0), (6, 0), (6, 1), (6, 2), (7, 0)], "6 is stored whole");
        assert_eq!(segment_text(dir.path()).lines().count(), 5, "nothing twice");
    }
}
