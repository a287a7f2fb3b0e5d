//! Fencing tokens: `epoch << 48 | revision`.
//!
//! The revision is the etcd revision at which the grant transaction
//! committed; the epoch is the one the same transaction compared. Revisions
//! are cluster-wide and strictly increasing, so tokens strictly increase per
//! key; the epoch is advanced after any restore, so a token is never reused.
//!
//! A token is a capability: whoever presents it can write to a fenced
//! resource. `Debug` and `Display` therefore never show its value; call
//! [`Token::expose`] at the single place where it is handed to the resource.

use std::fmt;

/// Bits of the token that carry the revision.
pub const REVISION_BITS: u32 = 48;
/// Largest epoch that keeps the token positive in a signed 64-bit column.
pub const MAX_EPOCH: u32 = (1 << 15) - 1;
/// Largest revision that fits below the epoch.
pub const MAX_REVISION: u64 = (1 << REVISION_BITS) - 1;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(u64);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("epoch {0} is out of range (1..={MAX_EPOCH})")]
    Epoch(u32),
    #[error("revision {0} is out of range (1..={MAX_REVISION})")]
    Revision(u64),
}

impl Token {
    /// Packs an epoch and a commit revision.
    pub fn new(epoch: u32, revision: u64) -> Result<Self, TokenError> {
        if epoch == 0 || epoch > MAX_EPOCH {
            return Err(TokenError::Epoch(epoch));
        }
        if revision == 0 || revision > MAX_REVISION {
            return Err(TokenError::Revision(revision));
        }
        Ok(Token((u64::from(epoch) << REVISION_BITS) | revision))
    }

    /// The token of an **unprotected** grant: 0, below every token an
    /// arbiter mints, so a fenced resource refuses it. Only an `open`
    /// class's grant made from an arbiter's memory while etcd was out of
    /// reach carries it (the grant says `unprotected = true`);
    /// [`Token::from_wire`] never reads it.
    pub const fn unprotected() -> Self {
        Token(0)
    }

    /// True for [`Token::unprotected`].
    pub const fn is_unprotected(self) -> bool {
        self.0 == 0
    }

    /// Reads a token received on the wire. Rejects values that no arbiter
    /// could have minted.
    pub fn from_wire(value: u64) -> Result<Self, TokenError> {
        let epoch = u32::try_from(value >> REVISION_BITS).unwrap_or(u32::MAX);
        Self::new(epoch, value & MAX_REVISION)
    }

    pub fn epoch(self) -> u32 {
        (self.0 >> REVISION_BITS) as u32
    }

    pub fn revision(self) -> u64 {
        self.0 & MAX_REVISION
    }

    /// The packed value, for the wire and for the resource's fence column.
    /// Never log or print what this returns.
    pub fn expose(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted token>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_epoch_in_top_bits() {
        let t = Token::new(3, 301).unwrap();
        assert_eq!(t.expose() >> 48, 3);
        assert_eq!(t.epoch(), 3);
        assert_eq!(t.revision(), 301);
        assert!(t.expose() <= i64::MAX as u64);
    }

    #[test]
    fn later_epoch_beats_any_revision_of_an_earlier_one() {
        let old = Token::new(1, MAX_REVISION).unwrap();
        let new = Token::new(2, 1).unwrap();
        assert!(new > old);
    }

    #[test]
    fn rejects_out_of_range() {
        assert_eq!(Token::new(0, 1), Err(TokenError::Epoch(0)));
        assert_eq!(Token::new(MAX_EPOCH + 1, 1), Err(TokenError::Epoch(MAX_EPOCH + 1)));
        assert_eq!(Token::new(1, 0), Err(TokenError::Revision(0)));
        assert!(Token::from_wire(u64::MAX).is_err());
    }

    #[test]
    fn from_wire_reads_back_what_new_packs() {
        let wire = (3u64 << 48) | 301;
        let t = Token::from_wire(wire).unwrap();
        assert_eq!((t.epoch(), t.revision(), t.expose()), (3, 301, wire));
        assert_eq!(Token::new(3, 301).unwrap().expose(), wire);
        assert_eq!(Token::from_wire(wire), Token::new(3, 301));
        let top = Token::from_wire((u64::from(MAX_EPOCH) << 48) | MAX_REVISION).unwrap();
        assert_eq!((top.epoch(), top.revision()), (MAX_EPOCH, MAX_REVISION));
    }

    #[test]
    fn the_unprotected_token_is_0_and_below_every_minted_one() {
        let u = Token::unprotected();
        assert!(u.is_unprotected() && u.expose() == 0);
        assert!(u < Token::new(1, 1).unwrap());
        assert!(!Token::new(1, 1).unwrap().is_unprotected());
        assert!(Token::from_wire(0).is_err(), "never read from the wire: only an unprotected grant says it");
    }

    #[test]
    fn from_wire_refuses_what_no_arbiter_mints() {
        // Epoch 0 (never minted), a revision of 0, and an epoch past the
        // signed-column limit.
        assert_eq!(Token::from_wire(301), Err(TokenError::Epoch(0)));
        assert_eq!(Token::from_wire(3 << 48), Err(TokenError::Revision(0)));
        assert_eq!(Token::from_wire(u64::from(MAX_EPOCH + 1) << 48 | 1), Err(TokenError::Epoch(MAX_EPOCH + 1)));
        assert_eq!(Token::from_wire(u64::MAX), Err(TokenError::Epoch(u32::from(u16::MAX))));
    }

    #[test]
    fn accepts_the_full_range_and_nothing_past_it() {
        assert_eq!(Token::new(MAX_EPOCH, MAX_REVISION).unwrap().expose(), i64::MAX as u64);
        assert_eq!(Token::new(1, 1).unwrap().expose(), (1 << 48) | 1);
        assert_eq!(Token::new(1, MAX_REVISION + 1), Err(TokenError::Revision(MAX_REVISION + 1)));
    }

    #[test]
    fn debug_and_display_say_redacted() {
        let t = Token::new(1, 123456).unwrap();
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
        assert_eq!(t.to_string(), "<redacted token>");
    }

    #[test]
    fn never_prints_its_value() {
        let t = Token::new(1, 123456).unwrap();
        let shown = format!("{t} {t:?} {t:#?}");
        assert!(!shown.contains("123456"));
        assert!(!shown.contains(&t.expose().to_string()));
    }
}
