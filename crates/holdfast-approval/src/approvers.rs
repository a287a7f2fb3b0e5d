//! `/etc/holdfast/approvers.toml`:
//!
//! ```toml
//! [approver.alice]
//! roles = ["dr-operator", "lock-operator"]
//! keys = ["sk-ssh-ed25519@openssh.com AAAAGnNr... alice@yubikey"]
//! ```
//!
//! Every problem is reported at once, each naming the approver and the fix.

use serde::Deserialize;
use ssh_key::PublicKey;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// A role an approver may hold; each operation needs one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Force-releases a hold.
    LockOperator,
    /// Advances the epoch after a restore.
    DrOperator,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::LockOperator, Role::DrOperator];

    pub fn name(self) -> &'static str {
        match self {
            Role::LockOperator => "lock-operator",
            Role::DrOperator => "dr-operator",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One approver: a person, their roles and their keys.
#[derive(Debug, Clone)]
pub struct Approver {
    pub name: String,
    pub roles: Vec<Role>,
    pub keys: Vec<PublicKey>,
    /// The SPIFFE ID whose grants (`force_release` prefixes) bound which
    /// keys this person may request or approve a force-release of. A
    /// lock-operator without one can approve none.
    pub identity: Option<String>,
}

/// Every approver, by name.
#[derive(Debug, Clone, Default)]
pub struct Approvers {
    pub approvers: BTreeMap<String, Approver>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    approver: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    roles: Vec<String>,
    keys: Vec<String>,
    #[serde(default)]
    identity: Option<String>,
}

/// Why an approvers file was refused: every problem found.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {} problem(s):\n  {}", problems.len(), problems.join("\n  "))]
pub struct ApproversError {
    pub path: String,
    pub problems: Vec<String>,
}

/// An approver name: lower-case letters, digits, `-`, `_` and `.`.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

impl Approvers {
    pub fn load(path: &Path) -> Result<Self, ApproversError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ApproversError { path: path.display().to_string(), problems: vec![format!("cannot read the file ({e})")] })?;
        Self::from_text(path, &text)
    }

    /// [`Approvers::parse`] of the text read from `path` (by a reader that
    /// checked the file first), the error naming the file.
    pub fn from_text(path: &Path, text: &str) -> Result<Self, ApproversError> {
        Self::parse(text).map_err(|problems| ApproversError { path: path.display().to_string(), problems })
    }

    /// Parses and validates the file's text; `Err` lists every problem.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let file: File = toml::from_str(text).map_err(|e| vec![e.to_string().trim().to_string()])?;
        let mut problems = Vec::new();
        let mut out = Approvers::default();
        let mut owner_of: BTreeMap<String, String> = BTreeMap::new();
        if file.approver.len() < 2 {
            problems.push(format!(
                "{} approver(s) listed; two-person operations need at least two (add [approver.NAME] tables)",
                file.approver.len()
            ));
        }
        for (name, entry) in file.approver {
            if !valid_name(&name) {
                problems.push(format!("approver {name:?}: use lower-case letters, digits, '-', '_' or '.'"));
            }
            let mut roles = Vec::new();
            for r in &entry.roles {
                match Role::parse(r) {
                    Some(role) if !roles.contains(&role) => roles.push(role),
                    Some(_) => problems.push(format!("approver {name}: role {r:?} is listed twice")),
                    None => problems.push(format!(
                        "approver {name}: unknown role {r:?}; the roles are {}",
                        Role::ALL.map(|r| format!("{:?}", r.name())).join(", ")
                    )),
                }
            }
            if entry.roles.is_empty() {
                problems.push(format!("approver {name}: no roles; give them \"lock-operator\" and/or \"dr-operator\""));
            }
            let mut keys = Vec::new();
            for (i, k) in entry.keys.iter().enumerate() {
                match PublicKey::from_openssh(k.trim()) {
                    Ok(key) => {
                        let fingerprint = key.fingerprint(Default::default()).to_string();
                        if let Some(other) = owner_of.insert(fingerprint.clone(), name.clone()) {
                            problems.push(format!(
                                "approver {name}: key {} ({fingerprint}) is also {other}'s; a key must name one person",
                                i + 1
                            ));
                        }
                        keys.push(key);
                    }
                    Err(e) => problems.push(format!(
                        "approver {name}: key {} is not an OpenSSH public key ({e}); paste one line of `ssh-keygen -y -f KEY` or the .pub file",
                        i + 1
                    )),
                }
            }
            if entry.keys.is_empty() {
                problems.push(format!("approver {name}: no keys; add their OpenSSH public key (a FIDO2 sk-ssh-ed25519 key is best)"));
            }
            if let Some(id) = &entry.identity
                && (!id.starts_with("spiffe://") || id.len() <= "spiffe://".len())
            {
                problems.push(format!(
                    "approver {name}: identity {id:?} is not a SPIFFE ID; give the spiffe://TRUST-DOMAIN/PATH whose force_release grants bound what they may release"
                ));
            }
            out.approvers.insert(name.clone(), Approver { name, roles, keys, identity: entry.identity });
        }
        if problems.is_empty() { Ok(out) } else { Err(problems) }
    }

    /// The approver whose listed key this is.
    pub fn owner(&self, key: &ssh_key::public::KeyData) -> Option<&Approver> {
        self.approvers.values().find(|a| a.keys.iter().any(|k| k.key_data() == key))
    }
}
