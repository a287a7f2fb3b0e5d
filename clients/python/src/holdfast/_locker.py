"""The asyncio core: sessions per (TTL, tier), holds, re-entrancy, arbiter
choice. The blocking API (holdfast.Locker) drives this same code on a
background loop thread."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Union

import grpc

from ._affinity import ranked
from ._key import Key
from ._session import Health, Session
from ._token import REDACTED, Token
from .config import Config, aio_secure_channel
from .errors import ConfigError, HoldfastError, UnavailableError, from_rpc_error
from .lockv1 import lock_pb2
from .lockv1.lock_pb2_grpc import LockStub

log = logging.getLogger("holdfast")

#: Extra time an Acquire call may take beyond its wait before it is abandoned.
CALL_MARGIN = 30.0


@dataclass(frozen=True)
class Fenced:
    """Handed to on_fence when a session is lost (its local deadline passed, or
    the arbiter said it is gone): every key in ``keys`` must be treated as
    lost. Stop acting on them now."""

    ttl: float
    session_id: int
    keys: tuple[Key, ...]


OnFence = Callable[[Fenced], Union[None, Awaitable[None]]]
KeyLike = Union[Key, str]


def _key(key: KeyLike) -> Key:
    return key if isinstance(key, Key) else Key.parse(key)


class _Entry:
    __slots__ = ("token", "count", "via", "unprotected")

    def __init__(self, token: Token, via: int, unprotected: bool) -> None:
        self.token, self.count, self.via, self.unprotected = token, 1, via, unprotected


class _Slot:
    """One session and the holds on it."""

    def __init__(self, session: Session, key: tuple[float, str], home: int) -> None:
        self.session = session
        self.key = key
        # The arbiter the session was opened on: the only one that knows an
        # unprotected session.
        self.home = home
        self.holds: dict[Key, _Entry] = {}
        # Final releases sent without an answer (token, arbiter index): the
        # hold may still be live and the release may still be applied, so
        # acquire sends it again first.
        self.releasing: dict[Key, tuple[Token, int]] = {}
        self.key_locks: dict[Key, asyncio.Lock] = {}

    def key_lock(self, k: Key) -> asyncio.Lock:
        """Serialises acquire and release of one key in the slot."""
        return self.key_locks.setdefault(k, asyncio.Lock())


def _unavailable(e: BaseException) -> bool:
    return isinstance(e, UnavailableError)


async def _send_release(stubs: Sequence[LockStub], s: _Slot, key: Key, token: Token, via: int) -> bool:
    """Sends the final release of key's hold token, from arbiter via on
    (failing over while unavailable). Without an answer (every arbiter
    unavailable, or the call cancelled) the release is kept in the slot as
    unanswered; only an answer clears it. A refusal says this attempt did
    nothing, not what became of an earlier unanswered one."""
    req = lock_pb2.ReleaseRequest(session_id=s.session.id, namespace=key.namespace, key=key.path, token=token.expose())
    last: BaseException | None = None
    try:
        for step in range(len(stubs)):
            try:
                r = await stubs[(via + step) % len(stubs)].Release(req, timeout=CALL_MARGIN)
            except grpc.RpcError as err:
                typed = from_rpc_error(err)
                if not _unavailable(typed):
                    raise typed from None
                last = typed
                continue
            s.releasing.pop(key, None)
            return r.released
    except asyncio.CancelledError:
        s.releasing[key] = (token, via)
        raise
    s.releasing[key] = (token, via)
    raise last or ConfigError("no arbiter endpoints")


class AsyncLocker:
    """Takes locks for one workload identity, on the running asyncio loop.
    Share one per process and loop; close it with ``await locker.aclose()``
    or ``async with AsyncLocker(...)``.

    ``on_fence`` is required: it is how the library tells the application to
    stop acting on its keys. It is called once per lost session that held
    keys; a coroutine function is awaited in its own task, a plain function
    runs in the loop's default executor (so it may block without delaying
    other sessions' keepalives)."""

    def __init__(self, config: Config, on_fence: OnFence, *,
                 _channel_factory: Callable[[str], grpc.aio.Channel] | None = None) -> None:
        if on_fence is None or not callable(on_fence):
            raise ConfigError("on_fence is required: it is how the library tells you to stop")
        if not config.endpoints:
            raise ConfigError("no arbiter endpoints configured")
        self._endpoints = list(config.endpoints)
        self._on_fence = on_fence
        factory = _channel_factory
        if factory is None:
            config.credentials()  # refuse unreadable files now
            factory = lambda e: aio_secure_channel(e, config)  # noqa: E731
        self._factory = factory
        self._channels: list[grpc.aio.Channel] | None = None
        self._stubs: list[LockStub] = []
        self._slots_lock: asyncio.Lock | None = None
        self._slots: dict[tuple[float, str], _Slot] = {}
        self._classes: dict[str, tuple[float, str]] = {}
        self._watchers: set[asyncio.Task] = set()

    def _connect(self) -> None:
        # Channels bind to the running loop: made at the first call.
        if self._channels is None:
            self._channels = [self._factory(e) for e in self._endpoints]
            self._stubs = [LockStub(c) for c in self._channels]
            self._slots_lock = asyncio.Lock()

    def home_of(self, key: KeyLike) -> int:
        """The endpoint (index into config.endpoints) that serves key first."""
        return ranked(str(_key(key)), self._endpoints)[0]

    async def _slot(self, key: Key, ttl: float | None) -> _Slot:
        """The session for holds of key's class TTL (or ttl), opened if needed:
        a new session is opened for the key's namespace, so the arbiter says
        the class's TTL and tier (and refuses a ttl that differs)."""
        self._connect()
        assert self._slots_lock is not None
        async with self._slots_lock:
            known = self._classes.get(key.namespace)
            if known is not None and ttl:
                known = (ttl, known[1])
            if known is not None:
                s = self._slots.get(known)
                if s is not None and s.session.health is not Health.LOST:
                    return s
            # Sessions are spread by TTL and tier (or namespace, until its
            # class is known) over the arbiters, with failover.
            if known is not None and known[1] == "entity":
                spread = f"session/{round(known[0] * 1000)}"
            elif known is not None:
                spread = f"session/{round(known[0] * 1000)}/{known[1]}"
            else:
                spread = f"session/{key.namespace}"
            asked = ttl or (known[0] if known else 0)
            order = ranked(spread, self._endpoints)
            last: BaseException | None = None
            for n, i in enumerate(order):
                stubs = [self._stubs[j] for j in order[n:] + order[:n]]
                opened_at = time.monotonic()
                try:
                    resp = await self._stubs[i].OpenSession(
                        lock_pb2.OpenSessionRequest(ttl_millis=round(asked * 1000), namespace=key.namespace), timeout=CALL_MARGIN)
                except grpc.RpcError as e:
                    err = from_rpc_error(e)
                    if _unavailable(err):
                        last = err
                        continue
                    raise err from None
                sess = Session(stubs, resp.session_id, resp.ttl_millis / 1000, opened_at)
                if resp.tier:
                    sess.tier = resp.tier
                sess.unprotected = resp.unprotected
                k = (sess.ttl, sess.tier)
                self._classes[key.namespace] = k
                # Opened only to learn the class's TTL and tier, which a live
                # session already has: keep that one (one session per TTL and tier).
                s = self._slots.get(k)
                if s is not None and s.session.health is not Health.LOST:
                    try:
                        await sess.close()
                    except HoldfastError:
                        pass
                    return s
                s = _Slot(sess, k, i)
                self._slots[k] = s
                t = asyncio.get_running_loop().create_task(self._fence_when_lost(s))
                self._watchers.add(t)
                t.add_done_callback(self._watchers.discard)
                return s
            raise last or ConfigError("no arbiter endpoints")

    async def _fence_when_lost(self, s: _Slot) -> None:
        """Waits for the session to end; if it was lost (not closed), drops it
        and hands every key it held to on_fence."""
        try:
            await asyncio.shield(s.session.done)
        except asyncio.CancelledError:
            if not s.session.done.done():
                return
        if s.session.health is not Health.LOST:
            return
        assert self._slots_lock is not None
        async with self._slots_lock:
            if self._slots.get(s.key) is s:
                del self._slots[s.key]
        keys = tuple(s.holds)
        s.holds.clear()
        if not keys:
            return
        fenced = Fenced(ttl=s.session.ttl, session_id=s.session.id, keys=keys)
        log.warning("holdfast: session %x lost; fencing %d key(s): %s", fenced.session_id, len(keys), ", ".join(map(str, keys)))
        try:
            if inspect.iscoroutinefunction(self._on_fence):
                await self._on_fence(fenced)
            else:
                await asyncio.get_running_loop().run_in_executor(None, self._on_fence, fenced)
        except Exception:
            log.exception("holdfast: on_fence raised")

    async def acquire(self, key: KeyLike, *, wait: float = 0.0, ttl: float | None = None) -> AsyncLock:
        """Acquire key, waiting up to ``wait`` seconds while another session
        holds it (0: try once). ``ttl``: the session TTL in seconds; None (the
        default) is the key's class TTL, the only one the arbiter accepts.
        A key already held through this locker's session of the same TTL is
        re-entered: its count goes up and nothing is sent; the returned lock
        shares the hold's token. If the key's last release in this session got
        no answer, it is sent again first, and acquire raises (unavailable, or
        the arbiter's refusal) until it is answered: the arbiter would
        otherwise hand the session its old hold back, which the late release
        could then delete under the new holder."""
        k = _key(key)
        s = await self._slot(k, ttl)
        async with s.key_lock(k):
            unanswered = s.releasing.get(k)
            if unanswered is not None:
                await _send_release(self._stubs, s, k, *unanswered)
            e = s.holds.get(k)
            if e is not None:
                e.count += 1
                return AsyncLock(self, s, k, e.token, e.unprotected)
            # An unprotected session exists only on the arbiter that opened it.
            order = [s.home] if s.session.unprotected else ranked(str(k), self._endpoints)
            last: BaseException | None = None
            for i in order:
                try:
                    token, unprotected = await self._acquire_on(s.session, self._stubs[i], k, wait)
                except UnavailableError as err:
                    last = err
                    continue
                s.holds[k] = _Entry(token, i, unprotected)
                return AsyncLock(self, s, k, token, unprotected)
            raise last or ConfigError("no arbiter endpoints")

    async def _acquire_on(self, session: Session, stub: LockStub, key: Key, wait: float) -> tuple[Token, bool]:
        """Asks stub for key on session (any arbiter serves any session).
        Refused locally once the session is lost."""
        session.ensure_alive()
        try:
            resp = await stub.Acquire(
                lock_pb2.AcquireRequest(session_id=session.id, namespace=key.namespace, key=key.path, wait_millis=round(wait * 1000)),
                timeout=wait + CALL_MARGIN)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        token = Token(0) if resp.unprotected else Token._from_wire(resp.token)
        try:
            session.ensure_alive()
        except HoldfastError:
            # Lost while the grant was in flight: the hold cannot be trusted.
            try:
                await stub.Release(lock_pb2.ReleaseRequest(session_id=session.id, namespace=key.namespace, key=key.path,
                                                           token=token.expose()), timeout=5)
            except grpc.RpcError:
                pass
            raise
        return token, resp.unprotected

    def lock(self, key: KeyLike, *, wait: float = 0.0, ttl: float | None = None) -> _AsyncLockContext:
        """``async with locker.lock("ns/key", wait=30) as lock:`` acquires on
        entry and releases on exit."""
        return _AsyncLockContext(self, key, wait, ttl)

    async def aclose(self) -> None:
        """Ends every session of this locker (and so every hold), each in one
        committed entry, and closes the connections. No fence is delivered for
        holds ended this way."""
        if self._channels is None:
            return
        assert self._slots_lock is not None
        async with self._slots_lock:
            slots, self._slots = self._slots, {}
        errors: list[BaseException] = []
        for s in slots.values():
            s.holds.clear()
            s.releasing.clear()
            try:
                await s.session.close()
            except HoldfastError as e:
                errors.append(e)
        for t in list(self._watchers):
            t.cancel()
        for c in self._channels:
            await c.close()
        self._channels = None
        if errors:
            raise errors[0]

    async def __aenter__(self) -> AsyncLocker:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class _AsyncLockContext:
    def __init__(self, locker: AsyncLocker, key: KeyLike, wait: float, ttl: float | None) -> None:
        self._args = (locker, key, wait, ttl)
        self._lock: AsyncLock | None = None

    async def __aenter__(self) -> AsyncLock:
        locker, key, wait, ttl = self._args
        self._lock = await locker.acquire(key, wait=wait, ttl=ttl)
        return self._lock

    async def __aexit__(self, *exc) -> None:
        assert self._lock is not None
        await self._lock.release()


class AsyncLock:
    """One level of a held lock. Call :meth:`release` (or use the context
    manager); dropping it keeps the hold until its session ends. Its token
    never prints."""

    def __init__(self, locker: AsyncLocker, slot: _Slot, key: Key, token: Token, unprotected: bool) -> None:
        self._locker, self._slot, self._released = locker, slot, False
        self.key = key
        self._token = token
        self._unprotected = unprotected

    @property
    def token(self) -> Token:
        """The fencing token: pass ``lock.token.expose()`` to the resource with
        every write. 0 for an unprotected grant, which a fenced resource refuses."""
        return self._token

    @property
    def unprotected(self) -> bool:
        """A grant made from an arbiter's memory while etcd was out of its
        reach (a class with on_quorum_loss = "open"): token 0, another arbiter
        may grant the key at the same time. Lost (fenced) once etcd is back."""
        return self._unprotected

    def can_start(self) -> bool:
        """False from the first failed keepalive until keepalives are confirmed
        again: finish the unit of work in hand, start no new one."""
        return self._slot.session.can_start()

    def remaining_ttl(self) -> float:
        """Seconds until the local deadline, when the hold must be treated as
        lost. Do not start work that cannot finish in this time."""
        return self._slot.session.remaining_ttl()

    @property
    def health(self) -> Health:
        return self._slot.session.health

    @property
    def lost(self):
        """A threading.Event set when the session is lost (on_fence is called too)."""
        return self._slot.session.lost

    @property
    def session_id(self) -> int:
        return self._slot.session.id

    @property
    def ttl(self) -> float:
        """The session's TTL in seconds (the class's)."""
        return self._slot.session.ttl

    async def release(self) -> bool:
        """Ends one level of nesting; the last one releases the hold at the
        arbiter. True if a hold was deleted there (False while still nested,
        if the hold was already gone, or if this lock was released before).
        UnavailableError means the outcome is unknown: the hold may live until
        its session ends. Call release again to retry; the next acquire of the
        key through this locker also sends the release again first."""
        if self._released:
            return False
        self._released = True
        s = self._slot
        try:
            async with s.key_lock(self.key):
                e = s.holds.get(self.key)
                unanswered = s.releasing.get(self.key)
                if e is None and unanswered is not None and unanswered[0] == self._token:
                    # This lock's release is still unanswered: send it again.
                    return await _send_release(self._locker._stubs, s, self.key, *unanswered)
                if e is None or e.token != self._token:
                    return False  # fenced or replaced meanwhile
                if e.count > 1:
                    e.count -= 1
                    return False
                del s.holds[self.key]
                return await _send_release(self._locker._stubs, s, self.key, self._token, e.via)
        except (asyncio.CancelledError, UnavailableError):
            self._released = False
            raise

    def __repr__(self) -> str:
        return (f"AsyncLock(key={str(self.key)!r}, session={self._slot.session.id:x}, token={REDACTED}, "
                f"unprotected={self._unprotected})")

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce__(self):
        raise TypeError("a holdfast lock cannot be pickled")
