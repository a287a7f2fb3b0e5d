"""One session (one etcd lease on the arbiter), renewed in the background on
an asyncio loop. The pure deadline arithmetic is at the top."""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from .errors import HoldfastError, SessionNotFoundError, _lost, from_rpc_error, from_status
from .lockv1 import lock_pb2
from .lockv1.lock_pb2_grpc import LockStub

log = logging.getLogger("holdfast")

#: Kept between the local deadline and the earliest moment the arbiter's
#: lease can end (seconds).
FENCE_MARGIN = 1.0
#: The shortest interval between keepalives (seconds).
MIN_KEEPALIVE_PERIOD = 0.5
#: After a failed keepalive, the next one (to the next arbiter) after this.
RETRY_AFTER_FAILURE = 0.25


def keepalive_period(ttl: float) -> float:
    """TTL/3, at least 500 ms."""
    return max(ttl / 3, MIN_KEEPALIVE_PERIOD)


def fence_deadline(sent_at: float, ttl: float) -> float:
    """The local deadline a keepalive sent at ``sent_at`` (a time.monotonic()
    reading) and confirmed sets: sent_at + TTL - FENCE_MARGIN. The arbiter
    cannot have extended the lease before the keepalive was sent, so the
    deadline falls before the lease's end."""
    return sent_at + max(ttl - FENCE_MARGIN, 0.0)


class Health(enum.Enum):
    """What a session knows about its own liveness."""

    #: The last keepalive was confirmed. New work may start.
    HEALTHY = "healthy"
    #: A keepalive failed; the session may still be alive on the arbiter.
    #: Finish the unit of work in hand, start no new one.
    DEGRADED = "degraded"
    #: The local deadline passed, or the arbiter said the session is gone.
    #: Every hold of the session must be treated as lost.
    LOST = "lost"


class _Outcome(enum.Enum):
    ACKED = 1  # confirmed renewal
    GONE = 2  # the arbiter says the session no longer exists
    FAILED = 3  # no usable answer: error, lost stream, timeout, unconfirmed


async def _status_error(call) -> HoldfastError:
    """The typed error of a finished stream call."""
    code = await call.code()
    details = await call.details()
    trailing = await call.trailing_metadata()
    bin_ = None
    for k, v in trailing or ():
        if k == "grpc-status-details-bin":
            bin_ = v
    return from_status(code, details or "", bin_)


class Session:
    """Renews session ``id`` every keepalive_period(ttl) from a task on the
    running loop. ``stubs[0]`` is the arbiter the session was opened on;
    keepalives fail over to the others in turn. ``opened_at`` is the
    monotonic time the open call was sent: the lease cannot have started
    earlier, so the first deadline counts from there."""

    def __init__(self, stubs: Sequence[LockStub], id: int, ttl: float, opened_at: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stubs = list(stubs)
        self.id = id
        self.ttl = ttl
        self.tier = "entity"
        self.unprotected = False
        self._clock = clock
        # Read from any thread (the sync API); written only on the loop.
        self.deadline = fence_deadline(opened_at, ttl)
        self.health = Health.HEALTHY
        #: Set when the session is lost (threading.Event: waitable from any thread).
        self.lost = threading.Event()
        self._closing = False
        self._call = None
        self.done = asyncio.get_running_loop().create_task(self._run(), name=f"holdfast-keepalive-{id:x}")

    # -- what a hold asks -------------------------------------------------
    def can_start(self) -> bool:
        return self.health is Health.HEALTHY and self.remaining_ttl() > 0

    def remaining_ttl(self) -> float:
        """Seconds left before the local deadline (0 once past or lost)."""
        if self.health is Health.LOST:
            return 0.0
        return max(self.deadline - self._clock(), 0.0)

    def ensure_alive(self) -> None:
        if self.health is Health.LOST or self.remaining_ttl() == 0:
            raise _lost()

    def _set_lost(self) -> None:
        self.health = Health.LOST
        self.lost.set()

    # -- the loop ---------------------------------------------------------
    def _drop(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None

    async def _round(self, stub: LockStub, period: float) -> tuple[_Outcome, float]:
        """Sends one keepalive on the stream (opened if needed) and waits up to
        period for its answer."""
        if self._call is None:
            self._call = stub.KeepAlive()
        call = self._call
        sent_at = self._clock()
        try:
            async with asyncio.timeout(period):
                try:
                    await call.write(lock_pb2.KeepAliveRequest(session_id=self.id))
                except grpc.aio.AioRpcError:
                    raise
                except Exception:
                    # The stream ended: its status says why.
                    raise await _status_error(call) from None
                resp = await call.read()
        except TimeoutError:
            return _Outcome.FAILED, sent_at
        except (grpc.aio.AioRpcError, HoldfastError) as e:
            if isinstance(from_rpc_error(e), SessionNotFoundError):
                # The arbiter knows the session is gone (expired, closed, revoked).
                return _Outcome.GONE, sent_at
            return _Outcome.FAILED, sent_at
        except Exception:  # anything else from grpcio (a broken stream): no answer
            log.debug("holdfast: keepalive of session %x failed", self.id, exc_info=True)
            return _Outcome.FAILED, sent_at
        if resp is grpc.aio.EOF:
            return _Outcome.FAILED, sent_at
        if resp.ttl_millis > 0 and resp.confirmed:
            return _Outcome.ACKED, sent_at
        if resp.ttl_millis > 0:
            # Renewed by a leader whose term was not confirmed: does not count.
            return _Outcome.FAILED, sent_at
        return _Outcome.GONE, sent_at

    async def _sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(t - self._clock(), 0.0))

    async def _run(self) -> None:
        """The local deadline is the monotonic send time of the last confirmed
        keepalive + TTL - FENCE_MARGIN; when it passes, the session is lost at
        once, whatever call is in flight."""
        period = keepalive_period(self.ttl)
        current = 0
        try:
            while True:
                deadline = self.deadline
                if self._clock() >= deadline:
                    self._set_lost()
                    return
                try:
                    async with asyncio.timeout(deadline - self._clock()):
                        outcome, sent_at = await self._round(self.stubs[current], period)
                except TimeoutError:
                    # The deadline passed with the keepalive unanswered: lost now
                    # (the round is cancelled; nothing it says can count any more).
                    self._set_lost()
                    return
                if outcome is _Outcome.ACKED:
                    d = fence_deadline(sent_at, self.ttl)
                    if d <= self._clock():
                        # Read only after the deadline it sets (the process was
                        # stopped while it waited): it extends nothing.
                        self._set_lost()
                        return
                    self.deadline = d
                    self.health = Health.HEALTHY
                    await self._sleep_until(min(sent_at + period, d))
                elif outcome is _Outcome.GONE:
                    self._set_lost()
                    return
                else:
                    # Try the next arbiter: any arbiter renews any session.
                    self._drop()
                    current = (current + 1) % len(self.stubs)
                    if self.health is Health.HEALTHY:
                        self.health = Health.DEGRADED
                    await self._sleep_until(min(self._clock() + RETRY_AFTER_FAILURE, deadline))
        except Exception:
            # A bug here must not leave holds trusted with nothing renewing
            # them: the session is lost, and its keys are fenced.
            log.exception("holdfast: the keepalive loop of session %x failed; fencing its keys", self.id)
            self._set_lost()
        finally:
            self._drop()

    async def close(self, timeout: float = 10.0) -> None:
        """Ends the keepalives and the session (and every hold on it) at the
        arbiter it was opened on."""
        self.done.cancel()
        try:
            await self.done
        except asyncio.CancelledError:
            pass
        try:
            await self.stubs[0].CloseSession(lock_pb2.CloseSessionRequest(session_id=self.id), timeout=timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
