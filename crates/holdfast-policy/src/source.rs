//! Reading a policy directory: `DIR/classes.d/*.toml` and `DIR/grants.d/*.toml`.

use std::path::{Path, PathBuf};

/// The usual policy directory on a host.
pub const DEFAULT_DIR: &str = "/etc/holdfast";
pub const CLASSES_DIR: &str = "classes.d";
pub const GRANTS_DIR: &str = "grants.d";

/// One file's name (as it will appear in problems) and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// The path as read, e.g. `/etc/holdfast/classes.d/payments.toml`.
    pub name: String,
    /// The text, or why it is not text (not UTF-8).
    pub text: Result<String, String>,
}

impl SourceFile {
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        SourceFile { name: name.into(), text: Ok(text.into()) }
    }
}

/// The class and grant files of one policy directory, each list in file
/// name order (so duplicates are reported at the later file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub classes: Vec<SourceFile>,
    pub grants: Vec<SourceFile>,
    /// Files in `classes.d/` or `grants.d/` that were not read because their
    /// name does not end in `.toml` (or starts with `.`).
    pub ignored: Vec<String>,
}

/// A policy directory that cannot be read at all (exit 78, not a problem in
/// the set).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {path}: {source}; pass the directory that holds classes.d/ and grants.d/ (e.g. {DEFAULT_DIR})")]
    Unreadable { path: String, source: std::io::Error },
    #[error(
        "{path} is missing; a policy directory holds classes.d/ and grants.d/ (either may be empty): create it, or pass the right directory"
    )]
    Missing { path: String },
}

impl Sources {
    /// Reads `dir/classes.d/*.toml` and `dir/grants.d/*.toml`. Both
    /// subdirectories must exist (a misspelt one would otherwise read as an
    /// empty set).
    pub fn read(dir: &Path) -> Result<Sources, LoadError> {
        // Only the two subdirectories are listed: the daemon's user may
        // pass through `dir` (0711 in packages) without listing it.
        let source = match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => None,
            Ok(_) => Some(std::io::Error::from(std::io::ErrorKind::NotADirectory)),
            Err(e) => Some(e),
        };
        if let Some(source) = source {
            return Err(LoadError::Unreadable { path: dir.display().to_string(), source });
        }
        let mut sources = Sources::default();
        sources.classes = read_subdir(&dir.join(CLASSES_DIR), &mut sources.ignored)?;
        sources.grants = read_subdir(&dir.join(GRANTS_DIR), &mut sources.ignored)?;
        Ok(sources)
    }
}

fn read_subdir(dir: &Path, ignored: &mut Vec<String>) -> Result<Vec<SourceFile>, LoadError> {
    let unreadable = |path: &Path, source| LoadError::Unreadable { path: path.display().to_string(), source };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(LoadError::Missing { path: format!("{}/", dir.display()) }),
        Err(e) => return Err(unreadable(dir, e)),
    };
    let mut paths: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
        let path = entry.path();
        // Follows symlinks: a deployed file may be a link into a checkout.
        if path.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".toml") && !name.starts_with('.') {
            paths.push(path);
        } else {
            ignored.push(path.display().to_string());
        }
    }
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let bytes = std::fs::read(&path).map_err(|e| unreadable(&path, e))?;
        let text = String::from_utf8(bytes).map_err(|e| format!("is not UTF-8 text ({e}); save it as UTF-8"));
        files.push(SourceFile { name: path.display().to_string(), text });
    }
    Ok(files)
}
