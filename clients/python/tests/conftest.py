"""An in-process fake arbiter (grpc.aio, plaintext on loopback) whose
keepalive answers each test scripts, for the session loop's unit tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import grpc
import pytest

from holdfast.lockv1 import lock_pb2, lock_pb2_grpc

SESSION_ID = 0x5E55


@dataclass
class Answer:
    """How the fake answers one keepalive: after ``delay`` seconds, with
    ``ttl_millis`` and ``confirmed``; ``stall``: never."""

    confirmed: bool = True
    ttl_millis: int | None = None  # None: the session's TTL
    delay: float = 0.0
    stall: bool = False


OK = Answer()
STALL = Answer(stall=True)
UNCONFIRMED = Answer(confirmed=False)
GONE = Answer(ttl_millis=0)


@dataclass
class FakeArbiter(lock_pb2_grpc.LockServicer):
    ttl_millis: int = 4500
    #: Answer to keepalive n (0-based); the last one repeats.
    plan: list[Answer] = field(default_factory=lambda: [OK])
    #: (monotonic receive time, Answer) per keepalive received.
    keepalives: list[tuple[float, Answer]] = field(default_factory=list)
    opens: int = 0
    acquires: int = 0
    releases: int = 0
    closes: int = 0

    async def OpenSession(self, request, context):
        self.opens += 1
        return lock_pb2.OpenSessionResponse(session_id=SESSION_ID + self.opens - 1, ttl_millis=self.ttl_millis, tier="entity")

    async def Acquire(self, request, context):
        self.acquires += 1
        return lock_pb2.AcquireResponse(token=(1 << 48) | (100 + self.acquires), epoch=1, revision=100 + self.acquires)

    async def Release(self, request, context):
        self.releases += 1
        return lock_pb2.ReleaseResponse(released=True)

    async def CloseSession(self, request, context):
        self.closes += 1
        return lock_pb2.CloseSessionResponse()

    async def KeepAlive(self, request_iterator, context):
        async for req in request_iterator:
            n = len(self.keepalives)
            answer = self.plan[min(n, len(self.plan) - 1)]
            self.keepalives.append((time.monotonic(), answer))
            if answer.stall:
                await asyncio.sleep(3600)
            if answer.delay:
                await asyncio.sleep(answer.delay)
            ttl = self.ttl_millis if answer.ttl_millis is None else answer.ttl_millis
            yield lock_pb2.KeepAliveResponse(session_id=req.session_id, ttl_millis=ttl, confirmed=answer.confirmed)

    def last_confirmed(self) -> float:
        """The receive time of the last keepalive answered as confirmed (it
        was sent at most a loopback hop earlier)."""
        return [t for t, a in self.keepalives if not a.stall and a.confirmed and a.ttl_millis != 0][-1]


@contextlib.asynccontextmanager
async def fake_arbiter(**kw):
    """A started fake arbiter and its endpoint (plain asyncio: the unit
    tests need no pytest plugin; each runs its coroutine with asyncio.run)."""
    arbiter = FakeArbiter(**kw)
    server = grpc.aio.server()
    lock_pb2_grpc.add_LockServicer_to_server(arbiter, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield arbiter, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@pytest.fixture
def fake_lock():
    """A blocking Lock held on a fake arbiter (its own thread)."""
    import threading

    from holdfast import Config, Locker

    ready, stop = threading.Event(), threading.Event()
    box = {}

    def serve():
        async def main():
            async with fake_arbiter() as (arbiter, endpoint):
                box["endpoint"] = endpoint
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main())

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    ready.wait(10)
    locker = Locker(Config([box["endpoint"]], "", "", ""), lambda f: None, _channel_factory=grpc.aio.insecure_channel)
    lock = locker.acquire("jobs/py-redact")
    yield lock
    locker.close()
    stop.set()
    th.join(10)
