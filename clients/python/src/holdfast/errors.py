"""Typed refusals: one exception class per lock.v1.ErrorReason, decoded from
the google.rpc.Status the arbiter sends in the grpc-status-details-bin
trailer (its lock.v1.ErrorDetail, and a google.rpc.RetryInfo if any)."""

from __future__ import annotations

import grpc
from google.protobuf import duration_pb2  # noqa: F401  (RetryInfo's field type)
from google.rpc import error_details_pb2, status_pb2

from .lockv1 import lock_pb2

ERROR_DETAIL_TYPE_URL = "type.googleapis.com/lock.v1.ErrorDetail"
_RETRY_INFO_TYPE_URL = "type.googleapis.com/google.rpc.RetryInfo"
_DETAILS_TRAILER = "grpc-status-details-bin"

Reason = lock_pb2.ErrorReason


class HoldfastError(Exception):
    """A refusal by the arbiter (or a transport failure, reason UNAVAILABLE).
    Branch on the class (or ``reason``), never on the message text.

    code: the gRPC status code; reason: the lock.v1.ErrorReason value
    (ERROR_REASON_UNSPECIFIED when the status carried none and its code maps
    to none); field: for INVALID_ARGUMENT, the refused request field;
    message: the status message; retry_after: seconds from a
    google.rpc.RetryInfo detail, or None."""

    reason: int = lock_pb2.ERROR_REASON_UNSPECIFIED

    def __init__(self, message: str, *, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN, field: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.name}, reason={Reason.Name(self.reason)}, field={self.field!r}, message={self.message!r})"


class ContentionError(HoldfastError):
    """The key stayed held by another session until the wait deadline passed."""
    reason = lock_pb2.ERROR_REASON_CONTENTION


class LeakError(HoldfastError):
    """The key is held by this same identity under another session: a leaked hold."""
    reason = lock_pb2.ERROR_REASON_LEAK


class SealedError(HoldfastError):
    """The arbiter grants nothing until an epoch advance (or init)."""
    reason = lock_pb2.ERROR_REASON_SEALED


class SessionNotFoundError(HoldfastError):
    """The session does not exist, expired, belongs to another identity, or was
    lost locally (its deadline passed)."""
    reason = lock_pb2.ERROR_REASON_SESSION_NOT_FOUND


class InvalidArgumentError(HoldfastError):
    """A request field was refused; ``field`` names it."""
    reason = lock_pb2.ERROR_REASON_INVALID_ARGUMENT


class UnauthenticatedError(HoldfastError):
    """The client certificate carries no usable identity."""
    reason = lock_pb2.ERROR_REASON_UNAUTHENTICATED


class DeniedError(HoldfastError):
    """The identity may not lock this key."""
    reason = lock_pb2.ERROR_REASON_DENIED


class UnavailableError(HoldfastError):
    """etcd or the arbiter could not be reached; transport failures count too."""
    reason = lock_pb2.ERROR_REASON_UNAVAILABLE


class NoPolicyError(HoldfastError):
    """The arbiter has no published class set yet."""
    reason = lock_pb2.ERROR_REASON_NO_POLICY


class WrongRegionError(HoldfastError):
    """The key's class is homed to another region (the message names it)."""
    reason = lock_pb2.ERROR_REASON_WRONG_REGION


class ClassTTLError(HoldfastError):
    """The session's TTL is not the TTL of the key's class."""
    reason = lock_pb2.ERROR_REASON_CLASS_TTL


class RateLimitedError(HoldfastError):
    """The identity made requests faster than the arbiter's limit."""
    reason = lock_pb2.ERROR_REASON_RATE_LIMITED


class QuotaError(HoldfastError):
    """A session or hold quota is used up."""
    reason = lock_pb2.ERROR_REASON_QUOTA


class ClassTierError(HoldfastError):
    """The session is on another tier than the key's class."""
    reason = lock_pb2.ERROR_REASON_CLASS_TIER


class MovingError(HoldfastError):
    """The key's range is moving between etcd clusters; nothing was written.
    Retry after ``retry_after``."""
    reason = lock_pb2.ERROR_REASON_MOVING


class ConfigError(Exception):
    """A bad or unreadable client configuration (no endpoint, unreadable
    certificate, malformed endpoint, a missing on_fence). Not a refusal."""


BY_REASON: dict[int, type[HoldfastError]] = {
    cls.reason: cls
    for cls in (
        ContentionError, LeakError, SealedError, SessionNotFoundError, InvalidArgumentError, UnauthenticatedError,
        DeniedError, UnavailableError, NoPolicyError, WrongRegionError, ClassTTLError, RateLimitedError, QuotaError,
        ClassTierError, MovingError,
    )
}

# Without a detail the reason follows the code, as in the Rust and Go clients.
_BY_CODE: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.UNAVAILABLE: lock_pb2.ERROR_REASON_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: lock_pb2.ERROR_REASON_UNAVAILABLE,
    grpc.StatusCode.CANCELLED: lock_pb2.ERROR_REASON_UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: lock_pb2.ERROR_REASON_UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: lock_pb2.ERROR_REASON_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT: lock_pb2.ERROR_REASON_INVALID_ARGUMENT,
}


def from_status(code: grpc.StatusCode, message: str, details: bytes | None) -> HoldfastError:
    """The typed error for a status: ``details`` is the serialized
    google.rpc.Status of the grpc-status-details-bin trailer (or None)."""
    reason, field, retry_after = lock_pb2.ERROR_REASON_UNSPECIFIED, "", None
    if details:
        st = status_pb2.Status()
        try:
            st.ParseFromString(details)
        except Exception:  # a malformed trailer: fall back on the code
            st = status_pb2.Status()
        for any_ in st.details:
            if any_.type_url == ERROR_DETAIL_TYPE_URL and reason == lock_pb2.ERROR_REASON_UNSPECIFIED:
                d = lock_pb2.ErrorDetail()
                if any_.Unpack(d) and d.reason in BY_REASON:
                    reason, field = d.reason, d.field
            elif any_.type_url == _RETRY_INFO_TYPE_URL:
                ri = error_details_pb2.RetryInfo()
                if any_.Unpack(ri) and ri.HasField("retry_delay"):
                    retry_after = ri.retry_delay.ToTimedelta().total_seconds()
    if reason == lock_pb2.ERROR_REASON_UNSPECIFIED:
        reason = _BY_CODE.get(code, lock_pb2.ERROR_REASON_UNSPECIFIED)
    cls = BY_REASON.get(reason, HoldfastError)
    return cls(message or code.name, code=code, field=field, retry_after=retry_after)


def from_rpc_error(err: BaseException) -> BaseException:
    """Turn an error raised by a raw lock.v1 call (grpc.RpcError, also
    grpc.aio.AioRpcError) into its typed :class:`HoldfastError`; anything
    else is returned unchanged."""
    if isinstance(err, HoldfastError) or not isinstance(err, grpc.RpcError):
        return err
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else ""
    details = None
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for k, v in trailing or ():
        if k == _DETAILS_TRAILER:
            details = v
    typed = from_status(code or grpc.StatusCode.UNKNOWN, message or "", details)
    typed.__cause__ = err
    return typed


def _lost() -> SessionNotFoundError:
    """What a call on a lost session raises (as the Rust and Go clients)."""
    return SessionNotFoundError(
        "the session is lost (its local deadline passed); open a new session", code=grpc.StatusCode.FAILED_PRECONDITION
    )
