"""The token is a capability: no repr/str/format/logging path shows it."""

import copy
import io
import logging
import pickle

import pytest

from holdfast import Token
from holdfast.errors import ConfigError

VALUE = (7 << 48) | 123456789  # epoch 7, revision 123456789


def forms(v: int) -> list[str]:
    rev = v & ((1 << 48) - 1)
    return [str(v), hex(v)[2:], f"{v:x}", f"{v:X}", oct(v)[2:], str(rev), f"{rev:x}"]


def assert_redacted(text: str, v: int = VALUE) -> None:
    for form in forms(v):
        assert form not in text, f"the token ({form}) shows in {text!r}"
    assert "redacted" in text, text


def every_rendering(obj) -> str:
    return " ".join(
        [
            repr(obj), str(obj), f"{obj}", f"{obj!r}", f"{obj!s}", f"{obj:d}", f"{obj:x}", f"{obj:>40}", f"{obj:#x}",
            "%s %r" % (obj, obj), "{} {!r} {:d}".format(obj, obj, obj), format(obj), str([obj]), str({"t": obj}),
            repr((obj,)),
        ]
    )


def test_every_format_of_a_token_is_redacted():
    assert_redacted(every_rendering(Token(VALUE)))


def test_the_token_is_read_only_through_expose():
    t = Token(VALUE)
    assert t.expose() == VALUE and t.epoch == 7 and t.revision == 123456789 and not t.unprotected
    assert Token(0).unprotected
    assert not hasattr(t, "__dict__")
    assert str(VALUE) not in str([getattr(t, a, None) for a in dir(t) if a != "_Token__value"])


def test_logging_redacts_the_token_in_every_argument_style():
    stream = io.StringIO()
    logger = logging.getLogger("holdfast-test-redaction")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s %(token)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        t = Token(VALUE)
        logger.warning("token %s %r %d", t, t, 0, extra={"token": t})
        logger.warning("as a dict %(t)s", {"t": t}, extra={"token": t})
        logger.warning(t, extra={"token": [t]})
    finally:
        logger.removeHandler(handler)
    assert_redacted(stream.getvalue())


def test_a_token_does_not_leave_through_pickle_and_copies_stay_tokens():
    with pytest.raises(TypeError):
        pickle.dumps(Token(VALUE))
    assert copy.deepcopy(Token(VALUE)).expose() == VALUE
    assert Token(VALUE) == Token(VALUE) and Token(VALUE) != Token(VALUE + 1)


@pytest.mark.parametrize("bad", [0, 1, 1 << 48, (1 << 63) | 1])
def test_a_token_no_arbiter_could_mint_is_refused(bad):
    with pytest.raises(ConfigError) as e:
        Token._from_wire(bad)
    assert "malformed token" in str(e.value)


def test_a_lock_prints_without_its_token(fake_lock):
    lock = fake_lock
    text = every_rendering(lock)
    assert_redacted(text, lock.token.expose())
    assert "jobs/py-redact" in text
