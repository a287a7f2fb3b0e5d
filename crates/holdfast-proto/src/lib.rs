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

/// A refusal with a stable, typed reason attached as the status details.
pub fn refusal(code: tonic::Code, reason: ErrorReason, field: &str, message: impl Into<String>) -> tonic::Status {
    let detail = ErrorDetail { reason: reason as i32, field: field.to_string() };
    tonic::Status::with_details(code, message, detail.encode_to_vec().into())
}

/// The typed reason of a refusal, if the status carries one.
pub fn reason_of(status: &tonic::Status) -> Option<(ErrorReason, String)> {
    let detail = ErrorDetail::decode(status.details()).ok()?;
    let reason = ErrorReason::try_from(detail.reason).ok()?;
    if reason == ErrorReason::Unspecified {
        return None;
    }
    Some((reason, detail.field))
}
