"""The blocking API: the asyncio core (_locker.py) driven on one background
event-loop thread per Locker, so the protocol logic exists once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import grpc

from ._key import Key
from ._locker import AsyncLock, AsyncLocker, Fenced, KeyLike, _key
from ._session import Health
from ._token import Token
from .config import Config, secure_channel
from .errors import ConfigError, from_rpc_error
from .lockv1 import lock_pb2
from .lockv1.lock_pb2_grpc import LockStub


class Locker:
    """Takes locks for one workload identity. Thread-safe; share one per
    process. ``on_fence`` is required; it is called from a worker thread of
    the library, once per lost session that held keys. Use as a context
    manager, or call :meth:`close`."""

    def __init__(self, config: Config, on_fence: Callable[[Fenced], None], *, _channel_factory=None) -> None:
        if on_fence is None or not callable(on_fence):
            raise ConfigError("on_fence is required: it is how the library tells you to stop")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="holdfast-locker", daemon=True)
        self._thread.start()
        try:
            self._core: AsyncLocker = self._run(self._make(config, on_fence, _channel_factory))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(config, on_fence, factory) -> AsyncLocker:
        return AsyncLocker(config, on_fence, _channel_factory=factory)

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def home_of(self, key: KeyLike) -> int:
        return self._core.home_of(key)

    def acquire(self, key: KeyLike, *, wait: float = 0.0, ttl: float | None = None) -> Lock:
        """See :meth:`AsyncLocker.acquire`; blocks until granted or refused."""
        return Lock(self, self._run(self._core.acquire(key, wait=wait, ttl=ttl)))

    def lock(self, key: KeyLike, *, wait: float = 0.0, ttl: float | None = None) -> _LockContext:
        """``with locker.lock("ns/key", wait=30) as lock:`` acquires on entry
        and releases on exit."""
        return _LockContext(self, key, wait, ttl)

    def close(self) -> None:
        """Ends every session (and so every hold) and stops the loop thread.
        No fence is delivered for holds ended this way."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._core.aclose())
        finally:
            self._stop_loop()

    def __enter__(self) -> Locker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _LockContext:
    def __init__(self, locker: Locker, key: KeyLike, wait: float, ttl: float | None) -> None:
        self._args = (locker, key, wait, ttl)
        self._lock: Lock | None = None

    def __enter__(self) -> Lock:
        locker, key, wait, ttl = self._args
        self._lock = locker.acquire(key, wait=wait, ttl=ttl)
        return self._lock

    def __exit__(self, *exc) -> None:
        assert self._lock is not None
        self._lock.release()


class Lock:
    """One level of a held lock (blocking API). See :class:`AsyncLock`."""

    def __init__(self, locker: Locker, inner: AsyncLock) -> None:
        self._locker, self._inner = locker, inner

    key: Key = property(lambda self: self._inner.key)  # type: ignore[assignment]
    token: Token = property(lambda self: self._inner.token)  # type: ignore[assignment]
    unprotected: bool = property(lambda self: self._inner.unprotected)  # type: ignore[assignment]
    health: Health = property(lambda self: self._inner.health)  # type: ignore[assignment]
    session_id: int = property(lambda self: self._inner.session_id)  # type: ignore[assignment]
    ttl: float = property(lambda self: self._inner.ttl)  # type: ignore[assignment]
    lost: threading.Event = property(lambda self: self._inner.lost)  # type: ignore[assignment]

    def can_start(self) -> bool:
        return self._inner.can_start()

    def remaining_ttl(self) -> float:
        return self._inner.remaining_ttl()

    def release(self) -> bool:
        return self._locker._run(self._inner.release())

    def __repr__(self) -> str:
        return repr(self._inner).replace("AsyncLock(", "Lock(", 1)

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self):
        raise TypeError("a holdfast lock cannot be pickled")


class Client:
    """A blocking connection to one arbiter, for the calls a Locker does not
    make (inspect, server_status, validate_token) and raw lock.v1 calls
    (``client.rpc``; pass their grpc.RpcError through
    holdfast.errors.from_rpc_error for the typed error)."""

    def __init__(self, endpoint: str, config: Config) -> None:
        self._channel = secure_channel(endpoint, config)
        self.rpc = LockStub(self._channel)

    def _call(self, method, request, timeout: float = 30.0):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def inspect(self, key: KeyLike) -> lock_pb2.InspectResponse:
        """Who holds key (never the token)."""
        k = _key(key)
        return self._call(self.rpc.Inspect, lock_pb2.InspectRequest(namespace=k.namespace, key=k.path))

    def server_status(self) -> lock_pb2.ServerStatusResponse:
        return self._call(self.rpc.ServerStatus, lock_pb2.ServerStatusRequest())

    def validate_token(self, key: KeyLike, token: Token) -> bool:
        k = _key(key)
        return self._call(self.rpc.ValidateToken,
                          lock_pb2.ValidateTokenRequest(namespace=k.namespace, key=k.path, token=token.expose())).valid

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
