//! Enforcing the published class set (`/sys/policy`, written by
//! holdfast-controller; see docs/policy.md).
//!
//! [`run`] reads the set at start and then watches it; every new version is
//! checked (its content hash) and swapped in whole, so a call sees either
//! the old set or the new one, never a mix. A document that does not decode
//! or whose hash does not match is ignored, and the set in force stays.
//!
//! "New" is by (epoch, version): the epoch of the cluster the set is
//! published on, as read with it, then the document's version. A restore
//! of that cluster rolls `/sys/policy` back to an older version, and the
//! controller's next publication is that version + 1, which may be at or
//! below the one in force here; but a restore is always followed by an
//! epoch advance (the arbiters stay sealed until then), and when the epoch
//! changes this arbiter reads the set again and takes what is published,
//! whatever its version. Versions within one epoch only grow.
//!
//! [`Policy::authorize`] runs before anything touches etcd: the caller's
//! SPIFFE ID against the grants ([`holdfast_policy::Access`], a prefix tree
//! with longest match), then the class's home region. A denial is one
//! message, built from the request alone: it cannot depend on whether the
//! key exists or is held, because nothing about the key has been read.
//! Without a published set nothing is granted ([`ErrorReason::NoPolicy`]).

use crate::Refusal;
use crate::etcd::Etcd;
use etcd_client::WatchOptions;
use holdfast_model::LockKey;
use holdfast_model::layout::{EPOCH_KEY, POLICY_KEY};
use holdfast_policy::{Access, Action, Class};
use holdfast_proto::ErrorReason;
use holdfast_store::policy::{PublishedPolicy, Stored, decode_published};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tonic::Code;

/// One published version, ready to enforce.
pub struct Loaded {
    /// The epoch of the set's cluster when it was read.
    pub epoch: u32,
    pub version: u64,
    pub hash: String,
    access: Access,
    classes: Vec<Class>,
}

/// The set this arbiter enforces, swapped whole on every publish.
pub struct Policy {
    current: RwLock<Option<Arc<Loaded>>>,
    /// This arbiter's region (`region` in its config); `None`: one region,
    /// every class is served here.
    region: Option<String>,
}

impl Policy {
    pub fn new(region: Option<String>) -> Self {
        Policy { current: RwLock::new(None), region }
    }

    /// The version in force, if any.
    pub fn loaded(&self) -> Option<Arc<Loaded>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts a published document, read at `epoch`, in force if it is newer
    /// by (epoch, version) than the one in force and its hash matches its
    /// content. Returns whether it did.
    pub fn install(&self, published: &PublishedPolicy, epoch: u32) -> Result<bool, String> {
        if published.hash != published.set.hash || !published.set.hash_is_valid() {
            return Err(format!("version {} at {POLICY_KEY}: its hash does not match its content", published.version));
        }
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|c| (c.epoch, c.version) >= (epoch, published.version)) {
            return Ok(false);
        }
        let loaded = Loaded {
            epoch,
            version: published.version,
            hash: published.hash.clone(),
            access: Access::new(&published.set),
            classes: published.set.classes.values().cloned().collect(),
        };
        *current = Some(Arc::new(loaded));
        crate::metrics::set_policy_version(published.version);
        Ok(true)
    }

    /// The classes of the set in force (none before one is published).
    pub fn classes(&self) -> Vec<Class> {
        self.loaded().map(|l| l.classes.clone()).unwrap_or_default()
    }

    /// The class of `key` if `who` may do `action` on it here. Checks only
    /// what is in memory; see the module documentation.
    pub fn authorize(&self, who: &str, key: &LockKey, action: Action) -> Result<Class, Refusal> {
        let Some(loaded) = self.loaded() else { return Err(no_policy()) };
        let Some(class) = loaded.access.check(who, key.namespace(), key.key(), action) else {
            return Err(denied(who, key, action));
        };
        if let (Some(home), Some(here)) = (&class.home_region, &self.region)
            && home != here
        {
            return Err(wrong_region(key, &class.name, home, here));
        }
        Ok(class.clone())
    }

    /// The class governing `namespace`, for a session opened for it; the
    /// caller must hold some lock grant in it.
    pub fn class_for_session(&self, who: &str, namespace: &str) -> Result<Class, Refusal> {
        let Some(loaded) = self.loaded() else { return Err(no_policy()) };
        loaded.access.namespace_class(who, namespace).cloned().ok_or_else(|| {
            Refusal::new(
                Code::PermissionDenied,
                ErrorReason::Denied,
                format!("{who} has no grant to lock keys in namespace {namespace:?}; add one in grants.d/ (docs/policy.md)"),
            )
        })
    }

    /// For a session opened without a namespace: `who` must hold a lock
    /// grant in some class. Without one the session could hold nothing,
    /// and opening it would cost etcd a lease and a record for a caller the
    /// policy gives nothing.
    pub fn may_open_session(&self, who: &str) -> Result<(), Refusal> {
        let Some(loaded) = self.loaded() else { return Err(no_policy()) };
        match loaded.access.any_lock_class(who) {
            Some(_) => Ok(()),
            None => Err(Refusal::new(
                Code::PermissionDenied,
                ErrorReason::Denied,
                format!("{who} may lock in no class, so it may open no session; ask for a lock grant in grants.d/ (docs/policy.md)"),
            )),
        }
    }
}

fn no_policy() -> Refusal {
    Refusal::new(
        Code::FailedPrecondition,
        ErrorReason::NoPolicy,
        "no class set is published yet, so this arbiter grants nothing; run holdfast-controller on a valid policy directory \
         and see `holdfastctl status`",
    )
}

/// The one denial: the same text for a free, held or never-used key.
fn denied(who: &str, key: &LockKey, action: Action) -> Refusal {
    let verb = match action {
        Action::Lock => "lock",
        Action::Inspect => "inspect",
        Action::ForceRelease => "force-release",
    };
    Refusal::new(
        Code::PermissionDenied,
        ErrorReason::Denied,
        format!(
            "{who} may not {verb} {key}: no grant covers it; ask for {} {verb} grant in grants.d/ (docs/policy.md)",
            if verb == "inspect" { "an" } else { "a" }
        ),
    )
}

fn wrong_region(key: &LockKey, class: &str, home: &str, here: &str) -> Refusal {
    Refusal::new(
        Code::FailedPrecondition,
        ErrorReason::WrongRegion,
        format!("{key} is in class {class}, homed to region {home}; this arbiter serves region {here}; call an arbiter in {home}"),
    )
}

/// The refusal of an Acquire on a session whose TTL is not the class's.
pub fn class_ttl(key: &LockKey, class: &Class, session_ttl_secs: u64) -> Refusal {
    let ttl = class.ttl.as_secs();
    Refusal::new(
        Code::FailedPrecondition,
        ErrorReason::ClassTtl,
        format!(
            "{key} is in class {} whose TTL is {ttl}s, but this session's TTL is {session_ttl_secs}s; \
             open a session for namespace {:?} (or with a {ttl}s TTL)",
            class.name, class.namespace
        ),
    )
}

/// A key of a class on one tier, asked for on a session of the other.
pub fn class_tier(key: &LockKey, class: &Class, session: holdfast_policy::Tier) -> Refusal {
    let name = crate::cluster::tier_name;
    Refusal::new(
        Code::FailedPrecondition,
        ErrorReason::ClassTier,
        format!(
            "{key} is in class {} of the {} tier, but this session is on the {} tier (each tier's keys live on its own etcd cluster); \
             open a session for namespace {:?}",
            class.name,
            name(class.tier),
            name(session),
            class.namespace
        ),
    )
}

/// Reads the published set once (before READY, so the first calls see it
/// when one is published); an error here is left to [`run`].
pub async fn load(etcd: &Etcd, policy: &Policy) {
    if let Ok((stored, epoch)) = holdfast_store::policy::read_published_at_epoch(etcd).await {
        apply(policy, &stored, epoch);
    }
}

/// Keeps `policy` equal to the published set: reads it with its cluster's
/// epoch, then watches both; reads again after any watch error and
/// whenever the epoch changes. Never returns.
pub async fn run(etcd: Etcd, policy: Arc<Policy>) {
    loop {
        match holdfast_store::policy::read_published_at_epoch(&etcd).await {
            Ok((stored, epoch)) => {
                apply(&policy, &stored, epoch);
                watch(&etcd, &policy, stored.mod_revision(), epoch).await;
            }
            Err(e) => tracing::debug!(error = %e, "reading the published class set failed; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Applies each new version of the set, read at `epoch`, until the watch
/// fails or the epoch changes (the caller then reads both again).
async fn watch(etcd: &Etcd, policy: &Policy, from: i64, epoch: u32) {
    let opts = || Some(WatchOptions::new().with_start_revision(from + 1));
    let Ok(mut sets) = etcd.watch.clone().watch(POLICY_KEY, opts()).await else { return };
    let Ok(mut epochs) = etcd.watch.clone().watch(EPOCH_KEY, opts()).await else { return };
    loop {
        tokio::select! {
            resp = sets.message() => {
                let Ok(Some(resp)) = resp else { return };
                if resp.canceled() {
                    return;
                }
                for event in resp.events() {
                    if event.event_type() == etcd_client::EventType::Put {
                        apply(policy, &decode_published(event.kv()), epoch);
                    } else {
                        tracing::error!("{POLICY_KEY} was deleted; the set in force stays (only holdfast-controller writes it)");
                    }
                }
            }
            resp = epochs.message() => {
                let Ok(Some(resp)) = resp else { return };
                if resp.canceled() || resp.events().iter().any(|e| holdfast_store::policy::epoch_of(e.kv()) != epoch) {
                    return;
                }
            }
        }
    }
}

fn apply(policy: &Policy, stored: &Stored<PublishedPolicy>, epoch: u32) {
    match stored {
        Stored::Absent => {
            if policy.loaded().is_none() {
                tracing::warn!("no class set is published at {POLICY_KEY}: granting nothing until holdfast-controller publishes one");
            }
        }
        Stored::Malformed { error, .. } => tracing::error!(%error, "ignoring the document at {POLICY_KEY}; the set in force stays"),
        Stored::Present { doc, .. } => match policy.install(doc, epoch) {
            Ok(true) => tracing::info!(epoch, version = doc.version, hash = %doc.hash, "class set in force"),
            Ok(false) => {}
            Err(e) => tracing::error!(error = %e, "ignoring it; the set in force stays"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_policy::CompiledSet;
    use std::collections::BTreeMap;

    fn doc(version: u64) -> PublishedPolicy {
        let set = CompiledSet::new(BTreeMap::new(), BTreeMap::new());
        PublishedPolicy { version, hash: set.hash.clone(), source_commit: None, published_unix_ms: 0, published_by: String::new(), set }
    }

    #[test]
    fn sets_are_ordered_by_epoch_then_version() {
        let p = Policy::new(None);
        assert_eq!(p.install(&doc(5), 1), Ok(true));
        // Within an epoch only a greater version is taken.
        assert_eq!(p.install(&doc(5), 1), Ok(false));
        assert_eq!(p.install(&doc(4), 1), Ok(false));
        assert_eq!(p.install(&doc(6), 1), Ok(true));
        // A restore rolled the version back; the epoch it was read at is
        // older or the same: ignored until the advance.
        assert_eq!(p.install(&doc(3), 0), Ok(false));
        assert_eq!(p.install(&doc(4), 1), Ok(false));
        // After the advance the restored line is taken, and grows from there.
        assert_eq!(p.install(&doc(4), 2), Ok(true));
        assert_eq!(p.install(&doc(5), 2), Ok(true));
        let loaded = p.loaded().unwrap();
        assert_eq!((loaded.epoch, loaded.version), (2, 5));
        // A document whose hash does not match is refused whatever its order.
        let mut bad = doc(9);
        bad.hash = "sha256:00".into();
        assert!(p.install(&bad, 3).is_err());
    }
}
