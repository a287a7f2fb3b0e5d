use holdfast_proto::ErrorReason;

/// What went wrong, with the arbiter's typed reason when it refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The arbiter refused the call. Branch on `reason`, not on the text.
    /// `retry_after` is the wait the arbiter asked for before a retry (a
    /// `google.rpc.RetryInfo` in the status), when it asked for one.
    #[error("{message}")]
    Refused { code: tonic::Code, reason: ErrorReason, field: String, message: String, retry_after: Option<std::time::Duration> },
    /// The connection settings are incomplete or unreadable.
    #[error("{0}")]
    Config(String),
    /// The arbiter could not be reached at all.
    #[error("cannot reach the arbiter at {endpoint}: {message}")]
    Connect { endpoint: String, message: String },
}

impl Error {
    /// The typed reason of a refusal. Transport failures count as
    /// [`ErrorReason::Unavailable`].
    pub fn reason(&self) -> Option<ErrorReason> {
        match self {
            Error::Refused { reason, .. } => Some(*reason),
            Error::Connect { .. } => Some(ErrorReason::Unavailable),
            Error::Config(_) => None,
        }
    }

    /// The wait the arbiter asked for before a retry (with
    /// [`ErrorReason::Moving`], always), when it asked for one.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Refused { retry_after, .. } => *retry_after,
            Error::Connect { .. } | Error::Config(_) => None,
        }
    }

    /// The gRPC status code of a refusal (e.g. `ResourceExhausted` for a
    /// rate limit or quota); `None` when the arbiter was not reached.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Refused { code, .. } => Some(*code),
            Error::Connect { .. } | Error::Config(_) => None,
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        let (reason, field) = holdfast_proto::reason_of(&s).unwrap_or_else(|| {
            let reason = match s.code() {
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => ErrorReason::Unavailable,
                // tonic's own status for a broken connection (a call on a
                // connection the arbiter closed: "transport error"), which
                // carries the transport's error as its source; a status the
                // arbiter sent has none.
                tonic::Code::Unknown if std::error::Error::source(&s).is_some() => ErrorReason::Unavailable,
                tonic::Code::Unauthenticated => ErrorReason::Unauthenticated,
                tonic::Code::PermissionDenied => ErrorReason::Denied,
                tonic::Code::InvalidArgument => ErrorReason::InvalidArgument,
                _ => ErrorReason::Unspecified,
            };
            (reason, String::new())
        });
        let message = if s.message().is_empty() { format!("{:?}", s.code()) } else { s.message().to_string() };
        let retry_after = holdfast_proto::retry_after_of(&s);
        Error::Refused { code: s.code(), reason, field, message, retry_after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_connection_is_unavailable_and_an_unknown_status_from_the_arbiter_is_not() {
        let broken = tonic::Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(broken.code(), tonic::Code::Unknown);
        assert_eq!(Error::from(broken).reason(), Some(ErrorReason::Unavailable));
        assert_eq!(Error::from(tonic::Status::unknown("the arbiter said so")).reason(), Some(ErrorReason::Unspecified));
    }
}
