//! Where the policy directory's files came from: the HEAD commit of the Git
//! checkout it is in, read from `.git` directly (no git binary, no library).

use std::path::{Path, PathBuf};

/// The HEAD commit (40 or 64 hex digits) of the Git checkout containing
/// `dir`, if there is one and HEAD resolves. Edits not yet committed are not
/// reflected: it names the commit checked out, not the files' exact state.
pub fn head_commit(dir: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let git_dir = dir.ancestors().find_map(git_dir_at)?;
    // A linked worktree keeps its HEAD in its own git dir and the refs in
    // the common one.
    let common = match std::fs::read_to_string(git_dir.join("commondir")) {
        Ok(c) => git_dir.join(c.trim()),
        Err(_) => git_dir.clone(),
    };
    let head = std::fs::read_to_string(git_dir.join("HEAD")).ok()?;
    let head = head.trim();
    let Some(reference) = head.strip_prefix("ref:").map(str::trim) else {
        return is_object_id(head).then(|| head.to_string());
    };
    for base in [&git_dir, &common] {
        if let Ok(id) = std::fs::read_to_string(base.join(reference)) {
            let id = id.trim();
            if is_object_id(id) {
                return Some(id.to_string());
            }
        }
    }
    let packed = std::fs::read_to_string(common.join("packed-refs")).ok()?;
    packed.lines().filter(|l| !l.starts_with('#') && !l.starts_with('^')).find_map(|l| {
        let (id, name) = l.split_once(' ')?;
        (name.trim() == reference && is_object_id(id)).then(|| id.to_string())
    })
}

/// `DIR/.git` as a directory, or the directory a `.git` file points to
/// (`gitdir: PATH`, as in worktrees and submodules).
fn git_dir_at(dir: &Path) -> Option<PathBuf> {
    let dot_git = dir.join(".git");
    if dot_git.is_dir() {
        return Some(dot_git);
    }
    let text = std::fs::read_to_string(&dot_git).ok()?;
    let target = text.trim().strip_prefix("gitdir:")?.trim();
    Some(dir.join(target))
}

fn is_object_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef01234567";
    const B: &str = "89abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn reads_loose_packed_and_detached_heads() {
        let t = tempfile::tempdir().unwrap();
        let policy = t.path().join("etc/holdfast");
        std::fs::create_dir_all(&policy).unwrap();
        assert_eq!(head_commit(&policy), None, "not a checkout");
        let git = t.path().join(".git");
        std::fs::create_dir_all(git.join("refs/heads")).unwrap();
        std::fs::write(git.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(git.join("packed-refs"), format!("# pack-refs with: peeled\n{B} refs/heads/main\n")).unwrap();
        assert_eq!(head_commit(&policy).as_deref(), Some(B), "packed ref");
        std::fs::write(git.join("refs/heads/main"), format!("{A}\n")).unwrap();
        assert_eq!(head_commit(&policy).as_deref(), Some(A), "loose ref wins");
        std::fs::write(git.join("HEAD"), format!("{B}\n")).unwrap();
        assert_eq!(head_commit(&policy).as_deref(), Some(B), "detached");
        std::fs::write(git.join("HEAD"), "ref: refs/heads/none\n").unwrap();
        assert_eq!(head_commit(&policy), None, "unborn branch");
    }

    #[test]
    fn follows_a_gitdir_file() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("repo.git/worktrees/w");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("HEAD"), "ref: refs/heads/w\n").unwrap();
        std::fs::write(real.join("commondir"), "../..\n").unwrap();
        std::fs::create_dir_all(t.path().join("repo.git/refs/heads")).unwrap();
        std::fs::write(t.path().join("repo.git/refs/heads/w"), A).unwrap();
        let work = t.path().join("w");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join(".git"), format!("gitdir: {}\n", real.display())).unwrap();
        assert_eq!(head_commit(&work).as_deref(), Some(A));
    }
}
