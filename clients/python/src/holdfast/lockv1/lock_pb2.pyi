from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_CONTENTION: _ClassVar[ErrorReason]
    ERROR_REASON_LEAK: _ClassVar[ErrorReason]
    ERROR_REASON_SEALED: _ClassVar[ErrorReason]
    ERROR_REASON_SESSION_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_ARGUMENT: _ClassVar[ErrorReason]
    ERROR_REASON_UNAUTHENTICATED: _ClassVar[ErrorReason]
    ERROR_REASON_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_NO_POLICY: _ClassVar[ErrorReason]
    ERROR_REASON_WRONG_REGION: _ClassVar[ErrorReason]
    ERROR_REASON_CLASS_TTL: _ClassVar[ErrorReason]
    ERROR_REASON_RATE_LIMITED: _ClassVar[ErrorReason]
    ERROR_REASON_QUOTA: _ClassVar[ErrorReason]
    ERROR_REASON_CLASS_TIER: _ClassVar[ErrorReason]
    ERROR_REASON_MOVING: _ClassVar[ErrorReason]
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_CONTENTION: ErrorReason
ERROR_REASON_LEAK: ErrorReason
ERROR_REASON_SEALED: ErrorReason
ERROR_REASON_SESSION_NOT_FOUND: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_DENIED: ErrorReason
ERROR_REASON_UNAVAILABLE: ErrorReason
ERROR_REASON_NO_POLICY: ErrorReason
ERROR_REASON_WRONG_REGION: ErrorReason
ERROR_REASON_CLASS_TTL: ErrorReason
ERROR_REASON_RATE_LIMITED: ErrorReason
ERROR_REASON_QUOTA: ErrorReason
ERROR_REASON_CLASS_TIER: ErrorReason
ERROR_REASON_MOVING: ErrorReason

class ErrorDetail(_message.Message):
    __slots__ = ("reason", "field")
    REASON_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    reason: ErrorReason
    field: str
    def __init__(self, reason: _Optional[_Union[ErrorReason, str]] = ..., field: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("ttl_millis", "namespace")
    TTL_MILLIS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ttl_millis: int
    namespace: str
    def __init__(self, ttl_millis: _Optional[int] = ..., namespace: _Optional[str] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "ttl_millis", "tier", "unprotected")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MILLIS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    UNPROTECTED_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    ttl_millis: int
    tier: str
    unprotected: bool
    def __init__(self, session_id: _Optional[int] = ..., ttl_millis: _Optional[int] = ..., tier: _Optional[str] = ..., unprotected: _Optional[bool] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ("session_id", "ttl_millis", "confirmed")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MILLIS_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    ttl_millis: int
    confirmed: bool
    def __init__(self, session_id: _Optional[int] = ..., ttl_millis: _Optional[int] = ..., confirmed: _Optional[bool] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    def __init__(self, session_id: _Optional[int] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("session_id", "namespace", "key", "wait_millis")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_MILLIS_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    namespace: str
    key: str
    wait_millis: int
    def __init__(self, session_id: _Optional[int] = ..., namespace: _Optional[str] = ..., key: _Optional[str] = ..., wait_millis: _Optional[int] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("token", "epoch", "revision", "unprotected")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    UNPROTECTED_FIELD_NUMBER: _ClassVar[int]
    token: int
    epoch: int
    revision: int
    unprotected: bool
    def __init__(self, token: _Optional[int] = ..., epoch: _Optional[int] = ..., revision: _Optional[int] = ..., unprotected: _Optional[bool] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "namespace", "key", "token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    namespace: str
    key: str
    token: int
    def __init__(self, session_id: _Optional[int] = ..., namespace: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("namespace", "key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("held", "holder_identity", "session_id", "waiters", "epoch", "since_unix_ms")
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOLDER_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    held: bool
    holder_identity: str
    session_id: int
    waiters: int
    epoch: int
    since_unix_ms: int
    def __init__(self, held: _Optional[bool] = ..., holder_identity: _Optional[str] = ..., session_id: _Optional[int] = ..., waiters: _Optional[int] = ..., epoch: _Optional[int] = ..., since_unix_ms: _Optional[int] = ...) -> None: ...

class ServerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerStatusResponse(_message.Message):
    __slots__ = ("epoch", "cluster_id", "sealed", "sealed_reason", "etcd_version", "serving", "grant_attempts", "served", "cluster", "clusters")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SEALED_REASON_FIELD_NUMBER: _ClassVar[int]
    ETCD_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    GRANT_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    cluster_id: str
    sealed: bool
    sealed_reason: str
    etcd_version: str
    serving: bool
    grant_attempts: int
    served: _containers.RepeatedCompositeFieldContainer[ServedEpoch]
    cluster: str
    clusters: _containers.RepeatedCompositeFieldContainer[ClusterState]
    def __init__(self, epoch: _Optional[int] = ..., cluster_id: _Optional[str] = ..., sealed: _Optional[bool] = ..., sealed_reason: _Optional[str] = ..., etcd_version: _Optional[str] = ..., serving: _Optional[bool] = ..., grant_attempts: _Optional[int] = ..., served: _Optional[_Iterable[_Union[ServedEpoch, _Mapping]]] = ..., cluster: _Optional[str] = ..., clusters: _Optional[_Iterable[_Union[ClusterState, _Mapping]]] = ...) -> None: ...

class ClusterState(_message.Message):
    __slots__ = ("name", "tiers", "epoch", "cluster_id", "sealed", "sealed_reason", "serving")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SEALED_REASON_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    name: str
    tiers: str
    epoch: int
    cluster_id: str
    sealed: bool
    sealed_reason: str
    serving: bool
    def __init__(self, name: _Optional[str] = ..., tiers: _Optional[str] = ..., epoch: _Optional[int] = ..., cluster_id: _Optional[str] = ..., sealed: _Optional[bool] = ..., sealed_reason: _Optional[str] = ..., serving: _Optional[bool] = ...) -> None: ...

class ServedEpoch(_message.Message):
    __slots__ = ("cluster", "epoch", "cluster_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    epoch: int
    cluster_id: str
    def __init__(self, cluster: _Optional[str] = ..., epoch: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class ValidateTokenRequest(_message.Message):
    __slots__ = ("namespace", "key", "token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    token: int
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ..., token: _Optional[int] = ...) -> None: ...

class ValidateTokenResponse(_message.Message):
    __slots__ = ("valid",)
    VALID_FIELD_NUMBER: _ClassVar[int]
    valid: bool
    def __init__(self, valid: _Optional[bool] = ...) -> None: ...
