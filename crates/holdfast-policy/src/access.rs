//! The arbiter's enforcement index: who may do what to which key, built once
//! from a [`CompiledSet`] and asked on every call ([`Access::check`]).
//!
//! A check answers from the set and its arguments alone: no I/O, no clock,
//! and no allocation.
//!
//! # Identities: longest match
//!
//! A grant names an exact SPIFFE ID or a prefix of IDs ending in `/`
//! ([`Grant::matches`]). Of the grants that match the caller, only those
//! whose `identity` string is the longest apply: an exact ID is always
//! longer than any of its `/`-terminated prefixes, and a deeper prefix is
//! longer than a shallower one. Grants with that same identity string (in
//! different files, say) are unioned.
//!
//! A less specific grant adds nothing once a more specific one matches: a
//! specific grant *narrows*. If `spiffe://example.org/ns/payments/` may lock
//! `payments/` and `spiffe://example.org/ns/payments/sa/report` may only
//! inspect `payments/`, the report service cannot lock anything. To give an
//! identity more than its prefix has, list it in its own grant.
//!
//! A `/`-terminated prefix matches byte-wise, at a segment boundary by
//! construction: `spiffe://example.org/ns/payments/` matches
//! `.../ns/payments/sa/ledger`, never `.../ns/payments-old/x`.
//!
//! The identities are held in a byte trie: one node per distinct prefix of
//! the grants' identity strings, stored in one `Vec`, each node's children
//! sorted by byte and found by binary search. A check walks the caller's ID
//! once, remembering the last node reached through a `/` that carries
//! grants (a matching prefix grant) and, at the end of the ID, the node
//! itself (an exact grant). Its cost grows with the length of the ID, not
//! with the number of grants.
//!
//! # Keys
//!
//! The key `namespace/key` is allowed if one of the applicable grants' key
//! prefixes for the action (`lock`, `inspect` or `force_release`; each
//! action uses only its own list) is a byte prefix of it: `payments/` covers
//! the whole namespace, `payments/ledger-` covers `payments/ledger-7` but
//! not `payments/other`. The namespace must also have a class in the set,
//! even if a grant lists it; that class is what the check returns.

use crate::set::{Class, CompiledSet, Grant};
use std::collections::BTreeMap;
use std::fmt;

/// What a caller asks to do to a key; each has its own list in a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Acquire (and renew, release) a lock: [`Grant::lock`].
    Lock,
    /// See who holds a key: [`Grant::inspect`].
    Inspect,
    /// Release another holder's lock: [`Grant::force_release`].
    ForceRelease,
}

/// The enforcement index of one compiled set; see the module documentation.
#[derive(Clone)]
pub struct Access {
    /// Every class, by its namespace.
    classes: BTreeMap<String, Class>,
    /// The identity trie; `nodes[0]` is the root (the empty string).
    nodes: Vec<Node>,
    /// The unioned key prefixes of each distinct identity string.
    perms: Vec<Perms>,
}

/// One trie node: the identity string spelled by the path from the root.
#[derive(Clone, Default)]
struct Node {
    /// `(next byte, index in Access::nodes)`, sorted by byte.
    children: Vec<(u8, usize)>,
    /// Index in `Access::perms` if some grant's identity is this string.
    perms: Option<usize>,
}

/// The key prefixes of every grant with one identity string.
#[derive(Clone, Default)]
struct Perms {
    lock: Vec<String>,
    inspect: Vec<String>,
    force_release: Vec<String>,
}

impl Perms {
    fn add(&mut self, grant: &Grant) {
        extend(&mut self.lock, &grant.lock);
        extend(&mut self.inspect, &grant.inspect);
        extend(&mut self.force_release, &grant.force_release);
    }

    fn prefixes(&self, action: Action) -> &[String] {
        match action {
            Action::Lock => &self.lock,
            Action::Inspect => &self.inspect,
            Action::ForceRelease => &self.force_release,
        }
    }
}

/// Adds `more` to the sorted, duplicate-free `list`.
fn extend(list: &mut Vec<String>, more: &[String]) {
    list.extend(more.iter().cloned());
    list.sort();
    list.dedup();
}

impl Access {
    pub fn new(set: &CompiledSet) -> Access {
        let mut access = Access { classes: set.classes.clone(), nodes: vec![Node::default()], perms: Vec::new() };
        for grant in set.grants.values() {
            let node = access.insert(&grant.identity);
            let index = match access.nodes[node].perms {
                Some(index) => index,
                None => {
                    access.perms.push(Perms::default());
                    let index = access.perms.len() - 1;
                    access.nodes[node].perms = Some(index);
                    index
                }
            };
            access.perms[index].add(grant);
        }
        access
    }

    /// The class governing `namespace/key` if `spiffe_id` may do `action` on
    /// it; `None` otherwise (no class for the namespace, no grant for the
    /// identity, or no matching prefix).
    ///
    /// The identity's grants are looked up and scanned whether or not a
    /// class declares the namespace, so a denial takes the same steps for a
    /// namespace that exists and one that does not.
    pub fn check(&self, spiffe_id: &str, namespace: &str, key: &str, action: Action) -> Option<&Class> {
        let class = self.classes.get(namespace);
        let allowed = self.lookup(spiffe_id).is_some_and(|perms| perms.prefixes(action).iter().any(|p| covers(p, namespace, key)));
        class.filter(|_| allowed)
    }

    /// The class of `namespace` if `spiffe_id` may lock some key in it (a
    /// session opened for a namespace takes its class's TTL).
    pub fn namespace_class(&self, spiffe_id: &str, namespace: &str) -> Option<&Class> {
        let class = self.classes.get(namespace);
        let allowed = self.lookup(spiffe_id).is_some_and(|perms| perms.prefixes(Action::Lock).iter().any(|p| reaches(p, namespace)));
        class.filter(|_| allowed)
    }

    /// Some class in whose namespace `spiffe_id` may lock some key: a
    /// session opened without a namespace needs a lock grant somewhere.
    pub fn any_lock_class(&self, spiffe_id: &str) -> Option<&Class> {
        let prefixes = self.lookup(spiffe_id)?.prefixes(Action::Lock);
        self.classes.iter().find(|(ns, _)| prefixes.iter().any(|p| reaches(p, ns))).map(|(_, c)| c)
    }

    /// The node for `identity`, created with its missing ancestors.
    fn insert(&mut self, identity: &str) -> usize {
        let mut node = 0;
        for &b in identity.as_bytes() {
            let children = &self.nodes[node].children;
            node = match children.binary_search_by_key(&b, |&(c, _)| c) {
                Ok(i) => children[i].1,
                Err(i) => {
                    let child = self.nodes.len();
                    self.nodes.push(Node::default());
                    self.nodes[node].children.insert(i, (b, child));
                    child
                }
            };
        }
        node
    }

    /// The permissions of the longest grant identity matching `spiffe_id`.
    fn lookup(&self, spiffe_id: &str) -> Option<&Perms> {
        let mut node = self.nodes.first()?;
        let mut best = None;
        for &b in spiffe_id.as_bytes() {
            let next = match node.children.binary_search_by_key(&b, |&(c, _)| c) {
                Ok(i) => node.children.get(i).and_then(|&(_, n)| self.nodes.get(n)),
                Err(_) => None,
            };
            let Some(next) = next else {
                // The ID leaves the trie: only a prefix passed on the way applies.
                return best.and_then(|i| self.perms.get(i));
            };
            node = next;
            if b == b'/' && node.perms.is_some() {
                best = node.perms;
            }
        }
        // The whole ID is in the trie: a grant for exactly it is the longest.
        node.perms.or(best).and_then(|i| self.perms.get(i))
    }
}

/// Whether `prefix` is a byte prefix of `namespace/key`, without building
/// that string.
/// Whether `prefix` covers some key of `namespace` ([`covers`] for some key).
fn reaches(prefix: &str, namespace: &str) -> bool {
    if prefix.len() <= namespace.len() {
        return namespace.starts_with(prefix);
    }
    prefix.strip_prefix(namespace).is_some_and(|rest| rest.starts_with('/'))
}

fn covers(prefix: &str, namespace: &str, key: &str) -> bool {
    let (p, ns) = (prefix.as_bytes(), namespace.as_bytes());
    if p.len() <= ns.len() {
        return ns.starts_with(p);
    }
    let (p_ns, rest) = p.split_at(ns.len());
    match rest.split_first() {
        Some((b'/', p_key)) => p_ns == ns && key.as_bytes().starts_with(p_key),
        _ => false,
    }
}

impl fmt::Debug for Access {
    /// A summary: the trie itself is one node per identity byte.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Access")
            .field("namespaces", &self.classes.keys().collect::<Vec<_>>())
            .field("identities", &self.perms.len())
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::set::{Enforcement, Fairness, OnQuorumLoss, Purpose, Tier};
    use std::time::Duration;

    const LEDGER: &str = "spiffe://a/ns/payments/sa/ledger";

    fn class(namespace: &str) -> Class {
        Class {
            name: format!("{namespace}-class"),
            namespace: namespace.into(),
            purpose: Purpose::Correctness,
            enforcement: Enforcement::Fenced { resource: "fixture:r".into(), schema_version: 1 },
            ttl: Duration::from_secs(15),
            tier: Tier::Entity,
            on_quorum_loss: OnQuorumLoss::Closed,
            fairness: Fairness::BestEffort,
            home_region: None,
        }
    }

    /// One grant: `(name, identity, lock, inspect, force_release)`.
    type G<'a> = (&'a str, &'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);

    /// A set with a class for each namespace and the grants.
    fn access(namespaces: &[&str], grants: &[G]) -> Access {
        let list = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        let classes = namespaces.iter().map(|ns| (ns.to_string(), class(ns))).collect();
        let grants = grants
            .iter()
            .map(|&(name, identity, lock, inspect, force_release)| {
                let grant = Grant {
                    name: name.into(),
                    identity: identity.into(),
                    lock: list(lock),
                    inspect: list(inspect),
                    force_release: list(force_release),
                };
                (name.to_string(), grant)
            })
            .collect();
        Access::new(&CompiledSet::new(classes, grants))
    }

    fn can(access: &Access, id: &str, ns: &str, key: &str, action: Action) -> bool {
        access.check(id, ns, key, action).is_some()
    }

    #[test]
    fn check_returns_the_namespace_class() {
        let a = access(&["payments", "billing"], &[("g", LEDGER, &["payments/", "billing/"], &[], &[])]);
        assert_eq!(a.check(LEDGER, "billing", "x", Action::Lock).map(|c| c.name.as_str()), Some("billing-class"));
        assert_eq!(a.check(LEDGER, "payments", "x", Action::Lock).map(|c| c.name.as_str()), Some("payments-class"));
    }

    #[test]
    fn exact_id_beats_prefix_and_narrows_it() {
        let a = access(
            &["payments"],
            &[("team", "spiffe://a/ns/payments/", &["payments/"], &["payments/"], &[]), ("ledger", LEDGER, &[], &["payments/"], &[])],
        );
        assert!(can(&a, LEDGER, "payments", "x", Action::Inspect));
        assert!(!can(&a, LEDGER, "payments", "x", Action::Lock), "the prefix grant's lock must not leak in");
        assert!(can(&a, "spiffe://a/ns/payments/sa/other", "payments", "x", Action::Lock));
    }

    #[test]
    fn exact_id_matches_only_itself() {
        let a = access(&["payments"], &[("ledger", LEDGER, &["payments/"], &[], &[])]);
        assert!(!can(&a, "spiffe://a/ns/payments/sa/ledge", "payments", "x", Action::Lock));
        assert!(!can(&a, "spiffe://a/ns/payments/sa/ledger2", "payments", "x", Action::Lock));
        assert!(!can(&a, "spiffe://a/ns/payments/sa/ledger/x", "payments", "x", Action::Lock));
    }

    #[test]
    fn longest_prefix_wins_over_a_shorter_prefix() {
        let a = access(
            &["payments", "billing"],
            &[("domain", "spiffe://a/", &["billing/"], &[], &[]), ("team", "spiffe://a/ns/payments/", &["payments/"], &[], &[])],
        );
        assert!(can(&a, LEDGER, "payments", "x", Action::Lock));
        assert!(!can(&a, LEDGER, "billing", "x", Action::Lock), "the shorter prefix must not add billing");
        assert!(can(&a, "spiffe://a/ns/billing/sa/x", "billing", "x", Action::Lock));
        assert!(!can(&a, "spiffe://a/ns/billing/sa/x", "payments", "x", Action::Lock));
    }

    #[test]
    fn grants_with_the_same_identity_are_unioned() {
        let a = access(
            &["payments", "billing"],
            &[
                ("one", "spiffe://a/ns/payments/", &["payments/"], &[], &[]),
                ("two", "spiffe://a/ns/payments/", &["billing/"], &["payments/"], &[]),
            ],
        );
        assert!(can(&a, LEDGER, "payments", "x", Action::Lock));
        assert!(can(&a, LEDGER, "billing", "x", Action::Lock));
        assert!(can(&a, LEDGER, "payments", "x", Action::Inspect));
        assert!(!can(&a, LEDGER, "billing", "x", Action::Inspect));
    }

    #[test]
    fn prefix_identity_stops_at_its_slash() {
        let a = access(&["payments"], &[("team", "spiffe://a/ns/payments/", &["payments/"], &[], &[])]);
        assert!(!can(&a, "spiffe://a/ns/payments-old/x", "payments", "x", Action::Lock));
        assert!(!can(&a, "spiffe://a/ns/payments", "payments", "x", Action::Lock));
        assert!(can(&a, "spiffe://a/ns/payments/x", "payments", "x", Action::Lock));
    }

    #[test]
    fn key_prefix_covers_keys_that_start_with_it() {
        let a = access(&["payments", "pay"], &[("ledger", LEDGER, &["payments/ledger-", "pay/"], &[], &[])]);
        assert!(can(&a, LEDGER, "payments", "ledger-7", Action::Lock));
        assert!(can(&a, LEDGER, "payments", "ledger-", Action::Lock));
        assert!(!can(&a, LEDGER, "payments", "other", Action::Lock));
        assert!(!can(&a, LEDGER, "payments", "ledger", Action::Lock));
        assert!(can(&a, LEDGER, "pay", "anything", Action::Lock));
    }

    #[test]
    fn namespace_prefix_does_not_cover_a_longer_namespace() {
        let a = access(&["payments", "payments-old"], &[("ledger", LEDGER, &["payments/"], &[], &[])]);
        assert!(can(&a, LEDGER, "payments", "x", Action::Lock));
        assert!(!can(&a, LEDGER, "payments-old", "x", Action::Lock));
    }

    #[test]
    fn each_action_uses_its_own_list() {
        let a = access(&["lk", "insp", "force"], &[("ledger", LEDGER, &["lk/"], &["insp/"], &["force/"])]);
        for (ns, allowed) in [("lk", Action::Lock), ("insp", Action::Inspect), ("force", Action::ForceRelease)] {
            for action in [Action::Lock, Action::Inspect, Action::ForceRelease] {
                assert_eq!(can(&a, LEDGER, ns, "k", action), action == allowed, "{ns} {action:?}");
            }
        }
    }

    #[test]
    fn namespace_without_a_class_is_denied_even_if_granted() {
        let a = access(&["payments"], &[("ledger", LEDGER, &["payments/", "ghost/"], &["ghost/"], &["ghost/"])]);
        assert!(can(&a, LEDGER, "payments", "x", Action::Lock));
        for action in [Action::Lock, Action::Inspect, Action::ForceRelease] {
            assert!(a.check(LEDGER, "ghost", "x", action).is_none());
        }
    }

    #[test]
    fn namespace_class_needs_a_lock_prefix_in_the_namespace() {
        let a = access(&["payments", "orders"], &[("g", "spiffe://a/x", &["payments/ledger-"], &["orders/"], &[])]);
        assert_eq!(a.namespace_class("spiffe://a/x", "payments").map(|c| c.namespace.as_str()), Some("payments"));
        assert!(a.namespace_class("spiffe://a/x", "orders").is_none(), "inspect only");
        assert!(a.namespace_class("spiffe://a/y", "payments").is_none());
    }

    #[test]
    fn a_session_without_a_namespace_needs_a_lock_grant_somewhere() {
        let a = access(&["payments", "orders"], &[("g", "spiffe://a/x", &["payments/ledger-"], &["orders/"], &[])]);
        assert_eq!(a.any_lock_class("spiffe://a/x").map(|c| c.namespace.as_str()), Some("payments"));
        assert!(a.any_lock_class("spiffe://a/y").is_none(), "no grant");
        let inspect_only = access(&["orders"], &[("g", "spiffe://a/x", &[], &["orders/"], &[])]);
        assert!(inspect_only.any_lock_class("spiffe://a/x").is_none(), "inspect only");
        let no_class = access(&["orders"], &[("g", "spiffe://a/x", &["payments/"], &[], &[])]);
        assert!(no_class.any_lock_class("spiffe://a/x").is_none(), "a grant where no class is");
    }

    #[test]
    fn identity_without_a_grant_is_denied() {
        let a = access(&["payments"], &[("ledger", LEDGER, &["payments/"], &["payments/"], &["payments/"])]);
        for id in ["spiffe://b/ns/payments/sa/ledger", "spiffe://a/", "", "spiffe://a/ns/payments/sa/"] {
            for action in [Action::Lock, Action::Inspect, Action::ForceRelease] {
                assert!(!can(&a, id, "payments", "x", action), "{id:?} {action:?}");
            }
        }
        let empty = access(&["payments"], &[]);
        assert!(!can(&empty, LEDGER, "payments", "x", Action::Lock));
    }

    #[test]
    fn reaches_means_some_key_of_the_namespace_is_covered() {
        assert!(reaches("payments/", "payments"));
        assert!(reaches("payments/ledger-", "payments"));
        assert!(reaches("pay", "payments"));
        assert!(reaches("payments", "payments"));
        assert!(reaches("payments", "paymentsold"), "as covers(\"payments\", \"paymentsold\", _) is");
        assert!(!reaches("payments/", "payment"));
        assert!(!reaches("paymentsx", "payments"));
        assert!(!reaches("payments/", "paymentsold"));
        assert!(!reaches("orders/", "payments"));
    }

    #[test]
    fn covers_compares_namespace_slash_and_key_piecewise() {
        assert!(covers("payments/", "payments", ""));
        assert!(covers("payments/ledger-", "payments", "ledger-7"));
        assert!(!covers("payments/ledger-", "payments", "ledger"));
        assert!(!covers("payments/", "payment", "s/x"));
        assert!(!covers("paymentsx", "payments", "x"));
        assert!(covers("pay", "payments", "x"));
        assert!(!covers("payments/", "paymentsold", "x"));
    }

    #[test]
    fn agrees_with_grant_matches_on_the_longest_identity() {
        // Cross-check the trie against a scan of Grant::matches.
        let identities = ["spiffe://a/", "spiffe://a/ns/", "spiffe://a/ns/p/", "spiffe://a/ns/p/sa/x", "spiffe://a/ns/q"];
        let grants: Vec<G> = identities.iter().map(|id| (*id, *id, &["p/"][..], &[][..], &[][..])).collect();
        let a = access(&["p"], &grants);
        let callers = [
            "spiffe://a/",
            "spiffe://a/ns/p/sa/x",
            "spiffe://a/ns/p/sa/y",
            "spiffe://a/ns/q",
            "spiffe://a/ns/qq",
            "spiffe://a/ns",
            "spiffe://b/x",
            "spiffe://a/ns/p/sa/x/y",
        ];
        for caller in callers {
            let longest = identities
                .iter()
                .filter(|id| {
                    let g = Grant { name: String::new(), identity: id.to_string(), lock: vec![], inspect: vec![], force_release: vec![] };
                    g.matches(caller)
                })
                .max_by_key(|id| id.len());
            let found = a.lookup(caller).map(|p| p as *const Perms);
            let expected = longest.and_then(|id| a.lookup(id)).map(|p| p as *const Perms);
            assert_eq!(found, expected, "{caller}");
        }
    }
}
