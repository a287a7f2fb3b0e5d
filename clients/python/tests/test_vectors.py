"""The shared client conformance vectors (clients/conformance/vectors.json),
which the Rust, Go and Java clients check too."""

import base64
import json
import pathlib

import grpc
import pytest

from holdfast import Key, Token, fence_deadline, keepalive_period
from holdfast._affinity import ranked, score
from holdfast.errors import ConfigError, InvalidArgumentError, from_status
from holdfast.lockv1 import lock_pb2

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "conformance" / "vectors.json"
CODES = {c.value[0]: c for c in grpc.StatusCode}


def section(name: str) -> list[dict]:
    entries = json.loads(VECTORS.read_text()).get(name)
    assert entries, f"vectors.json: {name} is missing or empty"
    return entries


@pytest.mark.parametrize("v", section("tokens"), ids=lambda v: v["name"])
def test_tokens(v: dict) -> None:
    wire = int(v["wire"])
    if v.get("malformed"):
        with pytest.raises(ConfigError):
            Token._from_wire(wire)
    elif v["unprotected"]:
        # Never a token on the wire: only a fail-open grant's flag makes it.
        with pytest.raises(ConfigError):
            Token._from_wire(wire)
        u = Token(0)
        assert u.unprotected and u.expose() == wire
    else:
        t = Token._from_wire(wire)
        assert (t.epoch, t.revision, t.unprotected, t.expose()) == (v["epoch"], v["revision"], False, wire)
        shown = f"{t} {t!r} {t:d}"
        assert v["wire"] not in shown, shown


@pytest.mark.parametrize("v", section("keys"), ids=lambda v: v["text"][:40])
def test_keys(v: dict) -> None:
    if "invalid_field" in v:
        with pytest.raises(InvalidArgumentError) as e:
            Key.parse(v["text"])
        assert e.value.field == v["invalid_field"], e.value.message
    else:
        k = Key.parse(v["text"])
        assert (k.namespace, k.path, str(k)) == (v["namespace"], v["path"], v["text"])


@pytest.mark.parametrize("v", section("rendezvous"), ids=lambda v: f'{v["key"]}-{len(v["endpoints"])}')
def test_rendezvous(v: dict) -> None:
    assert [str(score(e, v["key"])) for e in v["endpoints"]] == v["scores"]
    assert ranked(v["key"], v["endpoints"]) == v["ranked"]


@pytest.mark.parametrize("v", section("error_details"), ids=lambda v: v["name"])
def test_error_details(v: dict) -> None:
    details = base64.b64decode(v["status_details_bin"]) or None
    e = from_status(CODES[v["code"]], v["message"], details)
    assert e.code == CODES[v["code"]]
    assert lock_pb2.ErrorReason.Name(e.reason) == v["reason"]
    assert e.field == v["field"]
    want = v["retry_after_ms"] / 1000 if v["retry_after_ms"] else None
    assert e.retry_after == want


@pytest.mark.parametrize("v", section("deadlines"), ids=lambda v: f'{v["ttl_ms"]}ms')
def test_deadlines(v: dict) -> None:
    # Whole milliseconds as integers, so float rounding cannot hide a difference.
    assert round(fence_deadline(v["sent_at_ms"] / 1000, v["ttl_ms"] / 1000) * 1000) == v["deadline_ms"]
    assert round(keepalive_period(v["ttl_ms"] / 1000) * 1000) == v["keepalive_period_ms"]
