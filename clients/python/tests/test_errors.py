"""Typed errors decoded from synthetic google.rpc.Status trailers, as the
arbiter encodes them (crates/holdfast-proto: a lock.v1.ErrorDetail in the
Status of grpc-status-details-bin, the Status carrying the same code and
message as the gRPC status)."""

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

import holdfast
from holdfast.errors import BY_REASON, ERROR_DETAIL_TYPE_URL, from_rpc_error, from_status
from holdfast.lockv1 import lock_pb2


def status_bin(code: grpc.StatusCode, message: str, *details) -> bytes:
    st = status_pb2.Status(code=code.value[0], message=message)
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        st.details.append(a)
    return st.SerializeToString()


CASES = [
    (lock_pb2.ERROR_REASON_CONTENTION, grpc.StatusCode.ABORTED, holdfast.ContentionError),
    (lock_pb2.ERROR_REASON_LEAK, grpc.StatusCode.FAILED_PRECONDITION, holdfast.LeakError),
    (lock_pb2.ERROR_REASON_SEALED, grpc.StatusCode.UNAVAILABLE, holdfast.SealedError),
    (lock_pb2.ERROR_REASON_SESSION_NOT_FOUND, grpc.StatusCode.NOT_FOUND, holdfast.SessionNotFoundError),
    (lock_pb2.ERROR_REASON_INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT, holdfast.InvalidArgumentError),
    (lock_pb2.ERROR_REASON_UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED, holdfast.UnauthenticatedError),
    (lock_pb2.ERROR_REASON_DENIED, grpc.StatusCode.PERMISSION_DENIED, holdfast.DeniedError),
    (lock_pb2.ERROR_REASON_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE, holdfast.UnavailableError),
    (lock_pb2.ERROR_REASON_NO_POLICY, grpc.StatusCode.FAILED_PRECONDITION, holdfast.NoPolicyError),
    (lock_pb2.ERROR_REASON_WRONG_REGION, grpc.StatusCode.FAILED_PRECONDITION, holdfast.WrongRegionError),
    (lock_pb2.ERROR_REASON_CLASS_TTL, grpc.StatusCode.INVALID_ARGUMENT, holdfast.ClassTTLError),
    (lock_pb2.ERROR_REASON_RATE_LIMITED, grpc.StatusCode.RESOURCE_EXHAUSTED, holdfast.RateLimitedError),
    (lock_pb2.ERROR_REASON_QUOTA, grpc.StatusCode.RESOURCE_EXHAUSTED, holdfast.QuotaError),
    (lock_pb2.ERROR_REASON_CLASS_TIER, grpc.StatusCode.FAILED_PRECONDITION, holdfast.ClassTierError),
    (lock_pb2.ERROR_REASON_MOVING, grpc.StatusCode.UNAVAILABLE, holdfast.MovingError),
]


def test_every_reason_has_its_own_class():
    reasons = [v for v in lock_pb2.ErrorReason.values() if v != lock_pb2.ERROR_REASON_UNSPECIFIED]
    assert sorted(BY_REASON) == sorted(reasons)
    assert len({c for c in BY_REASON.values()}) == len(reasons)
    assert {c for _, _, c in CASES} == set(BY_REASON.values())


@pytest.mark.parametrize("reason, code, cls", CASES)
def test_the_detail_decides_the_class(reason, code, cls):
    err = from_status(code, "jobs/k: refused", status_bin(code, "jobs/k: refused", lock_pb2.ErrorDetail(reason=reason, field="f")))
    assert type(err) is cls and isinstance(err, holdfast.HoldfastError)
    assert (err.reason, err.code, err.field, err.message, str(err)) == (reason, code, "f", "jobs/k: refused", "jobs/k: refused")


def test_retry_info_is_decoded():
    rl = lock_pb2.ErrorDetail(reason=lock_pb2.ERROR_REASON_RATE_LIMITED)
    ri = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1, nanos=500_000_000))
    err = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", status_bin(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", rl, ri))
    assert isinstance(err, holdfast.RateLimitedError) and err.retry_after == 1.5


@pytest.mark.parametrize(
    "code, cls",
    [
        (grpc.StatusCode.UNAVAILABLE, holdfast.UnavailableError),
        (grpc.StatusCode.DEADLINE_EXCEEDED, holdfast.UnavailableError),
        (grpc.StatusCode.CANCELLED, holdfast.UnavailableError),
        (grpc.StatusCode.UNAUTHENTICATED, holdfast.UnauthenticatedError),
        (grpc.StatusCode.PERMISSION_DENIED, holdfast.DeniedError),
        (grpc.StatusCode.INVALID_ARGUMENT, holdfast.InvalidArgumentError),
    ],
)
def test_without_a_detail_the_code_decides(code, cls):
    assert type(from_status(code, "", None)) is cls


def test_no_detail_and_an_unmapped_code_is_the_base_class():
    err = from_status(grpc.StatusCode.INTERNAL, "", None)
    assert type(err) is holdfast.HoldfastError and err.reason == lock_pb2.ERROR_REASON_UNSPECIFIED and err.message == "INTERNAL"


def test_a_malformed_or_unknown_detail_falls_back_on_the_code():
    assert type(from_status(grpc.StatusCode.NOT_FOUND, "x", b"\xff\xff\xff")) is holdfast.HoldfastError
    unknown = status_bin(grpc.StatusCode.ABORTED, "x")
    st = status_pb2.Status.FromString(unknown)
    st.details.add(type_url=ERROR_DETAIL_TYPE_URL, value=lock_pb2.ErrorDetail(reason=99).SerializeToString())
    assert type(from_status(grpc.StatusCode.UNAVAILABLE, "x", st.SerializeToString())) is holdfast.UnavailableError


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing):
        self._c, self._d, self._t = code, details, trailing

    def code(self):
        return self._c

    def details(self):
        return self._d

    def trailing_metadata(self):
        return self._t


def test_from_rpc_error_reads_the_trailer():
    b = status_bin(grpc.StatusCode.NOT_FOUND, "session 3039 does not exist", lock_pb2.ErrorDetail(reason=lock_pb2.ERROR_REASON_SESSION_NOT_FOUND))
    raw = FakeRpcError(grpc.StatusCode.NOT_FOUND, "session 3039 does not exist", (("other", "x"), ("grpc-status-details-bin", b)))
    err = from_rpc_error(raw)
    assert isinstance(err, holdfast.SessionNotFoundError) and err.code == grpc.StatusCode.NOT_FOUND and err.__cause__ is raw
    assert from_rpc_error(err) is err
    other = ValueError("not grpc")
    assert from_rpc_error(other) is other
