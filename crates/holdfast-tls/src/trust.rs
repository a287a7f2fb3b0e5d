//! Owner and mode checks for trust material: CA bundles, certificates,
//! private keys and `approvers.toml`, at load and at every reload, by the
//! rule OpenSSH's `StrictModes` applies to `authorized_keys`.
//!
//! - The owner is root or the user this process runs as: anyone else who
//!   owns a trust file can rewrite it.
//! - No trust file is writable by its group or by others: whoever could
//!   write it could add a CA, a key or an approver.
//! - A private key is not readable by others either. Its group may read it
//!   (`root:holdfast-arbiter 0640` is how packages hand a key to the one
//!   daemon that uses it).
//!
//! The checks run on the open file (`fstat`), so what was checked is what
//! is read. A refusal says what to change.
//!
//! Under systemd a unit may receive a file by `LoadCredential=NAME:PATH`
//! instead: when `$CREDENTIALS_DIRECTORY/NAME` exists for the file name of
//! a configured path, that copy is read ([`credential`]). The config keeps
//! the real path, so `check` run by root reads the real file.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a file is, for the rule that applies to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A CA bundle, a certificate, `approvers.toml`: anyone may read it.
    Public,
    /// A private key: its owner and group only.
    Secret,
}

/// Why a trust file is not safe to use, or `None`: `uid` and `mode` are
/// the file's, `me` the effective user of this process.
pub fn problem(path: &Path, kind: Kind, uid: u32, mode: u32, me: u32) -> Option<String> {
    let p = path.display();
    let mode = mode & 0o7777;
    if uid != 0 && uid != me {
        return Some(format!(
            "is owned by uid {uid}, not by root or by the user this runs as (uid {me}); whoever owns it can rewrite it: \
             `chown root {p}` (or this user)"
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!("is writable by its group or by others (mode {mode:04o}); `chmod go-w {p}`"));
    }
    if kind == Kind::Secret && mode & 0o007 != 0 {
        return Some(format!("is a private key open to others (mode {mode:04o}); `chmod o-rwx {p}`"));
    }
    None
}

/// Why a trust file failed: it could not be read, or it is not safe.
#[derive(Debug)]
pub enum Refused {
    Io(std::io::Error),
    Insecure(String),
}

/// The copy of `path` that systemd handed this process by `LoadCredential=`:
/// the file of the same name in `$CREDENTIALS_DIRECTORY`, if there is one.
pub fn credential(path: &Path) -> Option<PathBuf> {
    credential_in(std::env::var_os("CREDENTIALS_DIRECTORY").as_deref(), path)
}

fn credential_in(dir: Option<&OsStr>, path: &Path) -> Option<PathBuf> {
    let copy = Path::new(dir?).join(path.file_name()?);
    copy.is_file().then_some(copy)
}

/// Opens `path` (or its [`credential`] copy), checks its owner and mode on
/// the open file, and reads it. A file this user may not open says how to
/// hand it to this user alone.
pub fn read(path: &Path, kind: Kind) -> Result<Vec<u8>, Refused> {
    let copy = credential(path);
    let path = copy.as_deref().unwrap_or(path);
    let mut file = std::fs::File::open(path).map_err(|e| Refused::Io(explain(e, path, kind)))?;
    let meta = file.metadata().map_err(Refused::Io)?;
    if let Some(why) = problem(path, kind, meta.uid(), meta.mode(), nix::unistd::geteuid().as_raw()) {
        return Err(Refused::Insecure(why));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).map_err(Refused::Io)?;
    Ok(bytes)
}

/// A permission error on a key names the fix: each daemon reads its own
/// keys through its own group (`root:holdfast-arbiter 0640`).
fn explain(e: std::io::Error, path: &Path, kind: Kind) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::PermissionDenied || kind != Kind::Secret {
        return e;
    }
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name);
    let user = user.unwrap_or_else(|| format!("uid {}", nix::unistd::geteuid()));
    std::io::Error::new(
        e.kind(),
        format!(
            "{e}; this runs as {user}: hand the key to this user alone, `chown root:{user} {p} && chmod 0640 {p}`, \
             or by systemd's LoadCredential=",
            p = path.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_and_mode_rules() {
        let p = Path::new("/etc/holdfast/tls/arbiter-key.pem");
        let ok = |kind, uid, mode| problem(p, kind, uid, mode, 998).is_none();
        // Root or this user own it; group may read a key, nobody else.
        assert!(ok(Kind::Secret, 0, 0o640) && ok(Kind::Secret, 998, 0o600) && ok(Kind::Secret, 0, 0o400));
        assert!(ok(Kind::Public, 0, 0o644) && ok(Kind::Public, 998, 0o444));
        // Another owner; group or other write; a key others may read.
        let owner = problem(p, Kind::Public, 1000, 0o644, 998).unwrap();
        assert!(owner.contains("owned by uid 1000") && owner.contains("chown root"), "{owner}");
        for mode in [0o664, 0o646, 0o660, 0o602] {
            let why = problem(p, Kind::Secret, 0, mode, 998).unwrap();
            assert!(why.contains("chmod go-w"), "{mode:o}: {why}");
        }
        let open = problem(p, Kind::Secret, 0, 0o644, 998).unwrap();
        assert!(open.contains("mode 0644") && open.contains("chmod o-rwx /etc/holdfast/tls/arbiter-key.pem"), "{open}");
        assert!(problem(p, Kind::Secret, 0, 0o604, 998).is_some());
        // File type bits are not mode bits.
        assert!(ok(Kind::Secret, 0, 0o100600));
    }

    #[test]
    fn a_credential_of_the_same_name_is_read_in_place_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = Path::new("/etc/holdfast/tls/etcd-tailer-key.pem");
        assert_eq!(credential_in(None, key), None);
        assert_eq!(credential_in(Some(dir.path().as_os_str()), key), None, "no such credential");
        std::fs::write(dir.path().join("etcd-tailer-key.pem"), "k").unwrap();
        assert_eq!(credential_in(Some(dir.path().as_os_str()), key), Some(dir.path().join("etcd-tailer-key.pem")));
        assert_eq!(credential_in(Some(dir.path().as_os_str()), Path::new("/")), None, "a path without a file name");
    }
}
