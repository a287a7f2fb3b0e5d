//! The spool of unprotected grants: every grant, release and end of a hold
//! made from memory while etcd was out of reach ([`crate::unprotected`]),
//! on this arbiter's own disk, until it is shipped to the audit store.
//!
//! `<state_dir>/unprotected.spool` is a sequence of records, each
//! `length (u32 LE) | CRC-32C of the payload (u32 LE) | payload (JSON)`,
//! appended and fsync'd before the grant it records is answered: a grant
//! the client saw is on disk. Opening the spool reads every record back:
//!
//! - a record cut short at the end of the file (a crash during an append
//!   that was never answered) is cut off, and said so in the log;
//! - a checksum mismatch in the last record is the same torn append;
//! - a mismatch or a cut with records after it is damage, not a torn
//!   append: the arbiter refuses to start and names the offset, rather than
//!   drop what follows.
//!
//! The spool is bounded (`fail_open.spool_max_bytes`). A grant is admitted
//! only if its record and the record that will end it both fit, counting
//! the ends reserved for holds still open, so a release or an expiry is
//! never refused for want of room and nothing already spooled is dropped.
//!
//! Each spool has an ID, chosen when its first record is written and
//! carried by every record; with the sequence number it names a record
//! uniquely, which is what makes shipping exactly-once across crashes.

pub use holdfast_model::spool::{Entry, Event, read_records};
use holdfast_model::spool::{HEADER, encode_record};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The spool's file name under `state_dir`.
pub const FILE: &str = "unprotected.spool";

/// Why a record was not spooled.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error(
        "the fail-open spool {path} is full ({used} of {max} bytes, {reserved} reserved for holds still open): \
         open-class grants are refused until etcd is back and the spool is shipped; raise fail_open.spool_max_bytes for longer outages"
    )]
    Full { path: String, used: u64, reserved: u64, max: u64 },
    #[error("writing the fail-open spool {path}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// The open spool file.
pub struct Spool {
    path: PathBuf,
    file: File,
    /// Bytes of whole records in the file.
    len: u64,
    max: u64,
    /// Bytes set aside for the ends of holds still open.
    reserved: u64,
    id: String,
    next_seq: u64,
}

impl Spool {
    /// Opens (or creates) the spool in `state_dir`, checking every record;
    /// also returns the records found.
    pub fn open(state_dir: &Path, max: u64) -> Result<(Spool, Vec<Entry>), String> {
        let path = state_dir.join(FILE);
        let shown = path.display().to_string();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode_0600()
            .open(&path)
            .map_err(|e| format!("opening the fail-open spool {shown}: {e}"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| format!("reading the fail-open spool {shown}: {e}"))?;
        let (entries, good) = read_records(&bytes).map_err(|e| format!("the fail-open spool {shown} is damaged: {e}"))?;
        if good < bytes.len() as u64 {
            tracing::warn!(
                spool = %shown,
                cut = bytes.len() as u64 - good,
                "the fail-open spool ended in a torn append (a crash before it was answered); cutting it off"
            );
            file.set_len(good).map_err(|e| format!("cutting the torn end off {shown}: {e}"))?;
            file.sync_all().map_err(|e| format!("syncing {shown}: {e}"))?;
        }
        file.seek(SeekFrom::End(0)).map_err(|e| format!("{shown}: {e}"))?;
        let id = entries.first().map_or_else(new_id, |e| e.spool.clone());
        let next_seq = entries.last().map_or(1, |e| e.seq + 1);
        let spool = Spool { path, file, len: good, max, reserved: 0, id, next_seq };
        Ok((spool, entries))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of records in the spool.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a grant, fsync'd, if it and its end both fit with every
    /// end already reserved; reserves room for its end.
    pub fn grant(&mut self, mut entry: Entry) -> Result<Entry, SpoolError> {
        entry.event = Event::Grant;
        // The longest end: "release" with the longest reason, and room for
        // the sequence number to grow by a few digits before it is written.
        let end = self.size_of(&Entry { event: Event::Release, why: "quorum_back".into(), ..entry.clone() }) + 4;
        let this = self.size_of(&entry);
        if self.len + self.reserved + this + end > self.max {
            return Err(SpoolError::Full { path: self.path.display().to_string(), used: self.len, reserved: self.reserved, max: self.max });
        }
        let e = self.append(entry)?;
        self.reserved += end;
        Ok(e)
    }

    /// Appends the end of a hold granted by [`Spool::grant`] (its release,
    /// or its end), fsync'd, into the room its grant reserved.
    pub fn end(&mut self, entry: Entry) -> Result<Entry, SpoolError> {
        let size = self.size_of(&entry);
        let e = self.append(entry)?;
        self.reserved = self.reserved.saturating_sub(size);
        Ok(e)
    }

    /// The size of `entry`'s record once numbered.
    fn size_of(&self, entry: &Entry) -> u64 {
        let numbered = Entry { spool: self.id.clone(), seq: self.next_seq, ..entry.clone() };
        HEADER + serde_json::to_vec(&numbered).map_or(0, |v| v.len() as u64)
    }

    fn append(&mut self, entry: Entry) -> Result<Entry, SpoolError> {
        let io = |error| SpoolError::Io { path: self.path.display().to_string(), error };
        let entry = Entry { spool: self.id.clone(), seq: self.next_seq, ..entry };
        let record = encode_record(&entry);
        let written = self.file.write_all(&record).and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // Whatever part was written is not a record: cut it off, so the
            // next append does not follow a torn one.
            let _ = self.file.set_len(self.len);
            return Err(io(e));
        }
        self.len += record.len() as u64;
        self.next_seq += 1;
        Ok(entry)
    }

    /// Every record in the spool now, and the length they end at.
    pub fn records(&self) -> Result<(Vec<Entry>, u64), String> {
        use std::os::unix::fs::FileExt;
        let shown = self.path.display().to_string();
        let mut bytes = vec![0; self.len as usize];
        self.file.read_exact_at(&mut bytes, 0).map_err(|e| format!("reading the fail-open spool {shown}: {e}"))?;
        let (entries, _) = read_records(&bytes).map_err(|e| format!("the fail-open spool {shown} is damaged: {e}"))?;
        Ok((entries, self.len))
    }

    /// Empties the spool if it still ends at `len` (nothing was appended
    /// since its records were shipped): true if it did.
    pub fn shipped_up_to(&mut self, len: u64) -> Result<bool, String> {
        if self.len != len {
            return Ok(false);
        }
        self.shipped().map(|()| true)
    }

    /// Empties the spool once every record has been shipped, and starts a
    /// new one (a new ID) for the next outage.
    pub fn shipped(&mut self) -> Result<(), String> {
        let shown = self.path.display().to_string();
        self.file.set_len(0).map_err(|e| format!("emptying the shipped spool {shown}: {e}"))?;
        self.file.sync_all().map_err(|e| format!("syncing {shown}: {e}"))?;
        self.len = 0;
        self.id = new_id();
        self.next_seq = 1;
        Ok(())
    }
}

/// The grants in `entries` that no later record of the same spool ends:
/// holds still open when the spool was last written.
pub fn open_grants(entries: &[Entry]) -> Vec<Entry> {
    let mut open: Vec<Entry> = Vec::new();
    for e in entries {
        match e.event {
            Event::Grant => open.push(e.clone()),
            Event::Release | Event::End => open.retain(|g| !(g.session == e.session && g.namespace == e.namespace && g.key == e.key)),
        }
    }
    open
}

fn new_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

trait Mode0600 {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Mode0600 for OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.mode(0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str) -> Entry {
        Entry {
            spool: String::new(),
            seq: 0,
            event: Event::Grant,
            at_unix_ms: 1_700_000_000_000,
            cluster: "local".into(),
            namespace: "cache".into(),
            key: key.into(),
            class: "cache-warm".into(),
            identity: "spiffe://example.org/warmer".into(),
            session: 7,
            why: String::new(),
        }
    }

    #[test]
    fn records_are_read_back_in_order_with_one_spool_id_and_consecutive_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, found) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert!(found.is_empty() && s.is_empty());
        s.grant(entry("a")).unwrap();
        s.end(Entry { event: Event::Release, ..entry("a") }).unwrap();
        s.grant(entry("b")).unwrap();
        drop(s);
        let (s, found) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            found.iter().map(|e| (e.seq, e.event, e.key.as_str())).collect::<Vec<_>>(),
            [(1, Event::Grant, "a"), (2, Event::Release, "a"), (3, Event::Grant, "b")]
        );
        assert!(found.iter().all(|e| e.spool == found[0].spool && e.spool.len() == 16));
        assert_eq!(s.next_seq, 4, "numbering goes on after a restart");
        let mode = std::fs::metadata(dir.path().join(FILE)).unwrap().permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600, "the arbiter's alone");
    }

    #[test]
    fn a_torn_last_append_is_cut_off_and_damage_before_the_end_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        s.grant(entry("a")).unwrap();
        s.grant(entry("b")).unwrap();
        let whole = s.len();
        drop(s);
        let path = dir.path().join(FILE);
        let good = std::fs::read(&path).unwrap();
        // A crash part-way through a third append.
        let mut torn = good.clone();
        torn.extend_from_slice(&[40, 0, 0, 0, 1, 2, 3, 4, b'{']);
        std::fs::write(&path, &torn).unwrap();
        let (s, found) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!((found.len(), s.len()), (2, whole));
        assert_eq!(std::fs::read(&path).unwrap(), good, "the torn bytes are cut off the file");
        drop(s);
        // A whole last record whose checksum does not match: torn too.
        let mut bad_last = good.clone();
        let n = bad_last.len();
        bad_last[n - 2] ^= 1;
        std::fs::write(&path, &bad_last).unwrap();
        assert_eq!(Spool::open(dir.path(), 1 << 20).unwrap().1.len(), 1);
        // A flipped byte in the first record, with a record after it: damage.
        let mut damaged = good.clone();
        damaged[12] ^= 1;
        std::fs::write(&path, &damaged).unwrap();
        let e = Spool::open(dir.path(), 1 << 20).err().expect("refused");
        assert!(e.contains("is damaged: record at byte 0: checksum mismatch, with records after it"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), damaged, "a damaged spool is left as it is");
    }

    #[test]
    fn a_full_spool_refuses_grants_but_always_has_room_for_the_ends_of_open_holds() {
        let dir = tempfile::tempdir().unwrap();
        let one = {
            let (mut s, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            s.grant(entry("k0")).unwrap();
            let one = s.len() + s.reserved;
            s.shipped().unwrap();
            one
        };
        // Room for three grants and their ends, and a little over.
        let max = 3 * one + 10;
        let (mut s, _) = Spool::open(dir.path(), max).unwrap();
        for k in ["k1", "k2", "k3"] {
            s.grant(entry(k)).unwrap();
        }
        let e = s.grant(entry("k4")).expect_err("full");
        assert!(matches!(e, SpoolError::Full { .. }), "{e}");
        assert!(e.to_string().contains("open-class grants are refused until etcd is back and the spool is shipped"), "{e}");
        // Every open hold can still end, and nothing spooled was dropped.
        for k in ["k1", "k2", "k3"] {
            s.end(Entry { event: Event::End, why: "quorum_back".into(), ..entry(k) }).unwrap();
        }
        assert!(s.len() <= max);
        drop(s);
        let (_, found) = Spool::open(dir.path(), max).unwrap();
        assert_eq!(found.len(), 6);
        assert_eq!(found.iter().filter(|e| e.event == Event::Grant).count(), 3);
    }

    #[test]
    fn a_shipped_spool_starts_again_empty_under_a_new_id() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        let first = s.grant(entry("a")).unwrap();
        s.shipped().unwrap();
        let second = s.grant(entry("a")).unwrap();
        assert_eq!(second.seq, 1);
        assert_ne!(first.spool, second.spool);
        drop(s);
        assert_eq!(Spool::open(dir.path(), 1 << 20).unwrap().1, vec![second]);
    }
}
