"""The Python client against the dev appliance (`holdfastctl dev` with the
conformance classes dropped in), the cases of clients/go/conformance. Skipped unless HOLDFAST_CONFORMANCE=1: run by
`cargo test --test client_python` (tests/tests/client_python.rs), which
fails unless every test here ran and passed.

Environment (set by client_python.rs): HOLDFAST_ENDPOINT, HOLDFAST_CA,
HOLDFAST_CERT, HOLDFAST_KEY (identity A); HOLDFAST_CONFORMANCE_CERT2/_KEY2
(identity B); HOLDFAST_CONFORMANCE_PLAIN_CERT/_PLAIN_KEY (the right CA, no
SPIFFE ID); HOLDFAST_CONFORMANCE_ARBITER_PID; HOLDFAST_CONFORMANCE_SCRIPTS
(clients/conformance: hold-in-etcd, fenced-write, take-over) with what they
read: HOLDFAST_CONFORMANCE_ETCD (etcd's client URL) and, for an https etcd
with client-certificate authentication, HOLDFAST_CONFORMANCE_ETCD_CA/_CERT/
_KEY; HOLDFAST_CONFORMANCE_PG_URL. Optional: HOLDFAST_CONFORMANCE_TTL (the
TTL of the conformance, re and fence classes; default 10),
HOLDFAST_CONFORMANCE_IDENTITY (A's SPIFFE path; default conformance/py-a)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import queue
import signal
import subprocess
import time
from dataclasses import dataclass, replace

import grpc
import pytest
from google.rpc import status_pb2

import holdfast
from holdfast import Client, Config, Key, Locker
from holdfast.lockv1 import lock_pb2


@dataclass
class Env:
    a: Config
    b: Config
    plain: Config
    pid: int
    scripts: str
    ttl: float
    identity: str


@pytest.fixture(scope="session")
def env() -> Env:
    if os.environ.get("HOLDFAST_CONFORMANCE") != "1":
        pytest.skip("HOLDFAST_CONFORMANCE is not 1: run through tests/tests/client_python.rs (cargo test --test client_python)")
    a = holdfast.config_from_env()
    need = ["HOLDFAST_CONFORMANCE_CERT2", "HOLDFAST_CONFORMANCE_KEY2", "HOLDFAST_CONFORMANCE_PLAIN_CERT",
            "HOLDFAST_CONFORMANCE_PLAIN_KEY", "HOLDFAST_CONFORMANCE_ARBITER_PID", "HOLDFAST_CONFORMANCE_ETCD",
            "HOLDFAST_CONFORMANCE_SCRIPTS"]
    missing = [n for n in need if not os.environ.get(n)]
    if missing:
        pytest.fail(f"{', '.join(missing)} must be set")
    b = replace(a, cert_file=os.environ["HOLDFAST_CONFORMANCE_CERT2"], key_file=os.environ["HOLDFAST_CONFORMANCE_KEY2"])
    plain = replace(a, cert_file=os.environ["HOLDFAST_CONFORMANCE_PLAIN_CERT"], key_file=os.environ["HOLDFAST_CONFORMANCE_PLAIN_KEY"])
    return Env(a, b, plain, int(os.environ["HOLDFAST_CONFORMANCE_ARBITER_PID"]), os.environ["HOLDFAST_CONFORMANCE_SCRIPTS"],
               float(os.environ.get("HOLDFAST_CONFORMANCE_TTL", "10")), os.environ.get("HOLDFAST_CONFORMANCE_IDENTITY", "conformance/py-a"))


class Fences:
    """What on_fence receives."""

    def __init__(self) -> None:
        self.q: queue.Queue[tuple[float, holdfast.Fenced]] = queue.Queue()

    def __call__(self, f: holdfast.Fenced) -> None:
        self.q.put((time.monotonic(), f))


@pytest.fixture
def lockers():
    made: list[Locker] = []

    def make(cfg: Config) -> tuple[Locker, Fences]:
        f = Fences()
        made.append(Locker(cfg, f))
        return made[-1], f

    yield make
    for l in made:
        try:
            l.close()
        except holdfast.HoldfastError:
            pass


@pytest.fixture
def client(env):
    with Client(env.a.endpoints[0], env.a) as c:
        yield c


def hold_in_etcd(env: Env, key: str) -> bool:
    """Whether key exists in etcd itself, with the shared script
    clients/conformance/hold-in-etcd: a test-only peek at the arbiter's
    layout (a hold is /l/NS/KEY)."""
    out = subprocess.run([os.path.join(env.scripts, "hold-in-etcd"), key], capture_output=True, text=True, timeout=10)
    assert out.returncode in (0, 1), f"hold-in-etcd {key}: exit {out.returncode}: {out.stderr}"
    return out.returncode == 0


def test_acquire_and_release(env, lockers, client):
    l, _ = lockers(env.a)
    with l.lock("conformance/py-acquire") as lock:
        assert lock.token.expose() > 0 and lock.token.epoch > 0 and not lock.unprotected and lock.can_start()
        assert lock.ttl == env.ttl and 0 < lock.remaining_ttl() <= env.ttl - 1
        got = client.inspect("conformance/py-acquire")
        assert got.held and got.session_id == lock.session_id and got.holder_identity.endswith("/" + env.identity)
    assert not client.inspect("conformance/py-acquire").held


def test_the_asyncio_api_acquires_and_releases(env, client):
    async def main():
        fences = Fences()
        async with holdfast.AsyncLocker(env.a, fences) as l:
            async with l.lock("conformance/py-async", wait=5) as lock:
                assert lock.token.expose() > 0 and lock.can_start() and lock.ttl == env.ttl
                return lock.session_id, await asyncio.to_thread(client.inspect, "conformance/py-async")

    session, held = asyncio.run(main())
    assert held.held and held.session_id == session
    assert not client.inspect("conformance/py-async").held


def test_holds_of_one_ttl_share_one_session(env, lockers):
    l, _ = lockers(env.a)
    # conformance and re are two classes with one TTL on one tier.
    locks = [l.acquire(k) for k in ("conformance/py-share-1", "conformance/py-share-2", "re/py-share-3")]
    try:
        assert len({k.session_id for k in locks}) == 1
    finally:
        for k in locks:
            k.release()


def test_reentrant_acquire_reaches_the_arbiter_once(env, lockers, client):
    l, _ = lockers(env.a)
    # Open the session first: the grant count below is the key's alone.
    with l.lock("conformance/py-reentrant-warm"):
        before = client.server_status().grant_attempts
        outer = l.acquire("conformance/py-reentrant")
        inner = l.acquire("conformance/py-reentrant")
        assert client.server_status().grant_attempts - before == 1
        assert inner.token == outer.token
        assert inner.release() is False and client.inspect("conformance/py-reentrant").held
        assert outer.release() is True and not client.inspect("conformance/py-reentrant").held


def test_contention_is_a_typed_error_after_a_zero_wait(env, lockers):
    la, _ = lockers(env.a)
    lb, _ = lockers(env.b)
    with lb.lock("conformance/py-contended"), la.lock("conformance/py-contended-other"):
        start = time.monotonic()
        with pytest.raises(holdfast.ContentionError) as e:
            la.acquire("conformance/py-contended", wait=0)
        took = time.monotonic() - start
    err = e.value
    assert err.code == grpc.StatusCode.ABORTED and not isinstance(err, holdfast.LeakError)
    assert "conformance/py-contended" in err.message and took < 2, (err, took)


def test_leak_is_a_typed_error(env, lockers):
    first, _ = lockers(env.a)
    second, _ = lockers(env.a)
    with first.lock("conformance/py-leak"):
        with pytest.raises(holdfast.LeakError) as e:
            second.acquire("conformance/py-leak")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_refusals_reach_grpcio_with_their_code_and_detail(env, client):
    # Raw grpcio: the status code itself, and the google.rpc.Status in the
    # trailer carrying the same code and message (no Internal anywhere).
    with pytest.raises(grpc.RpcError) as e:
        client.rpc.Acquire(lock_pb2.AcquireRequest(session_id=0x3039, namespace="conformance", key="py-nosession"), timeout=30)
    raw = e.value
    assert raw.code() == grpc.StatusCode.NOT_FOUND, raw
    details = dict(raw.trailing_metadata())["grpc-status-details-bin"]
    st = status_pb2.Status.FromString(details)
    assert st.code == grpc.StatusCode.NOT_FOUND.value[0] and st.message == raw.details() and len(st.details) == 1
    d = lock_pb2.ErrorDetail()
    assert st.details[0].Unpack(d) and d.reason == lock_pb2.ERROR_REASON_SESSION_NOT_FOUND
    assert isinstance(holdfast.from_rpc_error(raw), holdfast.SessionNotFoundError)

    with pytest.raises(grpc.RpcError) as e:
        client.rpc.Acquire(lock_pb2.AcquireRequest(session_id=0x3039, namespace="Jobs", key="k"), timeout=30)
    typed = holdfast.from_rpc_error(e.value)
    assert isinstance(typed, holdfast.InvalidArgumentError) and typed.field == "namespace"
    assert typed.code == grpc.StatusCode.INVALID_ARGUMENT

    try:
        client.rpc.Release(lock_pb2.ReleaseRequest(session_id=0x3039, namespace="conformance", key="py-nosession", token=(1 << 48) | 1), timeout=30)
    except grpc.RpcError as err:
        assert err.code() != grpc.StatusCode.INTERNAL, err

    # The refusals that need another arbiter: one in another region that
    # allows one request a second (HOLDFAST_CONFORMANCE_ELSEWHERE), one
    # sealed (HOLDFAST_CONFORMANCE_SEALED).
    elsewhere, sealed = os.environ.get("HOLDFAST_CONFORMANCE_ELSEWHERE"), os.environ.get("HOLDFAST_CONFORMANCE_SEALED")
    if not elsewhere or not sealed:
        pytest.fail("HOLDFAST_CONFORMANCE_ELSEWHERE and HOLDFAST_CONFORMANCE_SEALED must be set")
    with pytest.raises(grpc.RpcError) as e:
        client.rpc.Inspect(lock_pb2.InspectRequest(namespace="undeclared", key="k"), timeout=30)
    assert_refused("a namespace no grant covers", e.value, grpc.StatusCode.PERMISSION_DENIED, lock_pb2.ERROR_REASON_DENIED, holdfast.DeniedError)

    with Client(sealed, env.a) as s:
        opened = s.rpc.OpenSession(lock_pb2.OpenSessionRequest(namespace="conformance"), timeout=30)
        with pytest.raises(grpc.RpcError) as e:
            s.rpc.Acquire(lock_pb2.AcquireRequest(session_id=opened.session_id, namespace="conformance", key="py-sealed"), timeout=30)
    assert_refused("a sealed arbiter", e.value, grpc.StatusCode.FAILED_PRECONDITION, lock_pb2.ERROR_REASON_SEALED, holdfast.SealedError)

    with Client(elsewhere, env.b) as w, pytest.raises(grpc.RpcError) as e:
        w.rpc.Inspect(lock_pb2.InspectRequest(namespace="homed", key="k"), timeout=30)
    assert_refused("a class homed to another region", e.value, grpc.StatusCode.FAILED_PRECONDITION,
                   lock_pb2.ERROR_REASON_WRONG_REGION, holdfast.WrongRegionError)

    with Client(elsewhere, env.a) as limited:
        for _ in range(21):
            try:
                limited.rpc.Inspect(lock_pb2.InspectRequest(namespace="conformance", key="k"), timeout=30)
            except grpc.RpcError as err:
                refusal = err
                break
        else:
            pytest.fail("21 calls in a row at one a second were all answered")
    assert_refused("the request rate", refusal, grpc.StatusCode.RESOURCE_EXHAUSTED, lock_pb2.ERROR_REASON_RATE_LIMITED,
                   holdfast.RateLimitedError)


def assert_refused(what: str, raw: grpc.RpcError, code: grpc.StatusCode, reason: int, typed: type) -> None:
    """raw reached grpcio with code and one lock.v1.ErrorDetail of reason in
    the trailer's google.rpc.Status, and the library maps it to typed."""
    assert raw.code() == code, f"{what}: {raw}"
    st = status_pb2.Status.FromString(dict(raw.trailing_metadata())["grpc-status-details-bin"])
    d = lock_pb2.ErrorDetail()
    assert st.code == code.value[0] and len(st.details) == 1 and st.details[0].Unpack(d) and d.reason == reason, f"{what}: {st}"
    assert isinstance(holdfast.from_rpc_error(raw), typed), f"{what}: {holdfast.from_rpc_error(raw)!r}"
    print(f"{what}: {code.name}, {lock_pb2.ErrorReason.Name(reason)}")


def test_a_certificate_without_a_spiffe_id_is_unauthenticated(env, lockers):
    l, _ = lockers(env.plain)
    with pytest.raises(holdfast.UnauthenticatedError) as e:
        l.acquire("conformance/py-plain")
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_a_session_closed_elsewhere_is_fenced_with_its_keys(env, lockers, client):
    l, fences = lockers(env.a)
    locks = [l.acquire(k) for k in ("conformance/py-fence-1", "conformance/py-fence-2")]
    lock = locks[-1]
    client.rpc.CloseSession(lock_pb2.CloseSessionRequest(session_id=lock.session_id), timeout=30)
    _, fenced = fences.q.get(timeout=env.ttl)
    assert sorted(map(str, fenced.keys)) == ["conformance/py-fence-1", "conformance/py-fence-2"]
    assert fenced.session_id == lock.session_id and fenced.ttl == env.ttl
    assert lock.health is holdfast.Health.LOST and not lock.can_start() and lock.lost.is_set()
    # The next acquire opens a new session.
    with l.lock("conformance/py-fence-1") as again:
        assert again.session_id != lock.session_id


def test_the_token_never_prints(env, lockers):
    l, _ = lockers(env.a)
    with l.lock("conformance/py-redact") as lock:
        v = lock.token.expose()
        t = lock.token
        stream = io.StringIO()
        logger = logging.getLogger("holdfast-conformance")
        handler = logging.StreamHandler(stream)
        logger.addHandler(handler)
        try:
            logger.warning("%s %r %s %r", lock, lock, t, t)
            logger.warning(lock)
        finally:
            logger.removeHandler(handler)
        out = " ".join([repr(lock), str(lock), f"{lock}", f"{lock!r}", f"{lock:>10}", repr(t), str(t), f"{t}", f"{t:d}",
                        f"{t:x}", f"{t!r}", "%s %r" % (t, t), str([lock, t]), stream.getvalue()])
    for form in (str(v), f"{v:x}", str(v & ((1 << 48) - 1))):
        assert form not in out, f"the token ({form}) shows in {out!r}"
    assert "conformance/py-redact" in out and "redacted" in out


def test_an_unanswered_release_is_sent_again_before_the_key_is_acquired_again(env):
    """A release that gets no answer may still be applied later, so the
    library keeps its key blocked: through a proxy in front of the dev
    arbiter that drops everything while cut (HOLDFAST_CONFORMANCE_CUTTABLE,
    cut while the file HOLDFAST_CONFORMANCE_CUT exists), the release gets no
    answer and the hold stays in etcd; the next acquire sends the release
    again first and gets nowhere while still cut; once the cut ends, the
    acquire has the release answered and gets a hold of its own on the same
    session, rather than the old one handed back (which the late release
    could delete under it)."""
    proxy, cut = os.environ.get("HOLDFAST_CONFORMANCE_CUTTABLE"), os.environ.get("HOLDFAST_CONFORMANCE_CUT")
    assert proxy and cut, "HOLDFAST_CONFORMANCE_CUTTABLE (the proxy) and HOLDFAST_CONFORMANCE_CUT (its cut file) must be set"
    key = "conformance/py-unanswered"

    async def main():
        async with holdfast.AsyncLocker(replace(env.a, endpoints=[proxy]), Fences()) as l:
            first = await l.acquire(key)
            open(cut, "w").close()
            try:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(first.release(), 1.0)
                assert await asyncio.to_thread(hold_in_etcd, env, "/l/" + key), "the unanswered release was applied: the proxy let it through"
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(l.acquire(key), 1.0)
            finally:
                os.remove(cut)
            end = time.monotonic() + 8
            while True:
                try:
                    again = await l.acquire(key)
                    break
                except holdfast.UnavailableError:
                    assert time.monotonic() < end, "no acquire within 8 s of the cut's end"
                    await asyncio.sleep(0.1)
            assert again.session_id == first.session_id, "the session was lost during the cut: the test proves nothing"
            assert again.token.expose() > first.token.expose(), \
                "the old hold was handed back to its session: a late release could delete it under the new holder"
            assert await again.release()

    asyncio.run(main())


def test_a_stopped_arbiter_drains_then_fences_before_the_lease_can_expire(env, lockers):
    """Last: it stops the arbiter (SIGSTOP), twice. A short freeze: can_start
    turns false at the first failed keepalive and true again once one is
    confirmed, with no fence. A long one: on_fence comes at the local
    deadline (the last confirmed keepalive's send time + TTL - 1 s), while
    etcd still has the hold; etcd ends it later (measured, the arbiter still
    stopped)."""
    l, fences = lockers(env.a)
    k = "fence/py-sigstop"
    lock = l.acquire(k)
    ttl = env.ttl
    assert lock.ttl == ttl

    def stop() -> float:
        # Wait for a confirmed renewal first (the deadline moves forward).
        first = time.monotonic() + lock.remaining_ttl()
        while time.monotonic() + lock.remaining_ttl() - first < 0.5:
            assert time.monotonic() - first < ttl, "no confirmed keepalive"
            time.sleep(0.05)
        os.kill(env.pid, signal.SIGSTOP)
        return time.monotonic()

    def wait_drained(stopped: float) -> float:
        while lock.can_start():
            assert time.monotonic() - stopped < ttl, "can_start stayed true with the arbiter stopped"
            time.sleep(0.01)
        return time.monotonic()

    try:
        # 1. A short freeze.
        stopped = stop()
        drained = wait_drained(stopped)
        os.kill(env.pid, signal.SIGCONT)
        while not lock.can_start():
            assert time.monotonic() - drained < 5, "can_start did not come back after keepalives resumed"
            time.sleep(0.02)
        assert fences.q.empty(), "fenced on a recovered blip"
        print(f"can_start dropped {drained - stopped:.3f}s after the short freeze and recovered")

        # 2. A long freeze.
        stopped = stop()
        # Renewals cannot move the deadline any more.
        deadline = stopped + lock.remaining_ttl()
        drained = wait_drained(stopped)
        fenced, f = fences.q.get(timeout=2 * ttl)
        assert [str(x) for x in f.keys] == [k]
        assert drained <= fenced and deadline - 0.05 <= fenced <= deadline + 0.3, (drained - stopped, fenced - stopped, deadline - stopped)
        # The lease's real end, read from etcd itself while the arbiter is
        # still stopped: the hold must still exist after the fence, and
        # disappear when etcd expires the lease.
        first, expired = True, None
        while expired is None:
            assert time.monotonic() - fenced < ttl, "the hold outlived the fence by a TTL"
            if hold_in_etcd(env, "/l/" + k):
                first = False
            else:
                assert not first, f"the hold was gone from etcd at the first look after the fence ({time.monotonic() - fenced:.3f}s after it): the fence came too late"
                expired = time.monotonic()
            time.sleep(0.02)
    finally:
        os.kill(env.pid, signal.SIGCONT)
    print(f"FENCE-MARGIN python: drained {drained - stopped:.3f}s and fenced {fenced - stopped:.3f}s after SIGSTOP; "
          f"etcd expired the lease {expired - fenced:.3f}s after the fence (TTL {ttl:g}s, margin {holdfast.FENCE_MARGIN:g}s)")
    assert expired > fenced
    assert lock.health is holdfast.Health.LOST and not lock.can_start()


def fenced_write(scripts: str, token: holdfast.Token, record: str) -> bool:
    """One write through the PostgreSQL reference fence with the shared
    script (clients/conformance/fenced-write), the token on its standard
    input: True when the fence accepted it, False when it rejected it."""
    r = subprocess.run([os.path.join(scripts, "fenced-write"), record], input=f"{token.expose()}\n",
                       capture_output=True, text=True, timeout=60)
    out = r.stdout.strip()
    if r.returncode == 0 and out == "accepted":
        return True
    if r.returncode == 1 and out == "rejected":
        return False
    pytest.fail(f"fenced-write {record}: exit {r.returncode}: {r.stdout}{r.stderr}")


def test_a_stopped_clients_late_write_is_rejected_by_the_postgresql_fence(env, lockers):
    """This process stops itself (SIGSTOP) past its TTL while it holds a
    key. A successor (clients/conformance/take-over, another identity) gets
    the key once the lease expires, writes with its newer token and resumes
    this process, whose late write with the old token the fence rejects."""
    scripts, pg = os.environ.get("HOLDFAST_CONFORMANCE_SCRIPTS"), os.environ.get("HOLDFAST_CONFORMANCE_PG_URL")
    if not scripts or not pg:
        pytest.fail("HOLDFAST_CONFORMANCE_SCRIPTS and HOLDFAST_CONFORMANCE_PG_URL must be set")
    l, fences = lockers(env.a)
    k, record = "fence/py-late-write", "py-late-write"
    lock = l.acquire(k)
    assert fenced_write(scripts, lock.token, record), "the holder's first write was rejected"
    successor = subprocess.Popen([os.path.join(scripts, "take-over"), str(os.getpid()), k, record],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    remaining, stopped = lock.remaining_ttl(), time.monotonic()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.2)  # kill returns before the stop reaches every thread: the process stops here
    resumed = time.monotonic()
    assert resumed - stopped > remaining, f"stopped for {resumed - stopped:.3f}s, within the lock's remaining TTL {remaining:.3f}s"
    out, _ = successor.communicate(timeout=60)
    assert successor.returncode == 0 and "accepted" in out, f"the successor: exit {successor.returncode}: {out}"
    _, f = fences.q.get(timeout=5)
    assert [str(x) for x in f.keys] == [k], f.keys
    assert not lock.can_start()
    # The write a paused process makes when it wakes, before it looks at its
    # lock: the fence must reject it.
    assert not fenced_write(scripts, lock.token, record), "the stopped client's late write was accepted"
    count = subprocess.run([os.path.join(scripts, "fenced-write"), "--count", record], capture_output=True, text=True, timeout=60)
    assert count.stdout.strip() == "2", f"accepted writes: {count.stdout!r} {count.stderr!r} (want the holder's first and the successor's)"
    print(f"LATE-WRITE python: the late write was rejected after a {resumed - stopped:.3f}s stop "
          f"({remaining:.3f}s of the lock's TTL was left when it stopped; TTL {env.ttl:g}s)")
