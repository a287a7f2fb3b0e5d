"""holdfast: a thin client for holdfast's lock.v1 API (distributed locks with
fencing tokens). Blocking (:class:`Locker`) and asyncio (:class:`AsyncLocker`)
APIs share one implementation: the blocking one drives the asyncio core on a
background loop thread."""

from ._affinity import ranked, score
from ._key import Key
from ._locker import AsyncLock, AsyncLocker, Fenced
from ._session import FENCE_MARGIN, Health, fence_deadline, keepalive_period
from ._sync import Client, Lock, Locker
from ._token import Token
from .config import Config, config_from_env
from .errors import (
    ClassTierError,
    ClassTTLError,
    ConfigError,
    ContentionError,
    DeniedError,
    HoldfastError,
    InvalidArgumentError,
    LeakError,
    MovingError,
    NoPolicyError,
    QuotaError,
    RateLimitedError,
    SealedError,
    SessionNotFoundError,
    UnauthenticatedError,
    UnavailableError,
    WrongRegionError,
    from_rpc_error,
)

__all__ = [
    "FENCE_MARGIN", "AsyncLock", "AsyncLocker", "ClassTTLError", "ClassTierError", "Client", "Config", "ConfigError",
    "ContentionError", "DeniedError", "Fenced", "Health", "HoldfastError", "InvalidArgumentError", "Key", "LeakError",
    "Lock", "Locker", "MovingError", "NoPolicyError", "QuotaError", "RateLimitedError", "SealedError", "SessionNotFoundError", "Token",
    "UnauthenticatedError", "UnavailableError", "WrongRegionError", "config_from_env", "fence_deadline",
    "from_rpc_error", "keepalive_period", "ranked", "score",
]
