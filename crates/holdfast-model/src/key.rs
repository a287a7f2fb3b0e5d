//! Lock keys: a namespace and a path inside it, stored at `/l/<ns>/<key>`.
//!
//! Validation is what keeps one namespace from reaching into another: the
//! namespace has no `/`, and the key has no empty, `.` or `..` segment, no
//! leading or trailing `/`, and only visible ASCII.

use std::fmt;

pub const MAX_NAMESPACE_LEN: usize = 63;
pub const MAX_KEY_LEN: usize = 512;

/// A refused request field: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        FieldError { field, message: message.into() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockKey {
    namespace: String,
    key: String,
}

impl LockKey {
    pub fn new(namespace: &str, key: &str) -> Result<Self, FieldError> {
        validate_namespace(namespace)?;
        validate_key(key)?;
        Ok(LockKey { namespace: namespace.to_string(), key: key.to_string() })
    }

    /// Parses the CLI form `NS/KEY`: everything up to the first `/` is the
    /// namespace.
    pub fn parse(text: &str) -> Result<Self, FieldError> {
        match text.split_once('/') {
            Some((ns, key)) => Self::new(ns, key),
            None => Err(FieldError::new("key", format!("{text:?} has no namespace; write it as NAMESPACE/KEY, e.g. payments/ledger-7"))),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.key)
    }
}

pub(crate) fn validate_namespace(ns: &str) -> Result<(), FieldError> {
    let bad = |m: String| Err(FieldError::new("namespace", m));
    if ns.is_empty() {
        return bad("is empty; every key lives in a namespace such as \"payments\"".into());
    }
    if ns.len() > MAX_NAMESPACE_LEN {
        return bad(format!("is {} bytes; the limit is {MAX_NAMESPACE_LEN}", ns.len()));
    }
    if !ns.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return bad(format!("{ns:?} may contain only a-z, 0-9 and '-'"));
    }
    if ns.starts_with('-') || ns.ends_with('-') {
        return bad(format!("{ns:?} may not start or end with '-'"));
    }
    Ok(())
}

fn validate_key(key: &str) -> Result<(), FieldError> {
    let bad = |m: String| Err(FieldError::new("key", m));
    if key.is_empty() {
        return bad("is empty; name the resource the lock guards, e.g. \"ledger-7\"".into());
    }
    if key.len() > MAX_KEY_LEN {
        return bad(format!("is {} bytes; the limit is {MAX_KEY_LEN}", key.len()));
    }
    if let Some(c) = key.chars().find(|c| !c.is_ascii_graphic()) {
        return bad(format!("contains {c:?}; only visible ASCII characters are allowed"));
    }
    if key.starts_with('/') || key.ends_with('/') {
        return bad("may not start or end with '/'".into());
    }
    for segment in key.split('/') {
        match segment {
            "" => return bad("contains an empty path segment (\"//\")".into()),
            "." | ".." => {
                return bad(format!("contains a {segment:?} path segment, which could leave the namespace"));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_keys() {
        let k = LockKey::parse("payments/ledger/7").unwrap();
        assert_eq!(k.namespace(), "payments");
        assert_eq!(k.key(), "ledger/7");
    }

    #[test]
    fn refuses_escapes_and_junk() {
        for (ns, key, field) in [
            ("", "k", "namespace"),
            ("a/b", "k", "namespace"),
            ("Pay", "k", "namespace"),
            ("p", "", "key"),
            ("p", "/etc", "key"),
            ("p", "../other/k", "key"),
            ("p", "a/./b", "key"),
            ("p", "a//b", "key"),
            ("p", "a b", "key"),
            ("p", "k/", "key"),
        ] {
            let err = LockKey::new(ns, key).unwrap_err();
            assert_eq!(err.field, field, "{ns:?}/{key:?}");
        }
        assert_eq!(LockKey::new("p", &"x".repeat(MAX_KEY_LEN + 1)).unwrap_err().field, "key");
        assert!(LockKey::new("p", &"x".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(LockKey::parse("nokey").unwrap_err().field, "key");
    }

    #[test]
    fn displays_as_the_form_it_parses() {
        let k = LockKey::new("pay-2", "ledger/7").unwrap();
        assert_eq!(k.to_string(), "pay-2/ledger/7");
        assert_eq!(LockKey::parse(&k.to_string()), Ok(k));
    }

    #[test]
    fn namespace_is_lowercase_digits_and_inner_dashes_up_to_the_limit() {
        assert!(LockKey::new("a-0", "k").is_ok());
        assert!(LockKey::new(&"n".repeat(MAX_NAMESPACE_LEN), "k").is_ok());
        for ns in ["n".repeat(MAX_NAMESPACE_LEN + 1), "-a".into(), "a-".into(), "a_b".into(), "a.b".into()] {
            let err = LockKey::new(&ns, "k").unwrap_err();
            assert_eq!(err.field, "namespace", "{ns:?}");
        }
    }

    #[test]
    fn key_refuses_each_escape_on_its_own() {
        assert!(LockKey::new("p", "a/b.c/..d/~!").is_ok());
        for key in ["/a", "a/", ".", "..", "a/..", "./a", "a\tb", "caf\u{e9}", "a\nb"] {
            let err = LockKey::new("p", key).unwrap_err();
            assert_eq!(err.field, "key", "{key:?}");
        }
        // A leading or trailing '/' also makes an empty segment; the message
        // names the real mistake.
        for key in ["/a", "a/"] {
            assert_eq!(LockKey::new("p", key).unwrap_err().message, "may not start or end with '/'", "{key:?}");
        }
    }
}
