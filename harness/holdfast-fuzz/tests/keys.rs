//! Fuzz target: lock keys (`LockKey::new`, `LockKey::parse`, the etcd keys
//! built from them) and fencing tokens read from the wire.
//!
//! A key the model accepts must obey the rules of `holdfast_model::key`
//! (checked here by an independent reading of them) and read back as
//! itself; every key those rules allow must be accepted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_fuzz::{any_text, config};
use holdfast_model::key::{MAX_KEY_LEN, MAX_NAMESPACE_LEN};
use holdfast_model::layout;
use holdfast_model::token::{MAX_EPOCH, MAX_REVISION, REVISION_BITS};
use holdfast_model::{LockKey, Token};
use proptest::prelude::*;

/// The rules, read from the module documentation and the field messages:
/// `None` if `namespace/key` is a valid lock key, else the field at fault
/// (the namespace is checked first).
fn refused_field(namespace: &str, key: &str) -> Option<&'static str> {
    let ns_ok = (1..=MAX_NAMESPACE_LEN).contains(&namespace.len())
        && namespace.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-'))
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    if !ns_ok {
        return Some("namespace");
    }
    let key_ok = (1..=MAX_KEY_LEN).contains(&key.len())
        && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
        && key.split('/').all(|segment| !matches!(segment, "" | "." | ".."));
    if !key_ok {
        return Some("key");
    }
    None
}

/// Everything an accepted key promises.
fn check_accepted(k: &LockKey, namespace: &str, key: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(k.namespace(), namespace);
    prop_assert_eq!(k.key(), key);
    prop_assert!(!k.namespace().contains('/'));
    prop_assert_eq!(refused_field(k.namespace(), k.key()), None);
    let shown = k.to_string();
    prop_assert_eq!(&shown, &format!("{namespace}/{key}"));
    prop_assert_eq!(LockKey::parse(&shown), Ok(k.clone()));
    let hold = layout::hold_key(k);
    prop_assert!(hold.starts_with(&format!("{}{namespace}/", layout::HOLD_PREFIX)), "{hold:?}");
    prop_assert_eq!(&hold[layout::HOLD_PREFIX.len()..], shown.as_str());
    // The withdrawal marker names the hold, and only it.
    let marker = layout::withdrawn_key(&hold);
    prop_assert!(marker.starts_with(layout::WITHDRAWN_PREFIX));
    prop_assert_eq!(layout::hold_key_of_withdrawn(&marker), Some(hold));
    Ok(())
}

fn check_new(namespace: &str, key: &str) -> Result<(), TestCaseError> {
    match LockKey::new(namespace, key) {
        Ok(k) => check_accepted(&k, namespace, key)?,
        Err(e) => {
            prop_assert!(!e.message.is_empty());
            prop_assert_eq!(Some(e.field), refused_field(namespace, key), "{}", e);
        }
    }
    prop_assert_eq!(LockKey::new(namespace, key).is_ok(), refused_field(namespace, key).is_none());
    Ok(())
}

fn check_parse(text: &str) -> Result<(), TestCaseError> {
    match LockKey::parse(text) {
        Ok(k) => {
            let (namespace, key) = text.split_once('/').expect("an accepted key has a '/'");
            check_accepted(&k, namespace, key)?;
            prop_assert_eq!(k.to_string(), text);
        }
        Err(e) => {
            prop_assert!(!e.message.is_empty());
            match text.split_once('/') {
                None => prop_assert_eq!(e.field, "key"),
                Some((namespace, key)) => prop_assert_eq!(Some(e.field), refused_field(namespace, key)),
            }
        }
    }
    Ok(())
}

/// A path segment, biased toward the edges of the key grammar.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z0-9._-]{1,8}",
        1 => Just(String::new()),
        1 => Just(".".to_string()),
        1 => Just("..".to_string()),
        1 => "\\.{1,4}",
        1 => "[!-~]{1,4}",
        1 => "[\\x00-\\x20\\x7f]{1,2}",
        1 => "\\PC{1,3}",
        1 => "[a-z]{0,3}[\u{80}-\u{7ff}\u{fffd}\u{1f512}][a-z]{0,3}",
    ]
}

/// A key: segments joined by `/`, sometimes with a leading or trailing `/`.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (prop::collection::vec(segment(), 1..6), any::<bool>(), any::<bool>()).prop_map(|(segments, lead, trail)| {
            let mut k = segments.join("/");
            if lead {
                k.insert(0, '/');
            }
            if trail {
                k.push('/');
            }
            k
        }),
        1 => any_text(12),
        1 => long(MAX_KEY_LEN, "[a-z0-9./]"),
    ]
}

/// A namespace, biased toward the edges of the namespace grammar.
fn namespace() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?",
        1 => "-?[a-z0-9-]{0,4}-?",
        1 => "[a-zA-Z0-9_./ -]{0,6}",
        1 => any_text(6),
        1 => long(MAX_NAMESPACE_LEN, "[a-z0-9-]"),
    ]
}

/// A string of `unit` characters whose length is near `limit` bytes, now
/// and then with one multi-byte character (a limit in bytes, not characters).
fn long(limit: usize, unit: &'static str) -> impl Strategy<Value = String> {
    let unit = proptest::string::string_regex(unit).expect("a regex");
    (prop::collection::vec(unit, limit - 3..=limit + 2), prop::option::of(any::<char>()), any::<prop::sample::Index>()).prop_map(
        |(units, odd, at)| {
            let mut s = units.concat();
            if let Some(c) = odd {
                let at = at.index(s.len() + 1);
                s.insert(at, c);
            }
            s
        },
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn new_accepts_exactly_the_documented_keys(ns in namespace(), key in key()) {
        check_new(&ns, &key)?;
    }

    #[test]
    fn new_on_any_text_never_panics(ns in any_text(8), key in any_text(16)) {
        check_new(&ns, &key)?;
    }

    #[test]
    fn parse_accepts_what_new_accepts_and_displays_it_back(ns in namespace(), key in key()) {
        check_parse(&format!("{ns}/{key}"))?;
        check_parse(&ns)?;
        check_parse(&key)?;
    }

    #[test]
    fn parse_on_any_text_never_panics(text in any_text(24)) {
        check_parse(&text)?;
    }

    #[test]
    fn withdrawn_markers_of_any_text_read_back(text in any_text(24)) {
        // Arbiters read markers from etcd: any key under the prefix.
        let marker = format!("{}{text}", layout::WITHDRAWN_PREFIX);
        let hold = layout::hold_key_of_withdrawn(&marker);
        prop_assert_eq!(hold.clone(), Some(format!("{}{text}", layout::HOLD_PREFIX)));
        prop_assert_eq!(layout::withdrawn_key(&hold.unwrap()), marker);
        prop_assert_eq!(layout::hold_key_of_withdrawn(&text), text.strip_prefix(layout::WITHDRAWN_PREFIX).map(|r| format!("{}{r}", layout::HOLD_PREFIX)));
    }

    #[test]
    fn class_names_and_pause_test_keys(class in namespace(), a in any_text(12), b in any_text(12)) {
        let valid = layout::validate_class(&class).is_ok();
        // A class name follows the namespace rules.
        prop_assert_eq!(valid, refused_field(&class, "k").is_none());
        if valid {
            let (ka, kb) = (layout::pausetest_key(&class, &a), layout::pausetest_key(&class, &b));
            let prefix = format!("{}{class}/", layout::PAUSETEST_PREFIX);
            // The resource is one segment of visible ASCII, and two
            // resources never share a key.
            for k in [&ka, &kb] {
                let rest = k.strip_prefix(&prefix).expect("under the class");
                prop_assert!(rest.bytes().all(|b| b.is_ascii_graphic() && b != b'/'), "{k:?}");
            }
            prop_assert_eq!(ka == kb, a == b);
        }
    }

    #[test]
    fn tokens_from_the_wire(
        value in prop_oneof![
            any::<u64>(),
            (0..=u64::from(MAX_EPOCH) + 2, prop_oneof![Just(0), Just(1), Just(MAX_REVISION), 0..=MAX_REVISION])
                .prop_map(|(epoch, revision)| (epoch << REVISION_BITS) | revision),
        ]
    ) {
        let epoch = value >> REVISION_BITS;
        let revision = value & MAX_REVISION;
        let mintable = (1..=u64::from(MAX_EPOCH)).contains(&epoch) && revision >= 1;
        match Token::from_wire(value) {
            Ok(t) => {
                prop_assert!(mintable);
                prop_assert_eq!(t.expose(), value);
                prop_assert_eq!((u64::from(t.epoch()), t.revision()), (epoch, revision));
                prop_assert_eq!(Token::new(t.epoch(), t.revision()), Ok(t));
                prop_assert_eq!(Token::from_wire(t.expose()), Ok(t));
                // Fits a signed 64-bit fence column.
                prop_assert!(i64::try_from(t.expose()).is_ok());
                // A capability never shows its value.
                let shown = format!("{t} {t:?} {t:#?}");
                prop_assert!(!shown.contains(&value.to_string()), "{shown}");
            }
            Err(e) => {
                prop_assert!(!mintable, "{e}");
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

// Named cases: edges worth running whatever the strategies draw. An input a
// target fails on is added here as its own #[test] (see src/lib.rs).

#[test]
fn the_edges_of_each_limit() {
    check_new(&"a".repeat(MAX_NAMESPACE_LEN), &"k".repeat(MAX_KEY_LEN)).unwrap();
    check_new(&"a".repeat(MAX_NAMESPACE_LEN + 1), "k").unwrap();
    check_new("a", &"k".repeat(MAX_KEY_LEN + 1)).unwrap();
    // Two bytes, one character: the limit counts bytes.
    check_new("a", &format!("{}\u{e9}", "k".repeat(MAX_KEY_LEN - 2))).unwrap();
    check_parse("a/").unwrap();
    check_parse("/k").unwrap();
    check_parse("a//k").unwrap();
    check_parse("a/k/..").unwrap();
    check_parse("a/...").unwrap();
}
