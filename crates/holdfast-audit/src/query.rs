//! Queries over stored events: the filters of `holdfastctl audit` and the
//! client-health reports routed to owning teams.

use crate::event::{Event, Kind};
use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

/// A time flag's value as milliseconds since the Unix epoch: RFC 3339
/// (`2026-12-01T03:00:00Z`) or a duration before now (`90m`, `24h`, `7d`).
pub fn parse_time(flag: &str, text: &str) -> Result<u64, String> {
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    if let Ok(t) = humantime::parse_rfc3339_weak(text) {
        return Ok(ms(t));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(ms(SystemTime::now()).saturating_sub(ago.as_millis() as u64)),
        Err(_) => Err(format!("{flag} {text:?}: give an RFC 3339 time (2026-12-01T03:00:00Z) or a duration ago (90m, 24h, 7d)")),
    }
}

/// Which events to show; every set field must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// The lock key `<ns>/<key>`, exactly.
    pub key: Option<String>,
    pub identity: Option<String>,
    pub namespace: Option<String>,
    pub class: Option<String>,
    /// Any of these kinds (empty: every kind).
    pub kinds: Vec<Kind>,
    /// `time_unix_ms` at or after this.
    pub since_unix_ms: Option<u64>,
    /// `time_unix_ms` before this.
    pub until_unix_ms: Option<u64>,
    /// Only the records of grants made without etcd and their ends
    /// (`unprotected = true`): the reconciliation list.
    pub unprotected: bool,
}

impl Filter {
    pub fn matches(&self, e: &Event) -> bool {
        fn eq(want: &Option<String>, have: &Option<String>) -> bool {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        }
        eq(&self.key, &e.key)
            && eq(&self.identity, &e.identity)
            && eq(&self.namespace, &e.namespace)
            && eq(&self.class, &e.class)
            && (self.kinds.is_empty() || self.kinds.contains(&e.kind))
            && self.since_unix_ms.is_none_or(|t| e.time_unix_ms >= t)
            && self.until_unix_ms.is_none_or(|t| e.time_unix_ms < t)
            && (!self.unprotected || e.unprotected == Some(true))
    }
}

/// Clears the revision of every grant whose hold has not ended in the
/// stored history: with the epoch it would be the live holder's token.
/// Must run over the whole history, before filtering. Returns how many
/// were withheld.
pub fn withhold_live_grant_revisions(events: &mut [Event]) -> usize {
    let mut open: HashMap<&str, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if e.kind == Kind::Grant {
            open.insert(e.etcd_key.as_str(), i);
        } else if e.kind.ends_hold() {
            open.remove(e.etcd_key.as_str());
        }
    }
    let live: Vec<usize> = open.into_values().collect();
    for &i in &live {
        events[i].revision = None;
    }
    live.len()
}

/// Holds that ended by expiry (their session lapsed) rather than by a
/// release, by namespace and identity: a client that crashed, hung or lost
/// its network while holding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExpiryCount {
    pub namespace: String,
    pub identity: String,
    pub expiries: u64,
    pub releases: u64,
}

pub fn expiries_without_release(events: &[Event]) -> Vec<ExpiryCount> {
    let mut counts: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for e in events {
        if !matches!(e.kind, Kind::Expiry | Kind::Release) {
            continue;
        }
        let k = (e.namespace.clone().unwrap_or_default(), e.identity.clone().unwrap_or_default());
        let c = counts.entry(k).or_default();
        if e.kind == Kind::Expiry {
            c.0 += 1;
        } else {
            c.1 += 1;
        }
    }
    counts
        .into_iter()
        .filter(|(_, (expiries, _))| *expiries > 0)
        .map(|((namespace, identity), (expiries, releases))| ExpiryCount { namespace, identity, expiries, releases })
        .collect()
}

/// One of the longest holds in a namespace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LongHold {
    pub namespace: String,
    pub key: String,
    pub identity: String,
    pub held_ms: u64,
    /// How it ended (`release`, `expiry`, …).
    pub ended_by: Kind,
    pub ended_unix_ms: u64,
}

/// The `per_namespace` longest ended holds of each namespace, longest first.
pub fn longest_holds(events: &[Event], per_namespace: usize) -> Vec<LongHold> {
    let mut by_ns: BTreeMap<String, Vec<LongHold>> = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind.ends_hold()) {
        let (Some(held_ms), Some(namespace)) = (e.held_ms, e.namespace.clone()) else { continue };
        by_ns.entry(namespace.clone()).or_default().push(LongHold {
            namespace,
            key: e.key.clone().unwrap_or_default(),
            identity: e.identity.clone().unwrap_or_default(),
            held_ms,
            ended_by: e.kind,
            ended_unix_ms: e.time_unix_ms,
        });
    }
    let mut out = Vec::new();
    for (_, mut holds) in by_ns {
        holds.sort_by(|a, b| b.held_ms.cmp(&a.held_ms).then_with(|| a.key.cmp(&b.key)));
        out.extend(holds.into_iter().take(per_namespace));
    }
    out
}

/// Grants per class (the class then published), for the risk register.
pub fn grants_by_class(events: &[Event]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for e in events.iter().filter(|e| e.kind == Kind::Grant) {
        if let Some(c) = &e.class {
            *counts.entry(c.clone()).or_default() += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(revision: i64, kind: Kind, key: &str, held_ms: Option<u64>) -> Event {
        let mut e = Event::new(1, revision, 0, kind, &format!("/l/{key}"), revision as u64 * 1000);
        e.key = Some(key.into());
        e.namespace = key.split('/').next().map(str::to_string);
        e.identity = Some("spiffe://t/a".into());
        e.class = Some("c".into());
        e.held_ms = held_ms;
        e
    }

    #[test]
    fn live_grants_lose_their_revision_and_reports_count_by_construction() {
        let mut events = vec![
            ev(1, Kind::Grant, "ns/a", None),
            ev(2, Kind::Release, "ns/a", Some(5)),
            ev(3, Kind::Grant, "ns/a", None),
            ev(4, Kind::Grant, "ns/b", None),
            ev(5, Kind::Expiry, "ns/b", Some(50)),
        ];
        assert_eq!(withhold_live_grant_revisions(&mut events), 1);
        assert_eq!(events.iter().map(|e| e.revision).collect::<Vec<_>>(), [Some(1), Some(2), None, Some(4), Some(5)]);
        let ex = expiries_without_release(&events);
        assert_eq!(ex, [ExpiryCount { namespace: "ns".into(), identity: "spiffe://t/a".into(), expiries: 1, releases: 1 }]);
        let long = longest_holds(&events, 1);
        assert_eq!((long.len(), long[0].key.as_str(), long[0].held_ms, long[0].ended_by), (1, "ns/b", 50, Kind::Expiry));
        assert_eq!(grants_by_class(&events).get("c"), Some(&3));
        let f = Filter { key: Some("ns/a".into()), kinds: vec![Kind::Grant], ..Filter::default() };
        assert_eq!(events.iter().filter(|e| f.matches(e)).count(), 2);
        let f = Filter { since_unix_ms: Some(2000), until_unix_ms: Some(4000), ..Filter::default() };
        assert_eq!(events.iter().filter(|e| f.matches(e)).count(), 2);
        assert_eq!(parse_time("--since", "1970-01-01T00:00:02Z"), Ok(2000));
        assert!(parse_time("--since", "1h").unwrap() > 1_700_000_000_000);
        assert!(parse_time("--since", "yesterday").unwrap_err().contains("RFC 3339"));
    }
}
