"""The session loop and the locker against the in-process fake arbiter
(conftest.py): drain then fence at the send-time deadline, unconfirmed
keepalives, sessions the arbiter calls gone, one session per TTL,
re-entrancy. Real time: TTL 4.5 s, so keepalives every 1.5 s and the
deadline 3.5 s after the last confirmed send."""

import asyncio
import threading
import time

import grpc
import pytest

import holdfast
from holdfast import AsyncLocker, Config, Health, Locker
from conftest import GONE, OK, STALL, UNCONFIRMED, Answer, fake_arbiter

TTL = 4.5
# Confirmed answers arrive this late: a deadline counted from the receive
# time instead of the send time would fall this much later.
REPLY_DELAY = 0.6
SLOW_OK = Answer(delay=REPLY_DELAY)


def config(endpoint: str) -> Config:
    return Config([endpoint], "", "", "")


class Fences:
    def __init__(self) -> None:
        self.got: list[tuple[float, holdfast.Fenced]] = []
        self.event = threading.Event()

    def __call__(self, f: holdfast.Fenced) -> None:
        self.got.append((time.monotonic(), f))
        self.event.set()


def locker(endpoint: str, fences) -> AsyncLocker:
    return AsyncLocker(config(endpoint), fences, _channel_factory=grpc.aio.insecure_channel)


async def wait_for(cond, timeout: float, step: float = 0.005) -> float:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        await asyncio.sleep(step)
    return time.monotonic()


def test_on_fence_is_required():
    with pytest.raises(holdfast.ConfigError, match="on_fence is required"):
        AsyncLocker(config("127.0.0.1:1"), None)
    with pytest.raises(holdfast.ConfigError, match="on_fence is required"):
        Locker(config("127.0.0.1:1"), None)


def test_stalled_keepalives_drain_then_fence_at_the_send_time_deadline():
    async def main():
        async with fake_arbiter(ttl_millis=int(TTL * 1000), plan=[SLOW_OK, SLOW_OK, SLOW_OK, STALL]) as (arb, ep):
            fences = Fences()
            l = locker(ep, fences)
            lock = await l.acquire("jobs/a")
            lock2 = await l.acquire("jobs/b")
            assert lock.ttl == TTL and lock.can_start() and lock.session_id == lock2.session_id
            await wait_for(lambda: len(arb.keepalives) >= 4, 10)
            last_ok = arb.last_confirmed()
            # The answer to the last confirmed keepalive came REPLY_DELAY after it.
            assert lock.can_start()
            drained = await wait_for(lambda: not lock.can_start(), 10)
            await wait_for(lambda: fences.got, 10)
            fenced_at, fenced = fences.got[0]
            deadline = last_ok + TTL - holdfast.FENCE_MARGIN
            # Drained when the stalled round's period ran out, before the deadline.
            assert last_ok + 1.5 * 2 - 0.15 < drained < deadline
            # Loose bounds for a loaded CI machine, still tighter than REPLY_DELAY.
            assert deadline - 0.15 < fenced_at < deadline + 0.35, (fenced_at - last_ok)
            assert sorted(map(str, fenced.keys)) == ["jobs/a", "jobs/b"] and fenced.ttl == TTL
            assert lock.health is Health.LOST and lock.remaining_ttl() == 0 and lock.lost.is_set()
            with pytest.raises(holdfast.SessionNotFoundError):
                await l._acquire_on(lock._slot.session, l._stubs[0], holdfast.Key.parse("jobs/c"), 0)
            assert len(fences.got) == 1
            await l.aclose()

    asyncio.run(main())


def test_unconfirmed_keepalives_do_not_count():
    async def main():
        async with fake_arbiter(ttl_millis=int(TTL * 1000), plan=[SLOW_OK, UNCONFIRMED]) as (arb, ep):
            fences = Fences()
            l = locker(ep, fences)
            lock = await l.acquire("jobs/u")
            await wait_for(lambda: len(arb.keepalives) >= 2, 10)
            first_ok = arb.last_confirmed()
            await wait_for(lambda: not lock.can_start(), 10)
            await wait_for(lambda: fences.got, 10)
            fenced_at, fenced = fences.got[0]
            # Renewed (ttl_millis > 0) on every round after the first, but
            # never confirmed: the deadline is still the first one's.
            assert len(arb.keepalives) >= 3
            assert first_ok + TTL - 1 - 0.15 < fenced_at < first_ok + TTL - 1 + 0.35
            assert [str(k) for k in fenced.keys] == ["jobs/u"]
            await l.aclose()

    asyncio.run(main())


def test_a_session_the_arbiter_calls_gone_is_fenced_at_once_and_replaced():
    async def main():
        async with fake_arbiter(ttl_millis=int(TTL * 1000), plan=[OK, GONE, OK]) as (arb, ep):
            fences = Fences()
            l = locker(ep, fences)
            lock = await l.acquire("jobs/g")
            await wait_for(lambda: fences.got, 5)
            fenced_at, fenced = fences.got[0]
            gone_at = arb.keepalives[1][0]
            assert fenced_at - gone_at < 0.5 and [str(k) for k in fenced.keys] == ["jobs/g"]
            assert lock.health is Health.LOST and not lock.can_start()
            assert await lock.release() is False  # nothing of ours left to release
            again = await l.acquire("jobs/g")
            assert again.session_id != lock.session_id and arb.opens == 2
            await l.aclose()

    asyncio.run(main())


def test_a_failed_keepalive_drains_and_a_confirmed_one_recovers_without_fence():
    async def main():
        plan = [OK, Answer(stall=True), OK]
        async with fake_arbiter(ttl_millis=int(TTL * 1000), plan=plan) as (arb, ep):
            fences = Fences()
            l = locker(ep, fences)
            lock = await l.acquire("jobs/r")
            await wait_for(lambda: not lock.can_start(), 10)
            await wait_for(lambda: lock.can_start(), 10)
            assert lock.health is Health.HEALTHY and not fences.got
            await l.aclose()

    asyncio.run(main())


def test_holds_of_one_ttl_share_a_session_and_reentry_stays_in_the_library():
    async def main():
        async with fake_arbiter(ttl_millis=int(TTL * 1000)) as (arb, ep):
            fences = Fences()
            async with locker(ep, fences) as l:
                a = await l.acquire("jobs/x")
                b = await l.acquire("re/y")  # another namespace, same TTL and tier
                assert a.session_id == b.session_id
                # re/y's open learned its class; its extra session was closed.
                assert arb.opens == 2 and arb.closes == 1
                before = arb.acquires
                inner = await l.acquire("jobs/x")
                assert arb.acquires == before and inner.token == a.token
                assert await inner.release() is False and arb.releases == 0
                assert await inner.release() is False  # twice: no effect
                async with l.lock("jobs/x") as third:
                    assert third.token == a.token and arb.acquires == before
                assert arb.releases == 0
                assert await a.release() is True and arb.releases == 1
                assert await b.release() is True
            assert arb.closes == 2 and not fences.got

    asyncio.run(main())


def test_the_blocking_api_drives_the_same_core():
    ready, stop = threading.Event(), threading.Event()
    box = {}

    def serve():
        async def main():
            async with fake_arbiter(ttl_millis=int(TTL * 1000), plan=[OK, STALL]) as (arb, ep):
                box["arb"], box["ep"] = arb, ep
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.02)

        asyncio.run(main())

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    assert ready.wait(10)
    fences = Fences()
    try:
        with Locker(config(box["ep"]), fences, _channel_factory=grpc.aio.insecure_channel) as l:
            with l.lock("jobs/sync", wait=1) as lock:
                assert lock.can_start() and 0 < lock.remaining_ttl() <= TTL - 1
                assert fences.event.wait(10)
                assert not lock.can_start() and [str(k) for k in fences.got[0][1].keys] == ["jobs/sync"]
    finally:
        stop.set()
        th.join(10)
