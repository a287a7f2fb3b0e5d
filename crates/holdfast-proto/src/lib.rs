//! The `lock.v1` API. This crate owns the proto and re-exports what callers
//! need: the generated messages, client and server, and the typed error
//! detail that every refusal carries.

pub mod v1 {
    tonic::include_proto!("lock.v1");
}

/// The encoded `FileDescriptorSet` of `lock.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lock_v1_descriptor");

pub use v1::lock_client::LockClient;
pub use v1::lock_server::{Lock, LockServer};
pub use v1::{ErrorDetail, ErrorReason};

use prost::Message;

/// The type URL of [`ErrorDetail`] inside a `google.rpc.Status`'s details.
pub const ERROR_DETAIL_TYPE_URL: &str = "type.googleapis.com/lock.v1.ErrorDetail";

/// `google.rpc.Status` on the wire (its three fields, by number). Declared
/// here rather than taken from tonic-types and prost-types: those two
/// crates would put the shipped `holdfastctl` over its 150-crate limit,
/// for two messages of three and two fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<RpcAny>,
}

/// `google.protobuf.Any` on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// A refusal with a stable, typed reason attached as the status details,
/// in gRPC's rich error model: the `grpc-status-details-bin` trailer is a
/// `google.rpc.Status` with the same code and message as the status, whose
/// details hold one `lock.v1.ErrorDetail` (as an `Any`). grpc-go turns a
/// status whose details disagree with its code or message into `Internal`
/// (checked with grpcurl in `tests/tests/systemd_notify.rs`).
pub fn refusal(code: tonic::Code, reason: ErrorReason, field: &str, message: impl Into<String>) -> tonic::Status {
    refusal_retry_after(code, reason, field, message, None)
}

/// [`refusal`], and with `retry_after` a `google.rpc.RetryInfo` detail
/// after the [`ErrorDetail`]: how long the caller should wait before it
/// tries again ([`retry_after_of`] reads it back).
pub fn refusal_retry_after(
    code: tonic::Code,
    reason: ErrorReason,
    field: &str,
    message: impl Into<String>,
    retry_after: Option<std::time::Duration>,
) -> tonic::Status {
    let message = message.into();
    let detail = ErrorDetail { reason: reason as i32, field: field.to_string() };
    let mut details = vec![RpcAny { type_url: ERROR_DETAIL_TYPE_URL.into(), value: detail.encode_to_vec() }];
    if let Some(d) = retry_after {
        let delay = PbDuration { seconds: d.as_secs().min(i64::MAX as u64) as i64, nanos: d.subsec_nanos() as i32 };
        details.push(RpcAny { type_url: RETRY_INFO_TYPE_URL.into(), value: RetryInfo { retry_delay: Some(delay) }.encode_to_vec() });
    }
    let status = RpcStatus { code: code as i32, message: message.clone(), details };
    tonic::Status::with_details(code, message, status.encode_to_vec().into())
}

/// The typed reason of a refusal, if the status carries one.
pub fn reason_of(status: &tonic::Status) -> Option<(ErrorReason, String)> {
    let detail = detail_of(status.details())?;
    let reason = ErrorReason::try_from(detail.reason).ok()?;
    if reason == ErrorReason::Unspecified {
        return None;
    }
    Some((reason, detail.field))
}

/// `type_url` of the `google.rpc.RetryInfo` detail: how long the caller
/// should wait before it retries.
pub const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// `google.rpc.RetryInfo`, the one field we read.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<PbDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// The retry delay of a `google.rpc.RetryInfo` in a status's details, when
/// one is there and not negative.
pub fn retry_after_of(status: &tonic::Status) -> Option<std::time::Duration> {
    let rpc = RpcStatus::decode(status.details()).ok()?;
    let any = rpc.details.iter().find(|a| a.type_url == RETRY_INFO_TYPE_URL)?;
    let delay = RetryInfo::decode(any.value.as_slice()).ok()?.retry_delay?;
    let seconds = u64::try_from(delay.seconds).ok()?;
    let nanos = u32::try_from(delay.nanos).ok()?;
    Some(std::time::Duration::new(seconds, nanos))
}

/// The [`ErrorDetail`] in a status's details: inside a `google.rpc.Status`
/// (what arbiters send), or the bare message an arbiter from before
/// 2026-12-07 sent (a `google.rpc.Status` with details always has one, so
/// the two are never confused).
fn detail_of(bytes: &[u8]) -> Option<ErrorDetail> {
    if let Ok(status) = RpcStatus::decode(bytes)
        && !status.details.is_empty()
    {
        let any = status.details.iter().find(|a| a.type_url == ERROR_DETAIL_TYPE_URL)?;
        return ErrorDetail::decode(any.value.as_slice()).ok();
    }
    ErrorDetail::decode(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_google_rpc_status_agreeing_with_its_code_and_message() {
        let s = refusal(tonic::Code::NotFound, ErrorReason::SessionNotFound, "session_id", "session 3039 does not exist");
        // What grpc-go checks before it believes the status.
        let rpc = RpcStatus::decode(s.details()).unwrap();
        assert_eq!(rpc.code, tonic::Code::NotFound as i32);
        assert_eq!(rpc.message, "session 3039 does not exist");
        assert_eq!(rpc.details.len(), 1);
        assert_eq!(rpc.details[0].type_url, ERROR_DETAIL_TYPE_URL);
        assert_eq!(reason_of(&s), Some((ErrorReason::SessionNotFound, "session_id".to_string())));
    }

    #[test]
    fn a_retry_after_rides_with_the_reason() {
        let d = std::time::Duration::from_millis(2750);
        let s = refusal_retry_after(tonic::Code::Unavailable, ErrorReason::Moving, "", "moving", Some(d));
        assert_eq!(reason_of(&s), Some((ErrorReason::Moving, String::new())));
        assert_eq!(retry_after_of(&s), Some(d));
        assert_eq!(retry_after_of(&refusal(tonic::Code::Unavailable, ErrorReason::Moving, "", "moving")), None);
    }

    #[test]
    fn the_bare_detail_of_an_older_arbiter_is_still_read() {
        let detail = ErrorDetail { reason: ErrorReason::Contention as i32, field: String::new() };
        let s = tonic::Status::with_details(tonic::Code::Aborted, "held", detail.encode_to_vec().into());
        assert_eq!(reason_of(&s), Some((ErrorReason::Contention, String::new())));
    }

    #[test]
    fn a_status_without_our_detail_has_no_reason() {
        assert_eq!(reason_of(&tonic::Status::internal("boom")), None);
        let other = RpcStatus {
            code: 5,
            message: "x".into(),
            details: vec![RpcAny { type_url: "type.googleapis.com/google.rpc.DebugInfo".into(), value: vec![] }],
        };
        let s = tonic::Status::with_details(tonic::Code::NotFound, "x", other.encode_to_vec().into());
        assert_eq!(reason_of(&s), None);
    }
}
