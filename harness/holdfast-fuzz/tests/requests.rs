//! Fuzz target: the `lock.v1` messages as bytes off the wire, and the
//! checks the arbiter applies to a request's fields before anything else
//! (`LockKey::new`, `Token::from_wire`, the session ID and TTL rules of
//! `holdfast-arbiter`'s `service.rs`).
//!
//! Inputs: any bytes, encodings of valid messages, and those encodings with
//! bytes flipped, inserted, deleted, repeated or cut. A message that decodes
//! must encode to bytes that decode to the same message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_fuzz::{any_text, config};
use holdfast_model::ttl::{self, MAX_TTL, MIN_TTL};
use holdfast_model::{LockKey, Token, layout};
use holdfast_proto::v1::*;
use proptest::prelude::*;
use proptest::sample::Index;
use prost::Message;
use std::fmt::Debug;
use std::time::Duration;

/// Decodes `bytes` as `M`; a message that decodes re-encodes to bytes that
/// decode to the same message, the same bytes again.
fn decoded<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Result<Option<M>, TestCaseError> {
    let Ok(m) = M::decode(bytes) else { return Ok(None) };
    let again = m.encode_to_vec();
    prop_assert_eq!(again.len(), m.encoded_len());
    let back = M::decode(again.as_slice());
    prop_assert_eq!(back.as_ref().ok(), Some(&m), "re-encoded {:?}", again);
    prop_assert_eq!(back.unwrap().encode_to_vec(), again);
    Ok(Some(m))
}

/// The arbiter's checks on a request's fields.
trait Boundary {
    fn boundary(&self) -> Result<(), TestCaseError>;
}

/// `lock_key` in the arbiter's `service.rs`.
fn lock_key(namespace: &str, key: &str) -> Result<(), TestCaseError> {
    match LockKey::new(namespace, key) {
        Ok(k) => {
            prop_assert_eq!((k.namespace(), k.key()), (namespace, key));
            prop_assert_eq!(layout::hold_key(&k), format!("{}{namespace}/{key}", layout::HOLD_PREFIX));
        }
        Err(e) => prop_assert!(matches!(e.field, "namespace" | "key") && !e.message.is_empty(), "{e:?}"),
    }
    Ok(())
}

/// `session_id` in the arbiter's `service.rs`: a positive etcd lease ID.
fn session_id(id: u64) -> Result<(), TestCaseError> {
    match i64::try_from(id) {
        Ok(v) if v > 0 => prop_assert_eq!(v as u64, id),
        _ => prop_assert!(id == 0 || id > i64::MAX as u64),
    }
    Ok(())
}

fn token(value: u64) -> Result<(), TestCaseError> {
    if let Ok(t) = Token::from_wire(value) {
        prop_assert_eq!(t.expose(), value);
    }
    Ok(())
}

impl Boundary for OpenSessionRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        let requested = Duration::from_millis(self.ttl_millis);
        if self.namespace.is_empty() {
            match ttl::session_ttl(requested) {
                Ok(t) => prop_assert!((MIN_TTL..=MAX_TTL).contains(&t) && t.subsec_nanos() == 0, "{t:?}"),
                Err(m) => prop_assert!(!m.is_empty()),
            }
        } else {
            lock_key(&self.namespace, "x")?;
        }
        Ok(())
    }
}

impl Boundary for AcquireRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        lock_key(&self.namespace, &self.key)?;
        session_id(self.session_id)?;
        let _ = Duration::from_millis(self.wait_millis) > Duration::from_secs(3600);
        Ok(())
    }
}

impl Boundary for ReleaseRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        lock_key(&self.namespace, &self.key)?;
        session_id(self.session_id)?;
        token(self.token)
    }
}

impl Boundary for InspectRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        lock_key(&self.namespace, &self.key)
    }
}

impl Boundary for ValidateTokenRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        lock_key(&self.namespace, &self.key)?;
        token(self.token)
    }
}

impl Boundary for KeepAliveRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        session_id(self.session_id)
    }
}

impl Boundary for CloseSessionRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        session_id(self.session_id)
    }
}

impl Boundary for ServerStatusRequest {
    fn boundary(&self) -> Result<(), TestCaseError> {
        Ok(())
    }
}

/// The client's reading of a refusal's typed detail (`reason_of`).
impl Boundary for ErrorDetail {
    fn boundary(&self) -> Result<(), TestCaseError> {
        if let Ok(reason) = ErrorReason::try_from(self.reason) {
            prop_assert_eq!(reason as i32, self.reason);
        }
        Ok(())
    }
}

fn decode_and_check<M: Message + Default + PartialEq + Debug + Boundary>(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Some(m) = decoded::<M>(bytes)? {
        m.boundary()?;
    }
    Ok(())
}

/// One edit of an encoding.
#[derive(Debug, Clone)]
enum ByteEdit {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, u8),
    Delete(Index),
    Truncate(Index),
    /// Append a copy of a range (a field repeated, as protobuf allows).
    Repeat(Index, Index),
    /// Append a field header with a large varint (a huge length or tag).
    Huge(u8, u8),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, bit)| ByteEdit::Flip(i, bit)),
        (any::<Index>(), prop_oneof![any::<u8>(), Just(0x80u8), Just(0xff), Just(0x00)]).prop_map(|(i, b)| ByteEdit::Set(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        any::<Index>().prop_map(ByteEdit::Delete),
        any::<Index>().prop_map(ByteEdit::Truncate),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| ByteEdit::Repeat(a, b)),
        (any::<u8>(), 1u8..11).prop_map(|(key, n)| ByteEdit::Huge(key, n)),
    ]
}

fn edit(mut bytes: Vec<u8>, e: &ByteEdit) -> Vec<u8> {
    let n = bytes.len();
    match e {
        ByteEdit::Flip(i, bit) if n > 0 => bytes[i.index(n)] ^= 1 << bit,
        ByteEdit::Set(i, b) if n > 0 => bytes[i.index(n)] = *b,
        ByteEdit::Insert(i, b) => bytes.insert(i.index(n + 1), *b),
        ByteEdit::Delete(i) if n > 0 => {
            bytes.remove(i.index(n));
        }
        ByteEdit::Truncate(i) => bytes.truncate(i.index(n + 1)),
        ByteEdit::Repeat(a, b) if n > 0 => {
            let (a, b) = (a.index(n), b.index(n));
            let copy = bytes[a.min(b)..=a.max(b)].to_vec();
            bytes.extend(copy);
        }
        ByteEdit::Huge(key, len) => {
            bytes.push(*key);
            bytes.extend(std::iter::repeat_n(0xff, usize::from(*len) - 1));
            bytes.push(0x01);
        }
        _ => {}
    }
    bytes
}

/// Bytes for a decoder of `M`: any bytes, or a valid encoding after zero
/// to four edits.
fn wire<M: Message + Debug + 'static>(valid: impl Strategy<Value = M> + 'static) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..48),
        3 => (valid, prop::collection::vec(byte_edit(), 0..=4))
            .prop_map(|(m, edits)| edits.iter().fold(m.encode_to_vec(), edit)),
    ]
}

/// A namespace or key: mostly well-formed, sometimes anything.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-z0-9][a-z0-9-]{0,6}", 2 => "[a-z0-9./-]{0,12}", 1 => any_text(8)]
}

fn id() -> impl Strategy<Value = u64> {
    prop_oneof![any::<u64>(), Just(0), Just(i64::MAX as u64), Just(i64::MAX as u64 + 1), Just(u64::MAX), 1u64..1000]
}

fn millis() -> impl Strategy<Value = u64> {
    prop_oneof![any::<u64>(), 0u64..400_000, Just(u64::MAX)]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn open_session_request(bytes in wire((millis(), name()).prop_map(|(ttl_millis, namespace)| OpenSessionRequest { ttl_millis, namespace }))) {
        decode_and_check::<OpenSessionRequest>(&bytes)?;
    }

    #[test]
    fn acquire_request(bytes in wire((id(), name(), name(), millis()).prop_map(|(session_id, namespace, key, wait_millis)| {
        AcquireRequest { session_id, namespace, key, wait_millis }
    }))) {
        decode_and_check::<AcquireRequest>(&bytes)?;
    }

    #[test]
    fn release_request(bytes in wire((id(), name(), name(), any::<u64>()).prop_map(|(session_id, namespace, key, token)| {
        ReleaseRequest { session_id, namespace, key, token }
    }))) {
        decode_and_check::<ReleaseRequest>(&bytes)?;
    }

    #[test]
    fn inspect_request(bytes in wire((name(), name()).prop_map(|(namespace, key)| InspectRequest { namespace, key }))) {
        decode_and_check::<InspectRequest>(&bytes)?;
    }

    #[test]
    fn validate_token_request(bytes in wire((name(), name(), any::<u64>()).prop_map(|(namespace, key, token)| {
        ValidateTokenRequest { namespace, key, token }
    }))) {
        decode_and_check::<ValidateTokenRequest>(&bytes)?;
    }

    #[test]
    fn session_requests(
        keep_alive in wire(id().prop_map(|session_id| KeepAliveRequest { session_id })),
        close in wire(id().prop_map(|session_id| CloseSessionRequest { session_id })),
        status in wire(Just(ServerStatusRequest {})),
    ) {
        decode_and_check::<KeepAliveRequest>(&keep_alive)?;
        decode_and_check::<CloseSessionRequest>(&close)?;
        decode_and_check::<ServerStatusRequest>(&status)?;
    }

    #[test]
    fn error_detail(bytes in wire((prop_oneof![0i32..16, any::<i32>()], name()).prop_map(|(reason, field)| ErrorDetail { reason, field }))) {
        decode_and_check::<ErrorDetail>(&bytes)?;
    }

    #[test]
    fn any_bytes_as_every_request(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        decode_and_check::<OpenSessionRequest>(&bytes)?;
        decode_and_check::<AcquireRequest>(&bytes)?;
        decode_and_check::<ReleaseRequest>(&bytes)?;
        decode_and_check::<InspectRequest>(&bytes)?;
        decode_and_check::<ValidateTokenRequest>(&bytes)?;
        decode_and_check::<KeepAliveRequest>(&bytes)?;
        decode_and_check::<CloseSessionRequest>(&bytes)?;
        decode_and_check::<ServerStatusRequest>(&bytes)?;
        decode_and_check::<ErrorDetail>(&bytes)?;
    }
}

// Named cases: edges worth running whatever the strategies draw. An input a
// target fails on is added here as its own #[test] (see src/lib.rs).

#[test]
fn edges_of_the_wire_format() {
    // Empty: every field at its default, each refused at the boundary.
    decode_and_check::<AcquireRequest>(&[]).unwrap();
    // A length far past the end, an over-long varint, a group wire type.
    for bytes in [
        &[0x12, 0xff, 0xff, 0xff, 0xff, 0x0f][..],
        &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        &[0x0b, 0x0c],
    ] {
        decode_and_check::<AcquireRequest>(bytes).unwrap();
        decode_and_check::<ReleaseRequest>(bytes).unwrap();
    }
    // Invalid UTF-8 in a string field is refused by the decoder.
    assert!(InspectRequest::decode(&[0x0a, 0x01, 0xff][..]).is_err());
}
