//! etcd users and roles: one per tool, each limited to the key ranges it
//! needs (docs/security.md, "etcd roles"). etcd runs with `--client-cert-auth` and
//! `auth enable`; a client's etcd user is the common name (CN) of its
//! client certificate, so no tool holds a password. [`ROLES`] is the one
//! table of who may touch what; [`ensure`] makes a cluster match it
//! (`holdfastctl etcd roles`), idempotently.

use etcd_client::{Client, Permission, PermissionType, UserAddOptions};
use holdfast_model::layout;
use std::fmt;

/// A key range of a permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// One key.
    Key(&'static str),
    /// Every key starting with this.
    Prefix(&'static str),
    /// Keys from the first up to (not including) the second.
    Between(&'static str, &'static str),
    /// Every key.
    All,
}

impl Range {
    /// The `(key, range_end)` etcd stores for this range.
    pub fn bounds(self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Range::Key(k) => (k.as_bytes().to_vec(), Vec::new()),
            Range::Prefix(p) => (p.as_bytes().to_vec(), prefix_end(p.as_bytes())),
            Range::Between(a, b) => (a.as_bytes().to_vec(), b.as_bytes().to_vec()),
            Range::All => (vec![0], vec![0]),
        }
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Range::Key(k) => write!(f, "{k}"),
            Range::Prefix(p) => write!(f, "{p}*"),
            Range::Between(a, b) => write!(f, "[{a}, {b})"),
            Range::All => write!(f, "every key"),
        }
    }
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One tool's role (and its user, of the same name).
#[derive(Debug, Clone, Copy)]
pub struct Role {
    pub name: &'static str,
    /// Who uses it, for the book (docs/security.md) and `holdfastctl etcd roles`.
    pub used_by: &'static str,
    pub read: &'static [Range],
    pub read_write: &'static [Range],
}

/// Everything `/l/` up to `/s0`: holds, durable waiters and session records
/// (the arbiter's expiry and quota watches cover this one range).
const LOCK_SPACE: Range = Range::Between(layout::HOLD_PREFIX, "/s0");

pub const ARBITER: Role = Role {
    name: "holdfast-arbiter",
    used_by: "holdfast-arbiter: grants, releases, sessions, waiters, withdrawal and close markers, the seal and the restore floor, shipped fail-open spools; reads the drain markers each grant compares",
    read: &[LOCK_SPACE, Range::Key(layout::EPOCH_KEY), Range::Key(layout::POLICY_KEY), Range::Prefix(layout::DRAIN_PREFIX)],
    read_write: &[
        Range::Prefix(layout::HOLD_PREFIX),
        Range::Prefix(layout::WAITER_PREFIX),
        Range::Prefix(layout::SESSION_PREFIX),
        Range::Prefix(layout::WITHDRAWN_PREFIX),
        Range::Prefix(layout::CLOSED_PREFIX),
        Range::Prefix(layout::UNPROTECTED_PREFIX),
        Range::Key(layout::SEAL_KEY),
        Range::Key(layout::WATERMARK_KEY),
    ],
};

pub const CONTROLLER: Role = Role {
    name: "holdfast-controller",
    used_by: "holdfast-controller: publishes the class set, reports refusals, elects one active controller, reads pause-test results",
    read: &[Range::Prefix(layout::PAUSETEST_PREFIX)],
    read_write: &[Range::Key(layout::POLICY_KEY), Range::Key(layout::POLICY_STATUS_KEY), Range::Prefix(layout::CONTROLLER_ELECTION)],
};

pub const TAILER: Role = Role {
    name: "holdfast-tailer",
    used_by: "holdfast-tailer: reads the whole key space and its revision stream, elects one active tailer",
    read: &[Range::All],
    read_write: &[Range::Prefix(layout::TAILER_ELECTION)],
};

pub const PAUSETEST: Role = Role {
    name: "holdfast-pausetest",
    used_by: "holdfast-pausetest: records pause-test results",
    read: &[],
    read_write: &[Range::Prefix(layout::PAUSETEST_PREFIX)],
};

pub const EPOCH: Role = Role {
    name: "holdfast-epoch",
    used_by: "holdfastctl epoch init and the two-person epoch advance: writes /sys/epoch and raises the allocator /sys/epochs, ends every hold and session of the old epoch, records the request's nonce",
    read: &[],
    read_write: &[
        Range::Key(layout::EPOCH_KEY),
        Range::Key(layout::EPOCHS_KEY),
        Range::Key(layout::INIT_PAD_KEY),
        Range::Key(layout::SEAL_KEY),
        Range::Key(layout::WATERMARK_KEY),
        Range::Prefix(layout::HOLD_PREFIX),
        Range::Prefix(layout::WAITER_PREFIX),
        Range::Prefix(layout::SESSION_PREFIX),
        Range::Prefix(layout::WITHDRAWN_PREFIX),
        Range::Prefix(layout::NONCE_PREFIX),
    ],
};

pub const FORCE_RELEASE: Role = Role {
    name: "holdfast-force-release",
    used_by: "holdfastctl force-release: reads holds and the class set, deletes one hold, writes the force record and the request's nonce, revokes the holder's session (etcd has no delete-only permission: the range is read-write)",
    read: &[Range::Key(layout::POLICY_KEY)],
    read_write: &[
        LOCK_SPACE,
        Range::Prefix(layout::WITHDRAWN_PREFIX),
        Range::Prefix(layout::CLOSED_PREFIX),
        Range::Prefix(layout::FORCE_PREFIX),
        Range::Prefix(layout::NONCE_PREFIX),
    ],
};

pub const SHARD: Role = Role {
    name: "holdfast-shard",
    used_by: "holdfastctl shard init|add|remove|assign|segments: creates the shard map and edits its desired layout (on the coord cluster)",
    read: &[],
    read_write: &[Range::Key(layout::SHARDMAP_KEY)],
};

pub const OBSERVER: Role = Role {
    name: "holdfast-observer",
    used_by: "holdfastctl status and epoch status: reads /sys/ (class set, epoch, seal, controller leader), never a hold",
    read: &[Range::Prefix("/sys/")],
    read_write: &[],
};

/// Every role, in the order `holdfastctl etcd roles` prints them.
pub const ROLES: [Role; 8] = [ARBITER, CONTROLLER, TAILER, PAUSETEST, EPOCH, FORCE_RELEASE, SHARD, OBSERVER];

/// etcd's administrator: needed to enable auth, manage roles, take snapshots.
pub const ROOT: &str = "root";

impl Role {
    /// The permissions etcd should hold for this role, as (type, key, end).
    pub fn permissions(&self) -> Vec<(i32, Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        for (ranges, kind) in [(self.read, PermissionType::Read), (self.read_write, PermissionType::Readwrite)] {
            for r in ranges {
                let (key, end) = r.bounds();
                out.push((kind as i32, key, end));
            }
        }
        out
    }
}

/// One change [`ensure`] made (or found unnecessary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    RoleCreated(&'static str),
    Granted { role: &'static str, range: String },
    Revoked { role: &'static str, range: String },
    UserCreated(String),
    UserGranted { user: String, role: String },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::RoleCreated(r) => write!(f, "created role {r}"),
            Change::Granted { role, range } => write!(f, "granted {role} {range}"),
            Change::Revoked { role, range } => write!(f, "revoked from {role} {range} (not in the table)"),
            Change::UserCreated(u) => write!(f, "created user {u} (no password: it authenticates by the CN of its client certificate)"),
            Change::UserGranted { user, role } => write!(f, "granted role {role} to user {user}"),
        }
    }
}

fn already_exists(e: &etcd_client::Error) -> bool {
    e.to_string().contains("already exists")
}

fn not_found(e: &etcd_client::Error) -> bool {
    e.to_string().contains("not found")
}

fn permission_type(kind: i32) -> PermissionType {
    match kind {
        0 => PermissionType::Read,
        1 => PermissionType::Write,
        _ => PermissionType::Readwrite,
    }
}

fn describe(kind: i32, key: &[u8], end: &[u8]) -> String {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let kind = match permission_type(kind) {
        PermissionType::Read => "read",
        PermissionType::Write => "write",
        PermissionType::Readwrite => "readwrite",
    };
    match (key, end) {
        ([0], [0]) => format!("{kind} every key"),
        (_, []) => format!("{kind} {}", text(key)),
        _ if end == prefix_end(key) => format!("{kind} {}*", text(key)),
        _ => format!("{kind} [{}, {})", text(key), text(end)),
    }
}

/// Makes the cluster's roles and users match [`ROLES`] (extra permissions of
/// our roles are revoked; other roles are left alone), creates the `root`
/// user if absent and, with `enable_auth`, turns authentication on (or
/// leaves it on). Run it
/// with root's credentials (before auth is on, any client may). Returns what
/// changed: nothing on a second run.
pub async fn ensure(client: &mut Client, enable_auth: bool) -> Result<Vec<Change>, etcd_client::Error> {
    let mut changes = Vec::new();
    for role in ROLES {
        sync_role(client, &role, &mut changes).await?;
    }
    let users = ROLES.iter().map(|r| (r.name, r.name)).chain([(ROOT, ROOT)]);
    for (user, role) in users {
        sync_user(client, user, role, &mut changes).await?;
    }
    if enable_auth {
        // etcd ignores an enable of an enabled cluster (and 3.4 cannot say
        // whether auth is on), so this is sent every time and not counted
        // as a change.
        client.auth_enable().await?;
    }
    Ok(changes)
}

/// Makes one role outside [`ROLES`] (a harness's own, say) and its user of the
/// same name, as [`ensure`] makes ours: only what is missing is granted, and
/// a second run changes nothing (every grant is a new auth revision, which
/// refuses the requests in flight across it).
pub async fn ensure_one(client: &mut Client, role: &Role) -> Result<Vec<Change>, etcd_client::Error> {
    let mut changes = Vec::new();
    sync_role(client, role, &mut changes).await?;
    sync_user(client, role.name, role.name, &mut changes).await?;
    Ok(changes)
}

/// Creates `role` if absent and makes its permissions exactly its table's.
async fn sync_role(client: &mut Client, role: &Role, changes: &mut Vec<Change>) -> Result<(), etcd_client::Error> {
    match client.role_add(role.name).await {
        Ok(_) => changes.push(Change::RoleCreated(role.name)),
        Err(e) if already_exists(&e) => {}
        Err(e) => return Err(e),
    }
    let have: Vec<(i32, Vec<u8>, Vec<u8>)> = client
        .role_get(role.name)
        .await?
        .permissions()
        .into_iter()
        .map(|p| (p.get_type(), p.key().to_vec(), p.range_end().to_vec()))
        .collect();
    let want = role.permissions();
    for (kind, key, end) in &want {
        if !have.contains(&(*kind, key.clone(), end.clone())) {
            let mut p = Permission::new(permission_type(*kind), key.clone());
            if !end.is_empty() {
                p = p.with_range_end(end.clone());
            }
            client.role_grant_permission(role.name, p).await?;
            changes.push(Change::Granted { role: role.name, range: describe(*kind, key, end) });
        }
    }
    for (kind, key, end) in &have {
        if !want.iter().any(|(_, k, e)| k == key && e == end) {
            let options = (!end.is_empty()).then(|| etcd_client::RoleRevokePermissionOptions::new().with_range_end(end.clone()));
            client.role_revoke_permission(role.name, key.clone(), options).await?;
            changes.push(Change::Revoked { role: role.name, range: describe(*kind, key, end) });
        }
    }
    Ok(())
}

/// Creates `user` (no password: its certificate names it) if absent and
/// grants it `role` if it lacks it.
async fn sync_user(client: &mut Client, user: &str, role: &str, changes: &mut Vec<Change>) -> Result<(), etcd_client::Error> {
    let roles = match client.user_get(user).await {
        Ok(u) => u.roles().to_vec(),
        Err(e) if not_found(&e) => {
            client.user_add(user, "", Some(UserAddOptions::new().with_no_pwd())).await?;
            changes.push(Change::UserCreated(user.into()));
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    if !roles.iter().any(|r| r == role) {
        client.user_grant_role(user, role).await?;
        changes.push(Change::UserGranted { user: user.into(), role: role.into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_their_bounds() {
        assert_eq!(Range::Prefix("/l/").bounds(), (b"/l/".to_vec(), b"/l0".to_vec()));
        assert_eq!(Range::Key("/sys/epoch").bounds(), (b"/sys/epoch".to_vec(), Vec::new()));
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(describe(PermissionType::Readwrite as i32, b"/l/", b"/l0"), "readwrite /l/*");
        assert_eq!(describe(PermissionType::Read as i32, b"/l/", b"/s0"), "read [/l/, /s0)");
        assert_eq!(describe(PermissionType::Read as i32, &[0], &[0]), "read every key");
    }

    #[test]
    fn no_role_but_the_arbiter_and_the_epoch_writes_a_hold() {
        let writes_holds = |r: &Role| r.read_write.iter().any(|x| matches!(x, Range::Prefix(p) if *p == layout::HOLD_PREFIX));
        let names: Vec<&str> = ROLES.iter().filter(|r| writes_holds(r)).map(|r| r.name).collect();
        assert_eq!(names, ["holdfast-arbiter", "holdfast-epoch"]);
        // The force-release role deletes holds through its read-write range
        // over the lock space (etcd cannot grant delete alone).
        assert!(FORCE_RELEASE.read_write.contains(&LOCK_SPACE));
        assert!(
            !ARBITER.read_write.iter().any(|r| matches!(r, Range::Key(k) if *k == layout::EPOCH_KEY)),
            "the arbiter only reads the epoch"
        );
        assert!(!ARBITER.read_write.iter().any(|r| matches!(r, Range::Prefix(p) if *p == layout::PAUSETEST_PREFIX)));
    }
}
